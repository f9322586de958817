"""Point-cloud classification datasets: ModelNet40 / ModelNet10 in their common release layouts, and an embedded
procedural dataset that needs no download.

=======================  ==========================================================================================
name (:data:`DATASETS`)  what it reads
=======================  ==========================================================================================
``synthetic``            :class:`SyntheticShapes`, generated on the fly from trimesh primitives (the default)
``modelnet40_h5``        :class:`ModelNet40H5`, PointNet's ``modelnet40_ply_hdf5_2048`` (2,048 points, xyz only)
``modelnet40_normal``    :class:`ModelNet40Normal`, PointNet++'s ``modelnet40_normal_resampled`` (10,000 points with
                         normals per shape, one text file each)
``modelnet10_normal``    the same release restricted to ModelNet10 (``modelnet10_*.txt`` split files)
``modelnet40_sampled``   :class:`ModelNet40Sampled`, the cache ``datasets/prepare_modelnet40.py`` writes from the raw
                         ``.off`` meshes (area-weighted uniform surface samples with face normals)
``modelnet10_sampled``   the same for ModelNet10
=======================  ==========================================================================================

Every dataset returns ``(points, label)``: ``points`` float32 ``(num_points, 3)`` (or ``(num_points, 6)`` with
normals ``x, y, z, nx, ny, nz``), ``label`` an int64 scalar tensor; and exposes ``classes`` (names in label order)
and ``num_classes``; the axis each name's shapes stand on is in :data:`UP_AXES`. Subsets take the *first*
``num_points`` points of each stored cloud, as PointNet, PointNet++ (without ``--use_uniform_sample``) and DGCNN do:
the HDF5 and sampled releases store i.i.d. uniform samples, so any prefix is a uniform sample too; the
normal-resampled release is also used this way by most code.

Scale: the models and augmentations assume clouds in about the unit sphere, as every release here stores them.
The ModelNet datasets refuse a cloud with a coordinate beyond ``max_abs_coord`` (default :data:`MAX_ABS_COORD`;
a cloud in millimetres, say) with an error that names the file and the fix: centre and scale each cloud with
:class:`~pointcloud.transforms.NormalizeUnitSphere` (PointNet++'s ``pc_normalize``; the ModelNet recipe's
``normalize: true``), or pass ``max_abs_coord=None`` to keep the clouds as they are.

Data root (:mod:`engine.data`): the ``root`` argument, else the environment variable ``CENTROID_DATA``, else
``./datasets``. ``root`` may be the data root (the dataset is looked up in its release folder name under it) or the
dataset folder itself. ``datasets/README.md`` shows each expected tree.

Augmentation determinism: a dataset built with ``transform=...`` and ``seed=s`` calls
``transform(points, augmentation_rng(s, epoch, index))`` for sample ``index``, where ``epoch`` is what the last
``dataset.set_epoch(epoch)`` set (0 by default). Augmentation is thereby a function of ``(seed, epoch, index)``
only, independent of worker count, worker order and global random state, so a resumed run replays it exactly.
The epoch lives in a shared-memory tensor, so ``set_epoch`` reaches DataLoader workers whether or not they are
persistent, provided it is called *before* the epoch's ``iter(loader)``.
"""

from __future__ import annotations

import functools
import inspect
import json
import logging
import operator
import os
import time
from collections.abc import Callable, Sequence
from os import PathLike
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from engine.data import locate

from .synthetic import SHAPE_CLASSES, generate_shape
from .transforms import EpochAugmented, augmentation_rng

__all__ = [
    "DATASETS",
    "MAX_ABS_COORD",
    "UP_AXES",
    "ModelNet40H5",
    "ModelNet40Normal",
    "ModelNet40Sampled",
    "PointCloudDataset",
    "SyntheticShapes",
    "build_dataset",
    "save_sampled_split",
]

_logger = logging.getLogger(__name__)

_SPLITS = ("train", "test")

MAX_ABS_COORD = 10.0
"""Default limit on ``|x|``, ``|y|``, ``|z|`` of a stored cloud: ten times the unit sphere the models assume."""

