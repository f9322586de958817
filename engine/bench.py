"""Benchmark utilities shared by the tools/bench_*.py scripts: timing, peak memory in a subprocess, and tables.

Benchmarks print ratios against a baseline measured in the same run; absolute times are meaningful only on an
otherwise idle machine (and only on a GPU for the GPU tables).
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence

import torch


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def time_fn(fn: Callable[[], object], device: torch.device | str, repeats: int = 5, warmup: int = 1) -> float:
    """Median wall time of ``fn`` in milliseconds, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        sync(device)
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def current_rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()


def peak_rss_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux reports KiB


def peak_tensor_bytes(fn: Callable[[], object], device: torch.device | str, *track: object) -> int:
    """Peak bytes of live tensors while ``fn()`` runs: everything ``fn`` allocates plus the tensors of ``track``.

    On CUDA: ``torch.cuda.max_memory_allocated`` after a reset (all tensors on the device, ``track`` ignored). On CPU:
    PyTorch's ``MemTracker`` (``torch.distributed._tools.mem_tracker``), which counts tensor storages as they are
    allocated and freed: exact and repeatable, unlike the resident set, which the allocator's caching and other
    processes blur. ``track`` (modules, optimizers) adds their parameters, gradients, buffers and states, which
    exist before ``fn`` and would otherwise not be counted. Sparse tensors count as their index and value tensors.
    """
    device = torch.device(device)
    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        fn()
        sync(device)
        return torch.cuda.max_memory_allocated(device)
    from torch.distributed._tools import mem_tracker

    dense_storages = mem_tracker.get_untyped_storages

    def storages(t: torch.Tensor) -> set:
        # The tracker asks every tensor for its storage, which sparse tensors do not have: count their parts.
        if t.layout == torch.sparse_csr:
            return set().union(*(dense_storages(p) for p in (t.crow_indices(), t.col_indices(), t.values())))
        if t.layout == torch.sparse_coo:
            return set().union(*(dense_storages(p) for p in (t._indices(), t._values())))
        return dense_storages(t)

    tracker = mem_tracker.MemTracker()
    if track:
        tracker.track_external(*track)
    mem_tracker.get_untyped_storages = storages
    try:
        with tracker:
            fn()
    finally:
        mem_tracker.get_untyped_storages = dense_storages
    return int(tracker.get_tracker_snapshot("peak")[device]["Total"])


# aten ops that only make a new view or alias: no kernel on any device, but each still costs a dispatch
VIEW_OPS = frozenset(
    {"view", "_unsafe_view", "unsqueeze", "squeeze", "t", "transpose", "permute", "slice", "select", "detach",
     "expand", "alias", "as_strided", "_reshape_alias", "unbind", "split", "split_with_sizes", "narrow",
     "view_as_real", "view_as_complex", "unfold", "diagonal", "lift_fresh"}
)  # fmt: skip


def count_aten_ops(fn: Callable[[], object]) -> tuple[int, int]:
    """``(ops, view ops)``: how many aten ops ``fn()`` dispatches (autograd's backward ops included), and how many
    of them only make views (:data:`VIEW_OPS`).

    On a GPU every other op is (at least) one kernel launch, and a model whose kernels are small runs at the speed
    its host issues them (several microseconds each in eager PyTorch): this count is that cost. It can be taken on
    CPU, but it counts the path that device takes (CPU and CUDA differ in chunk budgets and backends: set those to
    CUDA's to predict a GPU's count). Host syncs (``_local_scalar_dense``: ``.item()``, ``bool(t)``) count too.
    """
    from torch.utils._python_dispatch import TorchDispatchMode

    class _Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops = self.views = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops += 1
            self.views += func.overloadpacket.__name__ in VIEW_OPS
            return func(*args, **(kwargs or {}))

    with _Count() as counter:
        fn()
    return counter.ops, counter.views


def run_config(module_file: str, measure: Callable[[dict], dict], payload: dict, isolate: bool) -> dict:
    """One configuration of a bench: :func:`run_isolated` (``module_file --child``), or ``measure(payload)`` in this
    process, where an exception (e.g. CUDA running out of memory) becomes that row's ``{"error": ...}`` as a failed
    child process would.

    On CUDA a process per configuration buys nothing (the allocator reports the peak of each step) and costs seconds
    of start-up per row; on CPU the resident set is only clean in a fresh process.
    """
    if isolate:
        return run_isolated(module_file, payload)
    try:
        return measure(payload)
    except Exception as e:  # the row reports its error; the other rows still run
        return {"error": f"{type(e).__name__}: {e}"}
    finally:
        try:
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
        except RuntimeError:  # after a fatal CUDA error this raises too: keep the row's own error (later rows fail)
            pass


def add_isolate_option(parser: object) -> None:
    """``--isolate {auto,yes,no}``: a fresh process per configuration (auto: on CPU, not on CUDA)."""
    parser.add_argument(  # type: ignore[attr-defined]
        "--isolate",
        choices=["auto", "yes", "no"],
        default="auto",
        help="a fresh process per configuration (auto: yes on CPU, where peak memory needs it; no on CUDA)",
    )


def isolate_configs(option: str, device: str) -> bool:
    return option == "yes" or (option == "auto" and torch.device(device).type != "cuda")


def run_isolated(module_file: str, payload: dict) -> dict:
    """Runs ``python module_file --child JSON`` in a fresh process and returns the JSON it prints last.

    Peak CPU memory of one configuration can only be read cleanly in a process that ran nothing else.
    """
    # A fixed mmap threshold makes glibc return every freed block above 64 KiB to the OS at once, so the resident
    # set follows the live tensors instead of keeping freed ones cached (which would hide later peaks).
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"}
    out = subprocess.run(
        [sys.executable, module_file, "--child", json.dumps(payload)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def print_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    """Prints a Markdown table (pasteable into docs/benchmarks.md)."""

    def fmt(v: object) -> str:
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    cells = [[fmt(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    print("| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |")
    print("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells:
        print("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")


def describe_machine(device: torch.device | str) -> str:
    dev = torch.device(device)
    what = torch.cuda.get_device_name(dev) if dev.type == "cuda" else f"{platform.processor() or 'cpu'}"
    return (
        f"torch {torch.__version__}, {what}, {torch.get_num_threads()} CPU threads, python {platform.python_version()}"
    )


def unit_sphere_clouds(batch: int, num_points: int, seed: int = 0) -> torch.Tensor:
    """``(B, N, 3)`` Gaussian clouds centred and scaled to max norm 1, like the data pipeline's clouds.

    Radius-based grouping (PointNet++) drops neighbours by distance, so its cost depends on the cloud's scale.
    """
    x = torch.randn(batch, num_points, 3, generator=torch.Generator().manual_seed(seed))
    x = x - x.mean(1, keepdim=True)
    return x / x.norm(dim=-1).amax(1).view(-1, 1, 1)
