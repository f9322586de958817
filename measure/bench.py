"""Benchmark utilities shared by the benches of every package (:mod:`attention.bench` and the domains' ``bench``
modules), the tools/bench_*.py scripts and the harness: timing, peak memory in a subprocess, op counts, profiles,
tables, targets and reports.

Benchmarks print ratios against a baseline measured in the same run; absolute times are meaningful only on an
otherwise idle machine (and only on a GPU for the GPU tables).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from measure.atomic import atomic_write_text

_logger = logging.getLogger(__name__)


def sync(device: torch.device | str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


# Graphs of one forward a bench run may compile: a bench builds a model per configuration (form, T, batch size,
# length, compile mode), and dynamo counts each instance's graph against the forward's code.
RECOMPILE_LIMIT = 64


def allow_recompiles(limit: int = RECOMPILE_LIMIT) -> None:
    """Raises dynamo's recompile limit to ``limit``: past it (8 by default) a compiled row of a bench would run eager
    with only a warning."""
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, limit)


def capture_graphs(module: torch.nn.Module, *sample_args: torch.Tensor) -> torch.nn.Module:
    """``module`` with its forward and backward captured whole into CUDA graphs
    (``torch.cuda.make_graphed_callables``: a few warm-up steps, then the capture, on a side stream; the module is
    changed in place and returned): a call copies its inputs into the graphs' static buffers and replays one graph
    forward and one backward, with no compiler and no guards, the least host work a step of eager kernels can take.
    A ``torch.compile`` wrapper (default mode, whose kernels run outside torch's cudagraph trees) is captured the same
    way: it compiles its forward and backward in the warm-up steps, and its replays run no guard either.

    Shapes, dtypes and ``requires_grad`` of the inputs are those of ``sample_args``, and the forward must not read
    values back (the package's input checks stand aside during a capture, :func:`attention.checks.checks_active`). A
    replay runs no Python: its inputs are never checked. The gradients it leaves in ``.grad`` are the graphs' own
    buffers, so set them to None between steps (``zero_grad(set_to_none=True)``) rather than summing over replays;
    and a module switched out of the train/eval mode it was captured in runs eagerly. The graphs' memory is taken at
    capture time and a replay allocates nothing, so the allocator's peak does not measure a replayed step."""
    return torch.cuda.make_graphed_callables(module, sample_args)


def capture_call(fn: Callable[..., Any], *sample_args: torch.Tensor, warmup: int = 3) -> Callable[..., Any]:
    """``fn`` (a call that records no autograd graph: inference under ``torch.no_grad``) captured whole into one CUDA
    graph: ``warmup`` (>= 1) calls on a side stream (a compiled ``fn`` compiles there; with ``cudnn.benchmark`` cuDNN
    picks its algorithms), then the capture, on copies of ``sample_args``. The returned callable copies its tensor
    arguments into those static inputs (a new batch each call, as a data loader would give; cudagraph trees copy
    their inputs too) and replays the graph: no Python of ``fn`` runs, no compiler guard and no cudagraph-tree
    bookkeeping, only the copies and one launch. It returns the output ``fn`` returned at capture, which the next
    replay overwrites. The graph holds its memory pool for as long as the returned callable lives.

    ``fn`` must not read values back to the host, and must enter autocast itself: casts cached by an autocast
    entered outside it would be freed under the graph (refused, as ``torch.cuda.make_graphed_callables`` does). A
    call with other shapes, strides (memory format), dtypes or devices than ``sample_args`` raises. For a train step
    (autograd) use :func:`capture_graphs`."""
    if warmup < 1:
        raise ValueError(f"capture_call needs warmup >= 1 (a compiled fn compiles before the capture), got {warmup}")
    if torch.is_autocast_enabled("cuda") and torch.is_autocast_cache_enabled():
        raise RuntimeError(
            "capture_call under an autocast with its cache enabled: enter autocast inside fn (or pass "
            "cache_enabled=False), so that no cast the graph reads is freed when the outer autocast exits"
        )
    if not all(isinstance(a, torch.Tensor) for a in sample_args):
        raise TypeError(f"capture_call takes tensors as sample_args, got {[type(a).__name__ for a in sample_args]}")
    static = [a.clone() for a in sample_args]  # the graph's inputs (clone keeps each one's memory format)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn(*static)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    failure: BaseException | None = None
    try:
        with torch.cuda.graph(graph):
            try:
                out = fn(*static)
            except Exception as e:  # ending the broken capture raises again: report fn's error, not that one
                failure = e
    except Exception:
        if failure is None:
            raise
    if failure is not None:
        raise RuntimeError(f"fn failed while being captured: {type(failure).__name__}: {failure}") from failure
    spec = [(tuple(s.shape), s.stride(), s.dtype, s.device) for s in static]

    def replay(*args: torch.Tensor) -> Any:
        got = [(tuple(a.shape), a.stride(), a.dtype, a.device) if isinstance(a, torch.Tensor) else a for a in args]
        if got != spec:
            raise ValueError(f"a captured call takes tensors of (shape, strides, dtype, device) {spec}, got {got}")
        for s, a in zip(static, args):
            s.copy_(a)
        graph.replay()
        return out

    return replay


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


def time_round_robin(
    fns: Sequence[Callable[[], object]], device: torch.device | str, repeats: int, warmup: int = 0
) -> list[list[float]]:
    """Wall times (ms) of each of ``fns``: ``warmup`` untimed calls of each, then ``repeats`` rounds that time one call
    of every fn in turn, so that a change in background load hits all of them alike."""
    for fn in fns:
        for _ in range(warmup):
            fn()
    sync(device)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(repeats):
        for t, fn in zip(times, fns):
            t.append(time_fn(fn, device, repeats=1, warmup=0))
    return times


def time_train_and_infer(
    prepared: Sequence[tuple[dict, Callable[[], object] | None, Callable[[], object]]],
    device: torch.device | str,
    batch: int,
    repeats: int,
    warmup: int,
    stat: str = "median",
    rate: str = "sps",
) -> list[dict]:
    """Times the train steps, then the inference calls, of ``prepared`` rows ``(row, train_step, infer)``
    round-robin (:func:`time_round_robin`), so that no timed call finds its model in the other mode, and adds to
    each row ``{train,infer}_ms`` (the median round, or the fastest with ``stat="min"``), ``{train,infer}_ms_rounds``
    (every round) and ``{train,infer}_<rate>`` (``batch`` samples per call; ``rate="ips"``: images). A row whose
    ``train_step`` is None is timed in inference only. Returns the rows."""
    results = [row for row, _, _ in prepared]
    for key, column in (("train", 1), ("infer", 2)):
        timed = [p for p in prepared if p[column] is not None]
        if not timed:
            continue
        for (r, *_), times in zip(timed, time_round_robin([p[column] for p in timed], device, repeats, warmup)):
            ms = min(times) if stat == "min" else statistics.median(times)
            r[f"{key}_ms"], r[f"{key}_ms_rounds"], r[f"{key}_{rate}"] = ms, times, batch / (ms / 1e3)
    return results


PROFILE_HEADERS = ["row", "ms", "device ms", "device busy", "device activities", "profile"]


def profile_step(
    step: Callable[[], object], device: torch.device | str, out_dir: str | os.PathLike, label: str, steps: int = 3
) -> dict:
    """Profiles ``steps`` calls of ``step`` (already warmed up) with ``torch.profiler`` and writes, in ``out_dir``:
    ``<label>.txt``, the ops by self device time (self CPU time on a CPU), and ``<label>.trace.json``, a Chrome trace
    (chrome://tracing, Perfetto).

    Returns per step ``{"device_ms", "device_activities", "table"}`` (:func:`device_totals`: the summed duration of
    the GPU's kernels, copies and memsets and their count, None on a CPU; ``table`` the text file's name), or
    ``{"error"}`` where profiling failed (the row's timing stands). Beside the step's wall time this says what bounds
    it: device time far below the wall time means launches and host work (what CUDA graphs and fusion remove), device
    time close to it means the GPU's work, and the table says which kernels."""
    from torch.profiler import ProfilerActivity, profile

    cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if cuda else [])]
    try:
        sync(device)
        with profile(activities=activities) as prof:
            for _ in range(steps):
                step()
            sync(device)
        os.makedirs(out_dir, exist_ok=True)
        sort = "self_device_time_total" if cuda else "self_cpu_time_total"
        table = f"{label}.txt"
        text = prof.key_averages().table(sort_by=sort, row_limit=60)
        atomic_write_text(os.path.join(out_dir, table), f"{label}: {steps} steps\n\n{text}\n")
        prof.export_chrome_trace(os.path.join(out_dir, f"{label}.trace.json"))
    except Exception as e:  # a profiler or file error costs the row its profile, not its timing
        _logger.warning("profiling %s failed: %s: %s", label, type(e).__name__, e)
        return {"error": f"{type(e).__name__}: {e}"[:200]}
    if not cuda:
        return {"device_ms": None, "device_activities": None, "table": table}
    total_us, count = device_totals(prof.events())
    return {"device_ms": total_us / 1e3 / steps, "device_activities": count / steps, "table": table}