H5_TREE = """\
<data root>/modelnet40_ply_hdf5_2048/
  shape_names.txt                 40 class names, one per line (label = line index)
  train_files.txt                 one h5 path per line, e.g. data/modelnet40_ply_hdf5_2048/ply_data_train0.h5
  test_files.txt                  (only the file name is used: it is looked up in this folder)
  ply_data_train0.h5 ... ply_data_train4.h5
  ply_data_test0.h5, ply_data_test1.h5
                                  datasets 'data' float32 (n, 2048, 3) and 'label' uint8 (n, 1)"""

NORMAL_TREE = """\
<data root>/modelnet40_normal_resampled/
  modelnet40_shape_names.txt      40 class names, one per line (label = line index)
  modelnet40_train.txt            shape ids, one per line, e.g. airplane_0001, night_stand_0001
  modelnet40_test.txt
  modelnet10_shape_names.txt      (ModelNet10 only) 10 class names
  modelnet10_train.txt            (ModelNet10 only)
  modelnet10_test.txt             (ModelNet10 only)
  <class>/<class>_<NNNN>.txt      rows 'x,y,z,nx,ny,nz' (10,000 per file in the release)"""

SAMPLED_TREE = """\
<data root>/{folder}/       written by `python datasets/prepare_modelnet40.py{flag}`
  shape_names.txt                 class names, one per line (label = line index)
  train.npz                       'points' float32 (n, P, 6) x,y,z,nx,ny,nz; 'labels' int64 (n,); 'ids' str (n,)
  test.npz
  meta.json                       num_points, seed, source folder, format version"""


def _check_split(split: str) -> None:
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {_SPLITS}, got {split!r}")


def _read_names(path: Path, count: int | None = None) -> list[str]:
    """The unique names in ``path``, one per line (exactly ``count`` of them, if given)."""
    names = [line.strip() for line in path.read_text().splitlines() if line.strip()]
    if not names:
        raise ValueError(f"{path}: expected one name per line, found none")
    if len(set(names)) != len(names):
        raise ValueError(f"{path}: names must be unique, found duplicates")
    if count is not None and len(names) != count:
        raise ValueError(f"{path}: expected {count} class names, found {len(names)}")
    return names


def _check_modelnet_classes(num_classes: int) -> None:
    if num_classes not in (10, 40):
        raise ValueError(f"num_classes must be 40 (ModelNet40) or 10 (ModelNet10), got {num_classes}")


def _check_finite(array: np.ndarray, path: Path | str, first_line: int | None = None) -> None:
    if not np.isfinite(array).all():
        bad = int(np.flatnonzero(~np.isfinite(array).reshape(len(array), -1).all(axis=1))[0])
        where = f", line {first_line + bad}" if first_line is not None else f", sample {bad}"
        raise ValueError(f"{path}{where}: contains NaN or Inf values; expected finite coordinates")


_SCALE_FIX = (
    "normalize the clouds (config normalize: true, or the NormalizeUnitSphere transform), or set max_abs_coord: null "
    "to use them as they are"
)


def _check_scale(
    xyz: np.ndarray, path: Path | str, limit: float | None, first_line: int | None = None, fix: str = _SCALE_FIX
) -> None:
    """Refuses coordinates beyond ``limit`` in ``xyz`` (``(N, C)`` rows of one file, or ``(n, N, C)`` samples); the
    message ends with ``fix``."""
    if limit is None or xyz.size == 0:
        return
    peak = np.abs(xyz[..., :3]).reshape(len(xyz), -1).max(axis=1)
    if not peak.max() > limit:
        return
    bad = int(np.flatnonzero(peak > limit)[0])
    coords = xyz[bad][..., :3].reshape(-1)
    value = float(coords[np.abs(coords).argmax()])
    where = f", line {first_line + bad}" if first_line is not None else f", sample {bad}"
    raise ValueError(
        f"{path}{where}: coordinate {value:.4g} is far outside the unit scale the models assume "
        f"(|x|, |y|, |z| <= max_abs_coord={limit:g}): {fix}"
    )


