"""Benchmarks of the shared core: the point ops (``tools/bench_points.py``), centroid attention
(``tools/bench_centroid.py``), the sequence mixers (``tools/bench_mixers.py``), the Triton kernels against the torch
paths they replace (``tools/gpu_check.py``), and the targets those runs declare.

Every target is a ratio of two rows measured in the same run (:func:`measure.bench.target`): a speedup of a kernel
over the path it replaces, never an absolute time, so that it reads the same on a busy machine. The thresholds are
CUDA figures: a CPU run reports the ratios with no verdict. The exception is the KNN search's memory
(:func:`knn_memory_targets`): a peak resident set on CPU, which load on the machine does not change. The scripts
print the tables; the functions here measure and return rows (progress goes to this module's logger).
"""

from __future__ import annotations

import importlib.util
import itertools
import logging
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor

from measure.bench import (
    allow_recompiles,
    capture_graphs,
    current_rss_bytes,
    peak_rss_bytes,
    peak_tensor_bytes,
    profile_step,
    run_config,
    run_isolated,
    target,
    time_fn,
    time_round_robin,
    unit_sphere_clouds,
)

from . import backends, points
from .centroid import CentroidAttention, attention_step_reference
from .centroid import functional as centroid_functional
from .chunking import chunk_budget
from .mixers import build_mixer
from .mixers import functional as mixer_functional
from .points import farthest_point_sample

__all__ = [
    "BENCH_MIXERS",
    "CENTROID_HEADERS",
    "CENTROID_PATHS",
    "CENTROID_TARGET_POINTS",
    "FPS_CLUSTER_SHAPE",
    "FPS_CLUSTER_TARGET",
    "FPS_HEADERS",
    "FSAT_MIN_LEN",
    "GRID_POINTS",
    "KERNEL_MIXERS",
    "KERNEL_TARGETS",
    "KNN_HEADERS",
    "KNN_KERNEL_BATCH",
    "KNN_KERNEL_HEADERS",
    "KNN_KERNEL_PRESETS",
    "KNN_MEMORY_CALLS",
    "KNN_MEMORY_HEADERS",
    "KNN_MEMORY_MAX_GROWTH_MB",
    "KNN_MEMORY_SHAPE",
    "KNN_MEMORY_TARGET_GB",
    "LARGE_CLOUDS",
    "LARGE_HEADERS",
    "MIXER_BASELINES",
    "QUADRATIC_MIXERS",
    "backend_flags",
    "centroid_path_skipped",
    "centroid_results",
    "centroid_rows",
    "centroid_targets",
    "fps_backends",
    "fps_cluster_target",
    "fsat_target",
    "kernel_targets",
    "knn_kernel_fastest",
    "knn_kernel_rows",
    "knn_kernel_shapes",
    "knn_kernel_table",
    "knn_memory_row",
    "knn_memory_sizes",
    "knn_memory_targets",
    "large_cloud_rows",
    "large_clouds",
    "measure_centroid",
    "measure_knn_memory",
    "measure_mixer",
    "mixer_kernel_targets",
    "mixer_path",
    "mixer_rows",
    "mixer_table",
    "numba_first_call_ms",
    "point_op_rows",
    "points_results",
    "triton_kernels",
]

_logger = logging.getLogger(__name__)

KERNEL_TARGETS = {"fps": 2.0, "cauchy": 5.0, "vandermonde": 5.0}  # Triton speedup over the torch path, on CUDA
FPS_CLUSTER_SHAPE = (32, 1024, 512)  # (B, N, M) of the FPS target against torch-cluster's FPS
FPS_CLUSTER_TARGET = 2.0  # Triton FPS speedup over torch-cluster's, on CUDA
FSAT_MIN_LEN = 16384  # FSAT must beat SDPA from this sequence length on


def backend_flags() -> dict[str, bool]:
    """Which optional point-op packages the switchboard found (``HAS_TORCH_CLUSTER``, ...)."""
    return {
        k: getattr(backends, k) for k in ("HAS_TORCH_CLUSTER", "HAS_PYTORCH3D", "HAS_TRITON") if hasattr(backends, k)
    }


def triton_kernels(device: str, quick: bool) -> dict:
    """The Triton kernels against the torch paths they replace, in one process: FPS (B=32, N=1024, M=512 on CUDA)
    and the Cauchy / Vandermonde mixers (L = 4096, forward + backward); smaller shapes on CPU, where Triton does not
    run and only the torch column is timed.

    Returns:
        ``{"device", "rows", "targets"}``: one row per kernel (``torch_ms``, ``triton_ms``, ``speedup``, ``note``)
        and :func:`kernel_targets`.
    """
    cuda = device == "cuda"
    triton_ok = cuda and importlib.util.find_spec("triton") is not None
    why = "" if triton_ok else ("needs CUDA" if not cuda else "triton missing")
    repeats = 5 if quick else 10

    def ms(fn) -> float:
        return time_fn(fn, device, repeats=repeats, warmup=2)

    rows = []
    B, N, M = FPS_CLUSTER_SHAPE if cuda else (4, 256, 128)
    x = torch.rand(B, N, 3, device=device, generator=None)
    start = torch.zeros(B, dtype=torch.long, device=device)
    ref_ms = ms(lambda: farthest_point_sample(x, M, start=start, backend="torch"))
    row = {"kernel": "fps", "shape": f"B={B} N={N} M={M}", "torch_ms": ref_ms}
    if triton_ok:
        same = torch.equal(
            farthest_point_sample(x, M, start=start, backend="triton"),
            farthest_point_sample(x, M, start=start, backend="torch"),
        )
        t = ms(lambda: farthest_point_sample(x, M, start=start, backend="triton"))
        row.update(triton_ms=t, speedup=ref_ms / t, same=same)
    rows.append(row)
    L, H, D = (4096, 4, 64) if cuda else (256, 2, 16)
    for kind in ("cauchy", "vandermonde"):
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, H, L, D, device=device, requires_grad=True) for _ in range(3))

        def step(backend: str, kind=kind, q=q, k=k, v=v) -> None:
            if kind == "cauchy":
                out = mixer_functional.cauchy_mix(q.exp() + 1, k.exp() + 1, v, backend=backend)
            else:
                out = mixer_functional.vandermonde_mix(q, k, v, 1e-3, backend=backend)
            out.sum().backward()

        ref_ms = ms(lambda step=step: step("torch"))
        row = {"kernel": kind, "shape": f"B=1 H={H} L={L} D={D} fwd+bwd", "torch_ms": ref_ms}
        if triton_ok:
            t = ms(lambda step=step: step("triton"))
            row.update(triton_ms=t, speedup=ref_ms / t)
        rows.append(row)
    for r in rows:
        r.setdefault("triton_ms", None)
        r.setdefault("speedup", None)
        if not triton_ok:
            r["note"] = f"triton not timed: {why}"
    return {"device": device, "rows": rows, "targets": kernel_targets(rows, device)}


def kernel_targets(rows: Sequence[dict], device: str) -> list[dict]:
    """Each Triton kernel's speedup over the torch path (:data:`KERNEL_TARGETS`), from :func:`triton_kernels`' rows;
    no verdict for a kernel that was not timed (the row's note says why)."""
    by_kernel = {r["kernel"]: r for r in rows}
    out = []
    for kernel, want in KERNEL_TARGETS.items():
        r = by_kernel.get(kernel, {})
        name = f"Triton {kernel} vs torch ({r.get('shape', '-')})"
        detail = r.get("note", "") if r else "row not measured"
        out.append(target(name, r.get("speedup"), ">=", want, device=device, on="cuda", detail=detail))
    return out


