"""Point clouds with part labels for the capsule autoencoder: ShapeNet Part, ShapeNet Core13, embedded synthetic parts.

Every dataset returns ``(points, parts)``: float32 ``(num_points, 3)`` centred at the centroid and scaled to max norm 1
(unit sphere), and int64 ``(num_points,)`` part labels (``-1`` where the source has none, e.g. Core13). Shapes with a
different number of stored points are resampled to exactly ``num_points`` (2048 by default) with
``numpy.random.default_rng((seed, index))``: without replacement when the shape has enough points, else all points
plus random repeats. The choice depends on the seed and the index only, so every epoch sees the same cloud.

======================== ============================================================ =====================
name (:data:`DATASETS`)  source                                                       part labels
======================== ============================================================ =====================
``synthetic_parts``      generated from trimesh primitives (tables, chairs, ...)       global, see PART_NAMES
``shapenet_part``        ``shapenetcore_partanno_segmentation_benchmark_v0``           per category, from 1
``shapenet_part_normal`` ``shapenetcore_partanno_segmentation_benchmark_v0_normal``    global, 0..49
``shapenet_core13``      ``shapenet_core13_points`` (sampled point files, see README)  none (-1)
======================== ============================================================ =====================

Part labels are kept as the files store them: part purity (:mod:`capsules.metrics`) only compares labels within a
shape. Expected trees are in ``datasets/README.md`` and in the errors a missing or corrupt file raises. ShapeNet Part
and the synthetic part shapes are :mod:`pointcloud.parts`' (re-exported here), which part segmentation reads too.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from os import PathLike

import numpy as np

from engine.data import locate
from pointcloud.parts import (
    PART_NAMES,
    SHAPENET_PART_NORMAL_TREE,
    SHAPENET_PART_TREE,
    PartDataset,
    ShapeNetPart,
    SyntheticParts,
    resample,
)

__all__ = [
    "CORE13_TREE",
    "DATASETS",
    "PART_NAMES",
    "SHAPENET_PART_NORMAL_TREE",
    "SHAPENET_PART_TREE",
    "PartDataset",
    "ShapeNetCore13",
    "ShapeNetPart",
    "SyntheticParts",
    "build_dataset",
    "resample",
]

_logger = logging.getLogger(__name__)

CORE13_TREE = """\
<data root>/shapenet_core13_points/
  train.txt                       '<synset>/<model id>' per line
  test.txt
  <synset>/<model id>.npy         float32 (n, 3) or (n, 6) x, y, z[, nx, ny, nz], n >= 1 (2048 or more advised)"""


class ShapeNetCore13(PartDataset):
    """ShapeNet Core, 13 categories (AtlasNet's subset, the paper's 64-capsule row), as sampled point files.

    The tree (:data:`CORE13_TREE`) is ours, because the point clouds the reference code used are no longer online;
    ``datasets/README.md`` says how to produce it from ShapeNetCore meshes. No part labels (all ``-1``).

    Args:
        root: Data root or the dataset folder itself.
        split: ``"train"`` or ``"test"``.
        num_points: Points per returned cloud (resampled).
        seed: Seed of the resampling.
    """

    FOLDER = "shapenet_core13_points"

    def __init__(
        self, root: str | PathLike | None = None, split: str = "train", num_points: int = 2048, seed: int = 0
    ) -> None:
        super().__init__(split, num_points, seed, ("train", "test"))
        self.root = locate(root, self.FOLDER, [f"{split}.txt"], "ShapeNet Core13 points", CORE13_TREE)
        path = self.root / f"{split}.txt"
        entries = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        for entry in entries:
            if len(entry.split("/")) != 2:
                raise ValueError(f"{path}: bad line {entry!r}; expected '<synset>/<model id>':\n{CORE13_TREE}")
        self.category_names = sorted({e.split("/")[0] for e in entries})
        self.files = [self.root / f"{e}.npy" for e in entries]
        for f in self.files:
            if not f.is_file():
                raise FileNotFoundError(f"{f}: listed in {path} but missing. Expected tree:\n{CORE13_TREE}")
        self.names = entries
        self.categories = [self.category_names.index(e.split("/")[0]) for e in entries]
        _logger.info("ShapeNet Core13 %s: %d shapes from %s", split, len(self), self.root)

    def check_files(self) -> None:
        """Checks every file's .npy header (shape and dtype, without reading the data) before training."""
        for path in self.files:
            try:
                array = np.load(path, mmap_mode="r", allow_pickle=False)
            except (ValueError, OSError) as err:
                raise ValueError(f"{path}: not a readable .npy array ({err}):\n{CORE13_TREE}") from err
            if array.ndim != 2 or array.shape[1] not in (3, 6) or len(array) == 0:
                raise ValueError(f"{path}: expected an (n, 3) or (n, 6) array, got shape {array.shape}:\n{CORE13_TREE}")

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        path = self.files[index]
        try:
            array = np.load(path, allow_pickle=False)
        except (ValueError, OSError) as err:
            raise ValueError(f"{path}: not a readable .npy array ({err}):\n{CORE13_TREE}") from err
        if array.ndim != 2 or array.shape[1] not in (3, 6) or len(array) == 0:
            raise ValueError(f"{path}: expected an (n, 3) or (n, 6) array, got shape {array.shape}:\n{CORE13_TREE}")
        if not np.isfinite(array).all():
            raise ValueError(f"{path}: contains NaN or Inf values")
        return array[:, :3].astype(np.float64), np.full(len(array), -1, dtype=np.int64)


DATASETS: dict[str, Callable[..., PartDataset]] = {
    "synthetic_parts": SyntheticParts,
    "shapenet_part": ShapeNetPart,
    "shapenet_part_normal": lambda **kw: ShapeNetPart(layout="normal", **kw),
    "shapenet_core13": ShapeNetCore13,
}
"""Dataset name -> constructor, for configs and CLIs (:func:`build_dataset`)."""


def build_dataset(name: str, split: str = "train", root: str | PathLike | None = None, **kwargs) -> PartDataset:
    """Build a dataset of :data:`DATASETS` by name (``root`` is ignored by ``synthetic_parts``)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}")
    if name != "synthetic_parts":
        kwargs["root"] = root
    return DATASETS[name](split=split, **kwargs)