def device_totals(events: Sequence[Any]) -> tuple[float, int]:
    """The summed duration (us) and the count of the GPU activities among a profile's ``events``: kernels, copies and
    memsets, not the spans of annotated regions (a compiled graph's ``## Call CompiledFxGraph ##``, which cover the
    kernels inside them and the gaps between). Activities on several streams add up: the sum can exceed the wall
    time of a step that overlaps them."""
    from torch.autograd import DeviceType

    on_device = [e for e in events if e.device_type == DeviceType.CUDA and not e.is_user_annotation]
    return sum(e.device_time_total for e in on_device), len(on_device)


def profile_rows(results: Sequence[dict], label: Callable[[dict], str], ms_key: str = "ms") -> list[list]:
    """Rows of :data:`PROFILE_HEADERS` for the results that carry a ``"profile"`` (:func:`profile_step`): each row's
    label, its timed ``ms_key``, the device time and its share of the step, and the activities per step (or the
    profiler's error)."""
    rows = []
    for r in results:
        p = r.get("profile")
        if not p:
            continue
        ms = r.get(ms_key)
        if "error" in p:
            rows.append([label(r), "-" if ms is None else ms, "-", "-", "-", f"error: {p['error'][:60]}"])
            continue
        device_ms = p["device_ms"]
        busy = device_ms / ms if device_ms is not None and ms else None
        activities = p["device_activities"]
        rows.append([label(r), *("-" if v is None else v for v in (ms, device_ms, busy, activities)), p["table"]])
    return rows


