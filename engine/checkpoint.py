"""Checkpoints: atomic save, safe load, ``--resume auto|PATH`` resolution and RNG state capture.

Trust rule: every checkpoint the project loads goes through :func:`load_checkpoint`, which calls
``torch.load(..., weights_only=True)``: only tensors and plain Python containers, numbers and strings are read, and
nothing in the file can run code. :func:`save_checkpoint` writes our own training state in that form (NumPy RNG states
and NumPy scalars are converted to tensors and Python numbers first), so nothing the toolkit writes needs more. A file
that needs the full unpickler (a checkpoint from another tool, or one written before this rule) is refused with a
:class:`CheckpointError` naming the file; loading it anyway takes the explicit opt-in ``allow_pickle=True`` (the CLIs'
``--trust-checkpoint``), which unpickles and so may run any code the file holds: use it only for files you trust.
"""

from __future__ import annotations

import logging
import pickle
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.interrupt import critical
from measure.atomic import atomic_open

__all__ = [
    "CheckpointError",
    "check_best_agrees",
    "get_rng_state",
    "load_checkpoint",
    "resolve_resume",
    "save_checkpoint",
    "set_rng_state",
    "unwrap_state_dict",
]

logger = logging.getLogger(__name__)


#: Key prefixes that wrappers add to a state dict: DDP and timm's ``ModelEmaV3`` (``module.``), ``torch.compile``.
WRAPPER_PREFIXES = ("module.", "_orig_mod.")


class CheckpointError(RuntimeError):
    """A checkpoint file exists but cannot be read (corrupt, truncated, or not a torch checkpoint)."""


def _plain(value: Any) -> Any:
    """``value`` with NumPy arrays as tensors and NumPy scalars as Python numbers (what ``weights_only`` accepts)."""
    if isinstance(value, np.ndarray):
        return torch.from_numpy(np.ascontiguousarray(value))
    if isinstance(value, np.generic):
        return value.item()
    if type(value) is dict:  # not OrderedDict: a state_dict keeps its _metadata (and holds tensors only)
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_plain(v) for v in value)
    return value


def save_checkpoint(state: dict[str, Any], path: str | Path) -> None:
    """Saves ``state`` with ``torch.save`` atomically: temp file in the same folder, flush + fsync, ``os.replace``.

    NumPy values are converted first, so that :func:`load_checkpoint` reads the file with ``weights_only=True``.
    SIGINT / SIGTERM are held back until the file is complete (:func:`engine.interrupt.critical`).

    Args:
        state: The checkpoint dict.
        path: Destination, e.g. ``runs/<name>/last.pt``. A kill during the write leaves the previous file intact.

    Raises:
        CheckpointError: The write failed (typically a full disk); the previous file is intact.
    """
    if not isinstance(state, dict):
        raise TypeError(f"checkpoint state must be a dict, got {type(state).__name__}")
    path = Path(path)
    state = _plain(state)
    with critical():
        try:
            with atomic_open(path, "wb") as f:
                torch.save(state, f)
        except (OSError, RuntimeError) as e:
            raise CheckpointError(
                f"could not write {path} ({type(e).__name__}: {e}); is the disk full? The previous {path.name} is "
                "intact: free space and continue with --resume auto"
            ) from e


def load_checkpoint(
    path: str | Path, map_location: str | torch.device | None = "cpu", *, allow_pickle: bool = False
) -> dict[str, Any]:
    """Loads a checkpoint with ``torch.load(weights_only=True)`` (see the trust rule in the module docstring).

    Args:
        path: The checkpoint file.
        map_location: Where tensors go; ``"cpu"`` by default (RNG states must stay on the CPU).
        allow_pickle: Load a file that needs the full unpickler. Unpickling can run arbitrary code: only for files
            you trust (the CLIs' ``--trust-checkpoint``).

    Returns:
        The checkpoint dict.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointError: The file needs pickle (and ``allow_pickle`` is off), is corrupt or truncated, or does not
            hold a dict.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"checkpoint not found: {path}")
    try:
        state = torch.load(path, map_location=map_location, weights_only=not allow_pickle)
    except pickle.UnpicklingError as e:
        if allow_pickle:
            raise CheckpointError(f"checkpoint {path} is corrupt and cannot be unpickled ({e})") from e
        raise CheckpointError(
            f"checkpoint {path} holds objects that only the full unpickler can load, which can run arbitrary code "
            f"({_blocked(str(e))}); refused. If you trust the file, load it with --trust-checkpoint "
            "(engine.load_checkpoint(..., allow_pickle=True))"
        ) from e
    except Exception as e:
        raise CheckpointError(
            f"checkpoint {path} is corrupt or truncated and cannot be loaded ({type(e).__name__}: {e}); "
            "delete it, or resume from another checkpoint such as best.pt"
        ) from e
    if not isinstance(state, dict):
        raise CheckpointError(f"checkpoint {path} is corrupt: expected a dict, got {type(state).__name__}")
    return state


# What torch's weights-only unpickler names in its refusal, newest phrasing first (the rest of its text is advice).
_BLOCKED_PATTERNS = (
    r"GLOBAL (\S+) was not an allowed global",  # torch >= 2.4
    r"unsupported GLOBAL (\S+) whose module \S+ is blocked",  # os, sys, posix, nt: torch >= 2.4
    r"Unsupported class (\S+)",  # torch < 2.4
    r"unrecognized function (.+?)(?: which belongs to|$)",  # a REDUCE of a function allowed as a global
    r"but got (<class '[^']+'>)",  # NEWOBJ / BUILD of a class allowed as a global
)


def _blocked(message: str) -> str:
    """The global that a weights-only load refused, as ``"needs <name>"``, else torch's most specific line."""
    for pattern in _BLOCKED_PATTERNS:
        found = re.search(pattern, message, flags=re.MULTILINE)
        if found:
            return f"it needs {found.group(1).rstrip('.')}, which a weights-only load does not allow"
    lines = [line.strip() for line in message.splitlines() if line.strip() and "documentation" not in line]
    return lines[-1] if lines else "weights-only load refused it"