class PointCloudDataset(EpochAugmented, Dataset):
    """Base class: labels, class names, the ``num_points`` prefix, and per-sample seeded augmentation.

    Subclasses fill ``self.labels`` and implement ``load_points(index)`` returning a NumPy ``(num_points, C)`` array.

    Args:
        classes: Class names in label order.
        num_points: Points per returned cloud.
        transform: Called as ``transform(points, rng)`` on the NumPy cloud (see :mod:`pointcloud.transforms`).
        seed: Augmentation seed; the transform of sample ``index`` gets ``augmentation_rng(seed, epoch, index)``.
    """

    def __init__(
        self,
        classes: Sequence[str],
        num_points: int,
        transform: Callable | None = None,
        seed: int = 0,
    ) -> None:
        if num_points < 1:
            raise ValueError(f"num_points must be >= 1, got {num_points}")
        if seed < 0:
            raise ValueError(f"seed must be non-negative, got {seed}")
        self.classes = list(classes)
        self.num_points = num_points
        self.transform = transform
        self.seed = seed
        self.labels = np.zeros(0, dtype=np.int64)
        self._init_epoch()

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def load_points(self, index: int) -> np.ndarray:
        """The stored cloud of sample ``index`` as float32 ``(num_points, C)``, before augmentation."""
        raise NotImplementedError

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        index = operator.index(index)
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for a dataset of {len(self)} samples")
        points = self.load_points(index)
        if self.transform is not None:
            points = self.transform(points, augmentation_rng(self.seed, self.epoch, index))
        points = torch.from_numpy(np.array(points, dtype=np.float32))  # a copy: callers may edit it in place
        return points, torch.tensor(int(self.labels[index]), dtype=torch.long)

    def extra_repr(self) -> str:
        return ""

    def __repr__(self) -> str:
        head = f"{type(self).__name__}(samples={len(self)}, classes={self.num_classes}, num_points={self.num_points}"
        extra = self.extra_repr()
        return head + (f", {extra}" if extra else "") + f", transform={self.transform!r})"


class ModelNet40H5(PointCloudDataset):
    """PointNet's HDF5 release ``modelnet40_ply_hdf5_2048`` (9,840 train / 2,468 test clouds of 2,048 points, y up).

    Everything is loaded into memory at construction (about 120 MB at 1,024 points).

    Args:
        root: Data root or the ``modelnet40_ply_hdf5_2048`` folder itself (see :func:`engine.data.data_root`).
        split: ``"train"`` or ``"test"``.
        num_points: Points per cloud (the first ``num_points`` of the stored 2,048).
        transform: Augmentation ``transform(points, rng)``.
        num_classes: Expected number of classes; must match ``shape_names.txt``.
        seed: Augmentation seed.
        use_normals: Must be False: this release stores xyz only (accepted so that every ModelNet dataset takes
            the same arguments).
        max_abs_coord: Refuse clouds with a coordinate beyond this (see the module docstring); ``None``: no limit.
    """

    FOLDER = "modelnet40_ply_hdf5_2048"

    def __init__(
        self,
        root: str | PathLike | None = None,
        split: str = "train",
        num_points: int = 1024,
        transform: Callable | None = None,
        num_classes: int = 40,
        seed: int = 0,
        use_normals: bool = False,
        max_abs_coord: float | None = MAX_ABS_COORD,
    ) -> None:
        if use_normals:
            raise ValueError(
                "modelnet40_ply_hdf5_2048 stores xyz only: use_normals=True needs modelnet40_normal_resampled "
                "(dataset modelnet40_normal) or meshes prepared with datasets/prepare_modelnet40.py"
            )
        _check_split(split)
        self.root = locate(root, self.FOLDER, ["shape_names.txt", f"{split}_files.txt"], "ModelNet40 HDF5", H5_TREE)
        classes = _read_names(self.root / "shape_names.txt", num_classes)
        super().__init__(classes, num_points, transform, seed)
        self.split, self.max_abs_coord = split, max_abs_coord
        list_file = self.root / f"{split}_files.txt"
        entries = [line.strip() for line in list_file.read_text().splitlines() if line.strip()]
        if not entries:
            raise ValueError(f"{list_file}: expected one h5 file per line, found none")
        points, labels = [], []
        for entry in entries:
            path = self.root / Path(entry.replace("\\", "/")).name  # release lists "data/modelnet40_ply_hdf5_2048/..."
            if not path.is_file():
                raise FileNotFoundError(
                    f"{list_file} lists {entry!r}, looked for it as {path}: not found. Expected tree:\n{H5_TREE}"
                )
            p, y = self._read_h5(path)
            points.append(p)
            labels.append(y)
        self.points = np.concatenate(points)
        self.labels = np.concatenate(labels)
        _logger.info("ModelNet40H5 %s: %d clouds from %d files in %s", split, len(self.labels), len(entries), self.root)

    def _read_h5(self, path: Path) -> tuple[np.ndarray, np.ndarray]:
        import h5py

        expected = "datasets 'data' float32 (n, 2048, 3) and 'label' uint8 (n, 1)"
        try:
            with h5py.File(path, "r") as f:
                missing = [k for k in ("data", "label") if k not in f]
                if missing:
                    raise ValueError(
                        f"{path}: missing HDF5 datasets {missing}, found {sorted(f.keys())}; expected {expected}"
                    )
                data_shape = f["data"].shape
                if len(data_shape) != 3 or data_shape[2] != 3:
                    raise ValueError(f"{path}: 'data' has shape {data_shape}; expected {expected}")
                if data_shape[1] < self.num_points:
                    raise ValueError(
                        f"{path}: clouds have {data_shape[1]} points, fewer than num_points={self.num_points}"
                    )
                data = np.asarray(f["data"][:, : self.num_points], dtype=np.float32)
                label = np.asarray(f["label"][:]).astype(np.int64).reshape(-1)
        except (OSError, KeyError, RuntimeError) as err:
            raise ValueError(f"{path}: cannot read HDF5 file ({err}); expected {expected}") from err
        if len(label) != len(data):
            raise ValueError(f"{path}: {len(data)} clouds but {len(label)} labels; expected {expected}")
        if len(label) and (label.min() < 0 or label.max() >= self.num_classes):
            raise ValueError(f"{path}: labels must lie in [0, {self.num_classes}), got [{label.min()}, {label.max()}]")
        _check_finite(data, path)
        _check_scale(data, path, self.max_abs_coord)
        return data, label

    def load_points(self, index: int) -> np.ndarray:
        return self.points[index]