def add_profile_option(parser: object) -> None:
    """``--profile DIR``: after timing, each row's step under ``torch.profiler`` (:func:`profile_step`)."""
    parser.add_argument(  # type: ignore[attr-defined]
        "--profile",
        metavar="DIR",
        default=None,
        help="profile each row's step after timing it: an op table and a Chrome trace per row in DIR, and a table of "
        "device time against the step's time (what bounds it: launches or the GPU's work)",
    )


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


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched while it is active (autograd's backward ops included): ``counts[name]``.

    ``on_op(func, args, kwargs, out)``, when given, sees every op after it ran (where it was called from, what it
    computed). The one dispatch-level counter of the package: :func:`count_aten_ops` and
    :func:`engine.testing.host_syncs` are both this mode with different questions.

    Example::

        with OpCounter() as ops:
            model(x).sum().backward()
        ops.counts["mm"], ops.total
    """

    def __init__(self, on_op: Callable[[Any, tuple, dict, object], None] | None = None) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.on_op = on_op

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        self.counts[func.overloadpacket.__name__] += 1
        if self.on_op is not None:
            self.on_op(func, args, kwargs, out)
        return out


def largest_output_bytes(fn: Callable[[], object]) -> int:
    """The largest storage (bytes) that any aten op produces while ``fn()`` runs, backward ops included: a bound on
    the temporaries of a chunked path that no allocator's caching or pooling blurs."""
    largest = 0

    def see(func: Any, args: tuple, kwargs: dict, out: object) -> None:
        nonlocal largest
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor):
                largest = max(largest, t.untyped_storage().nbytes())

    with OpCounter(see):
        fn()
    return largest


def count_aten_ops(fn: Callable[[], object]) -> tuple[int, int]:
    """``(ops, view ops)``: how many aten ops ``fn()`` dispatches (autograd's backward ops included), and how many
    of them only make views (:data:`VIEW_OPS`).

    On a GPU every other op is (at least) one kernel launch, and a model whose kernels are small runs at the speed
    its host issues them (several microseconds each in eager PyTorch): this count is that cost. It can be taken on
    CPU, but it counts the path that device takes (CPU and CUDA differ in chunk budgets and backends: set those to
    CUDA's to predict a GPU's count). Host syncs (``_local_scalar_dense``: ``.item()``, ``bool(t)``) count too.
    """
    with OpCounter() as counter:
        fn()
    return counter.total, sum(n for name, n in counter.counts.items() if name in VIEW_OPS)


def run_config(measure: Callable[[dict], dict], payload: dict, isolate: bool, rss: bool = False) -> dict:
    """One configuration of a bench: ``measure(payload)`` in a fresh process (:func:`run_isolated`, ``rss`` passed on),
    or in this one, where an exception (e.g. CUDA running out of memory) becomes that row's ``{"error": ...}`` as a
    failed child process would.

    On CUDA a process per configuration buys nothing (the allocator reports the peak of each step) and costs seconds
    of start-up per row; on CPU the resident set is only clean in a fresh process.
    """
    if isolate:
        return run_isolated(measure, payload, rss)
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


