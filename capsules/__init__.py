"""The 3D point capsule autoencoder of the centroid-attention paper (section 3.3) and its Chamfer loss.

The autoencoder of *3D Point Capsule Networks* (Zhao et al., CVPR 2019) with its dynamic routing replaced by centroid
attention (primary capsules as inputs, latent capsules as centroids), trained with the Chamfer distance between the
input cloud and its reconstruction. So far the package holds the loss, :func:`capsules.chamfer.chamfer_distance`, with
its pinned definition :data:`CHAMFER_DEFINITION`; the autoencoder itself (routing and centroid variants), the ShapeNet
loaders and the part-decomposition view are to come.
"""

from .chamfer import (
    CHAMFER_BACKENDS,
    CHAMFER_CHUNK_BYTES,
    CHAMFER_DEFINITION,
    ChamferOutput,
    chamfer_definition,
    chamfer_distance,
)

__all__ = [
    "CHAMFER_BACKENDS",
    "CHAMFER_CHUNK_BYTES",
    "CHAMFER_DEFINITION",
    "ChamferOutput",
    "chamfer_definition",
    "chamfer_distance",
]
