"""Point clouds for the capsule autoencoder: ShapeNet Part, ShapeNet Core13, the ModelNet releases, a plain folder of
clouds, embedded synthetic parts.

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
``modelnet40_normal``    the ModelNet releases, read by :mod:`pointcloud.data`         none (-1)
(and every other name    (:class:`PointCloudShapes`: ``modelnet40_h5``,
of its ``DATASETS``)     ``modelnet{40,10}_normal``, ``modelnet{40,10}_sampled``)
``cloud_folder``         any folder of clouds, one ``.npy`` / ``.txt`` / ``.ply`` file   none (-1)
                         per shape (:class:`CloudFolder`, :data:`CLOUD_FOLDER_TREE`)
======================== ============================================================ =====================

Part labels are kept as the files store them: part purity (:mod:`capsules.metrics`) only compares labels within a
shape; on data without labels the label-free patch spread measures the decomposition instead. Each dataset has an
``up_axis`` (``"z"`` for the synthetic shapes, ``"y"`` for the ShapeNet and ModelNet releases), which the viewer uses
unless the config sets one. Expected trees are in ``datasets/README.md`` and in the errors a missing or corrupt file
raises.
"""

from __future__ import annotations

import functools
import json
import logging
import time
from collections.abc import Callable, Sequence
from os import PathLike
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from engine.data import data_root, locate
from pointcloud.data import DATASETS as CLASSIFICATION_DATASETS
from pointcloud.data import build_dataset as build_classification_dataset
from pointcloud.synthetic import SHAPE_BUILDERS
from pointcloud.transforms import normalize_unit_sphere

__all__ = [
    "CLOUD_FOLDER_TREE",
    "CORE13_TREE",
    "DATASETS",
    "PART_NAMES",
    "SHAPENET_PART_NORMAL_TREE",
    "SHAPENET_PART_TREE",
    "CloudFolder",
    "PartDataset",
    "PointCloudShapes",
    "ShapeNetCore13",
    "ShapeNetPart",
    "SyntheticParts",
    "build_dataset",
    "resample",
]

_logger = logging.getLogger(__name__)

SHAPENET_PART_TREE = """\
<data root>/shapenetcore_partanno_segmentation_benchmark_v0/
  synsetoffset2category.txt       one '<Category>\\t<synset>' per line, e.g. 'Airplane\\t02691156'
  train_test_split/shuffled_train_file_list.json   JSON list of 'shape_data/<synset>/<id>'
  train_test_split/shuffled_val_file_list.json
  train_test_split/shuffled_test_file_list.json
  <synset>/points/<id>.pts        rows 'x y z'
  <synset>/points_label/<id>.seg  one part label per row of the .pts file (1-based within the category)"""

SHAPENET_PART_NORMAL_TREE = """\
<data root>/shapenetcore_partanno_segmentation_benchmark_v0_normal/
  synsetoffset2category.txt       one '<Category>\\t<synset>' per line, e.g. 'Airplane\\t02691156'
  train_test_split/shuffled_{train,val,test}_file_list.json   JSON lists of 'shape_data/<synset>/<id>'
  <synset>/<id>.txt               rows 'x y z nx ny nz part' (part: global label 0..49)"""

CORE13_TREE = """\
<data root>/shapenet_core13_points/
  train.txt                       '<synset>/<model id>' per line
  test.txt
  <synset>/<model id>.npy         float32 (n, 3) or (n, 6) x, y, z[, nx, ny, nz], n >= 1 (2048 or more advised)"""

# Part names of the synthetic classes, in the order their builders in pointcloud.synthetic return the parts.
PART_NAMES: dict[str, tuple[str, ...]] = {
    "table": ("top", "leg", "leg", "leg", "leg"),
    "chair": ("seat", "back", "leg", "leg", "leg", "leg"),
    "airplane": ("fuselage", "wing", "tail", "tail"),
    "lamp": ("base", "pole", "shade"),
    "mug": ("body", "body", "handle"),
    "l_shape": ("upright", "foot"),
    "cross": ("post", "bar"),
}
"""Synthetic class -> part name of each mesh its builder returns; a label is a (class, part name) pair."""


