"""Cauchy and Vandermonde matrix mixers ``y = M v`` as tiled Triton kernels that never build M.

The matrices of Hydra's Cauchy and Vandermonde mixers (Hwang et al., arXiv:2407.09941; our real-arithmetic forms in
:mod:`attention.mixers.structured`) are sums over the D channels, per batch b and head h::

    cauchy       m_ij = sum_d 1 / (a_id + b_jd)                        (the caller keeps a_id + b_jd >= c_min > 0)
    vandermonde  m_ij = sum_d cos(w q_id j) - cos(w k_jd i)             (w = 2 pi freq)
    y_i = sum_j m_ij v_j

The same x / y names are used for both: x = a or q (row terms), y = b or k (column terms). Like flash attention, each
program owns a block of rows (or columns) of one (b, h), walks the other axis in blocks, rebuilds the
``(BLOCK_M, BLOCK_N)`` tile of M from x and y in registers and multiplies it into an fp32 accumulator: no ``L x L``
(let alone ``L x L x D``) tensor ever exists, and extra memory is O(B H L (D + Dv)), the inputs' and gradients' size.

Backward pass, with ``G_ij = dLoss / dm_ij = g_i . v_j`` (g the output gradient)::

    dv_j  = sum_i m_ij g_i
    dx_id = sum_j G_ij dm_ij/dx_id      cauchy: -1 / (x_id + y_jd)^2     vandermonde: -w j sin(w x_id j)
    dy_jd = sum_i G_ij dm_ij/dy_jd      cauchy: -1 / (x_id + y_jd)^2     vandermonde:  w i sin(w y_jd i)

split into two kernels that recompute the tiles, so no atomics are needed: one parallel over row blocks (dx) and one
over column blocks (dy and dv). As ``dm_ij/dx_id`` depends on d, the backward tiles are ``(BLOCK_M, BLOCK_N, D)``
(D padded to a power of two) reduced over one axis; the forward tile (and the Vandermonde m of the column kernel,
which would not fit in registers next to the sines) sums over d in a loop.

Everything is computed in float32 (products through ``tl.dot`` with ``input_precision="ieee"``, not TF32); inputs must
be float32 (:func:`attention.mixers.functional.cauchy_mix` / ``vandermonde_mix`` cast). The reference is the chunked
PyTorch path of :mod:`attention.mixers.functional`. ``tests/attention/test_mixers_triton.py`` compares outputs and all
gradients with it and with the dense matrix under Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors) and, in
its ``gpu``-marked tests, on CUDA; a ``slow`` test compiles them for sm_90 ahead of time (at most a few bytes of
register spills for D, Dv <= 64, read off ptxas). The Vandermonde kernels take their phases in turns (``freq * q *
j``) and evaluate ``cos`` / ``sin`` with :func:`_cos_turns`, whose range reduction is one subtraction, instead of
``tl.cos`` / ``tl.sin``, whose general one dominates their time (``tools/bench_mixers.py --device cuda`` times them).
"""

from __future__ import annotations

import contextlib
import math

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._triton_compat import loop_bound
from .limits import MIX_TRITON_MAX_HEAD_DIM as MAX_HEAD_DIM

__all__ = ["MAX_HEAD_DIM", "CauchyMixTriton", "VandermondeMixTriton", "cauchy_mix_triton", "vandermonde_mix_triton"]

_CAUCHY: tl.constexpr = tl.constexpr(0)  # the kernels' KIND
_VANDERMONDE: tl.constexpr = tl.constexpr(1)
_TWO_PI: tl.constexpr = tl.constexpr(2 * math.pi)