def _read_point_txt(
    path: Path, num_points: int, num_columns: int = 6, max_abs_coord: float | None = None
) -> np.ndarray:
    """The first ``num_points`` rows of a comma-separated point file, float32 ``(num_points, num_columns)``; a bad
    row (columns, number, NaN / Inf, a coordinate beyond ``max_abs_coord``) raises naming the file and line."""
    expected = f"{num_columns} comma-separated numbers per line ('x,y,z,nx,ny,nz')"
    try:
        array = np.loadtxt(path, delimiter=",", dtype=np.float32, max_rows=num_points, ndmin=2)
    except OSError as err:
        raise ValueError(f"{path}: cannot read ({err})") from err
    except ValueError as err:
        _raise_bad_txt_line(path, num_points, num_columns)
        raise ValueError(f"{path}: cannot parse ({err}); expected {expected}") from err
    if array.shape[1] != num_columns:
        raise ValueError(f"{path}, line 1: found {array.shape[1]} columns; expected {expected}")
    if len(array) < num_points:
        raise ValueError(f"{path}: has {len(array)} rows, fewer than num_points={num_points} (truncated file?)")
    if not np.isfinite(array).all():
        _check_finite(array, path, first_line=1)
    _check_scale(array, path, max_abs_coord, first_line=1)
    return array


def _raise_bad_txt_line(path: Path, num_points: int, num_columns: int) -> None:
    rows = 0
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, start=1):
            text = line.strip()
            if not text:
                continue
            fields = text.split(",")
            if len(fields) != num_columns:
                raise ValueError(
                    f"{path}, line {lineno}: expected {num_columns} comma-separated numbers, "
                    f"got {len(fields)}: {text[:80]!r}"
                )
            try:
                [float(v) for v in fields]
            except ValueError as err:
                raise ValueError(f"{path}, line {lineno}: non-numeric value in {text[:80]!r}") from err
            rows += 1
            if rows >= num_points:
                return


