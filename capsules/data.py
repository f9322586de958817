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
``shapenet_core13``      ``shapenet_core13_points`` (sampled point files, datasets/README.md)  none (-1)
``modelnet40_normal``    the ModelNet releases, read by :mod:`pointcloud.data`         none (-1)
(and every other name    (:class:`PointCloudShapes`: ``modelnet40_h5``,
of its ``DATASETS``)     ``modelnet{40,10}_normal``, ``modelnet{40,10}_sampled``)
``cloud_folder``         any folder of clouds, one ``.npy`` / ``.txt`` / ``.ply`` file   none (-1)
                         per shape (:class:`CloudFolder`, :data:`CLOUD_FOLDER_TREE`)
======================== ============================================================ =====================

Part labels are kept as the files store them: part purity (:mod:`capsules.metrics`) only compares labels within a
shape; on data without labels the label-free patch spread measures the decomposition instead. Each dataset has an
``up_axis`` (``"z"`` for the synthetic shapes and the sampled ``.off`` meshes, ``"y"`` for the ShapeNet and ModelNet
releases: :data:`pointcloud.data.UP_AXES`), which the viewer uses unless the config sets one. Expected trees are in
``datasets/README.md`` and in the errors a missing or corrupt file raises. ShapeNet Part and the synthetic part shapes
are :mod:`pointcloud.parts`' (re-exported here), which part segmentation reads too.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable
from os import PathLike
from pathlib import Path

import numpy as np