@triton.jit
def _cos_turns(t):
    """``cos(2 pi t)`` for float32 ``t`` (turns), without libdevice's general range reduction.

    ``tl.cos`` of a radian argument runs libdevice's ``cosf`` (a multi-step reduction of any float to [-pi/4, pi/4]
    plus polynomials), which makes the Vandermonde kernels several times slower than the Cauchy kernels, the same
    loops with a division instead. Here the argument is in turns, so the
    reduction is exact: ``r = t - floor(t + 1/2)`` in [-1/2, 1/2) (a float subtraction of two nearby values), then
    ``a = |r|`` folded into [0, 1/4] with ``cos(2 pi a) = -cos(2 pi (1/2 - a))``, and a degree-12 Taylor polynomial
    of ``cos`` on [0, pi/2] (truncation error below 7e-9; float32 rounding about 1e-7 absolute). The callers'
    phases ``freq * x * j`` carry their own float32 rounding (one ulp of the phase), as the torch path's
    ``cos(2 pi freq x j)`` does.
    """
    r = t - tl.floor(t + 0.5)
    a = tl.abs(r)
    flip = a > 0.25
    x = tl.where(flip, 0.5 - a, a) * _TWO_PI
    x2 = x * x
    c = 1.0 / 479001600.0  # 1/12!, then Horner in x^2 down to 1
    c = c * x2 - 1.0 / 3628800.0
    c = c * x2 + 1.0 / 40320.0
    c = c * x2 - 1.0 / 720.0
    c = c * x2 + 1.0 / 24.0
    c = c * x2 - 0.5
    c = c * x2 + 1.0
    return tl.where(flip, -c, c)


@triton.jit
def _sin_turns(t):
    """``sin(2 pi t) = cos(2 pi (t - 1/4))`` (see :func:`_cos_turns`)."""
    return _cos_turns(t - 0.25)


@triton.jit
def _load_tile(base, rows, mask_rows, cols, mask_cols, width, other):
    """The ``(rows, cols)`` tile of a row-major matrix ``width`` wide at ``base``; ``other`` where masked."""
    return tl.load(
        base + rows[:, None] * width + cols[None, :], mask=mask_rows[:, None] & mask_cols[None, :], other=other
    )


@triton.jit
def _store_tile(base, rows, mask_rows, cols, mask_cols, width, value):
    """Writes ``value`` to the ``(rows, cols)`` tile of a row-major matrix ``width`` wide at ``base``."""
    tl.store(base + rows[:, None] * width + cols[None, :], value, mask=mask_rows[:, None] & mask_cols[None, :])


@triton.jit
def _m_tile(x_base, y_base, offs_m, offs_n, mask_m, mask_n, D, f, KIND: tl.constexpr, BLOCK_M: tl.constexpr,
            BLOCK_N: tl.constexpr):  # fmt: skip
    """The ``(BLOCK_M, BLOCK_N)`` tile of M at rows ``offs_m`` and columns ``offs_n``, summed over d in a loop;
    padded rows and columns (loaded as 1.0) give exact zeros."""
    valid = mask_m[:, None] & mask_n[None, :]
    i, j = offs_m.to(tl.float32), offs_n.to(tl.float32)
    m = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for d in range(loop_bound(D)):
        xd = tl.load(x_base + offs_m * D + d, mask=mask_m, other=1.0)  # (BLOCK_M,)
        yd = tl.load(y_base + offs_n * D + d, mask=mask_n, other=1.0)  # (BLOCK_N,)
        if KIND == _CAUCHY:
            t = 1.0 / (xd[:, None] + yd[None, :])
        else:
            t = _cos_turns(f * xd[:, None] * j[None, :]) - _cos_turns(f * yd[None, :] * i[:, None])
        m += tl.where(valid, t, 0.0)
    return m


@triton.jit
def _bwd_bases(x_ptr, y_ptr, v_ptr, g_ptr, L, D, DV, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr):
    """The backward kernels' start: this program's (batch, head) ``bh``, the d and dv offsets and masks, and where
    its rows of x, y, v and g begin."""
    bh = tl.program_id(1).to(tl.int64)
    offs_d, offs_dv = tl.arange(0, BLOCK_D), tl.arange(0, BLOCK_DV)
    x_base, y_base = x_ptr + bh * L * D, y_ptr + bh * L * D
    v_base, g_base = v_ptr + bh * L * DV, g_ptr + bh * L * DV
    return bh, offs_d, offs_dv, offs_d < D, offs_dv < DV, x_base, y_base, v_base, g_base


