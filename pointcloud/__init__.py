"""Point-cloud classification with centroid attention: the ModelNet40 centroid transformer, datasets, transforms.

* :mod:`pointcloud.model`: :class:`CentroidTransformer`, the registry (``create_model``, ``list_models``).
* :mod:`pointcloud.peers`: DGCNN and PointNet++ (SSG) peers from PyG's message-passing layers, registered too.
* :mod:`pointcloud.data`: ModelNet40 / ModelNet10 in their real layouts and the embedded synthetic shapes.
* :mod:`pointcloud.transforms`: augmentations (deterministic per seed, epoch, index) and test-time voting.
* :mod:`pointcloud.recipe`: the training recipe behind ``tools/train_modelnet.py``.
* :mod:`pointcloud.parts`: ShapeNet Part (both layouts) and the embedded synthetic part shapes, with part labels.
* :mod:`pointcloud.partseg`: part segmentation: the centroid model on the same encoder, a PointNet++ peer, the
  ShapeNet Part metric and recipe (``tools/train_partseg.py``); its own registry, ``pointcloud.partseg.list_models()``.
"""

from . import partseg, peers  # noqa: F401  (register the peer and part-segmentation models)
from .data import (
    DATASETS,
    UP_AXES,
    ModelNet40H5,
    ModelNet40Normal,
    ModelNet40Sampled,
    PointCloudDataset,
    SyntheticShapes,
    build_dataset,
)
from .model import CentroidTransformer, create_model, list_models, register_model
from .transforms import augmentation_rng, vote_logits

__all__ = [
    "DATASETS",
    "UP_AXES",
    "CentroidTransformer",
    "ModelNet40H5",
    "ModelNet40Normal",
    "ModelNet40Sampled",
    "PointCloudDataset",
    "SyntheticShapes",
    "augmentation_rng",
    "build_dataset",
    "create_model",
    "list_models",
    "register_model",
    "vote_logits",
]
