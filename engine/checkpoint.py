"""Checkpoints: atomic save, load with clear errors, ``--resume auto|PATH`` resolution and RNG state capture.

Trust assumption: :func:`load_checkpoint` calls ``torch.load(..., weights_only=False)``, i.e. it unpickles. Our own
checkpoints hold config dicts, RNG states (Python's ``random`` state is a tuple, NumPy's holds an array) and
optimizer/scheduler state, which the restricted ``weights_only`` unpickler does not all accept across torch
versions. Unpickling can run arbitrary code, so only load checkpoints that this toolkit (or someone you trust)
wrote; for third-party weights use ``torch.load(path, weights_only=True)`` directly.
"""

from __future__ import annotations

import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.atomic import atomic_open

__all__ = [
    "CheckpointError",
    "get_rng_state",
    "load_checkpoint",
    "resolve_resume",
    "save_checkpoint",
    "set_rng_state",
]

logger = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """A checkpoint file exists but cannot be read (corrupt, truncated, or not a torch checkpoint)."""


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    """Saves ``state`` with ``torch.save`` atomically: temp file in the same folder, flush + fsync, ``os.replace``.

    Args:
        state: The checkpoint dict.
        path: Destination, e.g. ``runs/<name>/last.pt``. A kill during the write leaves the previous file intact.
    """
    if not isinstance(state, dict):
        raise TypeError(f"checkpoint state must be a dict, got {type(state).__name__}")
    with atomic_open(path, "wb") as f:
        torch.save(state, f)


def load_checkpoint(path: str | Path, map_location: str | torch.device | None = "cpu") -> dict[str, Any]:
    """Loads a checkpoint written by :func:`save_checkpoint` (unpickles: see the module docstring).

    Args:
        path: The checkpoint file.
        map_location: Where tensors go; ``"cpu"`` by default (RNG states must stay on the CPU).

    Returns:
        The checkpoint dict.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointError: The file is corrupt, truncated or does not hold a dict.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated and cannot be loaded ({type(e).__name__}: {e}); "
            "delete it, or resume from another checkpoint such as best.pt"
        ) from e
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} is corrupt: expected a dict, got {type(state).__name__}")
    return state


def resolve_resume(resume: str | Path | None, run_dir: str | Path | None) -> Path | None:
    """Turns a ``--resume`` value into the checkpoint to load.

    Args:
        resume: ``None`` or ``""`` (start fresh), ``"auto"`` (``run_dir/last.pt`` if it exists, else start fresh),
            or a checkpoint path (which must exist).
        run_dir: The run folder, used by ``"auto"``.

    Returns:
        The checkpoint path, or ``None`` to start fresh.

    Raises:
        FileNotFoundError: An explicit path does not exist.
        ValueError: ``"auto"`` without a ``run_dir``.
    """
    if resume is None or str(resume) == "":
        return None
    if str(resume) == "auto":
        if run_dir is None:
            raise ValueError("resume='auto' needs a run folder to look for last.pt in, got run_dir=None")
        candidate = Path(run_dir) / "last.pt"
        if candidate.is_file():
            logger.info("resume=auto: resuming from %s", candidate)
            return candidate
        logger.info("resume=auto: no checkpoint at %s, starting fresh", candidate)
        return None
    path = Path(resume).expanduser()
    if not path.is_file():
        raise FileNotFoundError(
            f"resume checkpoint not found: {path} (pass an existing .pt file, or 'auto' for <run_dir>/last.pt)"
        )
    return path


def get_rng_state() -> dict[str, Any]:
    """Captures the Python, NumPy, torch CPU and (if CUDA is initialized) current CUDA device RNG states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),  # noqa: NPY002 - the legacy global RNG is what user code draws from
        "torch": torch.get_rng_state(),
        "cuda": None,
    }
    # Only the current device: get_rng_state_all() would create a CUDA context on every GPU of every rank.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restores states captured by :func:`get_rng_state` (missing entries are skipped)."""
    if state.get("python") is not None:
        random.setstate(state["python"])
    if state.get("numpy") is not None:
        np.random.set_state(state["numpy"])  # noqa: NPY002
    if state.get("torch") is not None:
        torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") is not None:
        if torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"].cpu())
        else:
            logger.warning("checkpoint holds a CUDA RNG state but CUDA is not available: not restored")