from engine.data import data_root, locate
from pointcloud.data import DATASETS as CLASSIFICATION_DATASETS
from pointcloud.data import UP_AXES
from pointcloud.data import build_dataset as build_classification_dataset
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
            except (ValueError, OSError, EOFError) as err:
                raise ValueError(f"{path}: not a readable .npy array ({err}):\n{CORE13_TREE}") from err
            if array.ndim != 2 or array.shape[1] not in (3, 6) or len(array) == 0:
                raise ValueError(f"{path}: expected an (n, 3) or (n, 6) array, got shape {array.shape}:\n{CORE13_TREE}")

    def load(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        path = self.files[index]
        try:
            array = np.load(path, allow_pickle=False)
        except (ValueError, OSError, EOFError) as err:  # EOFError: a truncated .npy
            raise ValueError(f"{path}: not a readable .npy array ({err}):\n{CORE13_TREE}") from err
        if array.ndim != 2 or array.shape[1] not in (3, 6) or len(array) == 0:
            raise ValueError(f"{path}: expected an (n, 3) or (n, 6) array, got shape {array.shape}:\n{CORE13_TREE}")
        if not np.isfinite(array).all():
            raise ValueError(f"{path}: contains NaN or Inf values")
        return array[:, :3].astype(np.float64), np.full(len(array), -1, dtype=np.int64)


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
        self.up_axis = UP_AXES[dataset]  # y for the releases, z for the caches sampled from the .off meshes
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
  test/  ...                             (numbered from the train split's; one that train lacks is an error)
or, with split files:
  <any files as above>
  train.txt, test.txt                    one path per line, relative to the folder (the extension may be left out)
.npy: float array (n, >= 3); .txt / .xyz / .pts: rows of >= 3 numbers (space or comma separated), x y z first;
.ply: a point cloud (its vertices) or a mesh (area-weighted surface samples)."""

CLOUD_SUFFIXES = (".npy", ".txt", ".xyz", ".pts", ".ply")


# bytes per value of each PLY scalar type
_PLY_SIZES = {name: size for size, names in ((1, "char uchar int8 uint8"), (2, "short ushort int16 uint16"),
              (4, "int uint float int32 uint32 float32"), (8, "double float64")) for name in names.split()}  # fmt: skip


def _ply_problem(path: Path) -> str | None:
    """Why the body of the PLY file ``path`` does not hold what its header declares, or ``None``.

    An ASCII body must hold one non-empty line per declared element (vertices, faces, ...); a binary body at least the
    bytes the header's elements need (a list property counted as its length field alone). A header that claims 450 M
    vertices over 50 rows is otherwise read as the 50 rows, silently.
    """
    elements: list[list] = []  # [name, count, the least bytes of one row]
    fmt = ""
    with open(path, "rb") as f:
        if f.readline().strip() != b"ply":
            return None  # not a PLY header: the reader says what it found
        while True:
            raw = f.readline()
            if not raw:
                return f"{path}: the PLY header has no end_header line"
            words = raw.decode("ascii", errors="replace").split()
            if words[:1] == ["format"] and len(words) > 1:
                fmt = words[1]
            elif words[:1] == ["element"]:
                if len(words) != 3 or not words[2].isdigit():
                    return f"{path}: bad PLY header line {raw.strip()[:80]!r}; expected 'element <name> <count>'"
                elements.append([words[1], int(words[2]), 0])
            elif words[:1] == ["property"] and elements and len(words) > 2:
                elements[-1][2] += _PLY_SIZES.get(words[2] if words[1] == "list" else words[1], 0)
            elif words[:1] == ["end_header"]:
                break
        declared = sum(count for _, count, _ in elements)
        counts = ", ".join(f"{count} {name}" for name, count, _ in elements)
        if fmt == "ascii":
            rows = sum(1 for line in f if line.strip())
            if rows != declared:
                return f"{path}: the PLY header declares {declared} rows ({counts}) but the file holds {rows}"
            return None
        body = path.stat().st_size - f.tell()
    need = sum(count * row for _, count, row in elements)
    if need > body:
        return (
            f"{path}: the PLY header declares {counts} ({need} bytes at least) but the file holds {body} bytes of data"
        )
    return None


def _read_cloud(path: Path, num_points: int, seed: tuple[int, ...]) -> np.ndarray:
    """The ``(n, 3)`` float64 cloud stored in ``path`` (one of :data:`CLOUD_SUFFIXES`), checked finite and non-empty;
    an empty file or a PLY whose body does not match its header is refused by name."""
    suffix = path.suffix.lower()
    if path.stat().st_size == 0:
        raise ValueError(f"{path}: the file is empty (0 bytes); expected a point cloud ({', '.join(CLOUD_SUFFIXES)})")
    problem = _ply_problem(path) if suffix == ".ply" else None
    if problem is not None:
        raise ValueError(problem)
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
    except (ValueError, OSError, EOFError) as err:  # EOFError: a truncated .npy
        raise ValueError(f"{path}: not a readable point cloud ({err}). Expected:\n{CLOUD_FOLDER_TREE}") from err
    array = np.asarray(array, dtype=np.float64)
    if array.ndim != 2 or array.shape[1] < 3 or len(array) == 0:
        raise ValueError(
            f"{path}: expected an (n, >= 3) cloud, got shape {array.shape}. Expected:\n{CLOUD_FOLDER_TREE}"
        )
    if not np.isfinite(array[:, :3]).all():
        raise ValueError(f"{path}: contains NaN or Inf coordinates")
    return array[:, :3]


def _category(relative: Path) -> str:
    """A cloud folder shape's category: its first folder (``chair/a.npy``: ``chair``), ``"all"`` when it has none."""
    return relative.parts[0] if len(relative.parts) > 1 else "all"


class CloudFolder(PartDataset):
    """Any unlabelled point clouds: a folder with one file per shape (:data:`CLOUD_FOLDER_TREE`).

    The split is a subfolder (``train/``, ``test/``) or a split file (``train.txt``, ``test.txt``); a shape's category
    is its first subfolder below the split folder (or in its listed path), ``"all"`` if it has none. The categories are
    numbered once, from the train split (sorted by name), so a category has the same index in both splits; a test
    shape whose category the train split lacks is refused, naming it. Clouds are resampled to ``num_points`` like every
    dataset here; meshes in ``.ply`` files are sampled on their surface. No part labels (all ``-1``): the
    autoencoder's label-free patch spread measures the decomposition.

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
        self.files, relative = self._split(split)
        self.names = [r.with_suffix("").as_posix() for r in relative]
        category = [_category(r) for r in relative]
        train_category = category if split == "train" else [_category(r) for r in self._split("train")[1]]
        self.category_names = sorted(set(train_category))
        unknown = sorted(set(category) - set(self.category_names))
        if unknown:
            first = {c: self.names[category.index(c)] for c in unknown}
            raise ValueError(
                f"the {split} split of {self.root} has categories the train split lacks: "
                + ", ".join(f"{c!r} (e.g. {first[c]!r})" for c in unknown)
                + f"; the train split's categories are {self.category_names}. Categories are numbered from the train "
                "split, so that one index means one category in both: add train shapes of these categories, or move "
                "the test shapes into a category the train split has"
            )
        self.categories = [self.category_names.index(c) for c in category]
        _logger.info("cloud folder %s: %d shapes in %s", split, len(self), self.root)

    def _split(self, split: str) -> tuple[list[Path], list[Path]]:
        """The cloud files of ``split``, and each one's path relative to the split folder (or to the root, for a listed
        file)."""
        listing, folder = self.root / f"{split}.txt", self.root / split
        if listing.is_file():
            files = [self._listed(listing, line.strip()) for line in listing.read_text().splitlines() if line.strip()]
            base = self.root
        elif folder.is_dir():
            files = sorted(p for p in folder.rglob("*") if p.suffix.lower() in CLOUD_SUFFIXES and p.is_file())
            base = folder
        else:
            raise FileNotFoundError(
                f"no {split} split in {self.root}: expected a folder {folder} or a file {listing}. Expected tree:\n"
                f"{CLOUD_FOLDER_TREE}"
            )
        if not files:
            raise ValueError(f"the {split} split of {self.root} holds no cloud ({', '.join(CLOUD_SUFFIXES)} files)")
        return files, [f.relative_to(base) for f in files]

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