@triton.jit
def _mix_fwd_kernel(
    x_ptr,  # (BH, L, D) float32, contiguous: a (Cauchy) or q (Vandermonde)
    y_ptr,  # (BH, L, D): b or k
    v_ptr,  # (BH, L, DV)
    out_ptr,  # (BH, L, DV)
    L,
    D,
    DV,
    f,  # freq: the phases f q j and f k i are in turns (Vandermonde; unused by Cauchy)
    KIND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_dv = tl.arange(0, BLOCK_DV)
    mask_m, mask_dv = offs_m < L, offs_dv < DV
    x_base, y_base, v_base = x_ptr + bh * L * D, y_ptr + bh * L * D, v_ptr + bh * L * DV
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)
    for n0 in range(0, loop_bound(L), BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < L
        m = _m_tile(x_base, y_base, offs_m, offs_n, mask_m, mask_n, D, f, KIND, BLOCK_M, BLOCK_N)
        vj = _load_tile(v_base, offs_n, mask_n, offs_dv, mask_dv, DV, 0.0)
        acc = tl.dot(m, vj, acc, input_precision="ieee")  # (BLOCK_M, BLOCK_DV)
    _store_tile(out_ptr + bh * L * DV, offs_m, mask_m, offs_dv, mask_dv, DV, acc)


@triton.jit
def _mix_bwd_rows_kernel(
    x_ptr,  # (BH, L, D)
    y_ptr,  # (BH, L, D)
    v_ptr,  # (BH, L, DV)
    g_ptr,  # (BH, L, DV): dLoss / dy_out
    gx_ptr,  # (BH, L, D): dLoss / dx, written
    L,
    D,
    DV,
    f,
    KIND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    bh, offs_d, offs_dv, mask_d, mask_dv, x_base, y_base, v_base, g_base = _bwd_bases(
        x_ptr, y_ptr, v_ptr, g_ptr, L, D, DV, BLOCK_D, BLOCK_DV
    )
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    mask_m = offs_m < L
    x = _load_tile(x_base, offs_m, mask_m, offs_d, mask_d, D, 1.0)  # (BLOCK_M, BLOCK_D)
    g = _load_tile(g_base, offs_m, mask_m, offs_dv, mask_dv, DV, 0.0)
    acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
    for n0 in range(0, loop_bound(L), BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < L
        y = _load_tile(y_base, offs_n, mask_n, offs_d, mask_d, D, 1.0)
        vj = _load_tile(v_base, offs_n, mask_n, offs_dv, mask_dv, DV, 0.0)
        gm = tl.dot(g, tl.trans(vj), input_precision="ieee")  # (BLOCK_M, BLOCK_N): G_ij = g_i . v_j
        valid = (mask_m[:, None] & mask_n[None, :])[:, :, None] & mask_d[None, None, :]  # (BLOCK_M, BLOCK_N, BLOCK_D)
        if KIND == _CAUCHY:
            r = 1.0 / (x[:, None, :] + y[None, :, :])
            dm = -(r * r)  # d m_ij / d a_id
        else:
            jf = f * offs_n.to(tl.float32)[None, :, None]  # f j
            dm = -(_TWO_PI * jf) * _sin_turns(x[:, None, :] * jf)  # d m_ij / d q_id
        acc += tl.sum(gm[:, :, None] * tl.where(valid, dm, 0.0), axis=1)
    _store_tile(gx_ptr + bh * L * D, offs_m, mask_m, offs_d, mask_d, D, acc)


@triton.jit
def _mix_bwd_cols_kernel(
    x_ptr,  # (BH, L, D)
    y_ptr,  # (BH, L, D)
    v_ptr,  # (BH, L, DV)
    g_ptr,  # (BH, L, DV)
    gy_ptr,  # (BH, L, D): dLoss / dy, written
    gv_ptr,  # (BH, L, DV): dLoss / dv, written
    L,
    D,
    DV,
    f,
    KIND: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    bh, offs_d, offs_dv, mask_d, mask_dv, x_base, y_base, v_base, g_base = _bwd_bases(
        x_ptr, y_ptr, v_ptr, g_ptr, L, D, DV, BLOCK_D, BLOCK_DV
    )
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_n = offs_n < L
    y = _load_tile(y_base, offs_n, mask_n, offs_d, mask_d, D, 1.0)  # (BLOCK_N, BLOCK_D)
    vj = _load_tile(v_base, offs_n, mask_n, offs_dv, mask_dv, DV, 0.0)  # (BLOCK_N, BLOCK_DV)
    acc_y = tl.zeros([BLOCK_N, BLOCK_D], dtype=tl.float32)
    acc_v = tl.zeros([BLOCK_N, BLOCK_DV], dtype=tl.float32)
    for m0 in range(0, loop_bound(L), BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        mask_m = offs_m < L
        x = _load_tile(x_base, offs_m, mask_m, offs_d, mask_d, D, 1.0)
        g = _load_tile(g_base, offs_m, mask_m, offs_dv, mask_dv, DV, 0.0)
        gm = tl.dot(g, tl.trans(vj), input_precision="ieee")  # (BLOCK_M, BLOCK_N): G_ij
        valid = (mask_m[:, None] & mask_n[None, :])[:, :, None] & mask_d[None, None, :]  # (BLOCK_M, BLOCK_N, BLOCK_D)
        if KIND == _CAUCHY:
            r = tl.where(valid, 1.0 / (x[:, None, :] + y[None, :, :]), 0.0)  # the terms of m_ij
            m = tl.sum(r, axis=2)  # (BLOCK_M, BLOCK_N)
            dm = -(r * r)  # d m_ij / d b_jd
        else:
            # m by a loop over d as in the forward kernel: a second (BLOCK_M, BLOCK_N, BLOCK_D) tile of cosines
            # next to the sines spilled registers (ptxas, sm_90, D = 64)
            m = _m_tile(x_base, y_base, offs_m, offs_n, mask_m, mask_n, D, f, KIND, BLOCK_M, BLOCK_N)
            fi = f * offs_m.to(tl.float32)[:, None, None]
            dm = tl.where(valid, (_TWO_PI * fi) * _sin_turns(y[None, :, :] * fi), 0.0)  # d m_ij / d k_jd
        acc_y += tl.sum(gm[:, :, None] * dm, axis=0)
        acc_v = tl.dot(tl.trans(m), g, acc_v, input_precision="ieee")  # dv_j += sum_i m_ij g_i
    _store_tile(gy_ptr + bh * L * D, offs_n, mask_n, offs_d, mask_d, D, acc_y)
    _store_tile(gv_ptr + bh * L * DV, offs_n, mask_n, offs_dv, mask_dv, DV, acc_v)


def _blocks(L: int, D: int, Dv: int, block_m: int | None, block_n: int | None) -> dict[str, int]:
    """Tile sizes and warps: >= 16 where ``tl.dot`` needs it; the backward's 3-d tiles at most 16K values (D <= 64)."""
    bd = triton.next_power_of_2(D)
    small = 32 if bd <= 16 else 16
    cap = max(16, triton.next_power_of_2(L))  # no tile larger than the sequence needs
    bwd_m, bwd_n = block_m or min(small, cap), block_n or min(small, cap)
    bdv = max(16, triton.next_power_of_2(Dv))
    return dict(
        fwd_m=block_m or min(64, cap),
        fwd_n=block_n or min(32, cap),
        bwd_m=bwd_m,
        bwd_n=bwd_n,
        BLOCK_D=bd,
        BLOCK_DV=bdv,
        # the 3-d tile plus the (block, Dv) operands: from about 10K values on, 4 warps' registers spill (ptxas, sm_90)
        bwd_warps=8 if bwd_m * bwd_n * bd + (bwd_m + bwd_n) * bdv >= 10240 else 4,
    )


def _device(t: Tensor) -> contextlib.AbstractContextManager:
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()  # launch on the tensors' GPU


def _check(x: Tensor, y: Tensor, v: Tensor) -> None:
    if x.shape != y.shape or x.shape[:3] != v.shape[:3] or x.dim() != 4:
        raise ValueError(f"expected x, y (B, H, L, D) and v (B, H, L, Dv), got {[tuple(t.shape) for t in (x, y, v)]}")
    if any(t.dtype != torch.float32 for t in (x, y, v)):
        raise ValueError(f"the Triton mixers take float32 tensors (the caller casts), got {x.dtype, y.dtype, v.dtype}")


def launch_forward(
    x: Tensor, y: Tensor, v: Tensor, f: float, kind: int, block_m: int | None, block_n: int | None
) -> Tensor:
    """The forward kernel on contiguous float32 x, y, v: ``y = M v``. Runs as ``torch.ops.attention.structured_mix_fwd``
    (declared in :mod:`attention.kernels.ops`)."""
    B, H, L, D = x.shape
    Dv = v.shape[-1]
    blk = _blocks(L, D, Dv, block_m, block_n)
    out = torch.empty_like(v)
    with _device(x):
        _mix_fwd_kernel[(triton.cdiv(L, blk["fwd_m"]), B * H)](
            x, y, v, out, L, D, Dv, f,
            KIND=kind, BLOCK_M=blk["fwd_m"], BLOCK_N=blk["fwd_n"], BLOCK_DV=blk["BLOCK_DV"],
            num_warps=4, enable_fp_fusion=True,
        )  # fmt: skip
    return out


def launch_backward(
    x: Tensor, y: Tensor, v: Tensor, g: Tensor, f: float, kind: int, block_m: int | None, block_n: int | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The two backward kernels (rows: dx; columns: dy, dv): ``(dx, dy, dv)``. Runs as
    ``torch.ops.attention.structured_mix_bwd``."""
    B, H, L, D = x.shape
    Dv = v.shape[-1]
    blk = _blocks(L, D, Dv, block_m, block_n)
    g = g.float().contiguous()  # e.g. the stride-0 gradient of a .sum()
    gx, gy, gv = torch.empty_like(x), torch.empty_like(y), torch.empty_like(v)
    common = dict(
        KIND=kind, BLOCK_M=blk["bwd_m"], BLOCK_N=blk["bwd_n"], BLOCK_D=blk["BLOCK_D"], BLOCK_DV=blk["BLOCK_DV"],
        num_warps=blk["bwd_warps"], enable_fp_fusion=True,
    )  # fmt: skip
    with _device(x):
        _mix_bwd_rows_kernel[(triton.cdiv(L, blk["bwd_m"]), B * H)](x, y, v, g, gx, L, D, Dv, f, **common)
        _mix_bwd_cols_kernel[(triton.cdiv(L, blk["bwd_n"]), B * H)](x, y, v, g, gy, gv, L, D, Dv, f, **common)
    return gx, gy, gv


class CauchyMixTriton(torch.autograd.Function):
    """``y_i = sum_j (sum_d 1 / (a_id + b_jd)) v_j``; ``apply(a, b, v, block_m, block_n)``, float32 ``(B, H, L, .)``."""

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, v: Tensor, block_m: int | None, block_n: int | None) -> Tensor:
        _check(a, b, v)
        a, b, v = a.contiguous(), b.contiguous(), v.contiguous()
        ctx.save_for_backward(a, b, v)
        ctx.blocks = block_m, block_n
        return torch.ops.attention.structured_mix_fwd(a, b, v, 0.0, _CAUCHY.value, block_m, block_n)

    @staticmethod
    @once_differentiable
    def backward(ctx, gy: Tensor) -> tuple[Tensor | None, ...]:
        a, b, v = ctx.saved_tensors
        return (*torch.ops.attention.structured_mix_bwd(a, b, v, gy, 0.0, _CAUCHY.value, *ctx.blocks), None, None)


class VandermondeMixTriton(torch.autograd.Function):
    """``y_i = sum_j (sum_d cos(2 pi freq q_id j) - cos(2 pi freq k_jd i)) v_j``;
    ``apply(q, k, v, freq, block_m, block_n)``."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, freq: float, block_m: int | None, block_n: int | None) -> Tensor:
        _check(q, k, v)
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        ctx.save_for_backward(q, k, v)
        ctx.freq, ctx.blocks = float(freq), (block_m, block_n)
        return torch.ops.attention.structured_mix_fwd(q, k, v, ctx.freq, _VANDERMONDE.value, block_m, block_n)

    @staticmethod
    @once_differentiable
    def backward(ctx, gy: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v = ctx.saved_tensors
        grads = torch.ops.attention.structured_mix_bwd(q, k, v, gy, ctx.freq, _VANDERMONDE.value, *ctx.blocks)
        return (*grads, None, None, None)


def cauchy_mix_triton(
    a: Tensor, b: Tensor, v: Tensor, block_m: int | None = None, block_n: int | None = None
) -> Tensor:
    """Cauchy mix of float32 ``(B, H, L, D)`` a, b and ``(B, H, L, Dv)`` v.

    ``block_m`` / ``block_n`` override the tile sizes (powers of two, >= 16; the tests use small ones).
    """
    return CauchyMixTriton.apply(a, b, v, block_m, block_n)


def vandermonde_mix_triton(
    q: Tensor, k: Tensor, v: Tensor, freq: float, block_m: int | None = None, block_n: int | None = None
) -> Tensor:
    """Vandermonde mix at frequency ``freq`` (turns per position per unit of q / k); arguments as
    :func:`cauchy_mix_triton`."""
    return VandermondeMixTriton.apply(q, k, v, freq, block_m, block_n)