class ModelNet40Normal(PointCloudDataset):
    """PointNet++'s ``modelnet40_normal_resampled`` release (also ModelNet10 through its ``modelnet10_*`` files).

    Each shape is a text file of 10,000 rows ``x,y,z,nx,ny,nz`` (unit sphere, y up); the first ``num_points`` rows are
    used. Files are parsed lazily on first access and kept in memory; ``preload=True`` parses everything at
    construction (with a progress bar), and ``cache_dir`` additionally stores the parsed split as one ``.npz``
    (``modelnet{40,10}_normal_{split}_{num_points}.npz``) that later constructions load instead of the text files.
    Lazily parsed clouds are cached per process: with DataLoader workers that are not persistent, prefer
    ``preload=True`` or ``cache_dir`` so that the workers inherit the parsed arrays instead of re-parsing every epoch.
    :meth:`check_files` (which :func:`engine.run` calls before training) parses and keeps every cloud too.

    Args:
        root: Data root or the ``modelnet40_normal_resampled`` folder itself (see :func:`engine.data.data_root`).
        split: ``"train"`` or ``"test"``.
        num_points: Points per cloud (at most the rows in each file).
        use_normals: Return ``(num_points, 6)`` with normals instead of ``(num_points, 3)``.
        transform: Augmentation ``transform(points, rng)``.
        num_classes: 40 for ModelNet40, 10 for ModelNet10 (selects the ``modelnet{40,10}_*.txt`` files).
        seed: Augmentation seed.
        preload: Parse all files at construction.
        cache_dir: Folder for the parsed ``.npz`` cache (implies ``preload``).
        progress: Show a tqdm bar while parsing every file (``None``: only on a terminal).
        max_abs_coord: Refuse clouds with a coordinate beyond this (see the module docstring); ``None``: no limit.
    """

    FOLDER = "modelnet40_normal_resampled"

    def __init__(
        self,
        root: str | PathLike | None = None,
        split: str = "train",
        num_points: int = 1024,
        use_normals: bool = False,
        transform: Callable | None = None,
        num_classes: int = 40,
        seed: int = 0,
        preload: bool = False,
        cache_dir: str | PathLike | None = None,
        progress: bool | None = None,
        max_abs_coord: float | None = MAX_ABS_COORD,
    ) -> None:
        _check_split(split)
        _check_modelnet_classes(num_classes)
        prefix = f"modelnet{num_classes}"
        names_file, split_file = f"{prefix}_shape_names.txt", f"{prefix}_{split}.txt"
        self.root = locate(
            root, self.FOLDER, [names_file, split_file], f"ModelNet{num_classes} normal-resampled", NORMAL_TREE
        )
        classes = _read_names(self.root / names_file, num_classes)
        super().__init__(classes, num_points, transform, seed)
        self.split, self.use_normals = split, use_normals
        self.progress, self.max_abs_coord = progress, max_abs_coord
        self.ids = [line.strip() for line in (self.root / split_file).read_text().splitlines() if line.strip()]
        index_of = {name: i for i, name in enumerate(classes)}
        labels, self.files = [], []
        for shape_id in self.ids:
            cls = shape_id.rsplit("_", 1)[0]  # "night_stand_0001" -> "night_stand"
            if cls not in index_of:
                raise ValueError(
                    f"{self.root / split_file}: shape id {shape_id!r} has class {cls!r}, which is not in "
                    f"{self.root / names_file}; known classes: {classes}"
                )
            path = self.root / cls / f"{shape_id}.txt"
            if not path.is_file():
                raise FileNotFoundError(f"{self.root / split_file} lists {shape_id!r} but {path} does not exist")
            labels.append(index_of[cls])
            self.files.append(path)
        self.labels = np.asarray(labels, dtype=np.int64)
        self._cache: dict[int, np.ndarray] = {}
        if cache_dir is not None:
            self._load_or_build_cache(Path(cache_dir), prefix, progress)
        elif preload:
            self._preload(progress)
        _logger.info("ModelNet%d normal %s: %d shapes in %s", num_classes, split, len(self), self.root)

    def _preload(self, progress: bool | None) -> None:
        """Parses every file not yet cached (each row checked: see :meth:`check_files`)."""
        from tqdm import tqdm

        todo = [i for i in range(len(self)) if i not in self._cache]
        start = time.perf_counter()
        for i in tqdm(todo, desc=f"parse {self.split}", disable=None if progress is None else not progress):
            self._cache[i] = self._read(i)
        if todo:
            _logger.info("parsed %d files in %.1f s", len(todo), time.perf_counter() - start)

    def _read(self, index: int) -> np.ndarray:
        return _read_point_txt(self.files[index], self.num_points, max_abs_coord=self.max_abs_coord)

    def _load_or_build_cache(self, cache_dir: Path, prefix: str, progress: bool | None) -> None:
        path = cache_dir / f"{prefix}_normal_{self.split}_{self.num_points}.npz"
        if path.is_file():
            with np.load(path, allow_pickle=False) as z:
                if list(z["ids"]) == self.ids and z["points"].shape == (len(self), self.num_points, 6):
                    points = z["points"]
                    _check_scale(points, path, self.max_abs_coord)
                    self._cache = dict(enumerate(points))
                    return
            _logger.warning("cache %s does not match the split file; rebuilding it", path)
        self._preload(progress)
        cache_dir.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp.npz")
        with open(tmp, "wb") as f:
            np.savez(f, points=np.stack([self._cache[i] for i in range(len(self))]), ids=np.asarray(self.ids))
        os.replace(tmp, path)

    def check_files(self) -> None:
        """Parses every file before training reads it, and keeps the clouds (as ``preload=True`` does), so that a bad
        file fails before the first step, not after an epoch, and no file is parsed twice.

        Every row that training reads (the first ``num_points``) must hold six comma-separated finite numbers with
        coordinates within ``max_abs_coord``, and the file at least ``num_points`` rows; the error names the file and
        the line. Rows past ``num_points`` are never read.
        """
        self._preload(self.progress)

    def load_points(self, index: int) -> np.ndarray:
        points = self._cache.get(index)
        if points is None:
            points = self._cache[index] = self._read(index)
        return points if self.use_normals else points[:, :3]

    def extra_repr(self) -> str:
        return f"split={self.split!r}, use_normals={self.use_normals}, root='{self.root}'"


