"""Benchmarks of the shared core: the Triton kernels against the torch paths they replace, one centroid-attention
step per implementation (``tools/bench_centroid.py``), and the targets that ``tools/bench_points.py``,
``tools/bench_mixers.py`` and ``tools/bench_centroid.py`` declare.

Every target is a ratio of two rows measured in the same run (:func:`engine.bench.target`): a speedup of a kernel
over the path it replaces, never an absolute time, so that it reads the same on a busy machine. The thresholds are
CUDA figures: a CPU run reports the ratios with no verdict.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Sequence

import torch
from torch import Tensor

from engine.bench import current_rss_bytes, peak_rss_bytes, target, time_fn

from . import backends
from .centroid import CentroidAttention, attention_step_reference
from .mixers import functional as mixer_functional
from .points import farthest_point_sample

__all__ = [
    "CENTROID_PATHS",
    "CENTROID_TARGET_POINTS",
    "FPS_CLUSTER_SHAPE",
    "FPS_CLUSTER_TARGET",
    "FSAT_MIN_LEN",
    "KERNEL_TARGETS",
    "backend_flags",
    "centroid_path_skipped",
    "centroid_step",
    "centroid_targets",
    "fps_cluster_target",
    "fsat_target",
    "kernel_targets",
    "triton_kernels",
]

KERNEL_TARGETS = {"fps": 2.0, "cauchy": 5.0, "vandermonde": 5.0}  # Triton speedup over the torch path, on CUDA
FPS_CLUSTER_SHAPE = (32, 1024, 512)  # (B, N, M) of the FPS target against torch-cluster's FPS
FPS_CLUSTER_TARGET = 2.0  # Triton FPS speedup over torch-cluster's, on CUDA
FSAT_MIN_LEN = 16384  # FSAT must beat SDPA from this sequence length on

# tools/bench_centroid.py: one attention step from M = N / 4 centroids to N inputs, forward + backward, per path:
# the dense score matrix materialized, SDPA, the KNN forms of attention.CentroidAttention ("knn" = gather), and
# torch.compile of the KNN path as "auto" chose it before the fused kernel existed (masked where N / K <=
# MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR, else gather): what the compiler alone gives.
CENTROID_PATHS = ("dense-matmul", "dense-sdpa", "knn", "knn-masked", "knn-triton", "knn-compiled")
_KNN_FORMS = {"knn": "gather", "knn-masked": "masked", "knn-triton": "triton"}
CENTROID_TARGET_POINTS = (1024, 16384)  # the fused KNN step must beat SDPA in time and peak memory at every N here


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


def fsat_target(results: Sequence[dict], device: str) -> dict:
    """FSAT's time as a fraction of SDPA's at the longest measured L >= :data:`FSAT_MIN_LEN`, from
    ``tools/bench_mixers.py``'s rows (``{"L", "mixer", "speedup vs attention-sdpa", ...}``): < 1 is faster."""
    name = f"FSAT time vs SDPA at L >= {FSAT_MIN_LEN // 1024}K (fraction)"
    rows = [r for r in results if r["mixer"] == "fsat" and r["L"] >= FSAT_MIN_LEN]
    if not rows:
        return target(name, None, "<", 1, device=device, on="cuda", unit="", detail=f"L = {FSAT_MIN_LEN} not measured")
    r = rows[-1]
    speedup = r.get("speedup vs attention-sdpa")
    if not speedup:
        detail = f"L = {r['L']}: {r.get('error', 'no SDPA baseline')}"
        return target(name, None, "<", 1, device=device, on="cuda", unit="", detail=detail)
    return target(name, 1 / speedup, "<", 1, device=device, on="cuda", unit="", detail=f"L = {r['L']}")


def _compiled_form(N: int, K: int) -> str:
    """The KNN form "auto" took on CUDA without the fused kernel (attention.backends): masked while N / K is small."""
    return "masked" if N / K <= backends.MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR else "gather"


def centroid_path_skipped(path: str, device: str, compiled: bool) -> str | None:
    """Why ``tools/bench_centroid.py`` does not time ``path`` on ``device``, or None: the Triton kernel needs CUDA (and
    triton); the compiled row is left out unless asked for (compiling on a CPU takes minutes per shape)."""
    if path == "knn-triton":
        if torch.device(device).type != "cuda":
            return "needs CUDA (the fused Triton kernel)"
        if not backends.HAS_TRITON:
            return f"needs {backends.INSTALL_HINTS['triton']}"
    if path == "knn-compiled" and not compiled:
        return "torch.compile row not requested (--compiled yes; default on CUDA only)"
    return None