def add_throughput_arguments(
    parser: argparse.ArgumentParser, batch: int, points: int, repeats: int, warmup: int, batches: bool = False
) -> None:
    """The flags the point-model throughput benches share (``tools/bench_modelnet.py``, ``tools/bench_partseg.py``),
    with that bench's defaults: device, batch (with ``batches``, one or more: a list), points per cloud, models
    (default: all), rounds, summary, AMP, threads and the JSON report."""
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    if batches:
        parser.add_argument("--batch", type=int, nargs="+", default=[batch], help="one table per batch size")
    else:
        parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--points", type=int, default=points)
    parser.add_argument("--models", nargs="+", default=None, help="subset of registered names (default: all)")
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--warmup", type=int, default=warmup, help="untimed calls before timing")
    parser.add_argument("--stat", default="median", choices=["median", "min"],
                        help="summary of the rounds; min resists background load on a shared machine")  # fmt: skip
    parser.add_argument("--amp", action="store_true", help="bf16 autocast (CUDA only)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")


def isolate_configs(option: str, device: str) -> bool:
    return option == "yes" or (option == "auto" and torch.device(device).type != "cuda")


# the child of run_isolated: imports the measure function by its module and name, prints its result as JSON
_CHILD = (
    "import importlib, json, sys; measure = getattr(importlib.import_module(sys.argv[1]), sys.argv[2]); "
    "print(json.dumps(measure(json.loads(sys.argv[3]))))"
)


