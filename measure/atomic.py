"""Atomic file writes: a reader sees either the old file or the complete new one, never a partial file.

The new content goes to a temporary file in the destination's folder (same file system, so the final rename is
atomic), which is flushed and fsync'ed before ``os.replace`` moves it over the destination. A process killed at any
moment therefore leaves a bench's ``--json`` report, or a run's ``last.pt`` / ``config.yaml`` / ``final_metrics.json``
(the harness, :mod:`engine`, writes through here too), either as it was or complete; a stray ``.<name>.*.tmp`` file
can only remain after a hard crash of the machine itself.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

__all__ = ["atomic_open", "atomic_write_text"]


def _default_file_mode() -> int:
    """Permission bits a plain ``open(path, "w")`` would give (``mkstemp`` uses 0o600)."""
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


@contextlib.contextmanager
def atomic_open(path: str | Path, mode: str = "wb", encoding: str | None = None) -> Iterator[IO[Any]]:
    """Opens a temporary file that replaces ``path`` when the ``with`` block exits without an exception.

    Args:
        path: Destination file; its parent folder is created if needed.
        mode: ``"wb"`` or ``"w"``.
        encoding: Text encoding for ``mode="w"`` (default UTF-8).

    Yields:
        The open temporary file. If the block raises, the temporary file is removed and ``path`` is untouched.
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open supports mode 'w' or 'wb', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, encoding=(encoding or "utf-8") if mode == "w" else None) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, _default_file_mode())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    _fsync_dir(path.parent)


def _fsync_dir(folder: Path) -> None:
    """Makes the rename itself durable; not supported on every platform, hence best effort."""
    with contextlib.suppress(OSError):
        fd = os.open(folder, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_text(path: str | Path, text: str, encoding: str = "utf-8") -> None:
    """Writes ``text`` to ``path`` atomically (see :func:`atomic_open`)."""
    with atomic_open(path, "w", encoding=encoding) as f:
        f.write(text)