def fps_cluster_target(fps_rows: Sequence[dict], device: str) -> dict:
    """Triton FPS against torch-cluster's at :data:`FPS_CLUSTER_SHAPE`, from ``tools/bench_points.py``'s FPS rows
    (``{"B", "N", "M", "backend", "speedup vs cluster", ...}``: NaN where torch-cluster is missing)."""
    B, N, M = FPS_CLUSTER_SHAPE
    name = f"Triton fps vs torch-cluster (B={B} N={N} M={M})"
    rows = [r for r in fps_rows if r["backend"] == "triton" and (r["B"], r["N"], r["M"]) == FPS_CLUSTER_SHAPE]
    if not rows:
        return target(name, None, ">=", FPS_CLUSTER_TARGET, device=device, on="cuda", detail="row not measured")
    speedup = rows[0]["speedup vs cluster"]
    missing = speedup is None or speedup != speedup  # NaN: no torch-cluster row to divide by
    detail = "torch-cluster not installed" if missing else ""
    return target(name, None if missing else speedup, ">=", FPS_CLUSTER_TARGET, device=device, on="cuda",
                  detail=detail)  # fmt: skip


def _at_batch(batch: int | None) -> str:
    """A target name's batch, for runs at several batch sizes (``tools/bench_mixers.py --batch 1 8``)."""
    return "" if batch is None else f", B = {batch}"


def fsat_target(results: Sequence[dict], device: str, batch: int | None = None) -> dict:
    """FSAT's time as a fraction of SDPA's at the longest measured L >= :data:`FSAT_MIN_LEN`, from
    ``tools/bench_mixers.py``'s rows (``{"L", "mixer", "speedup vs attention-sdpa", ...}``): < 1 is faster.
    ``batch``, where given, goes into the name."""
    name = f"FSAT time vs SDPA at L >= {FSAT_MIN_LEN // 1024}K (fraction{_at_batch(batch)})"
    rows = [r for r in results if r["mixer"] == "fsat" and r["L"] >= FSAT_MIN_LEN]
    if not rows:
        return target(name, None, "<", 1, device=device, on="cuda", unit="", detail=f"L = {FSAT_MIN_LEN} not measured")
    r = rows[-1]
    speedup = r.get("speedup vs attention-sdpa")
    if not speedup:
        detail = f"L = {r['L']}: {r.get('error', 'no SDPA baseline')}"
        return target(name, None, "<", 1, device=device, on="cuda", unit="", detail=detail)
    return target(name, 1 / speedup, "<", 1, device=device, on="cuda", unit="", detail=f"L = {r['L']}")


# FSAT and Hydra with their fused kernels, on CUDA at B = 1 and 8 (bench_mixers' rows; each a fraction of a baseline)
FSAT_MAX_TIME_VS_MATMUL_4K = 0.4  # the paper's 2.5x speed at 4K tokens
FSAT_MAX_MEMORY_VS_MATMUL_4K = 0.16  # and its 0.16x peak memory there
FSAT_BEATS_SDPA_FROM = 8192
HYDRA_BEATS_SDPA_FROM = 4096
HYDRA_MAX_GROWTH_8K_TO_16K = 2.2  # time 16K / 8K: linear in L, up to noise


def _measured(row: dict, key: str) -> bool:
    """Whether ``row`` measured ``key``: a time always, a memory ratio unless None or NaN (a CUDA-graph row's)."""
    value = row.get(key)
    return not key.startswith("memory") or (value is not None and not math.isnan(value))


def mixer_kernel_targets(results: Sequence[dict], device: str, batch: int | None = None) -> list[dict]:
    """The targets of the fused FSAT and Hydra kernels, from ``tools/bench_mixers.py``'s rows of ``fsat`` and
    ``hydra`` (what "auto" runs; each row's ``path`` names the backend), or of their ``-fused-compiled``,
    ``-fused-graphs``, ``-fused-captured`` and ``-fused-compiled-captured`` rows where those ran faster (the detail
    names the row): FSAT's time and peak memory as fractions of vanilla attention's at 4K, FSAT's and Hydra's time
    as fractions of SDPA's from 8K / 4K on (the largest), and Hydra's time growth from 8K to 16K. No verdict for a
    row not measured (the detail says which). ``batch``, where given, goes into the names."""
    by = {(r["L"], r["mixer"]): r for r in results}
    b = _at_batch(batch)

    def ratio(mixer: str, L: int, key: str) -> tuple[float | None, str]:
        # the kernels eager, compiled or in CUDA graphs, whichever row ran fastest (what a user can choose)
        # (a peak memory from the rows that measured one: not the CUDA-graph rows, see measure_centroid)
        names = (mixer, *(f"{mixer}-{v}" for v in _FUSED_VARIANTS))
        rows = [by[L, m] for m in names if "ms" in by.get((L, m), {}) and _measured(by[L, m], key)]
        r = min(rows, key=lambda row: row["ms"]) if rows else by.get((L, mixer))
        if r is None or "ms" not in r:
            return None, f"{mixer} at L = {L}: " + (r.get("error", "failed") if r else "not measured")
        value = r.get(key)
        value = None if not value or value != value else value
        return value, f"{r['mixer']} at L = {L} ran {r.get('path', mixer)}"

    out = []
    t, detail = ratio("fsat", 4096, "speedup vs attention-matmul")
    out.append(target(f"FSAT time vs attention (matmul) at L = 4K (fraction{b})", t and 1 / t, "<=",
                      FSAT_MAX_TIME_VS_MATMUL_4K, device=device, on="cuda", unit="", detail=detail))  # fmt: skip
    mem, detail = ratio("fsat", 4096, "memory vs attention-matmul")
    out.append(target(f"FSAT peak memory vs attention (matmul) at L = 4K (fraction{b})", mem, "<=",
                      FSAT_MAX_MEMORY_VS_MATMUL_4K, device=device, on="cuda", unit="", detail=detail))  # fmt: skip
    for mixer, label, start in (("fsat", "FSAT", FSAT_BEATS_SDPA_FROM), ("hydra", "Hydra", HYDRA_BEATS_SDPA_FROM)):
        name = f"{label} time vs SDPA at every L >= {start // 1024}K (the largest fraction{b})"
        measured = [
            (*ratio(mixer, L, "speedup vs attention-sdpa"), L) for L, m in sorted(by) if m == mixer and L >= start
        ]
        gaps = [d for s, d, _ in measured if s is None]
        if gaps or not measured:
            detail = "; ".join(gaps) or f"{mixer} not measured at L >= {start}"
            out.append(target(name, None, "<", 1, device=device, on="cuda", unit="", detail=detail))
            continue
        speedup, detail, _ = min(measured)  # the smallest speedup: the largest fraction of SDPA's time
        out.append(target(name, 1 / speedup, "<", 1, device=device, on="cuda", unit="", detail=detail))
    # the growth within one row (eager or compiled kernels), the smaller of the two
    growths = []
    for mixer in ("hydra", *(f"hydra-{v}" for v in _FUSED_VARIANTS)):
        t8, t16 = (by.get((L, mixer), {}).get("ms") for L in (8192, 16384))
        if t8 and t16:
            growths.append((t16 / t8, f"{mixer} at L = 8192 and 16384 ran {by[16384, mixer].get('path', mixer)}"))
    growth, detail = min(growths) if growths else (None, "")
    if not growths:
        gaps = [d for t, d in (ratio("hydra", L, "ms") for L in (8192, 16384)) if not t]
        detail = "; ".join(gaps) or "no hydra row measured at both L = 8192 and 16384"
    name = "Hydra time at L = 16K / at 8K" + ("" if batch is None else f" (B = {batch})")
    out.append(target(name, growth, "<=", HYDRA_MAX_GROWTH_8K_TO_16K, device=device, on="cuda", detail=detail))
    return out


# ------------------------------------------------------------------------------------ point ops (bench_points)

FPS_HEADERS = ["B", "N", "M", "backend", "ms", "speedup vs torch", "speedup vs cluster", "same indices"]
KNN_HEADERS = ["B", "N", "M", "C", "k", "backend", "ms", "speedup vs torch", "speedup vs cluster"]
LARGE_HEADERS = ["cloud", "N", "M", "backend", "kind", "ms", "time / bucket", "speedup vs reference",
                 "same indices as exact", "coverage / exact"]  # fmt: skip
GRID_POINTS = (1024, 4096)  # the grid's default cloud sizes N
LARGE_CLOUDS = ((50000, 4096), (100000, 8192))  # (N, M) of the default single large clouds