def check_best_agrees(last: dict[str, Any], best_path: str | Path, allow_pickle: bool = False) -> None:
    """Checks that ``best.pt`` is the checkpoint that ``last.pt`` (already loaded as ``last``) calls the best.

    ``best.pt`` is written before the ``last.pt`` that refers to it, so two states are consistent: ``best.pt`` holds
    ``last``'s ``best_epoch`` and ``best_metric``, or it holds the epoch right after ``last`` (a run stopped between
    the two writes). In the second case ``best.pt`` is the best there is, so ``last``'s ``best_epoch`` and
    ``best_metric`` are set to ``best.pt``'s, in place: the resumed run reports the best that ``best.pt`` holds and
    replaces it only with a better epoch, whether or not it replays that epoch (a resume with fewer epochs does not).
    Anything else means the files were mixed.

    Raises:
        CheckpointError: The two files disagree (the message names both).
    """
    best_path = Path(best_path)
    if not best_path.is_file():
        if last.get("best_metric") is not None:
            raise CheckpointError(
                f"last.pt records best {last.get('monitor')} = {last.get('best_metric')} at epoch "
                f"{last.get('best_epoch')}, but {best_path} is missing: the run folder is incomplete"
            )
        return
    best = load_checkpoint(best_path, allow_pickle=allow_pickle)
    same = best.get("epoch") == last.get("best_epoch") and best.get("best_metric") == last.get("best_metric")
    if same:
        return
    if best.get("epoch") == int(last["epoch"]) + 1 and best.get("best_epoch") == best.get("epoch"):
        logger.info(
            "%s holds epoch %s, one after last.pt (a stop between the two writes): its %s = %s is the run's best",
            best_path,
            best.get("epoch"),
            best.get("monitor"),
            best.get("best_metric"),
        )
        last["best_epoch"], last["best_metric"] = best["epoch"], best.get("best_metric")
        return
    raise CheckpointError(
        f"{best_path} (epoch {best.get('epoch')}, best {best.get('monitor')} = {best.get('best_metric')}) is not the "
        f"best checkpoint that last.pt records (epoch {last.get('best_epoch')}, {last.get('best_metric')}): the run "
        "folder holds checkpoints of different runs"
    )


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


def unwrap_state_dict(state_dict: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state_dict`` with the :data:`WRAPPER_PREFIXES` removed from its keys: the plain model's keys."""
    out = {}
    for key, value in state_dict.items():
        for prefix in WRAPPER_PREFIXES:
            key = key.removeprefix(prefix)
        out[key] = value
    return out


def get_rng_state() -> dict[str, Any]:
    """Captures the Python, NumPy, torch CPU and (if CUDA is initialized) current CUDA device RNG states."""
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": _numpy_state(),
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
        numpy_state = state["numpy"]
        if isinstance(numpy_state, dict):  # written by _numpy_state
            numpy_state = (
                numpy_state["bit_generator"],
                numpy_state["keys"].numpy().astype(np.uint32),
                numpy_state["pos"],
                numpy_state["has_gauss"],
                numpy_state["cached_gaussian"],
            )
        np.random.set_state(numpy_state)  # noqa: NPY002
    if state.get("torch") is not None:
        torch.set_rng_state(state["torch"].cpu())
    if state.get("cuda") is not None:
        if torch.cuda.is_available():
            torch.cuda.set_rng_state(state["cuda"].cpu())
        else:
            logger.warning("checkpoint holds a CUDA RNG state but CUDA is not available: not restored")


def _numpy_state() -> dict[str, Any]:
    """NumPy's legacy global RNG state as tensors and numbers (its ``get_state`` tuple holds an ndarray)."""
    name, keys, pos, has_gauss, cached = np.random.get_state()  # noqa: NPY002 - the global RNG user code draws from
    return {
        "bit_generator": str(name),
        "keys": torch.from_numpy(keys.astype(np.int64)),
        "pos": int(pos),
        "has_gauss": int(has_gauss),
        "cached_gaussian": float(cached),
    }