def run_isolated(measure: Callable[[dict], dict], payload: dict, rss: bool = False) -> dict:
    """``measure(payload)`` in a fresh Python process: the JSON-able dict it returns, or ``{"error": ...}`` with the
    last line the child wrote to stderr.

    Peak CPU memory of one configuration can only be read cleanly in a process that ran nothing else. ``measure``
    must be a module-level function of an importable module (the child imports it by name) that takes and returns
    JSON-able dicts. ``rss``: ``measure`` reads the resident set (:func:`peak_rss_bytes`), so the child's allocator
    returns freed memory to the OS at once.
    """
    module, name = measure.__module__, measure.__qualname__
    if module == "__main__" or "." in name:
        raise ValueError(f"run_isolated needs a module-level function of an importable module, got {module}.{name}")
    # A fixed mmap threshold makes glibc return every freed block above 64 KiB to the OS at once, so the resident
    # set follows the live tensors instead of keeping freed ones cached (which would hide later peaks). It makes every
    # such allocation a fresh mapping, which slows allocation-heavy steps (3x for the chunked Vandermonde mixer in
    # tools/bench_mixers.py), so only a measure that reads the resident set asks for it.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536"} if rss else None
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, module, name, json.dumps(payload)],
        capture_output=True,
        text=True,
        check=False,
        env=env,
    )
    if out.returncode != 0:
        return {"error": (out.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def markdown_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A Markdown table (pasteable into docs/benchmarks.md); floats to 3 significant figures (integers above 100), and
    ``-`` for NaN (a value not measured, e.g. a ratio whose baseline ran out of memory)."""

    def fmt(v: object) -> str:
        if isinstance(v, float) and math.isnan(v):
            return "-"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 100 else f"{v:.0f}"
        return str(v)

    cells = [[fmt(v) for v in r] for r in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) for i, h in enumerate(headers)]
    lines = ["| " + " | ".join(h.ljust(w) for h, w in zip(headers, widths)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    lines += ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |" for r in cells]
    return "\n".join(lines)


def print_table(
    headers: Sequence[str],
    rows: Sequence[Sequence[object]],
    tables: list[dict] | None = None,
    title: str | None = None,
) -> None:
    """Prints :func:`markdown_table` (for the bench scripts; the library itself never prints).

    Args:
        headers: column names.
        rows: the table's rows.
        tables: where given, the table is also appended to it as ``{"title", "headers", "rows"}``: the list a
            bench passes to :func:`finish`, so that its ``--json`` holds every table it printed.
        title: the table's heading, printed as ``## title`` above it.
    """
    if title is not None:
        print(f"## {title}\n")
    print(markdown_table(headers, rows))
    if tables is not None:
        tables.append({"title": title, "headers": list(headers), "rows": [list(r) for r in rows]})


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


# ------------------------------------------------------------------------------------------------ targets, reports

_COMPARE = {">=": float.__ge__, ">": float.__gt__, "<=": float.__le__, "<": float.__lt__}


def target(
    name: str,
    measured: float | None,
    op: str,
    threshold: float,
    *,
    device: torch.device | str,
    on: str | None = None,
    detail: str = "",
    unit: str = "x",
) -> dict:
    """One acceptance target of a bench: is ``measured op threshold``, ``measured`` a ratio of two rows of one run?

    Args:
        name: what is compared with what, e.g. ``"Triton fps vs torch-cluster (B=32 N=1024 M=512)"``.
        measured: the ratio; ``None`` (or NaN) where a row or its baseline was not measured: no verdict, and
            ``detail`` says why.
        op: one of ``>=``, ``>``, ``<=``, ``<``.
        device: where the ratio was measured.
        on: the device type the threshold is for (``"cuda"``: a CPU run reports the ratio with no verdict).
        unit: printed after the threshold (``"x"`` for a speedup, ``""`` for a fraction).

    Returns:
        ``{"target", "wanted", "op", "threshold", "measured", "met", "verdict", "detail"}``, with ``met`` True,
        False or None (``verdict`` "MET", "NOT MET" or "no verdict"): what a bench writes under ``"targets"`` in
        its ``--json`` and what ``tools/gpu_check.py`` gathers into its summary.
    """
    if op not in _COMPARE:
        raise ValueError(f"op must be one of {sorted(_COMPARE)}, got {op!r}")
    if measured is not None and math.isnan(measured):
        measured = None
    notes = [detail] if detail else []
    met = None if measured is None else _COMPARE[op](float(measured), float(threshold))
    if met is not None and on is not None and torch.device(device).type != on:
        met = None
        notes.append(f"no verdict: the target is for {on.upper()}")
    verdict = {True: "MET", False: "NOT MET"}.get(met, "no verdict")
    return {"target": name, "wanted": f"{op} {threshold:.3g}{unit}", "op": op, "threshold": threshold,
            "measured": measured, "met": met, "verdict": verdict, "detail": "; ".join(notes)}  # fmt: skip


def format_target(t: dict) -> str:
    """One line per target, as the benches print them under their tables."""
    measured = "not measured" if t["measured"] is None else f"{t['measured']:.3g}"
    detail = f"; {t['detail']}" if t["detail"] else ""
    return f"target: {t['target']} {t['wanted']}: {t['verdict']} ({measured}{detail})"


def finish(
    tool: str,
    device: torch.device | str,
    args: Any,
    targets: list[dict],
    *,
    argv: Sequence[str] | None = None,
    **payload: object,
) -> None:
    """The end of every bench script: a blank line, each target's verdict line (:func:`format_target`), and with
    ``args.json`` the report (:func:`write_report`, the script's flags as ``args``, its command line from ``argv``,
    default ``sys.argv[1:]``; ``payload`` holds ``results`` and the printed ``tables``)."""
    print()
    for t in targets:
        print(format_target(t))
    if getattr(args, "json", None):
        write_report(args.json, tool, device, vars(args), argv=argv, **payload, targets=targets)


def write_report(
    path: str | os.PathLike,
    tool: str,
    device: torch.device | str,
    args: dict,
    *,
    argv: Sequence[str] | None = None,
    **payload: object,
) -> None:
    """A bench's ``--json``, written atomically: ``{"tool", "command", "commit", "machine", "args", **payload}``.

    ``command`` is ``python tools/<tool>.py`` with ``argv`` (default ``sys.argv[1:]``), ``commit`` the checkout's
    ``git`` commit (None outside a git checkout), ``machine`` :func:`describe_machine`. ``payload`` holds the bench's
    ``results`` (the rows), its ``targets`` (:func:`target`), the ``tables`` it printed (:func:`print_table`), and
    whatever else that bench reports. ``tools/docs_benchmarks.py`` renders these files into docs/benchmarks.md
    (:mod:`measure.report`).
    """
    argv = sys.argv[1:] if argv is None else argv
    head = {
        "tool": tool,
        "command": shlex.join(["python", f"tools/{tool}.py", *argv]),
        "commit": git_commit(),
        "machine": describe_machine(device),
        "args": args,
    }
    atomic_write_text(path, json.dumps({**head, **payload}, indent=2, default=str) + "\n")


def git_commit(root: str | os.PathLike | None = None) -> str | None:
    """The short commit hash of the checkout ``root`` (default: the one this package runs from), with ``+dirty`` when
    tracked files outside ``docs/`` have uncommitted changes (a report written into ``docs/`` is not a change of the
    code it measures); None where git or the checkout is missing."""
    root = os.fspath(root) if root is not None else os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    try:
        head = subprocess.run(["git", "-C", root, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True, timeout=10).stdout.strip()  # fmt: skip
        status = ["git", "-C", root, "status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)docs"]
        dirty = subprocess.run(status, capture_output=True, text=True, check=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "") if head else None
