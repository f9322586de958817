"""The 3D point capsule autoencoder of the centroid-attention paper (section 3.3) and its Chamfer loss.

The autoencoder of *3D Point Capsule Networks* (Zhao et al., CVPR 2019) with its dynamic routing replaced by centroid
attention (primary capsules as inputs, latent capsules as centroids), trained with the Chamfer distance between the
input cloud and its reconstruction.

* :mod:`capsules.model`: :class:`PointCapsNet` (routing and centroid variants), the registry (``create_model``,
  ``list_models``): ``pointcaps_{routing,centroid}_{small,base}``.
* :mod:`capsules.chamfer`: :func:`chamfer_distance` and its pinned definition :data:`CHAMFER_DEFINITION`.
* :mod:`capsules.data`: ShapeNet Part (both released layouts), ShapeNet Core13 point files, embedded synthetic part
  shapes; ``(points, part labels)`` per shape.
* :mod:`capsules.metrics`: part purity of the latent capsules' patches.
* :mod:`capsules.recipe`: the training recipe behind ``tools/train_capsules.py``.
* :mod:`capsules.visualize`: Open3D part-decomposition views (``tools/visualize_capsules.py``).
"""

from .chamfer import (
    CHAMFER_BACKENDS,
    CHAMFER_DEFINITION,
    ChamferOutput,
    chamfer_definition,
    chamfer_distance,
)
from .model import MODELS, PointCapsNet, create_model, list_models, register_model

__all__ = [
    "CHAMFER_BACKENDS",
    "CHAMFER_DEFINITION",
    "MODELS",
    "ChamferOutput",
    "PointCapsNet",
    "chamfer_definition",
    "chamfer_distance",
    "create_model",
    "list_models",
    "register_model",
]
