"""Point clouds with part labels: ShapeNet Part in both released layouts, the embedded synthetic part shapes, and the
part-segmentation view of them that ShapeNet Part's protocol evaluates.

Every :class:`PartDataset` returns ``(points, parts)``: float32 ``(num_points, 3)`` centred at the centroid and scaled
to max norm 1 (unit sphere), and int64 ``(num_points,)`` part labels as the source stores them (``-1`` where it has
none). Shapes with a different number of stored points are resampled to exactly ``num_points`` (2048 by default)
with ``numpy.random.default_rng((seed, index))``: without replacement when the shape has enough points, else all
points plus random repeats. The choice depends on the seed and the index only, so every epoch sees the same cloud.

======================== ============================================================ =====================
class                    source                                                       stored part labels
======================== ============================================================ =====================
:class:`SyntheticParts`  generated from trimesh primitives (tables, chairs, ...)       global, see PART_NAMES
:class:`ShapeNetPart`    ``shapenetcore_partanno_segmentation_benchmark_v0``           per category, from 1
``layout="normal"``      ``shapenetcore_partanno_segmentation_benchmark_v0_normal``    global, 0..49
======================== ============================================================ =====================

Part segmentation (:class:`PartSegmentation`) needs one label space for all categories: ShapeNet Part's protocol
numbers the 50 parts of its 16 categories globally (:data:`SHAPENET_PART_CLASSES`: Airplane 0-3, Bag 4-5, ...,
Table 47-49, the numbering of the ``_normal`` release, which PointNet++, DGCNN, Point Transformer and PointNeXt
use), and the object category is an input. The ``v0`` release's per-category labels are mapped onto it
(``global = first part of the category + label - 1``), so both layouts give the same labels; the synthetic shapes'
labels are global already (one per ``(class, part name)`` pair).

Expected trees are in ``datasets/README.md`` and in the errors a missing or corrupt file raises.
"""

from __future__ import annotations

import json
import logging
import time
import warnings
from collections.abc import Callable, Sequence
from os import PathLike
from pathlib import Path
from typing import ClassVar

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from engine.data import locate

from .data import MAX_ABS_COORD, _check_scale
from .meshes import face_normals
from .synthetic import SHAPE_BUILDERS
from .transforms import EpochAugmented, augmentation_rng, normalize_unit_sphere

__all__ = [
    "PART_NAMES",
    "SHAPENET_PART_CLASSES",
    "SHAPENET_PART_NORMAL_TREE",
    "SHAPENET_PART_TREE",
    "PartDataset",
    "PartSegmentation",
    "ShapeNetPart",
    "SyntheticParts",
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

SHAPENET_PART_CLASSES: dict[str, tuple[int, ...]] = {
    "Airplane": (0, 1, 2, 3),
    "Bag": (4, 5),
    "Cap": (6, 7),
    "Car": (8, 9, 10, 11),
    "Chair": (12, 13, 14, 15),
    "Earphone": (16, 17, 18),
    "Guitar": (19, 20, 21),
    "Knife": (22, 23),
    "Lamp": (24, 25, 26, 27),
    "Laptop": (28, 29),
    "Motorbike": (30, 31, 32, 33, 34, 35),
    "Mug": (36, 37),
    "Pistol": (38, 39, 40),
    "Rocket": (41, 42, 43),
    "Skateboard": (44, 45, 46),
    "Table": (47, 48, 49),
}
"""ShapeNet Part's protocol: category -> its global part labels (50 parts in all, categories in name order)."""

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


_OUTLIER_FIX = (
    "one stray point this far out shrinks the rest of the shape to a dot when the cloud is scaled to the unit sphere: "
    "correct or remove the line, or set max_abs_coord: null to use the file as it is"
)


def _read_table(path: Path, columns: int, what: str) -> np.ndarray:
    """Every row of a whitespace-separated table: ``columns`` finite numbers (``what`` names them, e.g. ``'x y z'``);
    anything else is a one-line ValueError naming the file and the first bad line."""
    expected = f"{columns} whitespace-separated numbers ({what}) per line"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # "input contained no data": refused below, by name
            table = np.loadtxt(path, dtype=np.float64, ndmin=2)
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err})") from err
    except ValueError as err:
        raise ValueError(
            _bad_line(path, columns, expected) or f"{path}: cannot parse ({err}); expected {expected}"
        ) from err
    if table.size == 0:
        raise ValueError(f"{path}: holds no rows; expected {expected}")
    if table.shape[1] != columns:
        raise ValueError(f"{path}, line 1: found {table.shape[1]} numbers; expected {expected}")
    finite = np.isfinite(table).all(axis=1)
    if not finite.all():
        raise ValueError(f"{path}, line {int(np.flatnonzero(~finite)[0]) + 1}: NaN or Inf; expected {expected}")
    return table