def save_sampled_split(
    out_dir: str | PathLike, split: str, points: np.ndarray, labels: np.ndarray, ids: Sequence[str]
) -> Path:
    """Write one split of the sampled-ModelNet cache (the format :class:`ModelNet40Sampled` reads), atomically.

    Args:
        out_dir: The cache folder (e.g. ``<data root>/modelnet40_sampled``).
        split: ``"train"`` or ``"test"``.
        points: float32 ``(n, P, 6)``: x, y, z, nx, ny, nz.
        labels: ``(n,)`` class indices.
        ids: ``(n,)`` shape ids (``airplane_0001``).

    Returns:
        The written ``<split>.npz`` path.
    """
    _check_split(split)
    if points.ndim != 3 or points.shape[2] != 6:
        raise ValueError(f"points must be (n, P, 6), got {points.shape}")
    if not len(points) == len(labels) == len(ids):
        raise ValueError(
            f"points, labels and ids must have the same length, got {len(points)}, {len(labels)}, {len(ids)}"
        )
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{split}.npz"
    tmp = out_dir / f".{split}.tmp.npz"
    with open(tmp, "wb") as f:
        np.savez(
            f,
            points=points.astype(np.float32),
            labels=np.asarray(labels, dtype=np.int64),
            ids=np.asarray(ids, dtype=str),
        )
    os.replace(tmp, path)
    return path