def resample(num_stored: int, num_points: int, rng: np.random.Generator) -> np.ndarray:
    """Indices of ``num_points`` of ``num_stored`` points: a random subset, or all plus random repeats."""
    if num_stored >= num_points:
        return np.sort(rng.choice(num_stored, num_points, replace=False))
    return np.concatenate([np.arange(num_stored), rng.integers(0, num_stored, num_points - num_stored)])


def _read_table(path: Path, columns: int, tree: str) -> np.ndarray:
    """Whitespace-separated float rows with exactly ``columns`` columns, else a ValueError naming the file."""
    try:
        table = np.loadtxt(path, dtype=np.float64, ndmin=2)
    except ValueError as err:
        raise ValueError(
            f"{path}: not a table of numbers ({err}); expected rows of {columns} columns:\n{tree}"
        ) from err
    if table.shape[0] == 0 or table.shape[1] != columns:
        raise ValueError(f"{path}: expected rows of {columns} numbers, got an array of shape {table.shape}:\n{tree}")
    if not np.isfinite(table).all():
        raise ValueError(f"{path}: contains NaN or Inf values")
    return table


def _check_first_row(path: Path, columns: int, tree: str) -> None:
    """A cheap check of a point table: not empty, and its first row holds ``columns`` numbers."""
    with open(path, "rb") as f:
        first = f.readline().decode("utf-8", errors="replace").split()
    try:
        [float(v) for v in first]
    except ValueError:
        first = []
    if len(first) != columns:
        raise ValueError(f"{path}, line 1: expected {columns} whitespace-separated numbers (an empty or corrupt file?):"
                         f"\n{tree}")  # fmt: skip


class PartDataset(Dataset):
    """Base class: resampling to ``num_points``, unit-sphere normalization, ``(points, parts)`` tensors.

    Subclasses fill ``self.names`` (one id per shape) and ``self.categories`` (category index per shape) and
    implement ``load(index) -> (xyz (n, 3), parts (n,))``.
    """

    up_axis: ClassVar[str] = "y"  # ShapeNet and ModelNet store their shapes y up

    def __init__(self, split: str, num_points: int, seed: int, splits: Sequence[str]) -> None:
        if split not in splits:
            raise ValueError(f"split must be one of {tuple(splits)}, got {split!r}")
        if num_points < 1:
            raise ValueError(f"num_points must be >= 1, got {num_points}")
        self.split, self.num_points, self.seed = split, num_points, seed
        self.names: list[str] = []
        self.categories: list[int] = []
        self.category_names: list[str] = []

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} shapes")
        index = index % len(self)
        xyz, parts = self.load(index)
        if len(xyz) != self.num_points:
            keep = resample(len(xyz), self.num_points, np.random.default_rng((self.seed, index)))
            xyz, parts = xyz[keep], parts[keep]
        xyz = normalize_unit_sphere(np.asarray(xyz, dtype=np.float64))
        return torch.from_numpy(xyz.astype(np.float32)), torch.from_numpy(np.asarray(parts, dtype=np.int64))

    def __repr__(self) -> str:
        return f"{type(self).__name__}(split={self.split!r}, shapes={len(self)}, num_points={self.num_points})"