def _bad_line(path: Path, columns: int, expected: str) -> str | None:
    """Where ``path`` first breaks the table format, as an error message (``None`` if no line does)."""
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            try:
                [float(v) for v in fields]
            except ValueError:
                return f"{path}, line {lineno}: not a number in {line.strip()[:80]!r}; expected {expected}"
            if len(fields) != columns:
                return f"{path}, line {lineno}: found {len(fields)} numbers; expected {expected}"
    return None


class PartDataset(Dataset):
    """Base class: resampling to ``num_points``, unit-sphere normalization, ``(points, parts)`` tensors.

    Subclasses fill ``self.names`` (one id per shape) and ``self.categories`` (category index per shape) and
    implement ``load(index) -> (points (n, 3), parts (n,))``; a source with normals returns ``(n, 6)`` points
    (x, y, z, nx, ny, nz) and sets ``has_normals``. Sources with part labels also say how they map onto one global
    label space (:attr:`part_classes`, :meth:`global_parts`), which :class:`PartSegmentation` needs.
    """

    has_normals: bool = False

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

    @property
    def part_classes(self) -> list[tuple[int, ...]]:
        """Category index -> the global part labels of that category."""
        raise NotImplementedError(f"{type(self).__name__} has no part labels to segment")

    @property
    def part_names(self) -> list[str]:
        """Global part label -> a readable name (``"<category> <part>"``)."""
        names: dict[int, str] = {}
        for category, labels in zip(self.category_names, self.part_classes):
            names.update({label: f"{category} part {j}" for j, label in enumerate(labels)})
        return [names.get(i, f"part {i}") for i in range(max(names, default=-1) + 1)]

    def global_parts(self, index: int, parts: np.ndarray) -> np.ndarray:
        """The stored labels of shape ``index`` in the global label space of :attr:`part_classes`."""
        return parts

    def sample(self, index: int, normals: bool = False) -> tuple[np.ndarray, np.ndarray]:
        """Shape ``index`` resampled to ``num_points`` and normalized: float32 ``(num_points, 3)`` points (``(.., 6)``
        with ``normals``: unit normals after x, y, z) and its stored int64 part labels."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} shapes")
        if normals and not self.has_normals:
            raise ValueError(f"{type(self).__name__} stores no normals; use a source with normals or drop them")
        index = index % len(self)
        points, parts = self.load(index)
        return self._resampled(index, points, parts, normals)

    def _resampled(
        self, index: int, points: np.ndarray, parts: np.ndarray, normals: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`sample` of the stored ``points`` and ``parts`` of shape ``index`` (already loaded)."""
        if len(points) != self.num_points:
            keep = resample(len(points), self.num_points, np.random.default_rng((self.seed, index)))
            points, parts = points[keep], parts[keep]
        xyz = normalize_unit_sphere(np.asarray(points[:, :3], dtype=np.float64))
        if normals:  # a translation and a uniform scale leave normals as they are
            xyz = np.concatenate([xyz, np.asarray(points[:, 3:6], dtype=np.float64)], axis=1)
        return xyz.astype(np.float32), np.asarray(parts, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.names)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        xyz, parts = self.sample(index)
        return torch.from_numpy(xyz), torch.from_numpy(parts)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(split={self.split!r}, shapes={len(self)}, num_points={self.num_points})"