class ModelNet40Sampled(PointCloudDataset):
    """Surface samples of the raw ModelNet ``.off`` meshes, as cached by ``datasets/prepare_modelnet40.py``.

    The cache stores per shape ``P`` i.i.d. area-weighted uniform surface points with their face normals, centred
    and scaled to the unit sphere, in the meshes' own frame (z up). The first ``num_points`` are used.

    Args:
        root: Data root or the cache folder itself (see :func:`engine.data.data_root`).
        split: ``"train"`` or ``"test"``.
        num_points: Points per cloud (at most the cached ``P``).
        use_normals: Return ``(num_points, 6)`` with normals instead of ``(num_points, 3)``.
        transform: Augmentation ``transform(points, rng)``.
        num_classes: 40 (folder ``modelnet40_sampled``) or 10 (``modelnet10_sampled``).
        seed: Augmentation seed.
        max_abs_coord: Refuse clouds with a coordinate beyond this (see the module docstring); ``None``: no limit.
    """

    def __init__(
        self,
        root: str | PathLike | None = None,
        split: str = "train",
        num_points: int = 1024,
        use_normals: bool = False,
        transform: Callable | None = None,
        num_classes: int = 40,
        seed: int = 0,
        max_abs_coord: float | None = MAX_ABS_COORD,
    ) -> None:
        _check_split(split)
        _check_modelnet_classes(num_classes)
        folder = f"modelnet{num_classes}_sampled"
        tree = SAMPLED_TREE.format(folder=folder, flag=" --modelnet10" if num_classes == 10 else "")
        self.root = locate(
            root, folder, ["shape_names.txt", f"{split}.npz"], f"sampled ModelNet{num_classes} cache", tree
        )
        classes = _read_names(self.root / "shape_names.txt", num_classes)
        super().__init__(classes, num_points, transform, seed)
        self.split, self.use_normals = split, use_normals
        path = self.root / f"{split}.npz"
        expected = "arrays 'points' float32 (n, P, 6), 'labels' int64 (n,), 'ids' str (n,)"
        try:
            with np.load(path, allow_pickle=False) as z:
                stored = z["points"]
                self.labels = np.asarray(z["labels"], dtype=np.int64)
                self.ids = [str(i) for i in z["ids"]]
        except (OSError, KeyError, ValueError, EOFError) as err:
            raise ValueError(f"{path}: cannot read the sampled cache ({err}); expected {expected}") from err
        if stored.ndim != 3 or stored.shape[2] != 6 or not len(stored) == len(self.labels) == len(self.ids):
            raise ValueError(
                f"{path}: found points {stored.shape}, {len(self.labels)} labels, {len(self.ids)} ids; "
                f"expected {expected}"
            )
        if stored.shape[1] < num_points:
            raise ValueError(f"{path}: holds {stored.shape[1]} points per shape, fewer than num_points={num_points}")
        if len(self.labels) and (self.labels.min() < 0 or self.labels.max() >= num_classes):
            raise ValueError(
                f"{path}: labels must lie in [0, {num_classes}), got [{self.labels.min()}, {self.labels.max()}]"
            )
        self.points = np.ascontiguousarray(stored[:, :num_points], dtype=np.float32)
        _check_finite(self.points, path)
        _check_scale(self.points, path, max_abs_coord)
        meta_path = self.root / "meta.json"
        self.meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
        _logger.info("ModelNet%d sampled %s: %d shapes from %s", num_classes, split, len(self), path)

    def load_points(self, index: int) -> np.ndarray:
        points = self.points[index]
        return points if self.use_normals else points[:, :3]

    def extra_repr(self) -> str:
        return f"split={self.split!r}, use_normals={self.use_normals}, root='{self.root}'"


