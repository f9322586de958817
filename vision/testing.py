"""Helpers shared by the vision tests (like ``torch_geometric.testing``, a module of the package): a tiny DeiT run's
``--set`` values and a tiny ImageNet-layout folder of real image files. Nothing in the library imports this module.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["TINY_DEIT_SETS", "write_imagefolder"]

# A 32 px centroid DeiT (4 x 4 patches -> 2 x 2 centroids), 4 classes x 8 images, with the parts of DeiT's recipe that
# the main job leaves off (RandAugment, random erasing, mixup + cutmix, EMA): train_deit tests' --set values.
TINY_DEIT_SETS = (
    "img_size=32",
    "synthetic_image_size=32",
    "embed_dim=32",
    "depth=2",
    "num_heads=2",
    "centroid_index=1",
    "synthetic_classes=4",
    "synthetic_train_per_class=8",
    "synthetic_val_per_class=4",
    "batch_size=8",
    "eval_batch_size=16",
    "auto_augment=rand-m9-mstd0.5-inc1",
    "reprob=0.25",
    "mixup=0.8",
    "cutmix=1.0",
    "model_ema=true",
    "model_ema_decay=0.9",
    "warmup_epochs=1",
)


def write_imagefolder(
    root: Path, classes: tuple[str, ...] = ("n01", "n02", "n03"), train_per_class: int = 4, val_per_class: int = 2
) -> Path:
    """A tiny ImageNet-layout tree (``root/{train,val}/<class>/<image>``) of real 40 px image files, JPEG for even
    classes and PNG for odd ones; each class has its own colour, each image its own noise."""
    import numpy as np
    from PIL import Image

    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for c, name in enumerate(classes):
            folder = Path(root) / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                rng = np.random.default_rng([c, i, len(split)])
                colour = np.array([(c * 97) % 256, (c * 53 + 80) % 256, (c * 31 + 160) % 256], dtype=np.float64)
                pixels = np.clip(colour + rng.normal(0, 20, (40, 40, 3)), 0, 255).astype(np.uint8)
                ext = "JPEG" if c % 2 == 0 else "png"
                Image.fromarray(pixels).save(folder / f"{name}_{i}.{ext}")
    return Path(root)
