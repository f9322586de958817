"""Sample the raw ModelNet40 (or ModelNet10) ``.off`` meshes into the point cache read by
``pointcloud.data.ModelNet40Sampled`` (dataset names ``modelnet40_sampled`` / ``modelnet10_sampled``).

Input tree (the Princeton ``ModelNet40.zip`` / ``ModelNet10.zip``, unzipped)::

    <src>/<class>/train/<class>_<NNNN>.off
    <src>/<class>/test/<class>_<NNNN>.off

For each mesh: parse the OFF file (also the fused ``OFF490 518 0`` header of many ModelNet files), draw
``--num-points`` area-weighted uniform surface points with ``trimesh.sample.sample_surface`` and keep the normal of
the face each point lies on, then centre the points at their centroid and scale them to max norm 1 (as in PointNet's
release). The frame is the meshes' own (z up). Each mesh has its own generator,
``numpy.random.default_rng((seed, crc32("<split>/<id>")))``, so the cache is identical for any ``--workers``.

Output (``--out``, default ``<data root>/modelnet40_sampled`` or ``modelnet10_sampled``)::

    shape_names.txt   class names in label order (sorted, as ModelNet40's shape_names.txt)
    train.npz         'points' float32 (n, P, 6) x,y,z,nx,ny,nz; 'labels' int64 (n,); 'ids' str (n,)
    test.npz
    meta.json         settings; written last, so its presence marks a complete cache

Re-running with the same settings does nothing; ``--force`` rebuilds. Usage::

    python datasets/prepare_modelnet40.py --src /data/ModelNet40 --num-points 2048 --workers 4
    python datasets/prepare_modelnet40.py --modelnet10 --src /data/ModelNet10
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
import zlib
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from tqdm import tqdm

from engine.data import DATA_ROOT_ENV, data_root
from pointcloud.data import save_sampled_split
from pointcloud.meshes import sample_off

__all__ = ["FORMAT_VERSION", "MODELNET10_CLASSES", "main", "prepare"]

_logger = logging.getLogger("prepare_modelnet40")

FORMAT_VERSION = 1
MODELNET10_CLASSES = [
    "bathtub",
    "bed",
    "chair",
    "desk",
    "dresser",
    "monitor",
    "night_stand",
    "sofa",
    "table",
    "toilet",
]
_SPLITS = ("train", "test")
_SRC_TREE = "<src>/<class>/train/<class>_<NNNN>.off and <src>/<class>/test/<class>_<NNNN>.off"


def _list_classes(src: Path, modelnet10: bool) -> list[str]:
    if not src.is_dir():
        raise FileNotFoundError(f"mesh folder {src} not found; expected {_SRC_TREE}")
    present = sorted(p.name for p in src.iterdir() if p.is_dir() and any((p / s).is_dir() for s in _SPLITS))
    if modelnet10:
        missing = [c for c in MODELNET10_CLASSES if c not in present]
        if missing:
            raise FileNotFoundError(f"{src}: ModelNet10 classes {missing} not found; expected {_SRC_TREE}")
        return list(MODELNET10_CLASSES)
    if not present:
        raise FileNotFoundError(f"{src}: no class folders with train/ or test/ found; expected {_SRC_TREE}")
    if len(present) != 40:
        _logger.warning("%s holds %d classes, not ModelNet40's 40", src, len(present))
    return present


def _expected_meta(src: Path, classes: list[str], num_points: int, seed: int) -> dict:
    return {
        "format_version": FORMAT_VERSION,
        "num_points": num_points,
        "seed": seed,
        "classes": classes,
        "source": str(src.resolve()),
        "sampling": "trimesh.sample.sample_surface, area-weighted, normals of the sampled faces",
        "normalization": "centroid at 0, max norm 1",
    }


def prepare(
    src: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    num_points: int = 2048,
    seed: int = 0,
    modelnet10: bool = False,
    workers: int = 0,
    force: bool = False,
    progress: bool | None = None,
) -> Path:
    """Build the sampled cache (see the module docstring); returns the output folder.

    Args:
        src: The unzipped ModelNet folder; default ``<data root>/ModelNet40`` (``ModelNet10`` with ``modelnet10``).
        out: The cache folder; default ``<data root>/modelnet40_sampled`` (``modelnet10_sampled``).
        num_points: Points per shape.
        seed: Global seed of the sampling.
        modelnet10: Build ModelNet10 (its 10 classes, from a ModelNet10 or ModelNet40 tree).
        workers: Worker processes (0 or 1: in this process).
        force: Rebuild even if a complete cache with the same settings exists.
        progress: Show tqdm bars (``None``: only on a terminal).
    """
    if num_points < 1:
        raise ValueError(f"num_points must be >= 1, got {num_points}")
    name = "ModelNet10" if modelnet10 else "ModelNet40"
    src = Path(src) if src is not None else data_root() / name
    out = Path(out) if out is not None else data_root() / f"{name.lower()}_sampled"
    classes = _list_classes(src, modelnet10)
    meta = _expected_meta(src, classes, num_points, seed)

    meta_path = out / "meta.json"
    if meta_path.is_file() and all((out / f"{s}.npz").is_file() for s in _SPLITS) and not force:
        found = json.loads(meta_path.read_text())
        if all(found.get(k) == v for k, v in meta.items() if k != "source"):
            _logger.info("%s is complete (same settings): nothing to do; pass --force to rebuild", out)
            return out
        settings = {k: found.get(k) for k in ("num_points", "seed", "format_version")}
        raise FileExistsError(f"{out} holds a cache built with other settings ({settings}); pass --force to rebuild it")

    meta_path.unlink(missing_ok=True)  # an interrupted rebuild must not look complete
    out.mkdir(parents=True, exist_ok=True)
    (out / "shape_names.txt").write_text("".join(f"{c}\n" for c in classes))
    counts = {}
    with contextlib.ExitStack() as stack:
        pool = None
        if workers > 1:
            pool = stack.enter_context(ProcessPoolExecutor(workers, mp_context=get_context("spawn")))
        for split in _SPLITS:
            files, labels = [], []
            for label, cls in enumerate(classes):
                found_files = sorted((src / cls / split).glob("*.off"))
                files += found_files
                labels += [label] * len(found_files)
            if not files:
                _logger.warning("no %s meshes found under %s/<class>/%s/", split, src, split)
            # One generator per mesh, keyed by (seed, split, id): the cache does not depend on --workers.
            seeds = [(seed, zlib.crc32(f"{split}/{f.stem}".encode())) for f in files]
            start = time.perf_counter()
            sizes = [num_points] * len(files)
            results = (
                pool.map(sample_off, files, sizes, seeds, chunksize=8) if pool else map(sample_off, files, sizes, seeds)
            )
            disable = None if progress is None else not progress
            clouds = list(tqdm(results, total=len(files), desc=f"{name} {split}", unit="mesh", disable=disable))
            points = np.stack(clouds) if clouds else np.zeros((0, num_points, 6), dtype=np.float32)
            save_sampled_split(out, split, points, np.asarray(labels, dtype=np.int64), [f.stem for f in files])
            counts[split] = len(files)
            _logger.info("%s %s: %d meshes sampled in %.1f s", name, split, len(files), time.perf_counter() - start)
    meta["counts"] = counts
    tmp = out / ".meta.json.tmp"
    tmp.write_text(json.dumps(meta, indent=2) + "\n")
    os.replace(tmp, meta_path)
    _logger.info("wrote %s", out)
    return out


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument(
        "--src",
        type=Path,
        help=f"unzipped ModelNet folder (default <data root>/ModelNet40; data root: ${DATA_ROOT_ENV}, else ./datasets)",
    )
    parser.add_argument("--out", type=Path, help="cache folder (default <data root>/modelnet40_sampled)")
    parser.add_argument("--num-points", type=int, default=2048, help="points per shape (default 2048)")
    parser.add_argument("--seed", type=int, default=0, help="sampling seed (default 0)")
    parser.add_argument("--modelnet10", action="store_true", help="build ModelNet10 instead of ModelNet40")
    parser.add_argument("--workers", type=int, default=min(4, os.cpu_count() or 1), help="worker processes")
    parser.add_argument("--force", action="store_true", help="rebuild an existing cache")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    prepare(args.src, args.out, args.num_points, args.seed, args.modelnet10, args.workers, args.force, progress=True)


if __name__ == "__main__":
    main()