class ShapeNetPart(PartDataset):
    """ShapeNet Part (Yi et al. 2016): 16 categories, 16,881 shapes, part labels per point; both released layouts.

    Args:
        root: Data root or the dataset folder itself.
        split: ``"train"``, ``"val"`` or ``"test"`` (the release's ``shuffled_*_file_list.json``).
        num_points: Points per returned cloud (resampled, see the module docstring).
        layout: ``"v0"`` (``.pts`` + ``.seg``, labels 1-based per category) or ``"normal"`` (``.txt`` rows
            ``x y z nx ny nz part``, global labels 0..49).
        categories: Keep only these categories (names such as ``"Airplane"`` or synset ids); None keeps all.
        seed: Seed of the resampling.
    """

    FOLDERS: ClassVar[dict[str, str]] = {
        "v0": "shapenetcore_partanno_segmentation_benchmark_v0",
        "normal": "shapenetcore_partanno_segmentation_benchmark_v0_normal",
    }
    TREES: ClassVar[dict[str, str]] = {"v0": SHAPENET_PART_TREE, "normal": SHAPENET_PART_NORMAL_TREE}

    def __init__(
        self,
        root: str | PathLike | None = None,
        split: str = "train",
        num_points: int = 2048,
        layout: str = "v0",
        categories: Sequence[str] | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(split, num_points, seed, ("train", "val", "test"))
        if layout not in self.FOLDERS:
            raise ValueError(f"layout must be one of {sorted(self.FOLDERS)}, got {layout!r}")
        self.layout, self.tree = layout, self.TREES[layout]
        split_file = f"train_test_split/shuffled_{split}_file_list.json"
        self.root = locate(
            root,
            self.FOLDERS[layout],
            ["synsetoffset2category.txt", split_file],
            f"ShapeNet Part ({layout})",
            self.tree,
        )
        synsets: dict[str, str] = {}
        for line in (self.root / "synsetoffset2category.txt").read_text().splitlines():
            fields = line.split()
            if not fields:
                continue
            if len(fields) != 2:
                raise ValueError(
                    f"{self.root / 'synsetoffset2category.txt'}: bad line {line!r}; expected:\n{self.tree}"
                )
            synsets[fields[1]] = fields[0]
        order = sorted(synsets, key=lambda s: synsets[s])
        keep = set(order)
        if categories is not None:
            wanted = set(categories)
            keep = {s for s in order if s in wanted or synsets[s] in wanted}
            if not keep:
                raise ValueError(
                    f"no category of {sorted(wanted)} in this release; choices: {sorted(synsets.values())}"
                )
        self.category_names = [synsets[s] for s in order]
        path = self.root / split_file
        try:
            entries = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err}); expected a list of 'shape_data/<synset>/<id>'") from err
        self.files: list[tuple[Path, ...]] = []
        for entry in entries:
            parts = str(entry).split("/")
            if len(parts) != 3 or parts[1] not in synsets:
                raise ValueError(f"{path}: bad entry {entry!r}; expected 'shape_data/<synset>/<id>' with a synset "
                                 f"of synsetoffset2category.txt")  # fmt: skip
            _, synset, shape_id = parts
            if synset not in keep:
                continue
            if layout == "v0":
                files = (self.root / synset / "points" / f"{shape_id}.pts",
                         self.root / synset / "points_label" / f"{shape_id}.seg")  # fmt: skip
            else:
                files = (self.root / synset / f"{shape_id}.txt",)
            for f in files:
                if not f.is_file():
                    raise FileNotFoundError(f"{f}: listed in {path} but missing. Expected tree:\n{self.tree}")
            self.files.append(files)
            self.names.append(f"{synset}/{shape_id}")
            self.categories.append(order.index(synset))
        _logger.info("ShapeNet Part (%s) %s: %d shapes from %s", layout, split, len(self), self.root)

    def check_files(self) -> None:
        """Checks every file cheaply before training reads it: not empty, a first row of the expected columns."""
        for files in self.files:
            for path, columns in zip(files, (7,) if self.layout == "normal" else (3, 1)):
                _check_first_row(path, columns, self.tree)

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        if self.layout == "normal":
            (path,) = self.files[index]
            table = _read_table(path, 7, self.tree)
            return table[:, :3], table[:, 6].astype(np.int64)
        pts, seg = self.files[index]
        xyz = _read_table(pts, 3, self.tree)
        labels = _read_table(seg, 1, self.tree)[:, 0].astype(np.int64)
        if len(labels) != len(xyz):
            raise ValueError(f"{seg}: {len(labels)} labels for the {len(xyz)} points of {pts}; expected one per point")
        return xyz, labels


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