class SyntheticShapes(PointCloudDataset):
    """The embedded dataset: procedural shapes from trimesh primitives (see :mod:`pointcloud.synthetic`).

    Sample ``index`` of class ``c = index // samples_per_class`` (copy ``i = index % samples_per_class``) is
    generated from ``numpy.random.default_rng((seed, split_id, c, i))`` with ``split_id`` 0 for train and 1 for test:
    deterministic, and disjoint streams for the two splits. A class keeps its samples when ``num_classes`` changes.
    The default 10 classes: box, sphere, cylinder, cone, torus, table, chair, mug, airplane, lamp; up to 13 with
    capsule, l_shape, cross. Clouds are z-up, randomly rotated about z, anisotropically scaled, noisy, with uneven
    point density.

    Args:
        split: ``"train"`` or ``"test"``.
        num_points: Points per cloud.
        num_classes: How many classes of :data:`pointcloud.synthetic.SHAPE_CLASSES` to use (2 to 13).
        samples_per_class: Samples per class; default 100 for train, 30 for test.
        seed: Seed of the generation and of the augmentation (distinct streams).
        transform: Augmentation ``transform(points, rng)``.
        use_normals: Return ``(num_points, 6)`` with face normals instead of ``(num_points, 3)``.
        normalize: Centre each cloud and scale it to max norm 1.
        precompute: Generate every sample at construction instead of on first access.
        progress: Show a tqdm bar while precomputing (``None``: only on a terminal).
    """

    def __init__(
        self,
        split: str = "train",
        num_points: int = 1024,
        num_classes: int = 10,
        samples_per_class: int | None = None,
        seed: int = 0,
        transform: Callable | None = None,
        use_normals: bool = False,
        normalize: bool = True,
        precompute: bool = True,
        progress: bool | None = None,
    ) -> None:
        _check_split(split)
        if not 2 <= num_classes <= len(SHAPE_CLASSES):
            raise ValueError(
                f"num_classes must be in [2, {len(SHAPE_CLASSES)}] (classes {SHAPE_CLASSES}), got {num_classes}"
            )
        if samples_per_class is None:
            samples_per_class = 100 if split == "train" else 30
        if samples_per_class < 1:
            raise ValueError(f"samples_per_class must be >= 1, got {samples_per_class}")
        super().__init__(SHAPE_CLASSES[:num_classes], num_points, transform, seed)
        self.split, self.samples_per_class = split, samples_per_class
        self.use_normals, self.normalize = use_normals, normalize
        self.labels = np.repeat(np.arange(num_classes, dtype=np.int64), samples_per_class)
        self._cache: dict[int, np.ndarray] = {}
        if precompute:
            from tqdm import tqdm

            start = time.perf_counter()
            disable = None if progress is None else not progress
            for i in tqdm(range(len(self)), desc=f"synthetic {split}", disable=disable):
                self._generate(i)
            _logger.info("generated %d synthetic %s clouds in %.1f s", len(self), split, time.perf_counter() - start)

    def _generate(self, index: int) -> np.ndarray:
        points = self._cache.get(index)
        if points is None:
            cls, copy = divmod(index, self.samples_per_class)
            rng = np.random.default_rng((self.seed, _SPLITS.index(self.split), cls, copy))
            points = self._cache[index] = generate_shape(self.classes[cls], rng, self.num_points, self.normalize)
        return points

    def load_points(self, index: int) -> np.ndarray:
        points = self._generate(index)
        return points if self.use_normals else points[:, :3]

    def extra_repr(self) -> str:
        return f"split={self.split!r}, samples_per_class={self.samples_per_class}, seed={self.seed}"


DATASETS: dict[str, Callable[..., PointCloudDataset]] = {
    "synthetic": SyntheticShapes,
    "modelnet40_h5": ModelNet40H5,
    "modelnet40_normal": functools.partial(ModelNet40Normal, num_classes=40),
    "modelnet10_normal": functools.partial(ModelNet40Normal, num_classes=10),
    "modelnet40_sampled": functools.partial(ModelNet40Sampled, num_classes=40),
    "modelnet10_sampled": functools.partial(ModelNet40Sampled, num_classes=10),
}
"""Dataset name -> constructor, for configs and CLIs (:func:`build_dataset`)."""

UP_AXES: dict[str, str] = {
    "synthetic": "z",
    "modelnet40_h5": "y",
    "modelnet40_normal": "y",
    "modelnet10_normal": "y",
    "modelnet40_sampled": "z",
    "modelnet10_sampled": "z",
}
"""Dataset name -> the axis its shapes stand on: the synthetic shapes and the raw ``.off`` meshes (so the sampled
caches) are z up; both ModelNet releases, ``modelnet40_ply_hdf5_2048`` and ``modelnet40_normal_resampled``, store
their shapes y up. A rotation about the up axis (:class:`~pointcloud.transforms.RandomRotateUp`) must use this axis:
the ModelNet recipe takes it when its ``up_axis`` is null and refuses another one."""


def build_dataset(name: str, split: str = "train", root: str | PathLike | None = None, **kwargs) -> PointCloudDataset:
    """Build a dataset of :data:`DATASETS` by name.

    Args:
        name: A key of :data:`DATASETS`.
        root: Data root (ignored by ``synthetic``); default ``$CENTROID_DATA``, else ``./datasets``.
        split: ``"train"`` or ``"test"``.
        **kwargs: Passed to the constructor (``num_points``, ``transform``, ``seed``, ``use_normals``, ...).
    """
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; choices: {sorted(DATASETS)}")
    factory = DATASETS[name]
    target = factory.func if isinstance(factory, functools.partial) else factory
    if "root" in inspect.signature(target).parameters:
        kwargs["root"] = root
    return factory(split=split, **kwargs)