class ShapeNetPart(PartDataset):
    """ShapeNet Part (Yi et al. 2016): 16 categories, 16,881 shapes, part labels per point; both released layouts.

    Args:
        root: Data root or the dataset folder itself.
        split: ``"train"``, ``"val"`` or ``"test"`` (the release's ``shuffled_*_file_list.json``), or ``"trainval"``
            (train, then val: what PointNet++, DGCNN and PointNeXt train on).
        num_points: Points per returned cloud (resampled, see the module docstring).
        layout: ``"v0"`` (``.pts`` + ``.seg``, labels 1-based per category) or ``"normal"`` (``.txt`` rows
            ``x y z nx ny nz part``, global labels 0..49).
        categories: Keep only these categories (names such as ``"Airplane"`` or synset ids); None keeps all.
        seed: Seed of the resampling.
        max_abs_coord: Refuse a file with a stored ``|x|``, ``|y|`` or ``|z|`` beyond this (the releases lie in the
            unit sphere; one stray point far out would shrink the rest of its shape to a dot when the cloud is scaled
            to the unit sphere); ``None``: no limit.

    :meth:`check_files` (which :func:`engine.run` calls before training) reads every row of every file and keeps each
    shape's sample, so a bad row fails before the first step and no file is parsed twice: about 0.9 GB for the
    16,881 shapes at 2,048 points with normals.
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
        max_abs_coord: float | None = MAX_ABS_COORD,
    ) -> None:
        super().__init__(split, num_points, seed, ("train", "val", "test", "trainval"))
        if layout not in self.FOLDERS:
            raise ValueError(f"layout must be one of {sorted(self.FOLDERS)}, got {layout!r}")
        self.layout, self.tree, self.max_abs_coord = layout, self.TREES[layout], max_abs_coord
        self._samples: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.has_normals = layout == "normal"
        lists = ("train", "val") if split == "trainval" else (split,)
        split_files = [f"train_test_split/shuffled_{s}_file_list.json" for s in lists]
        self.root = locate(
            root,
            self.FOLDERS[layout],
            ["synsetoffset2category.txt", *split_files],
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
        self.files: list[tuple[Path, ...]] = []
        for split_file in split_files:
            self._add_split(self.root / split_file, synsets, keep, order)
        _logger.info("ShapeNet Part (%s) %s: %d shapes from %s", layout, split, len(self), self.root)

    def _add_split(self, path: Path, synsets: dict[str, str], keep: set[str], order: list[str]) -> None:
        """The shapes of one ``shuffled_*_file_list.json`` (of the kept categories), with their files checked."""
        try:
            entries = json.loads(path.read_text())
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}: not valid JSON ({err}); expected a list of 'shape_data/<synset>/<id>'") from err
        for entry in entries:
            parts = str(entry).split("/")
            if len(parts) != 3 or parts[1] not in synsets:
                raise ValueError(f"{path}: bad entry {entry!r}; expected 'shape_data/<synset>/<id>' with a synset "
                                 f"of synsetoffset2category.txt")  # fmt: skip
            _, synset, shape_id = parts
            if synset not in keep:
                continue
            if self.layout == "v0":
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

    def check_files(self) -> None:
        """Reads every row of every file before training does, and keeps each shape's sample (see the class docstring).

        Every row must hold finite numbers in the layout's columns (``x y z`` and one label per ``.seg`` row for
        ``v0``, ``x y z nx ny nz part`` for ``normal``), with coordinates within ``max_abs_coord``; a ``.seg`` file
        one label per row of its ``.pts``; the labels integers among the category's parts (for the 16 categories of
        the protocol). The error names the file and the line.
        """
        start = time.perf_counter()
        protocol = all(c in SHAPENET_PART_CLASSES for c in self.category_names)
        for index in range(len(self)):
            if index in self._samples:
                continue
            stored, parts = self.load(index)
            if protocol:
                self.global_parts(index, parts)  # every stored label, not only the sampled ones
            points, parts = self._resampled(index, stored, parts, self.has_normals)
            small = parts.min() >= np.iinfo(np.int16).min and parts.max() <= np.iinfo(np.int16).max
            self._samples[index] = (points, parts.astype(np.int16) if small else parts)
        _logger.info("checked the %d files of %d shapes in %.1f s", sum(map(len, self.files)), len(self),
                     time.perf_counter() - start)  # fmt: skip

    def sample(self, index: int, normals: bool = False) -> tuple[np.ndarray, np.ndarray]:
        kept = self._samples.get(index % len(self)) if -len(self) <= index < len(self) else None
        if kept is None or (normals and not self.has_normals):
            return super().sample(index, normals)
        points, parts = kept
        return np.array(points if normals else points[:, :3]), parts.astype(np.int64)

    @property
    def part_classes(self) -> list[tuple[int, ...]]:
        """Category index -> global part labels, from :data:`SHAPENET_PART_CLASSES` (the protocol's numbering)."""
        unknown = [c for c in self.category_names if c not in SHAPENET_PART_CLASSES]
        if unknown:
            raise ValueError(
                f"{self.root / 'synsetoffset2category.txt'} names categories {unknown} outside ShapeNet Part's 16 "
                f"({sorted(SHAPENET_PART_CLASSES)}): their part labels have no place in the protocol's numbering"
            )
        return [SHAPENET_PART_CLASSES[c] for c in self.category_names]

    def global_parts(self, index: int, parts: np.ndarray) -> np.ndarray:
        """``v0``: per-category labels 1..k -> the category's global labels; ``normal``: stored global already."""
        labels = self.part_classes[self.categories[index]]
        if self.layout == "normal":
            bad = ~np.isin(parts, labels)
            first = labels[0]
        else:
            bad = (parts < 1) | (parts > len(labels))
            first = labels[0] - 1
        if bad.any():
            allowed = f"{labels[0]}..{labels[-1]}" if self.layout == "normal" else f"1..{len(labels)}"
            raise ValueError(
                f"{self.files[index][-1]}: part label {int(parts[bad][0])} outside {allowed}, the "
                f"{self.category_names[self.categories[index]]} parts of this layout"
            )
        return parts if self.layout == "normal" else parts + first

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        """The stored points and part labels of shape ``index``, every row checked (see :meth:`check_files`)."""
        if self.layout == "normal":
            (path,) = self.files[index]
            table = _read_table(path, 7, "x y z nx ny nz part")
            points, labels, label_file = table[:, :6], table[:, 6], path
        else:
            pts, label_file = self.files[index]
            points = _read_table(pts, 3, "x y z")
            labels = _read_table(label_file, 1, "the part label")[:, 0]
            if len(labels) != len(points):
                raise ValueError(f"{label_file}: {len(labels)} labels for the {len(points)} points of {pts}; expected "
                                 "one per point")  # fmt: skip
        fraction = labels != np.rint(labels)
        if fraction.any():
            row = int(np.flatnonzero(fraction)[0])
            raise ValueError(f"{label_file}, line {row + 1}: part label {labels[row]:g} is not an integer")
        _check_scale(points, self.files[index][0], self.max_abs_coord, first_line=1, fix=_OUTLIER_FIX)
        return points, labels.astype(np.int64)


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
    :data:`PART_NAMES` (a table's four legs share the label ``("table", "leg")``). Each point's face normal is kept.

    Args:
        split: ``"train"`` or ``"test"``.
        num_points: Points per cloud.
        classes: Classes of :data:`PART_NAMES`.
        samples_per_class: Shapes per class; default 40 for train, 8 for test.
        seed: Generation seed.
    """

    has_normals = True

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

    @property
    def part_classes(self) -> list[tuple[int, ...]]:
        return [tuple(i for i, (c, _) in enumerate(self.part_labels) if c == name) for name in self.category_names]

    @property
    def part_names(self) -> list[str]:
        return [f"{c} {part}" for c, part in self.part_labels]

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
        normals, _ = face_normals(np.asarray(mesh.vertices), np.asarray(mesh.faces))
        return np.concatenate([points, normals[face_index]], axis=1), np.concatenate(face_label)[face_index]

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self._cache[index]


class PartSegmentation(EpochAugmented, Dataset):
    """A :class:`PartDataset` as ShapeNet Part's segmentation task: ``(points, category, parts)`` per shape.

    ``points`` float32 ``(num_points, 3)`` (``(num_points, 6)`` with ``use_normals``), ``category`` an int64 scalar
    (the object category, an input of the protocol), ``parts`` int64 ``(num_points,)`` global part labels (the
    source's labels through :meth:`PartDataset.global_parts`). Augmentation is seeded per sample as in
    :mod:`pointcloud.data`: ``transform(cloud, augmentation_rng(seed, epoch, index))`` with the epoch of the last
    :meth:`set_epoch`. The transform sees the labels as one extra column after the point channels, so a transform
    that reorders or replaces points (``ShufflePoints``, ``RandomPointDropout``) keeps each label with its point.

    Args:
        parts: The source.
        use_normals: Feed x, y, z, nx, ny, nz instead of x, y, z (the source must store normals).
        transform: Called as ``transform(cloud, rng)`` (see :mod:`pointcloud.transforms`).
        seed: Augmentation seed.
    """

    def __init__(
        self, parts: PartDataset, use_normals: bool = False, transform: Callable | None = None, seed: int = 0
    ) -> None:
        if use_normals and not parts.has_normals:
            raise ValueError(
                f"use_normals needs a source with normals and {parts!r} has none: use the shapenet_part_normal layout "
                "or set use_normals to false"
            )
        self.parts, self.use_normals, self.transform, self.seed = parts, use_normals, transform, seed
        self.part_classes = [tuple(c) for c in parts.part_classes]
        self.num_categories = len(self.part_classes)
        self.num_parts = 1 + max((max(c) for c in self.part_classes if c), default=-1)
        self._init_epoch()

    @property
    def category_names(self) -> list[str]:
        return self.parts.category_names

    @property
    def names(self) -> list[str]:
        return self.parts.names

    @property
    def part_names(self) -> list[str]:
        return self.parts.part_names

    def check_files(self) -> None:
        check = getattr(self.parts, "check_files", None)
        if callable(check):
            check()

    def __len__(self) -> int:
        return len(self.parts)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor, Tensor]:
        points, labels = self.parts.sample(index, normals=self.use_normals)
        index = index % len(self)
        labels = self.parts.global_parts(index, labels)
        if self.transform is not None:
            cloud = np.concatenate([points, labels[:, None].astype(points.dtype)], axis=1)
            cloud = self.transform(cloud, augmentation_rng(self.seed, self.epoch, index))
            points, labels = cloud[:, :-1], np.rint(cloud[:, -1]).astype(np.int64)
        category = torch.tensor(self.parts.categories[index], dtype=torch.long)
        return torch.from_numpy(np.array(points, dtype=np.float32)), category, torch.from_numpy(labels)

    def __repr__(self) -> str:
        return f"PartSegmentation({self.parts!r}, use_normals={self.use_normals}, transform={self.transform!r})"