def centroid_step(cfg: dict) -> dict:
    """Time (ms, forward + backward) and peak memory (MB; None where the CPU resident set did not grow) of one step of
    ``cfg["path"]`` (one of :data:`CENTROID_PATHS`) at ``cfg``'s B, N, M, C, H, K on ``cfg["device"]``.

    Peak memory is ``torch.cuda.max_memory_allocated`` beyond what the inputs and the layer hold on CUDA, and the
    growth of the peak resident set on CPU (clean only in a fresh process: ``tools/bench_centroid.py --isolate``).
    ``"knn-compiled"`` compiles the layer (static shapes) in its warm-up step and reports the form it compiled.
    """
    device = torch.device(cfg["device"])
    torch.manual_seed(0)
    B, N, M, C, H, K, path = cfg["B"], cfg["N"], cfg["M"], cfg["C"], cfg["H"], cfg["K"], cfg["path"]
    knn = path.startswith("knn")
    form = _compiled_form(N, K) if path == "knn-compiled" else _KNN_FORMS.get(path, "auto")
    layer = CentroidAttention(C, H, num_neighbors=K if knn else None, attn_backend=form).to(device)
    x = torch.randn(B, N, C, device=device, requires_grad=True)
    u = torch.randn(B, M, C, device=device, requires_grad=True)
    forward: Callable[[Tensor, Tensor], Tensor] = layer
    if path == "dense-matmul":
        forward = lambda x, u: attention_step_reference(layer, x, u)  # noqa: E731
    elif path == "knn-compiled":
        forward = torch.compile(layer, dynamic=False)

    def step() -> None:
        forward(x, u).sum().backward()
        x.grad = u.grad = None
        layer.zero_grad(set_to_none=True)

    step()  # warm-up (Triton and torch.compile compile here); then measure the peak of one clean step
    if device.type == "cuda":
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
    return out | ({"form": form} if path == "knn-compiled" else {})


def centroid_targets(rows: Sequence[dict], device: str) -> list[dict]:
    """The fused KNN step against SDPA's dense attention at every measured N in :data:`CENTROID_TARGET_POINTS`' range,
    from ``tools/bench_centroid.py``'s rows (``{"N", "path", "ms", "peak_mb"}``): its slowest speedup (> 1 wanted) and
    its largest peak-memory ratio (< 1 wanted), each a ratio of two rows of the run."""
    lo, hi = CENTROID_TARGET_POINTS
    by = {(r["N"], r["path"]): r for r in rows}
    sizes = sorted({r["N"] for r in rows if lo <= r["N"] <= hi})
    speed, memory, notes = [], [], {}
    for n in sizes:
        pair = {p: by.get((n, p), {"note": f"no {p} row (--paths)"}) for p in ("knn-triton", "dense-sdpa")}
        fused, sdpa = pair["knn-triton"], pair["dense-sdpa"]
        if fused.get("ms") is None or sdpa.get("ms") is None:
            for r in pair.values():
                if r.get("ms") is None:
                    notes.setdefault(r.get("note") or r.get("error", "failed")[:80], []).append(str(n))
            continue
        speed.append((sdpa["ms"] / fused["ms"], n))
        if fused.get("peak_mb") and sdpa.get("peak_mb"):
            memory.append((fused["peak_mb"] / sdpa["peak_mb"], n))
    span = f"N = {lo // 1024}K-{hi // 1024}K"
    detail = "; ".join(f"{why} (N={', '.join(ns)})" for why, ns in notes.items())
    detail = detail or ("no N in range measured" if not sizes else "")

    def worst(pairs: list, pick) -> tuple[float | None, str]:
        if not pairs or notes:
            return None, detail or "not measured"
        value, n = pick(pairs)
        return value, f"worst at N={n} of {', '.join(str(m) for _, m in sorted(pairs, key=lambda p: p[1]))}"

    fastest, where = worst(speed, min)
    out = [target(f"fused KNN step vs SDPA speedup at every {span}", fastest, ">", 1, device=device, on="cuda",
                  detail=where)]  # fmt: skip
    ratio, where = worst(memory, max)
    out.append(target(f"fused KNN step vs SDPA peak memory at every {span}", ratio, "<", 1, device=device, on="cuda",
                      unit="", detail=where))  # fmt: skip
    return out
