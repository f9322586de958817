"""Part segmentation (ShapeNet Part) with the centroid transformer's encoder, a PointNet++ peer, the protocol's metric.

* :mod:`pointcloud.partseg.model`: :class:`CentroidPartSeg` and the part-segmentation registry (``create_model``,
  ``list_models``): ``centroid_transformer_partseg``, ``pointnet2_ssg_partseg``.
* :mod:`pointcloud.partseg.peers`: :class:`PointNet2PartSeg`, PointNet++ SSG from PyG's ``PointNetConv``.
* :mod:`pointcloud.partseg.metrics`: per-shape IoU over the category's parts, instance and class mIoU.
* :mod:`pointcloud.partseg.recipe`: the training recipe behind ``tools/train_partseg.py``.
* :mod:`pointcloud.partseg.visualize`: predicted parts beside the ground truth (``tools/visualize_partseg.py``).
* :mod:`pointcloud.partseg.bench`: params, GMACs and samples/s of both models (``tools/bench_partseg.py``).

The data (ShapeNet Part in both layouts, the embedded synthetic part shapes) is :mod:`pointcloud.parts`.
"""

from . import peers  # noqa: F401  (registers the PointNet++ peer)
from .metrics import PartSegMeter, shape_ious
from .model import MODELS, CentroidPartSeg, create_model, list_models, register_model
from .peers import PointNet2PartSeg

__all__ = [
    "MODELS",
    "CentroidPartSeg",
    "PartSegMeter",
    "PointNet2PartSeg",
    "create_model",
    "list_models",
    "register_model",
    "shape_ious",
]
