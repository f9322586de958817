"""Helpers shared by the test suite (like ``torch_geometric.testing``): load a CLI, run it, kill it, read its run.

Tests import these instead of editing ``sys.path``; nothing in the library imports this module.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

from engine.trainer import TIMING_KEYS

__all__ = [
    "REPO",
    "TINY_DEIT_SETS",
    "free_port",
    "host_syncs",
    "load_tool",
    "read_log",
    "start_tool",
    "stop_after_first_checkpoint",
    "strip_timing",
    "tool_env",
    "torchrun",
    "write_imagefolder",
]

# A 32 px centroid DeiT (4 x 4 patches -> 2 x 2 centroids), 4 classes x 8 images, with the parts of DeiT's recipe that
# the main job leaves off (RandAugment, random erasing, mixup + cutmix, EMA): train_deit tests' --set values.
TINY_DEIT_SETS = (
    "img_size=32",
    "synthetic_image_size=32",
    "embed_dim=32",
    "depth=2",
    "num_heads=2",
    "centroid_index=1",
    "synthetic_classes=4",
    "synthetic_train_per_class=8",
    "synthetic_val_per_class=4",
    "batch_size=8",
    "eval_batch_size=16",
    "auto_augment=rand-m9-mstd0.5-inc1",
    "reprob=0.25",
    "mixup=0.8",
    "cutmix=1.0",
    "model_ema=true",
    "model_ema_decay=0.9",
    "warmup_epochs=1",
)

REPO = Path(__file__).resolve().parents[1]

# aten ops whose result the host must read (a value, or a data-dependent size): on CUDA each waits for the GPU
SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim",
                      "unique_consecutive", "equal", "is_nonzero", "repeat_interleave"})  # fmt: skip


# the counter's own frames, never the caller of a sync
_NOT_CALLERS = (__file__, str(REPO / "engine" / "bench.py"))


def host_syncs(fn: Any) -> dict[str, int]:
    """``{"op at file:line": count}`` of the :data:`SYNC_OPS` that ``fn()`` dispatches, on any device.

    A CPU stand-in for ``torch.cuda.set_sync_debug_mode("error")``, not a replacement: it sees the ops dispatched,
    so it misses syncs made inside another op (boolean-mask indexing ``x[mask]`` runs its ``nonzero`` below the
    dispatcher) and copies to the host (``.cpu()``, ``.tolist()``); ``repeat_interleave`` counts even with an int
    repeat, where it would not sync. The ``gpu`` tests with the sync debug mode are the real check.
    """
    import traceback
    from collections import Counter

    from engine.bench import OpCounter

    found: Counter = Counter()

    def where(func: Any, args: tuple, kwargs: dict, out: object) -> None:
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            ours = [f for f in traceback.extract_stack() if f.filename.startswith(str(REPO)) and "site-packages"
                    not in f.filename and f.filename not in _NOT_CALLERS]  # fmt: skip
            at = f"{Path(ours[-1].filename).relative_to(REPO)}:{ours[-1].lineno}" if ours else "?"
            found[f"{name} at {at}"] += 1

    with OpCounter(on_op=where):
        fn()
    return dict(found)


class _ToolsFinder(importlib.abc.MetaPathFinder):
    """Finds ``tools/<name>.py`` for a top-level import (the scripts import their siblings, e.g. ``benchutil``)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        file = REPO / "tools" / f"{fullname}.py"
        if "." in fullname or not file.is_file():
            return None
        return importlib.util.spec_from_file_location(fullname, file)


def load_tool(name: str) -> ModuleType:
    """Imports ``tools/<name>.py`` as the module ``name`` (cached), without putting ``tools/`` on ``sys.path``.

    The scripts in ``tools/`` import their siblings as top-level modules (``from benchutil import ...``), as they do
    when run as ``python tools/x.py``; a finder that knows only ``tools/*.py`` (appended to ``sys.meta_path``, so it
    never shadows an installed module) resolves those imports.
    """
    if not any(isinstance(f, _ToolsFinder) for f in sys.meta_path):
        sys.meta_path.append(_ToolsFinder())
    if not (REPO / "tools" / f"{name}.py").is_file():
        raise ImportError(f"no tool named {name!r} in {REPO / 'tools'}")
    return importlib.import_module(name)


def strip_timing(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` without the wall-time keys (:data:`engine.TIMING_KEYS`) that differ between identical runs."""
    return {k: v for k, v in record.items() if k not in TIMING_KEYS}


def read_log(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/log.jsonl``, parsed strictly (a bare ``NaN`` fails)."""
    lines = (Path(run_dir) / "log.jsonl").read_text().splitlines()
    return [json.loads(line, parse_constant=_reject_constant) for line in lines if line.strip()]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def tool_env() -> dict[str, str]:
    """The environment for a CLI subprocess: this checkout first on ``PYTHONPATH``, one thread."""
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}


def start_tool(name: str, args: list[str]) -> subprocess.Popen:
    """Starts ``python tools/<name>.py args`` with its stderr captured as text."""
    cmd = [sys.executable, str(REPO / "tools" / f"{name}.py"), *args]
    return subprocess.Popen(cmd, env=tool_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def stop_after_first_checkpoint(
    proc: subprocess.Popen, run_dir: Path, sig: int = signal.SIGKILL, timeout: float = 300
) -> str:
    """Sends ``sig`` to ``proc`` once ``run_dir`` has a ``last.pt`` and a log line; returns its stderr.

    Raises:
        AssertionError: The run ended before it could be stopped (make it longer) or never wrote a checkpoint.
    """
    deadline = time.time() + timeout
    run_dir = Path(run_dir)
    while time.time() < deadline and proc.poll() is None:
        log = run_dir / "log.jsonl"
        if (run_dir / "last.pt").is_file() and log.is_file() and log.read_text().strip():
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be stopped: make it longer"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return err


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(name: str, args: list[str], nproc: int = 2, timeout: float = 300) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node nproc tools/<name>.py args`` on CPU (gloo), output captured."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), str(REPO / "tools" / f"{name}.py"), *args,
    ]  # fmt: skip
    return subprocess.run(cmd, env=tool_env(), capture_output=True, text=True, timeout=timeout)


def write_imagefolder(
    root: Path, classes: tuple[str, ...] = ("n01", "n02", "n03"), train_per_class: int = 4, val_per_class: int = 2
) -> Path:
    """A tiny ImageNet-layout tree (``root/{train,val}/<class>/<image>``) of real 40 px image files, JPEG for even
    classes and PNG for odd ones; each class has its own colour, each image its own noise."""
    import numpy as np
    from PIL import Image

    for split, count in (("train", train_per_class), ("val", val_per_class)):
        for c, name in enumerate(classes):
            folder = Path(root) / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                rng = np.random.default_rng([c, i, len(split)])
                colour = np.array([(c * 97) % 256, (c * 53 + 80) % 256, (c * 31 + 160) % 256], dtype=np.float64)
                pixels = np.clip(colour + rng.normal(0, 20, (40, 40, 3)), 0, 255).astype(np.uint8)
                ext = "JPEG" if c % 2 == 0 else "png"
                Image.fromarray(pixels).save(folder / f"{name}_{i}.{ext}")
    return Path(root)
