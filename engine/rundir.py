"""Run folders that lose nothing: new per run, never reused silently, locked while a process writes them.

Rules (enforced by :func:`engine.run` on rank 0, before anything is written):

* Without ``--output-dir`` every run gets a new folder ``runs/<group>/<name>/<YYYYmmdd-HHMMSS>`` and the symlink
  ``runs/<group>/<name>/latest`` points to the newest one (``--resume auto`` and ``--eval-only`` without
  ``--output-dir`` use it).
* A folder that holds a run (any of :data:`RUN_FILES`, finished or not) is only used again with ``--resume`` (continue
  it) or ``--overwrite`` (delete its run files first); otherwise the run stops before writing anything.
* ``run.lock`` holds the PID and host of the process writing the folder. A second run into the same folder stops at
  once and names that PID; a lock left by a process that no longer runs (same host) is stale and is taken over.
* Temporary files of atomic writes (``.<name>.*.tmp``) left by a killed run are removed when the next run starts.
"""

from __future__ import annotations

import contextlib
import datetime
import logging
import os
import shutil
import socket
from pathlib import Path

from engine.errors import UsageError

__all__ = [
    "LOCK_NAME",
    "RUN_FILES",
    "RunLock",
    "clean_temp_files",
    "default_run_dir",
    "holds_run",
    "latest_run_dir",
    "prepare_run_dir",
    "update_latest",
]

logger = logging.getLogger(__name__)

RUN_FILES = ("config.yaml", "log.jsonl", "last.pt", "best.pt", "final_metrics.json", "eval_metrics.json")
LOCK_NAME = "run.lock"
LATEST = "latest"


def default_run_dir(group: str, name: str, root: str | Path = "runs") -> Path:
    """A new folder ``root/group/name/<YYYYmmdd-HHMMSS>`` (with ``-2``, ``-3``... if that second is taken)."""
    parent = Path(root) / group / name
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    folder, n = parent / stamp, 1
    while folder.exists():
        n += 1
        folder = parent / f"{stamp}-{n}"
    return folder


def latest_run_dir(group: str, name: str, root: str | Path = "runs") -> Path | None:
    """The folder ``root/group/name/latest`` points to, or ``None``."""
    link = Path(root) / group / name / LATEST
    return link.resolve() if link.is_dir() else None


def update_latest(folder: Path) -> None:
    """Points ``folder.parent/latest`` at ``folder`` (atomically: a new symlink renamed over the old one)."""
    link = folder.parent / LATEST
    tmp = folder.parent / f".{LATEST}.{os.getpid()}.tmp"
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    try:
        tmp.symlink_to(folder.name, target_is_directory=True)
        os.replace(tmp, link)
    except OSError as e:  # e.g. a file system without symlinks: the run itself is unaffected
        logger.warning("could not update %s -> %s (%s)", link, folder.name, e)


def holds_run(folder: Path) -> list[str]:
    """The run files (:data:`RUN_FILES`) present in ``folder``."""
    return [name for name in RUN_FILES if (folder / name).exists()]


def prepare_run_dir(folder: Path, *, resume: bool, overwrite: bool) -> None:
    """Applies the reuse rule to ``folder`` (call with the lock held); ``overwrite`` deletes its run files.

    Raises:
        UsageError: ``folder`` holds a run and neither ``resume`` nor ``overwrite`` is set.
    """
    present = holds_run(folder)
    if not present:
        return
    if overwrite:
        for name in present:
            (folder / name).unlink()
        shutil.rmtree(folder / "tb", ignore_errors=True)
        logger.warning("--overwrite: deleted %s from %s", ", ".join(present), folder)
        return
    if not resume:
        raise UsageError(
            f"{folder} already holds a run ({', '.join(present)}): continue it with --resume auto, replace it with "
            "--overwrite, or choose another --output-dir (without --output-dir every run gets a new folder)"
        )


def clean_temp_files(folder: Path) -> list[Path]:
    """Removes ``.<name>.*.tmp`` files of interrupted atomic writes (call with the lock held); returns them."""
    removed = []
    for path in folder.glob(".*.tmp"):
        with contextlib.suppress(FileNotFoundError):
            size = path.stat().st_size
            path.unlink()
            removed.append(path)
            logger.info("removed %s (%.1f MB) left by an interrupted run", path, size / 2**20)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


class RunLock:
    """An exclusive lock on a run folder: the file ``run.lock`` with ``<pid> <host>``, created with ``O_EXCL``.

    Args:
        folder: The run folder (created if needed).

    Raises (from :meth:`acquire`):
        UsageError: Another live process holds the lock (its PID is named), or a lock from another host exists.
    """

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self.held = False

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = f"{os.getpid()} {socket.gethostname()}\n"
        for _ in range(2):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                self._check_holder()
                continue  # the stale lock was removed: try again
            with os.fdopen(fd, "w") as f:
                f.write(me)
            self.held = True
            return self
        raise UsageError(f"could not take the lock {self.path}: another process keeps creating it")

    def _check_holder(self) -> None:
        try:
            text = self.path.read_text().split()
        except FileNotFoundError:
            return
        pid = int(text[0]) if text and text[0].isdigit() else None
        host = text[1] if len(text) > 1 else None
        if pid is not None and host not in (None, socket.gethostname()):
            raise UsageError(
                f"{self.path.parent} is locked by process {pid} on host {host} ({self.path}); if that run is over, "
                "delete the lock file"
            )
        if pid is not None and _alive(pid):
            raise UsageError(
                f"{self.path.parent} is in use by process {pid} (lock {self.path}): wait for it to finish or stop it, "
                "or choose another --output-dir"
            )
        logger.warning("removing the stale lock %s of process %s, which no longer runs", self.path, pid)
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def release(self) -> None:
        if self.held:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()
            self.held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()
