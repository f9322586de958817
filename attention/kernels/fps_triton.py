"""Farthest point sampling as one Triton program per cloud.

The reference (``backend="torch"`` of :func:`attention.farthest_point_sample`) launches a handful of kernels for
each of the M steps; here one program per batch element keeps the running min-distance of all N points in registers
and runs all M steps in a single launch. Distances are accumulated channel by channel in float32 in the same order as
the reference, without fused multiply-adds, and ``tl.argmax`` breaks ties to the lowest index like ``torch.argmax``,
so the indices equal the reference's. Its limits (N, C) are in :mod:`attention.kernels.limits`, where
:mod:`attention.backends` reads them.

Tested against the reference on CUDA (``tests/attention/test_points.py``, marked ``gpu``) and, without a GPU, under
Triton's interpreter (``TRITON_INTERPRET=1``) on CPU tensors.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from ._triton_compat import loop_bound
from .limits import FPS_TRITON_MAX_CHANNELS as MAX_CHANNELS
from .limits import FPS_TRITON_MAX_POINTS as MAX_POINTS

__all__ = ["MAX_CHANNELS", "MAX_POINTS", "fps_triton"]


@triton.jit
def _fps_kernel(
    x_ptr,  # (B, N, C) float32, contiguous
    mask_ptr,  # (B, N) int8, 1 = real point (unused when HAS_MASK is False)
    start_ptr,  # (B,) int64
    out_ptr,  # (B, M) int64
    N,
    M,
    C: tl.constexpr,
    HAS_MASK: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_N)
    in_range = offs < N
    base = x_ptr + b * N * C
    real = in_range
    if HAS_MASK:
        real = real & (tl.load(mask_ptr + b * N + offs, mask=in_range, other=0) != 0)
    # Padded points and the power-of-two tail carry -1 and can never be the farthest.
    dist = tl.where(real, float("inf"), -1.0)
    far = tl.load(start_ptr + b)
    for i in range(loop_bound(M)):
        tl.store(out_ptr + b * M + i, far)
        d = tl.zeros([BLOCK_N], dtype=tl.float32)
        for c in tl.static_range(C):
            xc = tl.load(base + offs * C + c, mask=in_range, other=0.0)
            diff = xc - tl.load(base + far * C + c)
            d += diff * diff
        dist = tl.minimum(dist, d)
        far = tl.argmax(dist, axis=0).to(tl.int64)


def fps_triton(x: Tensor, num_samples: int, start: Tensor, mask: Tensor | None) -> Tensor:
    """FPS indices ``(B, M)`` of ``x`` ``(B, N, C)`` from ``start`` ``(B,)``; same contract as the reference."""
    B, N, C = x.shape
    if N > MAX_POINTS or C > MAX_CHANNELS:  # attention.backends refuses these before they get here
        raise ValueError(f"fps_triton supports N <= {MAX_POINTS} and C <= {MAX_CHANNELS}, got N={N}, C={C}")
    xf = x.detach().float().contiguous()
    out = torch.empty(B, num_samples, dtype=torch.long, device=x.device)
    m = mask.to(torch.int8).contiguous() if mask is not None else xf  # any pointer when unused
    block = triton.next_power_of_2(N)
    num_warps = 4 if block <= 2048 else (8 if block <= 8192 else 16)
    _fps_kernel[(B,)](
        xf, m, start.long().contiguous(), out, N, num_samples,
        C=C, HAS_MASK=mask is not None, BLOCK_N=block, num_warps=num_warps,
        enable_fp_fusion=False,  # square, then add: the reference's rounding, so near-ties break the same way
    )  # fmt: skip
    return out
