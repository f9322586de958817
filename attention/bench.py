"""Benchmarks of the shared core: the Triton kernels against the torch paths they replace, and the targets that
``tools/bench_points.py`` and ``tools/bench_mixers.py`` declare.

Every target is a ratio of two rows measured in the same run (:func:`engine.bench.target`): a speedup of a kernel
over the path it replaces, never an absolute time, so that it reads the same on a busy machine. The thresholds are
CUDA figures: a CPU run reports the ratios with no verdict.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import torch

from engine.bench import target, time_fn

from . import backends
from .mixers import functional as mixer_functional
from .points import farthest_point_sample

__all__ = [
    "FPS_CLUSTER_SHAPE",
    "FPS_CLUSTER_TARGET",
    "FSAT_MIN_LEN",
    "KERNEL_TARGETS",
    "backend_flags",
    "fps_cluster_target",
    "fsat_target",
    "kernel_targets",
    "triton_kernels",
]

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
