"""placeholder"""

from .data import (
    DATASETS,
    ModelNet40H5,
    ModelNet40Normal,
    ModelNet40Sampled,
    PointCloudDataset,
    SyntheticShapes,
    build_dataset,
)
from .transforms import augmentation_rng, vote_logits

__all__ = [
    "DATASETS",
    "ModelNet40H5",
    "ModelNet40Normal",
    "ModelNet40Sampled",
    "PointCloudDataset",
    "SyntheticShapes",
    "augmentation_rng",
    "build_dataset",
    "vote_logits",
]
