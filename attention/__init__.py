"""The shared core of the centroid-attention toolkit.

* :mod:`attention.points`: farthest point sampling, k nearest neighbours, gather and interpolation, with a plain
  PyTorch reference and optional fast backends (torch-cluster, pytorch3d, Triton).
* :mod:`attention.centroid`: centroid attention (dense or over K nearest inputs, T steps), its inits and blocks.
"""

from ._checks import input_checks, set_input_checks
from .centroid import (
    CENTROID_INITS,
    CentroidAttention,
    CentroidBlock,
    CentroidOutput,
    DWConv2dInit,
    FPSInit,
    KMeansInit,
    LinearInit,
    MeanPoolInit,
    Mlp,
    RandomInit,
    SelfAttentionBlock,
    build_centroid_init,
    centroid_attention,
    edge_projection,
)
from .points import (
    FPS_BACKENDS,
    HAS_PYTORCH3D,
    HAS_TORCH_CLUSTER,
    HAS_TRITON,
    KNN_BACKENDS,
    farthest_point_sample,
    gather,
    interpolate,
    knn,
    lengths_to_mask,
    nearest_upsample,
)

__all__ = [
    "CENTROID_INITS",
    "FPS_BACKENDS",
    "HAS_PYTORCH3D",
    "HAS_TORCH_CLUSTER",
    "HAS_TRITON",
    "KNN_BACKENDS",
    "CentroidAttention",
    "CentroidBlock",
    "CentroidOutput",
    "DWConv2dInit",
    "FPSInit",
    "KMeansInit",
    "LinearInit",
    "MeanPoolInit",
    "Mlp",
    "RandomInit",
    "SelfAttentionBlock",
    "build_centroid_init",
    "centroid_attention",
    "edge_projection",
    "farthest_point_sample",
    "gather",
    "input_checks",
    "interpolate",
    "knn",
    "lengths_to_mask",
    "nearest_upsample",
    "set_input_checks",
]
