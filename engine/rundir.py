"""Run folders that lose nothing: new per run, never reused silently, locked while a process writes them.

Rules (enforced by :func:`engine.run` on rank 0, before anything is written):

* Without ``--output-dir`` every run gets a new folder ``runs/<group>/<name>/<YYYYmmdd-HHMMSS>`` and the symlink
  ``runs/<group>/<name>/latest`` points to the newest one (``--resume auto`` and ``--eval-only`` without
  ``--output-dir`` use it).
* A folder that holds a run (any of :data:`RUN_FILES`, finished or not) is only used again with ``--resume`` (continue
  it) or ``--overwrite`` (delete its run files first); otherwise the run stops before writing anything.
* ``run.lock`` holds the PID and host of the process writing the folder (:class:`RunLock`). A second run into the same
  folder, training or ``--eval-only``, stops at once and names that PID; a lock left by a process that no longer runs
  (same host) is stale and is taken over, by one process only when several start at once.
* Temporary files of atomic writes (``.<name>.*.tmp``) left by a killed run are removed when the next run starts.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import logging
import os
import secrets
import shutil
import socket
import time
from pathlib import Path

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None

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
    """An exclusive lock on a run folder: the file ``run.lock``, which names its holder as ``<pid> <host>``.

    Where ``fcntl.flock`` works (Linux, macOS) the lock is a ``flock`` on the open file: the kernel gives it to one
    process only and frees it when that process dies, so a lock file whose holder is gone is simply taken over, by
    exactly one of the processes that try at once (a file that names a live process is still respected: its writer
    may not use ``flock``). The owner is written while the ``flock`` is held, and a process
    that gets the ``flock`` of a file its holder has just deleted (on release) tries again on the new file. Without
    ``flock`` (Windows, or a file system that refuses it) the file is published complete with ``os.link``, which
    fails if it exists; a lock left by a process that no longer runs then has to be deleted by hand (the error says
    which file), since removing it safely needs what ``flock`` gives.

    Args:
        folder: The run folder (created if needed).

    Raises (from :meth:`acquire`):
        UsageError: Another live process holds the lock (its PID is named), a lock from another host exists, or
            (without ``flock``) a lock of a process that no longer runs is in the way.
    """

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / LOCK_NAME
        self.held = False
        self._fd: int | None = None
        self._flock = fcntl is not None

    def acquire(self) -> RunLock:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        me = f"{os.getpid()} {socket.gethostname()}\n"
        for _ in range(100):  # each retry means another process released the lock between our open and flock
            done = self._try_flock(me) if self._flock else None
            if done is None:
                done = self._try_link(me)
            if done:
                self.held = True
                return self
        raise UsageError(f"could not take the lock {self.path}: other processes keep taking and releasing it")

    def _try_flock(self, me: str) -> bool | None:
        """One attempt with ``flock``: True when held, False to try again, None when ``flock`` is not supported."""
        try:
            fd, created = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644), True
        except FileExistsError:
            try:
                fd, created = os.open(self.path, os.O_RDWR), False
            except FileNotFoundError:  # released in between
                return False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = self._read_holder()
                if holder is None:  # its holder is releasing it
                    os.close(fd)
                    return False
                self._refuse(holder, alive=True)
            except OSError as e:
                if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                    raise
                logger.warning("no flock for %s (%s): the lock falls back to an exclusive file", self.path, e)
                if created:
                    self.path.unlink()
                os.close(fd)
                self._flock = False
                return None
            try:
                same = os.path.samestat(os.fstat(fd), os.stat(self.path))
            except FileNotFoundError:
                same = False
            if not same:  # its holder deleted it on release after our open: lock the file now at the path
                os.close(fd)
                return False
            pid, host = _parse(os.pread(fd, 256, 0).decode(errors="replace"))
            if pid is not None and host not in (None, socket.gethostname()):
                self._refuse((pid, host), alive=True)
            if pid is not None and pid != os.getpid() and _alive(pid):  # a holder that does not use flock
                self._refuse((pid, host), alive=True)
            if pid is not None and pid != os.getpid():
                logger.warning("taking over the stale lock %s of process %s, which no longer runs", self.path, pid)
            os.ftruncate(fd, 0)
            os.pwrite(fd, me.encode(), 0)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        return True

    def _try_link(self, me: str) -> bool:
        """One attempt without ``flock``: the complete file is published with ``os.link`` (fails if it exists)."""
        tmp = self.path.with_name(f".{LOCK_NAME}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
        tmp.write_text(me)
        try:
            os.link(tmp, self.path)
            return True
        except FileExistsError:
            holder = self._read_holder()
            if holder is None:  # released between the link and the read
                return False
            self._refuse(holder, alive=holder[0] is not None and _alive(holder[0]))
        except FileNotFoundError:  # the holder's clean_temp_files removed our temp file
            return False
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        return False

    def _read_holder(self) -> tuple[int | None, str | None] | None:
        """``(pid, host)`` from the lock file, ``None`` if it is gone; a holder that has just taken the ``flock`` may
        not have written its PID yet, hence the short wait."""
        for _ in range(20):
            try:
                holder = _parse(self.path.read_text())
            except FileNotFoundError:
                return None
            if holder[0] is not None:
                break
            time.sleep(0.005)
        return holder

    def _refuse(self, holder: tuple[int | None, str | None], alive: bool) -> None:
        pid, host = holder
        who = f"process {pid}" if pid is not None else "another process"
        if host not in (None, socket.gethostname()):
            raise UsageError(
                f"{self.path.parent} is locked by {who} on host {host} ({self.path}); if that run is over, "
                "delete the lock file"
            )
        if alive:
            raise UsageError(
                f"{self.path.parent} is in use by {who} (lock {self.path}): wait for it to finish or stop it, "
                "or choose another --output-dir"
            )
        state = "which no longer runs" if pid is not None else "whose PID it does not hold"
        raise UsageError(
            f"{self.path.parent} is locked by {who}, {state} ({self.path}); without flock a stale lock cannot be "
            "taken over safely: if no run uses the folder, delete the lock file and start again"
        )

    def release(self) -> None:
        if self.held:
            with contextlib.suppress(FileNotFoundError):
                self.path.unlink()  # before the flock is freed: a waiter then finds the file gone and retries
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self.held = False

    def __enter__(self) -> RunLock:
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def _parse(text: str) -> tuple[int | None, str | None]:
    """``(pid, host)`` of a lock file's ``<pid> <host>`` (``None`` for what is missing)."""
    parts = text.split()
    pid = int(parts[0]) if parts and parts[0].isdigit() else None
    return pid, parts[1] if len(parts) > 1 else None