def fps_backends(device: torch.device | str) -> list[str]:
    """Every installed FPS backend of the grid: all but the bucket approximation, which has its own table (the
    ``same indices`` column shows which ones are exact)."""
    return [b for b in backends.backend_names("fps") if b != "fpsample_bucket" and backends.available("fps", b, device)]


def point_op_rows(
    device: torch.device | str,
    batches: Sequence[int],
    num_points: Sequence[int],
    channels: Sequence[int],
    k: int,
    repeats: int,
) -> tuple[list[list], list[list]]:
    """The FPS and KNN grid (rows of :data:`FPS_HEADERS` and :data:`KNN_HEADERS`): for every B, N and M in
    {N/2, N/4}, each FPS backend's time, its speedup over the reference's (``torch``, timed in the same run) and over
    torch-cluster's, and whether its indices equal the reference's; then for each of ``channels`` the k nearest of the
    N points for the M sampled ones, per KNN backend; on CUDA also the Triton kernel called directly (without
    :func:`attention.knn`'s checks), split among programs as ``auto_splits`` decides (``triton-split``) and in one
    part (``triton-1split``)."""
    device = torch.device(device)
    names = fps_backends(device)
    fps_rows, knn_rows = [], []
    for B, N in itertools.product(batches, num_points):
        x = torch.rand(B, N, 3, device=device, generator=None)
        for M in (N // 2, N // 4):
            start = torch.zeros(B, dtype=torch.long, device=device)
            ref = points.farthest_point_sample(x, M, start=start, backend="torch")
            times = {}
            for b in names:
                fn = partial(points.farthest_point_sample, x, M, start=start, backend=b)
                same = torch.equal(fn(), ref)
                times[b] = (time_fn(fn, device, repeats=repeats), same)
            ref_ms, base = times["torch"][0], times.get("cluster", (float("nan"), True))[0]
            for b, (ms, same) in times.items():
                fps_rows.append([B, N, M, b, ms, ref_ms / ms, base / ms, "yes" if same else "NO"])
            for C in channels:
                feats = x if C == 3 else torch.randn(B, N, C, device=device)
                q = points.gather(feats, ref)
                ktimes = {}
                for b in [b for b in backends.backend_names("knn") if backends.available("knn", b, device)]:
                    ktimes[b] = time_fn(partial(points.knn, q, feats, k, backend=b), device, repeats=repeats)
                if "triton" in ktimes and device.type == "cuda":  # the kernel alone, split as auto splits, and not
                    from attention.kernels.knn_triton import knn_triton

                    for name, splits in (("triton-split", None), ("triton-1split", 1)):
                        fn = partial(knn_triton, q, feats, k, splits=splits)
                        ktimes[name] = time_fn(fn, device, repeats=repeats)
                kref, kbase = ktimes["torch"], ktimes.get("cluster", float("nan"))
                for b, ms in ktimes.items():
                    knn_rows.append([B, N, M, C, k, b, ms, kref / ms, kbase / ms])
    return fps_rows, knn_rows


def large_clouds(large: Sequence[int] | None, num_points: Sequence[int]) -> list[int]:
    """The single large clouds to run, as ``--large`` spells them (N M pairs, flat).

    ``None`` (the flag not given): :data:`LARGE_CLOUDS` with the default grid (:data:`GRID_POINTS`), none with other
    ``--points``, so that a run asked to be small stays small.
    """
    if large is None:
        return [v for pair in LARGE_CLOUDS for v in pair] if tuple(num_points) == GRID_POINTS else []
    if len(large) % 2:
        raise ValueError(f"--large takes N M pairs, got {len(large)} numbers: {' '.join(map(str, large))}")
    return list(large)


def _coverage(x: torch.Tensor, idx: torch.Tensor) -> float:
    """Largest distance from a point to its nearest sample (the quantity FPS greedily minimizes)."""
    return float(points.knn(x, points.gather(x, idx), 1, backend="torch")[0].max().sqrt())


def _cloud(kind: str, N: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator(device).manual_seed(N)
    if kind == "uniform":
        return torch.rand(1, N, 3, device=device, generator=g)
    centres = torch.rand(16, 3, device=device, generator=g)
    which = torch.randint(0, 16, (N,), device=device, generator=g)
    return (centres[which] + 0.02 * torch.randn(N, 3, device=device, generator=g))[None]


def large_cloud_rows(
    large: Sequence[int], device: torch.device | str, repeats: int, clouds: Sequence[str]
) -> list[list]:
    """FPS on one large cloud per N M pair of ``large`` and kind of ``clouds`` (``"uniform"`` in the unit cube,
    ``"clustered"``: 16 Gaussian blobs), rows of :data:`LARGE_HEADERS`: every installed backend that supports the
    shape, its time relative to the bucket FPS and the reference, and its coverage relative to exact FPS."""
    device = torch.device(device)
    rows = []
    names = [b for b in backends.backend_names("fps") if backends.available("fps", b, device)]
    for (N, M), kind in itertools.product(zip(large[::2], large[1::2]), clouds):
        x = _cloud(kind, N, device)
        start = torch.zeros(1, dtype=torch.long, device=device)
        ref = points.farthest_point_sample(x, M, start=start, backend="torch")
        ref_cov = _coverage(x, ref)
        results = {}
        for b in names:
            if backends.BACKENDS["fps"][b].unsupported(device, {"N": N, "C": 3}) is not None:
                continue
            fn = partial(points.farthest_point_sample, x, M, start=start, backend=b)
            idx = fn()
            results[b] = (time_fn(fn, device, repeats=repeats), torch.equal(idx, ref), _coverage(x, idx) / ref_cov)
        bucket_ms = results.get("fpsample_bucket", (float("nan"),))[0]
        ref_ms = results["torch"][0]
        shape = {"B": 1, "N": N, "C": 3, "M": M, "masked": False}
        auto = backends.resolve("fps", "auto", device, shape)
        for b, (ms, same, cov) in results.items():
            exact = backends.BACKENDS["fps"][b].exact
            name = f"{b} (auto)" if b == auto else b
            kind_ = "exact" if exact else "approx"
            rows.append([kind, N, M, name, kind_, ms, ms / bucket_ms, ref_ms / ms, "yes" if same else "no", cov])
    return rows


# The exact KNN search of one large cloud in feature space (a centroid layer's first search on a 200,000-point cloud
# takes 100,000 queries): its process's peak resident set on CPU, and that peak's growth over repeated searches.
KNN_MEMORY_SHAPE = (20000, 200000, 128)  # (M, N, C): queries, reference points, channels (~110 MB of float32 inputs)
KNN_MEMORY_TARGET_GB = 1.5  # the most the search's process may hold at its peak, at KNN_MEMORY_SHAPE on CPU
# Repeated searches of the growth measure, each of M / calls queries; growth is counted over the second half of them.
# The first half lets the allocator settle: glibc raises its mmap threshold to the size of the first freed chunk
# buffer, so later ones come from its heap: a one-off step of the peak (+43 MB over the first three of six calls of
# 200 queries at N = 200000, C = 128 in measure_knn_memory's per-call peaks, none over the last three).
KNN_MEMORY_CALLS = 6
KNN_MEMORY_MAX_GROWTH_MB = chunk_budget("knn", "cpu") / 2**20  # less than one chunk of distances over those calls
KNN_MEMORY_HEADERS = ["M", "N", "C", "k", "threads", "RSS before GB", "peak RSS GB", "growth calls", "growth M",
                      "growth MB", "error"]  # fmt: skip


def knn_memory_sizes(sizes: Sequence[int] | None, num_points: Sequence[int], device: torch.device | str) -> list[int]:
    """The KNN memory row's M N C, as ``--knn-memory`` spells them.

    ``None`` (the flag not given): :data:`KNN_MEMORY_SHAPE` with the default grid (:data:`GRID_POINTS`) on CPU, none
    otherwise (a run asked to be small stays small; a CUDA run has its own rows); ``[]``: none.
    """
    if sizes is None:
        return list(KNN_MEMORY_SHAPE) if tuple(num_points) == GRID_POINTS and torch.device(device).type == "cpu" else []
    if len(sizes) not in (0, 3) or any(v < 1 for v in sizes):
        raise ValueError(f"--knn-memory takes M N C (positive), got {' '.join(map(str, sizes)) or 'nothing'}")
    return list(sizes)


def measure_knn_memory(cfg: dict) -> dict:
    """``cfg["calls"]`` exact KNN searches (:func:`attention.points.knn_chunked`, the reference of ``knn``) of
    ``cfg["k"]`` neighbours for ``cfg["M"]`` queries among ``cfg["N"]`` points of ``cfg["C"]`` channels: one cloud,
    float32, ``no_grad``, CPU, ``cfg["threads"]`` threads.

    Returns ``{"before_gb", "peaks_gb"}``: the resident set once the inputs exist, and the process's peak resident set
    after each call. Meant for a fresh process (:func:`measure.bench.run_isolated`, without its ``rss`` mmap threshold:
    what the allocator keeps of freed chunk buffers is part of the figure, as it is in a model's process)."""
    torch.set_num_threads(cfg["threads"])
    g = torch.Generator().manual_seed(0)
    query = torch.randn(1, cfg["M"], cfg["C"], generator=g)
    ref = torch.randn(1, cfg["N"], cfg["C"], generator=g)
    before = current_rss_bytes()
    peaks = []
    with torch.no_grad():
        for _ in range(cfg["calls"]):
            points.knn_chunked(query, ref, cfg["k"])
            peaks.append(peak_rss_bytes() / 2**30)
    return {"before_gb": before / 2**30, "peaks_gb": peaks}


def knn_memory_row(sizes: Sequence[int], k: int, threads: int = 1, calls: int = KNN_MEMORY_CALLS) -> list:
    """The KNN memory row (:data:`KNN_MEMORY_HEADERS`), each measure in a fresh process: the peak resident set of one
    search of M queries, and the growth of the peak over ``calls`` searches of ``ceil(M / calls)`` queries (as much
    work as the one search): the last call's peak minus the peak after the first half of the calls
    (:data:`KNN_MEMORY_CALLS` says why)."""
    M, N, C = sizes
    cfg = {"N": N, "C": C, "k": k, "threads": threads}
    growth_m = -(-M // calls)
    one = run_isolated(measure_knn_memory, {**cfg, "M": M, "calls": 1})
    many = run_isolated(measure_knn_memory, {**cfg, "M": growth_m, "calls": calls}) if "error" not in one else one
    nan = float("nan")
    before, peak = (one["before_gb"], one["peaks_gb"][0]) if "error" not in one else (nan, nan)
    settled = calls // 2 - 1  # the last call of the first half
    growth = (many["peaks_gb"][-1] - many["peaks_gb"][settled]) * 1024 if "error" not in many else nan
    error = one.get("error") or many.get("error") or ""
    return [M, N, C, k, threads, before, peak, calls, growth_m, growth, error]


def knn_memory_targets(row: dict | None) -> list[dict]:
    """The KNN search's memory targets, from :func:`knn_memory_row` (as a dict keyed by :data:`KNN_MEMORY_HEADERS`;
    None: no row, no targets): its peak resident set at most :data:`KNN_MEMORY_TARGET_GB` at
    :data:`KNN_MEMORY_SHAPE` (another shape: the figure, no verdict), and no growth over repeated calls (at most
    :data:`KNN_MEMORY_MAX_GROWTH_MB`, any shape). Both are CPU figures, measured on CPU whatever ``--device``."""
    if row is None:
        return []
    shape = (row["M"], row["N"], row["C"])
    M, N, C = KNN_MEMORY_SHAPE
    error = row["error"]
    peak_detail = error or (f"the target is for M={M} N={N} C={C}" if shape != KNN_MEMORY_SHAPE else "")
    peak = target(f"KNN search peak RSS (M={row['M']} N={row['N']} C={row['C']} k={row['k']} threads={row['threads']})",
                  row["peak RSS GB"], "<=", KNN_MEMORY_TARGET_GB, device="cpu", on="cpu", unit=" GB",
                  detail=peak_detail)  # fmt: skip
    if shape != KNN_MEMORY_SHAPE and peak["met"] is not None:
        peak.update(met=None, verdict="no verdict")
    calls = row["growth calls"]
    name = f"KNN search peak RSS growth over the last {calls - calls // 2} of {calls} calls of M={row['growth M']} (MB)"
    growth = target(name,
                    row["growth MB"], "<=", KNN_MEMORY_MAX_GROWTH_MB, device="cpu", on="cpu", unit=" MB",
                    detail=error)  # fmt: skip
    return [peak, growth]


def points_results(
    fps_rows: Sequence[list], knn_rows: Sequence[list], large_rows: Sequence[list], memory_rows: Sequence[list] = ()
) -> dict:
    """``bench_points``' ``--json`` results: each table's rows as dicts keyed by its headers."""
    return {
        "fps": [dict(zip(FPS_HEADERS, r)) for r in fps_rows],
        "knn": [dict(zip(KNN_HEADERS, r)) for r in knn_rows],
        "large": [dict(zip(LARGE_HEADERS, r)) for r in large_rows],
        "knn_memory": [dict(zip(KNN_MEMORY_HEADERS, r)) for r in memory_rows],
    }


_FIRST_CALL = (
    "import time, torch; t = time.perf_counter(); from attention.points import farthest_point_sample; "
    "farthest_point_sample(torch.rand(1, 100, 3), 10, backend='numba'); print((time.perf_counter() - t) * 1e3)"
)


def numba_first_call_ms() -> tuple[float, float]:
    """Import + first numba FPS call in a fresh process: compiling into an empty cache, then loading from it."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        cold, warm = (float(subprocess.check_output([sys.executable, "-c", _FIRST_CALL], env=env)) for _ in range(2))
    return cold, warm


# ------------------------------------------------------------------------- centroid attention (bench_centroid)

# One attention step from M = N / 4 centroids to N inputs, forward + backward, per path: the dense score matrix
# materialized, SDPA, the KNN forms of attention.CentroidAttention ("knn" = gather), and torch.compile of the KNN path
# as "auto" chose it before the fused kernel existed (masked while N / K <= MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR, else
# gather): what the compiler alone gives; and of the fused kernel's path (the kernel an opaque op in the graph); the
# "-graphs" rows compile with mode="reduce-overhead" (CUDA graphs: one replay a step), the "-captured" rows capture the
# eager step whole (measure.bench.capture_graphs: no compiler, no guards), the fused step and SDPA's.
CENTROID_PATHS = ("dense-matmul", "dense-sdpa", "knn", "knn-masked", "knn-triton", "knn-compiled",
                  "knn-triton-compiled", "knn-triton-graphs", "dense-sdpa-graphs", "knn-triton-captured",
                  "dense-sdpa-captured")  # fmt: skip
_KNN_FORMS = {"knn": "gather", "knn-masked": "masked", "knn-triton": "triton", "knn-triton-compiled": "triton",
              "knn-triton-graphs": "triton", "knn-triton-captured": "triton"}  # fmt: skip
# the fused step eager, compiled, and in CUDA graphs both ways; the graph forms of the fused step and of SDPA
_FUSED_STEPS = ("knn-triton", "knn-triton-compiled", "knn-triton-graphs", "knn-triton-captured")
_GRAPHED = {"fused": ("knn-triton-graphs", "knn-triton-captured"), "sdpa": ("dense-sdpa-graphs", "dense-sdpa-captured")}
CENTROID_TARGET_POINTS = (1024, 16384)  # the fused KNN step must beat SDPA in time and peak memory at every N here
CENTROID_HEADERS = ["N", "M", "path", "ms", "peak MB", "speedup vs matmul", "memory vs matmul", "speedup vs sdpa",
                    "memory vs sdpa"]  # fmt: skip


def _compiled_form(N: int, K: int) -> str:
    """The KNN form "auto" took on CUDA without the fused kernel (attention.backends): masked while N / K is small."""
    return "masked" if N / K <= backends.MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR else "gather"


def centroid_path_skipped(path: str, device: str, compiled: bool) -> str | None:
    """Why ``tools/bench_centroid.py`` does not time ``path`` on ``device``, or None: the Triton kernel needs CUDA (and
    triton), and the CUDA-graph rows CUDA; the compiled rows are left out unless asked for (compiling on a CPU takes
    minutes per shape). The captured rows compile nothing and run on CUDA either way."""
    cuda = torch.device(device).type == "cuda"
    if path.startswith("knn-triton"):
        if not cuda:
            return "needs CUDA (the fused Triton kernel)"
        if not backends.HAS_TRITON:
            return f"needs {backends.INSTALL_HINTS['triton']}"
    if path.endswith(("-graphs", "-captured")) and not cuda:
        return "needs CUDA (CUDA graphs)"
    if path.endswith(("-compiled", "-graphs")) and not compiled:
        return "torch.compile row not requested (--compiled yes; default on CUDA only)"
    return None


def measure_centroid(cfg: dict) -> dict:
    """Time (ms, forward + backward) and peak memory (MB; None where the CPU resident set did not grow) of one step of
    ``cfg["mode"]`` (one of :data:`CENTROID_PATHS`) at ``cfg``'s B, N, M, C, H, K on ``cfg["device"]``.

    Peak memory is ``torch.cuda.max_memory_allocated`` beyond what the inputs and the layer hold on CUDA, and the
    growth of the peak resident set on CPU (clean only in a fresh process: ``tools/bench_centroid.py --isolate``).
    The ``-compiled`` paths compile the layer (static shapes) in their warm-up step and report the form they compiled;
    the ``-graphs`` paths compile it with ``mode="reduce-overhead"`` and report no peak: their tensors live in the
    graphs' private pool, whose allocator state torch's cudagraph trees checkpoint and restore, so the allocator's
    peak does not measure a step there (the same holds for ``measure_mixer``'s CUDA-graph rows). The ``-captured``
    paths capture the eager step whole (:func:`measure.bench.capture_graphs`) and report no peak either.
    """
    device = torch.device(cfg["device"])
    torch.manual_seed(0)
    B, N, M, C, H, K, path = cfg["B"], cfg["N"], cfg["M"], cfg["C"], cfg["H"], cfg["K"], cfg["mode"]
    knn = path.startswith("knn")
    form = _compiled_form(N, K) if path == "knn-compiled" else _KNN_FORMS.get(path, "auto")
    layer = CentroidAttention(C, H, num_neighbors=K if knn else None, attn_backend=form).to(device)
    x = torch.randn(B, N, C, device=device, requires_grad=True)
    u = torch.randn(B, M, C, device=device, requires_grad=True)
    forward: Callable[[Tensor, Tensor], Tensor] = layer
    if path == "dense-matmul":
        forward = partial(attention_step_reference, layer)
    elif path.endswith(("-compiled", "-graphs")):
        allow_recompiles()  # a layer per (N, path): each one more graph of the layer's forward
        mode = "reduce-overhead" if path.endswith("-graphs") else None
        forward = torch.compile(layer, dynamic=False, mode=mode)
    elif path.endswith("-captured"):
        forward = capture_graphs(layer, x, u)  # the warm-up steps and the capture run here

    def step() -> None:
        forward(x, u).sum().backward()
        x.grad = u.grad = None
        layer.zero_grad(set_to_none=True)

    step()  # warm-up (Triton and torch.compile compile here); then measure the peak of one clean step
    if path.endswith("-graphs") and device.type == "cuda":
        step(), step()  # cudagraph trees record (the first step warmed up), then replay, as the timed steps do
        peak = None
    elif path.endswith("-captured"):
        peak = None
    elif device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        base = current_rss_bytes()
        before = peak_rss_bytes()
        step()
        peak = max(peak_rss_bytes() - base, 0) if peak_rss_bytes() > before else None
    ms = time_fn(step, device, repeats=cfg["repeats"], warmup=0)
    out = {"ms": ms, "peak_mb": None if peak is None else peak / 2**20}
    if cfg.get("profile"):
        out["profile"] = profile_step(step, device, cfg["profile"], f"N{N}-{path}")
    return out | ({"form": form} if path.endswith(("-compiled", "-graphs", "-captured")) and knn else {})


def centroid_results(
    device: str,
    num_points: Sequence[int],
    *,
    paths: Sequence[str],
    compiled: bool,
    k: int,
    dim: int,
    heads: int,
    batch: int,
    repeats: int,
    isolate: bool,
    profile: str | None = None,
) -> list[dict]:
    """One result per (N, path): ``{"N", "M", "path", "ms", "peak_mb"}`` (and ``"form"`` for the compiled and graphed
    KNN rows, and
    with a ``profile`` folder the row's :func:`measure.bench.profile_step` summary, ``"profile"``), or a
    ``"note"`` saying why a path was not timed on ``device`` (:func:`centroid_path_skipped`) or its ``"error"``. Each
    configuration runs through :func:`measure.bench.run_config` (a fresh process where ``isolate``); the settings are
    ``tools/bench_centroid.py``'s flags of the same names (its defaults)."""
    results = []
    for N in num_points:
        for path in paths:
            why = centroid_path_skipped(path, device, compiled)
            if why is not None:
                r: dict = {"note": why}
            else:
                cfg = dict(mode=path, device=device, B=batch, N=N, M=N // 4, C=dim, H=heads, K=k, repeats=repeats,
                           profile=profile)  # fmt: skip
                r = run_config(measure_centroid, cfg, isolate, rss=True)
                _logger.info("N=%d %s: %s", N, path, r)
            results.append({"N": N, "M": N // 4, "path": path, **r})
    return results


def centroid_rows(results: Sequence[dict]) -> list[list]:
    """Rows of :data:`CENTROID_HEADERS` from :func:`centroid_results`: the ratios against ``dense-matmul`` and
    ``dense-sdpa`` of the same N (NaN where one was not measured)."""
    by = {(r["N"], r["path"]): r for r in results}
    rows = []
    for r in results:
        N = r["N"]
        if "ms" not in r:
            note = f"error: {r['error'][:60]}" if "error" in r else "not measured (see above)"
            rows.append([N, r["M"], r["path"], note, "", "", "", "", ""])
            continue
        ratios = []
        for base in ("dense-matmul", "dense-sdpa"):
            b = by.get((N, base), {})
            ratios.append(b["ms"] / r["ms"] if "ms" in b else float("nan"))
            ok = b.get("peak_mb") and r["peak_mb"] is not None
            ratios.append(r["peak_mb"] / b["peak_mb"] if ok else float("nan"))
        peak = r["peak_mb"] if r["peak_mb"] is not None else float("nan")
        label = f"{r['path']} ({r['form']})" if "form" in r else r["path"]
        rows.append([N, r["M"], label, r["ms"], peak, *ratios])
    return rows


def _why_missing(row: dict, key: str) -> str:
    """Why ``row`` has no ``key``: its note or error, or that it ran without measuring it (e.g. no peak)."""
    if "note" in row or "error" in row:
        return row.get("note") or row["error"][:80]
    return f"{row['path']}: no {'peak' if key == 'peak_mb' else key} measured" if "path" in row else "not measured"


def centroid_targets(rows: Sequence[dict], device: str) -> list[dict]:
    """The fused KNN step against SDPA's dense attention at every measured N in :data:`CENTROID_TARGET_POINTS`' range,
    from ``tools/bench_centroid.py``'s rows (``{"N", "path", "ms", "peak_mb"}``), each a ratio of two rows of the run:

    * its slowest speedup over eager SDPA (> 1 wanted), the fused step as it ran fastest (eager, compiled or in CUDA
      graphs: what a user can choose; the detail names the row);
    * the same with both in CUDA graphs (each its faster graph row, compiled with ``reduce-overhead`` or captured):
      both run the same way;
    * its largest peak-memory ratio over SDPA, both eager (< 1 wanted).
    """
    lo, hi = CENTROID_TARGET_POINTS
    by = {(r["N"], r["path"]): r for r in rows}
    sizes = sorted({r["N"] for r in rows if lo <= r["N"] <= hi})
    span = f"N = {lo // 1024}K-{hi // 1024}K"

    def worst(fused_paths: Sequence[str], base_paths: Sequence[str], key: str, pick) -> tuple[float | None, str]:
        """The worst ratio over the sizes (``pick``: min of speedups, max of memory ratios) of the best fused row
        against the best base row."""
        pairs, notes = [], {}
        for n in sizes:
            bases = [by.get((n, p), {"note": f"no {p} row (--paths)"}) for p in base_paths]
            missing = next((b for b in bases if "error" in b), bases[0])  # why, where no base row ran
            base = min((b for b in bases if b.get(key) is not None), key=lambda b: b[key], default=missing)
            runs = [by.get((n, p), {"note": f"no {p} row (--paths)"}) | {"path": p} for p in fused_paths]
            ran = [r for r in runs if r.get(key) is not None]
            if not ran or base.get(key) is None:
                # why: the base row's, and where no fused row ran the first error among them, else the first's note
                fused = next((r for r in runs if "error" in r), runs[0])
                for r in (base,) if ran else (base, fused):
                    if r.get(key) is None:
                        notes.setdefault(_why_missing(r, key), []).append(str(n))
                continue
            best = min(ran, key=lambda r: r[key])
            ratio = base[key] / best[key] if key == "ms" else best[key] / base[key]
            names = [best["path"]] if len(fused_paths) > 1 else []
            names += [base["path"]] if len(base_paths) > 1 else []
            pairs.append((ratio, n, " vs ".join(names)))
        if notes:
            return None, "; ".join(f"{why} (N={', '.join(ns)})" for why, ns in notes.items())
        if not pairs:
            return None, "no N in range measured"
        value, n, names = pick(pairs, key=lambda p: p[0])
        ns = ", ".join(str(p[1]) for p in sorted(pairs, key=lambda p: p[1]))
        return value, f"worst at N={n} of {ns}" + (f" ({names})" if names else "")

    speed, where = worst(_FUSED_STEPS, ("dense-sdpa",), "ms", min)
    out = [target(f"fused KNN step (its fastest row) vs eager SDPA speedup at every {span}", speed, ">", 1,
                  device=device, on="cuda", detail=where)]  # fmt: skip
    speed, where = worst(_GRAPHED["fused"], _GRAPHED["sdpa"], "ms", min)
    out.append(target(f"fused KNN step vs SDPA speedup at every {span}, both in CUDA graphs", speed, ">", 1,
                      device=device, on="cuda", detail=where))  # fmt: skip
    ratio, where = worst(("knn-triton",), ("dense-sdpa",), "peak_mb", max)
    out.append(target(f"fused KNN step vs SDPA peak memory at every {span}", ratio, "<", 1, device=device, on="cuda",
                      unit="", detail=where))  # fmt: skip
    return out


# ------------------------------------------------------------------------------ sequence mixers (bench_mixers)

MIXER_BASELINES = ("attention-matmul", "attention-sdpa")
# The mixers with fused kernels: "fsat" and "hydra" run what "auto" picks (the Triton kernels on CUDA), "<name>-torch"
# the plain PyTorch path auto picks without them, "<name>-compiled" that path under torch.compile (what the compiler
# alone gives), "<name>-fused-compiled" the kernels under torch.compile (inductor fuses the ops around them: what
# "auto" runs in a compiled model), "<name>-fused-graphs" the same compiled with mode="reduce-overhead" (CUDA graphs
# replay the whole step: no CPU cost a launch, which bounds a small batch), "<name>-fused-captured" the eager kernels
# captured whole into CUDA graphs (measure.bench.capture_graphs: no compiler and no guards, the least host work a step),
# "<name>-fused-compiled-captured" the compiled step (inductor's kernels, mode="default") captured the same way.
KERNEL_MIXERS = {"fsat": ("fsat_edges", "edge_backend"), "hydra": ("quasiseparable_mix", "backend")}
BENCH_MIXERS = (*MIXER_BASELINES, "fsat", "fsat-torch", "fsat-compiled", "fsat-fused-compiled", "fsat-fused-graphs",
                "fsat-fused-captured", "fsat-fused-compiled-captured", "fat", "linear", "lowrank", "toeplitz", "hydra",
                "hydra-torch", "hydra-compiled", "hydra-fused-compiled", "hydra-fused-graphs", "hydra-fused-captured",
                "hydra-fused-compiled-captured", "cauchy", "vandermonde")  # fmt: skip
# the kernels compiled, captured, or both
_FUSED_VARIANTS = ("fused-compiled", "fused-graphs", "fused-captured", "fused-compiled-captured")
_FUSED_SUFFIXES = tuple(f"-{v}" for v in _FUSED_VARIANTS)
# path labels by the name's ending, the first that matches (a compiled step captured before a captured one)
_VARIANT_PATHS = {"-compiled-captured": " compiled, captured CUDA graphs", "-compiled": " compiled",
                  "-graphs": " CUDA graphs", "-captured": " captured CUDA graphs"}  # fmt: skip
QUADRATIC_MIXERS = ("cauchy", "vandermonde", "cauchy_static", "vandermonde_static")  # O(L^2 D) operations
_COMPILED_PATHS = {"fsat": "gather"}  # dynamo does not trace the csr products' sparse tensors


def mixer_path(name: str, device: torch.device | str, head_dim: int) -> str | None:
    """The backend a row of :data:`KERNEL_MIXERS` runs (``"triton"``, ``"gather"``, ...; None for other rows)."""
    base, _, variant = name.partition("-")
    if base not in KERNEL_MIXERS:
        return None
    op = KERNEL_MIXERS[base][0]
    if variant == "compiled" and base in _COMPILED_PATHS:
        return _COMPILED_PATHS[base]
    if variant and variant not in _FUSED_VARIANTS:  # the first plain PyTorch backend of the auto order
        order = backends.AUTO_ORDER.get((op, torch.device(device).type), ())
        return next(n for n in (*order, *backends.backend_names(op)) if backends.BACKENDS[op][n].package is None)
    shape = {"D": head_dim, "N": head_dim, "Dv": head_dim, "separate_dt": True}  # Hydra's state size is D
    return backends.resolve(op, "auto", device, shape, torch.float32)


def _bench_mixer(name: str, dim: int, heads: int, max_len: int, device: torch.device) -> torch.nn.Module:
    if name == "attention-matmul":
        return build_mixer("softmax", dim, heads, sdpa=False)
    if name == "attention-sdpa":
        return build_mixer("softmax", dim, heads)
    base, _, variant = name.partition("-")
    if base in KERNEL_MIXERS and variant:
        path = {KERNEL_MIXERS[base][1]: mixer_path(name, device, dim // heads)}
        layer = build_mixer(base, dim, heads, max_len=max_len, **path).to(device)
        if variant.endswith(("compiled", "graphs", "compiled-captured")):
            allow_recompiles()  # a layer per row, each one more graph of the mixer's forward
        if variant.endswith("compiled-captured"):
            # the wrapper, whose forward capture_graphs replaces (compiled in place, the compiled call would trace
            # the replaced forward); a captured row has no peak, so the memory tracker's hooks never run on it
            return torch.compile(layer, dynamic=False)
        if variant.endswith(("compiled", "graphs")):
            # in place (torch.compile's wrapper would run the memory tracker's module hooks twice)
            layer.compile(**({"mode": "reduce-overhead"} if variant.endswith("graphs") else {}))
        return layer
    return build_mixer(name, dim, heads, max_len=max_len)


def measure_mixer(cfg: dict) -> dict:
    """Time (ms) and peak memory (MB) of one training step ``mixer(x).sum().backward()`` of one configuration
    ``{"mixer", "device", "B", "L", "C", "H", "repeats"}``: one warm-up step, one step under the memory tracker, then
    the median of ``repeats`` clean steps (the tracked one carries the tracker's per-op overhead). A CUDA-graph row
    on CUDA: three untimed steps (compile and warm up, record, replay), then the timed replays; a captured row: the
    capture's own warm-up steps (:func:`measure.bench.capture_graphs`; a compiled row compiles in them), one untimed
    replay, then the timed ones. Neither reports a peak (the graphs' pool, :func:`measure_centroid`)."""
    device = torch.device(cfg["device"])
    torch.manual_seed(0)
    B, L, C, H = cfg["B"], cfg["L"], cfg["C"], cfg["H"]
    layer = _bench_mixer(cfg["mixer"], C, H, L, device).to(device).train()
    x = torch.randn(B, L, C, device=device, requires_grad=True)
    captured = cfg["mixer"].endswith("-captured")
    if captured:
        layer = capture_graphs(layer, x)

    def step() -> None:
        layer(x).sum().backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)

    step()  # warm-up
    if cfg["mixer"].endswith("-graphs") and device.type == "cuda":
        step(), step()  # cudagraph trees record (the first step warmed up), then replay, as the timed steps do
        peak_mb = None  # the graphs' pool: no peak (see measure_centroid)
    elif captured:
        peak_mb = None
    else:
        # Peak memory of one step: exact tensor accounting on CPU (tensors the step creates: activations, gradients,
        # temporaries), the allocator's peak above what was allocated before on CUDA.
        base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
        peak_mb = (peak_tensor_bytes(step, device) - base) / 2**20
    ms = time_fn(step, device, repeats=cfg["repeats"], warmup=0)
    out = {"ms": ms, "peak_mb": peak_mb}
    if cfg.get("profile"):
        out["profile"] = profile_step(step, device, cfg["profile"], f"B{B}-L{L}-{cfg['mixer']}")
    return out


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a and b else float("nan")


def mixer_rows(
    device: str,
    lengths: Sequence[int],
    mixers: Sequence[str],
    *,
    dim: int,
    heads: int,
    batch: int,
    repeats: int,
    max_quadratic_len: int | None,
    isolate: bool,
    profile: str | None = None,
) -> list[dict]:
    """Both baselines and every mixer of ``mixers`` (e.g. :data:`BENCH_MIXERS`) at each L of ``lengths``, each
    configuration through :func:`measure.bench.run_config` (a fresh process where ``isolate``). The settings are
    ``tools/bench_mixers.py``'s flags of the same names (its defaults); with a ``profile`` folder each row also
    carries its :func:`measure.bench.profile_step` summary, ``"profile"``.

    Returns:
        One dict per row: ``L``, ``mixer``, ``ms`` and ``peak_mb`` (or ``error``), ``speedup vs <baseline>`` and
        ``memory vs <baseline>`` for each of :data:`MIXER_BASELINES`, and for the quadratic mixers
        ``dense_bhlld_mb`` (the ``(B, H, L, L, D)`` float32 tensor the public code materializes) and ``vs_bhlld``.
    """
    names = [*MIXER_BASELINES, *(m for m in mixers if m not in MIXER_BASELINES)]
    B, C, H = batch, dim, heads
    paths = {name: mixer_path(name, device, C // H) for name in names}
    results: list[dict] = []
    for L in lengths:
        res: dict[str, dict] = {}
        for name in names:
            if name in QUADRATIC_MIXERS and max_quadratic_len is not None and L > max_quadratic_len:
                res[name] = {"error": f"skipped (L > --max-quadratic-len {max_quadratic_len})"}
                continue
            base = name.partition("-")[0]
            if name.endswith("-torch") and paths[name] == mixer_path(base, device, C // H):
                res[name] = {"error": f"skipped: the {base} row runs this path ({paths[name]}) on {device}"}
                continue
            if name.endswith(_FUSED_SUFFIXES) and paths[name] != "triton":
                res[name] = {"error": f"skipped: no fused kernel runs on {device} ({base} takes {paths[name]})"}
                continue
            cfg = dict(mixer=name, device=device, B=B, L=L, C=C, H=H, repeats=repeats, profile=profile)
            res[name] = run_config(measure_mixer, cfg, isolate)
            _logger.info("L=%d %s: %s", L, name, res[name])
        for name, r in res.items():
            row = {"L": L, "mixer": name, **r}
            if paths[name] is not None:
                label = next((v for end, v in _VARIANT_PATHS.items() if name.endswith(end)), "")
                row["path"] = paths[name] + label
            if "ms" in r:
                for base in MIXER_BASELINES:
                    row[f"speedup vs {base}"] = _ratio(res[base].get("ms"), r["ms"])
                    row[f"memory vs {base}"] = _ratio(r["peak_mb"], res[base].get("peak_mb"))
            if name in QUADRATIC_MIXERS:
                row["dense_bhlld_mb"] = B * H * L * L * (C // H) * 4 / 2**20
                row["vs_bhlld"] = _ratio(r.get("peak_mb"), row["dense_bhlld_mb"])
            results.append(row)
    return results


def mixer_table(results: Sequence[dict]) -> tuple[list[str], list[list]]:
    """The printed table of :func:`mixer_rows`: time and memory as fractions of each baseline's (the paper's
    "speed" is the inverse of the time's)."""
    headers = ["L", "mixer", "ms", "peak MB"]
    headers += [f"{k} vs {b.split('-')[1]}" for b in MIXER_BASELINES for k in ("time", "memory")]
    headers += ["dense BHLLD MB", "vs BHLLD"]
    rows = []
    for r in results:
        if "ms" not in r:
            rows.append([r["L"], r["mixer"], r.get("error", "")[:60], *[""] * (len(headers) - 3)])
            continue
        mixer = f"{r['mixer']} ({r['path']})" if r.get("path") else r["mixer"]
        cells = [r["L"], mixer, r["ms"], r["peak_mb"] if r["peak_mb"] is not None else float("nan")]
        for b in MIXER_BASELINES:
            cells += [1 / r[f"speedup vs {b}"] if r[f"speedup vs {b}"] else float("nan"), r[f"memory vs {b}"]]
        cells += [r["dense_bhlld_mb"], r["vs_bhlld"]] if "dense_bhlld_mb" in r else ["", ""]
        rows.append(cells)
    return headers, rows


# (name, M, N, K, H, D) of each KNN attention of the ModelNet40 centroid transformer at 1024 points
# (pointcloud.CentroidTransformer's defaults: widths 64, 128, 128, 512, 4 heads, K = 24, half the points per CA block)
KNN_KERNEL_PRESETS = {
    "modelnet": (
        ("SA1", 1024, 1024, 24, 4, 16),
        ("CA1", 512, 1024, 24, 4, 32),
        ("SA2", 512, 512, 24, 4, 32),
        ("CA2", 256, 512, 24, 4, 128),
    ),
    # tools/bench_centroid.py's step: M = N / 4 centroids, K = 32, C = 128 in 4 heads
    "centroid": tuple((f"N={n}", n // 4, n, 32, 4, 32) for n in (1024, 4096, 16384)),
}
KNN_KERNEL_BATCH = {"modelnet": 32, "centroid": 1}  # the batch each preset's model or bench runs at
KNN_KERNEL_HEADERS = ["shape", "B", "M", "N", "K", "H", "D", "form", "fwd ms", "fwd+bwd ms", "vs block_h=1",
                      "vs gather", "max |out - gather|"]  # fmt: skip


def knn_kernel_shapes(
    preset: str | Sequence[tuple[str, int, int, int, int, int]], batch: int | None = None
) -> list[dict]:
    """The shapes :func:`knn_kernel_rows` times: :data:`KNN_KERNEL_PRESETS` ``[preset]`` at ``batch`` (default: the
    preset's, :data:`KNN_KERNEL_BATCH`), or ``preset`` given as ``(name, M, N, K, H, D)`` tuples (batch default 1),
    each as ``{"shape", "B", "M", "N", "K", "H", "D"}``.

    Raises:
        ValueError: an unknown preset, or a shape without M, N, K, H, D, B >= 1 and K <= N.
    """
    if isinstance(preset, str):
        if preset not in KNN_KERNEL_PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(KNN_KERNEL_PRESETS)}")
        shapes, batch = KNN_KERNEL_PRESETS[preset], batch or KNN_KERNEL_BATCH[preset]
    else:
        shapes, batch = preset, batch or 1
    out = []
    for name, M, N, K, H, D in shapes:
        if not (min(batch, M, N, K, H, D) >= 1 and K <= N):
            raise ValueError(f"shape {name}: need B, M, N, K, H, D >= 1 and K <= N, got {(batch, M, N, K, H, D)}")
        out.append({"shape": name, "B": batch, "M": M, "N": N, "K": K, "H": H, "D": D})
    return out


def knn_kernel_rows(
    shapes: Sequence[dict],
    device: torch.device | str,
    *,
    block_hs: Sequence[int] = (1, 2, 4),
    dtype: torch.dtype = torch.float32,
    repeats: int = 5,
    inner: int = 1,
) -> list[dict]:
    """The fused KNN-attention kernel (:func:`attention.kernels.knn_attention_triton.knn_attention_triton`) at each
    heads-per-program of ``block_hs``, against the gather path (the layer's form without the kernel,
    :func:`attention.centroid.functional.knn_centroid_attention`), at each of ``shapes`` (:func:`knn_kernel_shapes`).

    Inputs are in the layer's layout: q a ``(B, H, M, D)`` view of ``(B, M, H, D)``, k and v views of one
    ``(B, N, 2, H, D)`` tensor (the layer's ``kv`` projection), random values; each centroid attends to its K nearest
    of N random points (the first M points are the centroids: neighbour sets that nearby centroids share, as a KNN
    search gives). Per shape the forms are timed round-robin (:func:`measure.bench.time_round_robin`), each call
    ``inner`` times a round (a GPU then runs the launches back to back), the median round per call: ``fwd_ms`` (no
    grad) and ``step_ms`` (forward + backward from a random output gradient). The kernel's rows run on CUDA, or on
    CPU under ``TRITON_INTERPRET=1``; elsewhere one row per shape says why they did not.

    Returns:
        One dict per (shape, form), with the shape's keys and ``form``: ``"gather"``, ``"block_h=n"``, or ``"block_h=n
        (runs as m)"`` where n is past H's next power of two m (the kernel counts it as m). A timed row has
        ``block_h`` (n; None for gather), ``fwd_ms``, ``step_ms``, ``vs_bh1`` and ``vs_gather`` (the step's speedup
        over block_h=1's and the gather path's) and ``max_diff`` (its output against the gather path's); a block size
        the kernel refuses for the shape, and the kernel's row where it cannot run, have ``skipped`` (the reason).
    """
    device = torch.device(device)
    kernel_ok = backends.available("knn_attention", "triton", device)
    rows: list[dict] = []
    for shape in shapes:
        rows += _knn_kernel_shape(shape, device, block_hs if kernel_ok else (), dtype, repeats, inner)
        if not kernel_ok:
            why = "the Triton kernel runs on CUDA (or on CPU under TRITON_INTERPRET=1)"
            rows.append({**shape, "form": "block_h", "block_h": None, "skipped": why})
        _logger.info("timed %s", " ".join(f"{k}={v}" for k, v in shape.items()))
    return rows


def _knn_kernel_shape(
    shape: dict, device: torch.device, block_hs: Sequence[int], dtype: torch.dtype, repeats: int, inner: int
) -> list[dict]:
    """:func:`knn_kernel_rows`' rows of one shape: the gather path and the kernel at each of ``block_hs``."""
    B, M, N, K, H, D = (shape[k] for k in ("B", "M", "N", "K", "H", "D"))
    gen = torch.Generator().manual_seed(0)
    q_rows = torch.randn(B, M, H, D, generator=gen).to(device, dtype).requires_grad_(True)
    kv_rows = torch.randn(B, N, 2, H, D, generator=gen).to(device, dtype).requires_grad_(True)
    grad = torch.randn(B, M, H, D, generator=gen).to(device, dtype).transpose(1, 2)
    q = q_rows.transpose(1, 2)
    k, v = (t.transpose(1, 2) for t in kv_rows.unbind(2))
    pos = unit_sphere_clouds(B, N, seed=0).to(device)
    _, idx = points.knn(pos[:, :M], pos, K)  # (B, M, K)
    forms: dict[str, Callable[[], Tensor]] = {
        "gather": partial(centroid_functional.knn_centroid_attention, q, k, v, idx)
    }
    block_h: dict[str, int | None] = {"gather": None}  # each form's block_h as asked for
    if block_hs:
        from .kernels.knn_attention_triton import knn_attention_triton

        for bh in dict.fromkeys(block_hs):
            runs_as = min(bh, 1 << (H - 1).bit_length())  # the kernel counts a block_h past H's power of two as that
            label = f"block_h={bh}" if runs_as == bh else f"block_h={bh} (runs as {runs_as})"
            forms[label], block_h[label] = partial(knn_attention_triton, q, k, v, idx, block_h=bh), bh
    outs, refused = {}, []
    with torch.no_grad():
        for form, fn in list(forms.items()):
            try:
                outs[form] = fn().float()
            except ValueError as e:  # block sizes the kernel refuses for this shape (its message says why)
                bh = block_h[form]
                refused.append({**shape, "form": f"block_h={bh}", "block_h": bh, "skipped": str(e)})
                del forms[form]

    def infer(fn: Callable[[], Tensor]) -> None:
        with torch.no_grad():
            for _ in range(inner):
                fn()

    def step(fn: Callable[[], Tensor]) -> None:
        for _ in range(inner):
            fn().backward(grad)
            q_rows.grad = kv_rows.grad = None

    fns = [partial(kind, fn) for kind in (infer, step) for fn in forms.values()]
    medians = [statistics.median(t) / inner for t in time_round_robin(fns, device, repeats, warmup=1)]
    fwd, steps = dict(zip(forms, medians[: len(forms)])), dict(zip(forms, medians[len(forms) :]))
    return [
        {**shape, "form": form, "block_h": block_h[form], "fwd_ms": fwd[form], "step_ms": steps[form],
         "vs_bh1": steps["block_h=1"] / steps[form] if "block_h=1" in steps else None,
         "vs_gather": steps["gather"] / steps[form], "max_diff": (outs[form] - outs["gather"]).abs().max().item()}
        for form in forms
    ] + refused  # fmt: skip


def knn_kernel_table(rows: Sequence[dict]) -> list[list]:
    """:data:`KNN_KERNEL_HEADERS`' rows of :func:`knn_kernel_rows` (a skipped form: its reason)."""
    out = []
    for r in rows:
        head = [r[k] for k in ("shape", "B", "M", "N", "K", "H", "D", "form")]
        if "skipped" in r:
            out.append([*head, f"not timed: {r['skipped']}", *["-"] * 4])
            continue
        ratio = lambda x: "-" if x is None else x  # noqa: E731
        out.append([*head, r["fwd_ms"], r["step_ms"], ratio(r["vs_bh1"]), r["vs_gather"], r["max_diff"]])
    return out


def knn_kernel_fastest(rows: Sequence[dict]) -> dict | None:
    """The ``block_h`` (as requested: a layer's default) whose forward + backward takes the least time summed over
    the shapes of ``rows``: ``{"block_h", "step_ms", "sums"}`` (``sums``: each one's ``{"block_h", "step_ms"}``, in
    order), among those that ran at every shape; None where none did."""
    shapes = {r["shape"] for r in rows}
    totals: dict[int, float] = {}
    ran: dict[int, set] = {}
    for r in rows:
        if r.get("block_h") is not None and "skipped" not in r:
            totals[r["block_h"]] = totals.get(r["block_h"], 0.0) + r["step_ms"]
            ran.setdefault(r["block_h"], set()).add(r["shape"])
    totals = {bh: ms for bh, ms in totals.items() if ran[bh] == shapes}
    if not totals:
        return None
    best = min(totals, key=totals.get)
    sums = [{"block_h": bh, "step_ms": ms} for bh, ms in sorted(totals.items())]
    return {"block_h": best, "step_ms": totals[best], "sums": sums}