def _synthetic_part_labels(classes: Sequence[str]) -> list[tuple[str, str]]:
    labels: list[tuple[str, str]] = []
    for c in classes:
        for name in PART_NAMES[c]:
            if (c, name) not in labels:
                labels.append((c, name))
    return labels


class SyntheticParts(PartDataset):
    """The embedded dataset: part-structured shapes from trimesh primitives, a ground-truth part label per point.

    Shape ``index`` of class ``c = index // samples_per_class`` (copy ``i``) is built by the class's builder in
    :mod:`pointcloud.synthetic` from ``numpy.random.default_rng((seed, split_id, c, i))`` (split_id 0 train, 1 test):
    the parts (a table's top and four legs, an airplane's fuselage, wings and tail, ...) are stretched by one random
    factor per axis in [0.8, 1.25], ``num_points`` points are drawn uniformly on the surface (area-weighted), each
    labelled with the part of its face, and Gaussian noise of 0.005 is added. Shapes are upright (z up) and not
    rotated, as ShapeNet's are aligned. Labels index :attr:`part_labels`, the (class, part name) pairs of
    :data:`PART_NAMES` (a table's four legs share the label ``("table", "leg")``).

    Args:
        split: ``"train"`` or ``"test"``.
        num_points: Points per cloud.
        classes: Classes of :data:`PART_NAMES`.
        samples_per_class: Shapes per class; default 40 for train, 8 for test.
        seed: Generation seed.
    """

    up_axis: ClassVar[str] = "z"

    def __init__(
        self,
        split: str = "train",
        num_points: int = 2048,
        classes: Sequence[str] = ("table", "chair", "airplane", "lamp", "mug"),
        samples_per_class: int | None = None,
        seed: int = 0,
    ) -> None:
        super().__init__(split, num_points, seed, ("train", "test"))
        unknown = [c for c in classes if c not in PART_NAMES]
        if unknown or not classes:
            raise ValueError(f"classes must be a non-empty subset of {sorted(PART_NAMES)}, got {list(classes)}")
        if samples_per_class is None:
            samples_per_class = 40 if split == "train" else 8
        if samples_per_class < 1:
            raise ValueError(f"samples_per_class must be >= 1, got {samples_per_class}")
        self.category_names, self.samples_per_class = list(classes), samples_per_class
        self.part_labels = _synthetic_part_labels(classes)
        self.names = [f"{c}_{i:04d}" for c in classes for i in range(samples_per_class)]
        self.categories = [k for k in range(len(classes)) for _ in range(samples_per_class)]
        start = time.perf_counter()
        self._cache = [self._generate(i) for i in range(len(self))]
        _logger.info("generated %d synthetic part shapes (%s) in %.1f s", len(self), split, time.perf_counter() - start)

    def _generate(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        import trimesh

        cls, copy = divmod(index, self.samples_per_class)
        name = self.category_names[cls]
        rng = np.random.default_rng((self.seed, ("train", "test").index(self.split), cls, copy))
        meshes = SHAPE_BUILDERS[name](rng)
        if len(meshes) != len(PART_NAMES[name]):
            raise RuntimeError(f"builder of {name!r} returned {len(meshes)} parts, PART_NAMES has {PART_NAMES[name]}")
        scale = rng.uniform(0.8, 1.25, size=3)
        vertices, faces, face_label, offset = [], [], [], 0
        for (v, f), part in zip(meshes, PART_NAMES[name], strict=True):
            vertices.append(v * scale)
            faces.append(f + offset)
            face_label.append(np.full(len(f), self.part_labels.index((name, part)), dtype=np.int64))
            offset += len(v)
        mesh = trimesh.Trimesh(np.concatenate(vertices), np.concatenate(faces), process=False, validate=False)
        points, face_index = trimesh.sample.sample_surface(mesh, self.num_points, seed=rng)
        points = np.asarray(points) + rng.normal(0.0, 0.005, size=(self.num_points, 3))
        return points, np.concatenate(face_label)[face_index]

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self._cache[index]


class PointCloudShapes(PartDataset):
    """A classification dataset of :mod:`pointcloud.data` (the ModelNet releases) as shapes for the autoencoder.

    The clouds are read by the classifier's loaders (one implementation of each release), as they read them: the first
    ``num_points`` stored points (see :mod:`pointcloud.data`). The class is the shape's category; there are no part
    labels (all ``-1``). Names are the release's shape ids (``table_0053``) where it has them, else
    ``<class>_<index>``.

    Args:
        dataset: A name of :data:`pointcloud.data.DATASETS` other than ``synthetic``, e.g. ``"modelnet40_normal"``.
        root: Data root or the release folder itself.
        split: ``"train"`` or ``"test"``.
        num_points: Points per cloud.
        seed: Seed of the resampling (not used by the releases, which hold enough points).
    """

    def __init__(
        self,
        dataset: str,
        root: str | PathLike | None = None,
        split: str = "train",
        num_points: int = 2048,
        seed: int = 0,
    ) -> None:
        super().__init__(split, num_points, seed, ("train", "test"))
        self.source = build_classification_dataset(dataset, split, root, num_points=num_points, seed=seed)
        labels = [int(label) for label in self.source.labels]
        self.category_names = list(self.source.classes)
        self.categories = labels
        ids = getattr(self.source, "ids", None)
        self.names = list(ids) if ids is not None else [f"{self.category_names[c]}_{i}" for i, c in enumerate(labels)]
        self.root = getattr(self.source, "root", None)

    def check_files(self) -> None:
        """The release loader's own checks of every file (:mod:`pointcloud.data`)."""
        check = getattr(self.source, "check_files", None)
        if callable(check):
            check()

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        xyz = np.asarray(self.source.load_points(index)[:, :3], dtype=np.float64)
        return xyz, np.full(len(xyz), -1, dtype=np.int64)


CLOUD_FOLDER_TREE = """\
<data root: the folder itself>/
  train/ ... <shape>.npy | .txt | .ply    one shape per file, at any depth; the first subfolder is its category
  test/  ...
or, with split files:
  <any files as above>
  train.txt, test.txt                    one path per line, relative to the folder (the extension may be left out)
.npy: float array (n, >= 3); .txt / .xyz / .pts: rows of >= 3 numbers (space or comma separated), x y z first;
.ply: a point cloud (its vertices) or a mesh (area-weighted surface samples)."""

CLOUD_SUFFIXES = (".npy", ".txt", ".xyz", ".pts", ".ply")


def _read_cloud(path: Path, num_points: int, seed: tuple[int, ...]) -> np.ndarray:
    """The ``(n, 3)`` float64 cloud stored in ``path`` (one of :data:`CLOUD_SUFFIXES`), checked finite and non-empty."""
    suffix = path.suffix.lower()
    try:
        if suffix == ".npy":
            array = np.load(path, allow_pickle=False)
        elif suffix == ".ply":
            import trimesh

            shape = trimesh.load(path, process=False)
            if isinstance(shape, trimesh.Trimesh) and len(shape.faces):
                array, _ = trimesh.sample.sample_surface(shape, num_points, seed=np.random.default_rng(seed))
            else:
                array = np.asarray(getattr(shape, "vertices", np.zeros((0, 3))))
        else:
            with open(path, encoding="utf-8", errors="replace") as f:
                comma = "," in f.readline()
            array = np.loadtxt(path, dtype=np.float64, delimiter="," if comma else None, ndmin=2)
    except (ValueError, OSError) as err:
        raise ValueError(f"{path}: not a readable point cloud ({err}). Expected:\n{CLOUD_FOLDER_TREE}") from err
    array = np.asarray(array, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] < 3 or len(array) == 0:
        raise ValueError(
            f"{path}: expected an (n, >= 3) cloud, got shape {array.shape}. Expected:\n{CLOUD_FOLDER_TREE}"
        )
    if not np.isfinite(array[:, :3]).all():
        raise ValueError(f"{path}: contains NaN or Inf coordinates")
    return array[:, :3]


class CloudFolder(PartDataset):
    """Any unlabelled point clouds: a folder with one file per shape (:data:`CLOUD_FOLDER_TREE`).

    The split is a subfolder (``train/``, ``test/``) or a split file (``train.txt``, ``test.txt``); a shape's category
    is its first subfolder below the split folder (or in its listed path), ``"all"`` if it has none. Clouds are
    resampled to ``num_points`` like every dataset here; meshes in ``.ply`` files are sampled on their surface. No part
    labels (all ``-1``): the autoencoder's label-free patch spread measures the decomposition.

    Args:
        root: The folder (default: the data root, ``$CENTROID_DATA`` or ``./datasets``).
        split: ``"train"`` or ``"test"``.
        num_points: Points per returned cloud.
        seed: Seed of the resampling and of the surface samples of meshes.
    """

    def __init__(
        self, root: str | PathLike | None = None, split: str = "train", num_points: int = 2048, seed: int = 0
    ) -> None:
        super().__init__(split, num_points, seed, ("train", "test"))
        self.root = data_root(root)
        listing, folder = self.root / f"{split}.txt", self.root / split
        if listing.is_file():
            self.files = [
                self._listed(listing, line.strip()) for line in listing.read_text().splitlines() if line.strip()
            ]
            base = self.root
        elif folder.is_dir():
            self.files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in CLOUD_SUFFIXES and p.is_file())
            base = folder
        else:
            raise FileNotFoundError(
                f"no {split} split in {self.root}: expected a folder {folder} or a file {listing}. Expected tree:\n"
                f"{CLOUD_FOLDER_TREE}"
            )
        if not self.files:
            raise ValueError(f"the {split} split of {self.root} holds no cloud ({', '.join(CLOUD_SUFFIXES)} files)")
        relative = [f.relative_to(base) for f in self.files]
        self.names = [r.with_suffix("").as_posix() for r in relative]
        category = [r.parts[0] if len(r.parts) > 1 else "all" for r in relative]
        self.category_names = sorted(set(category))
        self.categories = [self.category_names.index(c) for c in category]
        _logger.info("cloud folder %s: %d shapes in %s", split, len(self), self.root)

    def _listed(self, listing: Path, entry: str) -> Path:
        path = self.root / entry
        if path.is_file():
            return path
        found = [path.with_suffix(s) for s in CLOUD_SUFFIXES if path.with_suffix(s).is_file()]
        if not found:
            raise FileNotFoundError(f"{listing} lists {entry!r}, but no such cloud file exists under {self.root}")
        return found[0]

    def check_files(self) -> None:
        """Reads every cloud once before training: a file that cannot be read fails now, naming itself."""
        for index, path in enumerate(self.files):
            _read_cloud(path, self.num_points, (self.seed, index))

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        xyz = _read_cloud(self.files[index], self.num_points, (self.seed, index))
        return xyz, np.full(len(xyz), -1, dtype=np.int64)


DATASETS: dict[str, Callable[..., PartDataset]] = {
    "synthetic_parts": SyntheticParts,
    "shapenet_part": ShapeNetPart,
    "shapenet_part_normal": lambda **kw: ShapeNetPart(layout="normal", **kw),
    "shapenet_core13": ShapeNetCore13,
    **{name: functools.partial(PointCloudShapes, name) for name in CLASSIFICATION_DATASETS if name != "synthetic"},
    "cloud_folder": CloudFolder,
}
"""Dataset name -> constructor, for configs and CLIs (:func:`build_dataset`)."""


def build_dataset(name: str, split: str = "train", root: str | PathLike | None = None, **kwargs) -> PartDataset:
    """Build a dataset of :data:`DATASETS` by name (``root`` is ignored by ``synthetic_parts``)."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}")
    if name != "synthetic_parts":
        kwargs["root"] = root
    return DATASETS[name](split=split, **kwargs)
