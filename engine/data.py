"""Where datasets live: the one data root every domain reads, and the search for a release folder under it.

The data root is the ``root`` argument (the CLIs' ``--data-root``), else the environment variable ``CENTROID_DATA``,
else ``./datasets``. A dataset's ``root`` may be the data root (the dataset is then looked up in its release folder
under it) or the dataset folder itself; :func:`locate` tries both and, when neither holds the files, raises an error
that names the searched folders, what each lacks, and the expected tree (``datasets/README.md`` shows them all).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

__all__ = ["DATA_ROOT_ENV", "data_root", "locate"]

DATA_ROOT_ENV = "CENTROID_DATA"


def data_root(root: str | PathLike | None = None) -> Path:
    """The data root: ``root`` if given, else ``$CENTROID_DATA``, else ``./datasets``."""
    if root is not None:
        return Path(root).expanduser()
    return Path(os.environ.get(DATA_ROOT_ENV) or "datasets").expanduser()


def locate(root: str | PathLike | None, folder: str, markers: Sequence[str], what: str, tree: str) -> Path:
    """``<data root>/<folder>`` or the data root itself, whichever holds every file in ``markers``.

    Args:
        root: The ``root`` argument of a dataset (see :func:`data_root`).
        folder: The release's folder name, e.g. ``"modelnet40_ply_hdf5_2048"``.
        markers: Files (relative paths) the dataset folder must hold, e.g. the split lists.
        what: The dataset's name in the error message.
        tree: The expected tree, printed in the error message.

    Raises:
        FileNotFoundError: Neither candidate holds all ``markers``; the message names both, what each lacks, the data
            root rule and ``tree``.
    """
    base = data_root(root)
    candidates = [base / folder, base]
    for cand in candidates:
        if all((cand / m).is_file() for m in markers):
            return cand
    missing = "; ".join(
        f"{c}: missing {[m for m in markers if not (c / m).is_file()]}" if c.is_dir() else f"{c}: no such folder"
        for c in candidates
    )
    raise FileNotFoundError(
        f"{what} not found. Searched {[str(c) for c in candidates]} ({missing}). The data root is the `root` "
        f"argument, else ${DATA_ROOT_ENV}, else ./datasets. Expected tree:\n{tree}\nSee datasets/README.md."
    )
