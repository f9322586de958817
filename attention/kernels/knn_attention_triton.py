"""KNN centroid attention (``normalize="inputs"``) as one Triton program per (centroid, block of heads): keys and
values are read by index, never gathered into a ``(B, M, K, H, D)`` tensor, and no ``(B, M, N)`` mask is built.

For centroid m of batch element b and head h, with neighbours ``j_k = idx[b, m, k]`` (k < K) and real inputs
``mask[b, j]`` (all True without a mask)::

    s_k = q_m . k_{j_k} / sqrt(D)           (-inf where mask[b, j_k] is False)
    p_k = exp(s_k - lse_m),  lse_m = log sum_k exp(s_k)
    o_m = sum_k p_k v_{j_k}

The forward program walks the K neighbours in blocks of ``BLOCK_K`` with an online softmax (running max and sum, as
FlashAttention), holds one ``(BLOCK_K, BLOCK_H * D)`` tile of keys and one of values at a time, writes ``o_m`` and
saves ``lse_m`` (float32, ``(B, H, M)``). Its ``BLOCK_H`` heads share the neighbours' indices: one program reads each
neighbour's rows of all of them, contiguous in the layer's ``(B, N, H, D)`` layout. The backward program recomputes
``p_k`` from the saved ``lse_m``, with ``g = dLoss / do_m`` and ``delta_m = g . o_m``::

    dp_k = g . v_{j_k}          ds_k = p_k (dp_k - delta_m)   (0 where masked)
    dq_m = sum_k ds_k k_{j_k} / sqrt(D)                        (in the program: no other program writes it)
    dk_{j_k} += ds_k q_m / sqrt(D)      dv_{j_k} += p_k g      (scattered with float32 atomics)

A neighbour listed twice in a row contributes twice, as in the reference (the gather path,
:func:`attention.centroid.knn_centroid_attention`, which gathers and scatters per (centroid, neighbour) edge). A
centroid whose neighbours are all masked gets what the reference gives: ``lse = -inf``, a NaN output, zero ``dq`` and
zero key gradients from it, NaN value gradients at its neighbours (the reference's softmax of an all ``-inf`` row is
NaN).

Determinism: the key and value gradients are sums of float32 atomic adds into ``(B, N, H, D)`` buffers, whose order
varies from run to run, so ``dk`` and ``dv`` can differ in their last bits between two identical calls (the values
before the final cast to the inputs' dtype); the output and ``dq`` are deterministic. ``attention.backends`` does not
pick this kernel while ``torch.use_deterministic_algorithms(True)`` is on.

Everything is computed in float32 from inputs of any floating dtype (outputs and gradients are cast back).
``dropout_p > 0`` is not supported (the switchboard refuses it). Limits: :mod:`attention.kernels.limits`. Tests:
``tests/attention/test_knn_attention_triton.py`` (outputs and every gradient against the reference, under Triton's
interpreter on CPU and compiled on CUDA; an ahead-of-time compile for sm_90).
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._triton_compat import loop_bound
from .limits import KNN_ATTN_TRITON_MAX_HEAD_DIM as MAX_HEAD_DIM

__all__ = ["MAX_HEAD_DIM", "KnnAttentionTriton", "knn_attention_triton", "launch_backward", "launch_forward"]


@triton.jit
def _neighbours(idx_base, si_k, mask_ptr, b, N, k0, offs_k, K, mask_c, HAS_MASK: tl.constexpr):
    """Block ``k0`` of the centroid's neighbours: their input rows ``j`` (BLOCK_K,), which of them count (listed and,
    with a mask, real inputs) and the ``(BLOCK_K, BLOCK_H * BLOCK_D)`` tile of their key and value rows to read."""
    in_k = k0 + offs_k < K
    j = tl.load(idx_base + (k0 + offs_k) * si_k, mask=in_k, other=0)
    valid = in_k
    if HAS_MASK:
        valid = valid & (tl.load(mask_ptr + b * N + j, mask=in_k, other=0) != 0)
    return j, valid, in_k[:, None] & mask_c[None, :]


@triton.jit
def _rows(base, j, s_n, offs_c, tile):
    """Rows ``j`` of the program's heads of the keys or values, ``(BLOCK_K, BLOCK_H * BLOCK_D)`` in float32 (``base``
    plus ``offs_c``: each channel's address in row 0; ``s_n`` from row to row)."""
    return tl.load(base + j[:, None] * s_n + offs_c[None, :], mask=tile, other=0.0).to(tl.float32)


@triton.jit
def _per_head(x, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """``(BLOCK_K, BLOCK_H * BLOCK_D)`` -> ``(BLOCK_K, BLOCK_H)``: the sum over each head's channels."""
    if BLOCK_H == 1:  # a plain row sum: a reshape costs layout conversions, and one head needs none
        y = tl.sum(x, axis=1)[:, None]
    else:
        y = tl.sum(tl.reshape(x, (BLOCK_K, BLOCK_H, BLOCK_D)), axis=2)
    return y


@triton.jit
def _channels(x, BLOCK_K: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """``(BLOCK_K, BLOCK_H)`` -> ``(BLOCK_K, BLOCK_H * BLOCK_D)``: each head's value on every one of its channels
    (one head: ``(BLOCK_K, 1)``, which broadcasts)."""
    if BLOCK_H == 1:
        y = x
    else:
        y = tl.reshape(tl.broadcast_to(x[:, :, None], (BLOCK_K, BLOCK_H, BLOCK_D)), (BLOCK_K, BLOCK_H * BLOCK_D))
    return y


@triton.jit
def _channel_index(h0, H, D, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """The program's channels, BLOCK_D of each of its heads from ``h0`` on, head-major: each one's head (from h0)
    and index in the head, and which are real (``(BLOCK_H * BLOCK_D,)`` each)."""
    ch = tl.arange(0, BLOCK_H * BLOCK_D)
    ch_h, ch_d = ch // BLOCK_D, ch % BLOCK_D
    return ch_h, ch_d, (h0 + ch_h < H) & (ch_d < D)


@triton.jit
def _channels_1d(x, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    """``(BLOCK_H,)`` -> ``(BLOCK_H * BLOCK_D,)``: as :func:`_channels`, for one row (one head: ``(1,)``)."""
    if BLOCK_H == 1:
        y = x
    else:
        y = tl.reshape(tl.broadcast_to(x[:, None], (BLOCK_H, BLOCK_D)), (BLOCK_H * BLOCK_D,))
    return y


@triton.jit
def _knn_attn_fwd_kernel(
    q_ptr,  # (B, H, M, D), any strides
    k_ptr,  # (B, H, N, D)
    v_ptr,  # (B, H, N, D)
    idx_ptr,  # (B, M, K) int64
    mask_ptr,  # (B, N) uint8, contiguous (unused without HAS_MASK)
    out_ptr,  # (B, H, M, D)
    out32_ptr,  # (B, H, M, D) float32 with out's strides: the output before rounding (written with STORE_F32)
    lse_ptr,  # (B, H, M) float32, contiguous
    M, N, K, H, D,
    sq_b, sq_h, sq_m, sq_d,
    sk_b, sk_h, sk_n, sk_d,
    sv_b, sv_h, sv_n, sv_d,
    si_b, si_m, si_k,
    so_b, so_h, so_m, so_d,
    scale,
    HAS_MASK: tl.constexpr,
    STORE_F32: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)  # b * M + m
    b, m = row // M, row % M
    h0 = tl.program_id(1).to(tl.int64) * BLOCK_H
    offs_k, offs_h = tl.arange(0, BLOCK_K), h0 + tl.arange(0, BLOCK_H)
    ch_h, ch_d, mask_c = _channel_index(h0, H, D, BLOCK_H, BLOCK_D)
    q = tl.load(q_ptr + b * sq_b + (h0 + ch_h) * sq_h + m * sq_m + ch_d * sq_d, mask=mask_c, other=0.0).to(tl.float32)
    k_base, v_base = k_ptr + b * sk_b + h0 * sk_h, v_ptr + b * sv_b + h0 * sv_h
    ch_h64 = ch_h.to(tl.int64)  # int64: (BLOCK_H - 1) times a head stride can pass int32
    ck, cv = ch_h64 * sk_h + ch_d * sk_d, ch_h64 * sv_h + ch_d * sv_d  # channel offsets in a key or value row
    idx_base = idx_ptr + b * si_b + m * si_m
    # running max, sum (per head) and weighted sum (per channel) of the online softmax
    m_i = tl.full([BLOCK_H], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H * BLOCK_D], tl.float32)
    for k0 in range(0, loop_bound(K), BLOCK_K):
        j, valid, tile = _neighbours(idx_base, si_k, mask_ptr, b, N, k0, offs_k, K, mask_c, HAS_MASK)
        kn = _rows(k_base, j, sk_n, ck, tile)
        s = _per_head(kn * q[None, :], BLOCK_K, BLOCK_H, BLOCK_D) * scale  # (BLOCK_K, BLOCK_H)
        s = tl.where(valid[:, None], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        # an all -inf prefix keeps the max at -inf: shift by 0 instead, so that exp gives 0 rather than NaN
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m_i - m_safe)
        p = tl.exp(s - m_safe[None, :])
        vn = _rows(v_base, j, sv_n, cv, tile)
        l_i = l_i * alpha + tl.sum(p, axis=0)
        acc = acc * _channels_1d(alpha, BLOCK_H, BLOCK_D) + tl.sum(_channels(p, BLOCK_K, BLOCK_H, BLOCK_D) * vn, axis=0)
        m_i = m_new
    # 0 / 0 = NaN for a centroid whose neighbours are all masked, as the reference's softmax
    out = acc / _channels_1d(l_i, BLOCK_H, BLOCK_D)
    out_rows = b * so_b + (h0 + ch_h) * so_h + m * so_m + ch_d * so_d
    tl.store(out_ptr + out_rows, out.to(out_ptr.dtype.element_ty), mask=mask_c)
    if STORE_F32:
        tl.store(out32_ptr + out_rows, out, mask=mask_c)
    tl.store(lse_ptr + (b * H + offs_h) * M + m, m_i + tl.log(l_i), mask=offs_h < H)


@triton.jit
def _knn_attn_bwd_kernel(
    q_ptr, k_ptr, v_ptr, idx_ptr, mask_ptr,
    out_ptr,  # (B, H, M, D) float32: the forward's output, unrounded (strides so_*, as dq)
    g_ptr,  # (B, H, M, D): dLoss / dout
    lse_ptr,  # (B, H, M) float32
    dq_ptr,  # (B, H, M, D): written, strides so_*
    dk_ptr,  # (B, N, H, D) float32, contiguous, zeroed: accumulated with atomics
    dv_ptr,  # (B, N, H, D) float32, contiguous, zeroed
    M, N, K, H, D,
    sq_b, sq_h, sq_m, sq_d,
    sk_b, sk_h, sk_n, sk_d,
    sv_b, sv_h, sv_n, sv_d,
    si_b, si_m, si_k,
    so_b, so_h, so_m, so_d,
    sg_b, sg_h, sg_m, sg_d,
    scale,
    HAS_MASK: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    b, m = row // M, row % M
    h0 = tl.program_id(1).to(tl.int64) * BLOCK_H
    offs_k, offs_h = tl.arange(0, BLOCK_K), h0 + tl.arange(0, BLOCK_H)
    ch_h, ch_d, mask_c = _channel_index(h0, H, D, BLOCK_H, BLOCK_D)
    q = tl.load(q_ptr + b * sq_b + (h0 + ch_h) * sq_h + m * sq_m + ch_d * sq_d, mask=mask_c, other=0.0).to(tl.float32)
    out_rows = b * so_b + (h0 + ch_h) * so_h + m * so_m + ch_d * so_d
    o = tl.load(out_ptr + out_rows, mask=mask_c, other=0.0)
    g = tl.load(g_ptr + b * sg_b + (h0 + ch_h) * sg_h + m * sg_m + ch_d * sg_d, mask=mask_c, other=0.0).to(tl.float32)
    lse = tl.load(lse_ptr + (b * H + offs_h) * M + m, mask=offs_h < H, other=0.0)  # (BLOCK_H,)
    # sum_k p_k dp_k per head (from the float32 output: a bf16 one made dk's error 2x bf16's)
    delta = _per_head((g * o)[None, :], 1, BLOCK_H, BLOCK_D)  # (1, BLOCK_H)
    k_base, v_base = k_ptr + b * sk_b + h0 * sk_h, v_ptr + b * sv_b + h0 * sv_h
    ch_h64 = ch_h.to(tl.int64)  # int64: (BLOCK_H - 1) times a head stride can pass int32
    ck, cv = ch_h64 * sk_h + ch_d * sk_d, ch_h64 * sv_h + ch_d * sv_d  # channel offsets in a key or value row
    idx_base = idx_ptr + b * si_b + m * si_m
    grad_base = b * N * H * D + (h0 + ch_h) * D + ch_d  # row j of (B, N, H, D) starts at b * N * H * D + j * H * D
    dq = tl.zeros([BLOCK_H * BLOCK_D], tl.float32)
    for k0 in range(0, loop_bound(K), BLOCK_K):
        j, valid, tile = _neighbours(idx_base, si_k, mask_ptr, b, N, k0, offs_k, K, mask_c, HAS_MASK)
        kn, vn = _rows(k_base, j, sk_n, ck, tile), _rows(v_base, j, sv_n, cv, tile)
        s = _per_head(kn * q[None, :], BLOCK_K, BLOCK_H, BLOCK_D) * scale  # (BLOCK_K, BLOCK_H)
        s = tl.where(valid[:, None], s, float("-inf"))
        # exp(-inf - lse) = 0 for a masked neighbour; NaN (as the reference's) when all are masked and lse = -inf
        p = tl.exp(s - lse[None, :])
        dp = _per_head(vn * g[None, :], BLOCK_K, BLOCK_H, BLOCK_D)
        # the reference's masked_fill passes no gradient to masked scores
        ds = _channels(tl.where(valid[:, None], p * (dp - delta), 0.0), BLOCK_K, BLOCK_H, BLOCK_D)
        dq += tl.sum(ds * kn, axis=0)
        rows = grad_base[None, :] + j[:, None] * (H * D)
        tl.atomic_add(dk_ptr + rows, ds * q[None, :] * scale, mask=tile, sem="relaxed")
        tl.atomic_add(dv_ptr + rows, _channels(p, BLOCK_K, BLOCK_H, BLOCK_D) * g[None, :], mask=tile, sem="relaxed")
    tl.store(dq_ptr + out_rows, (dq * scale).to(dq_ptr.dtype.element_ty), mask=mask_c)


_MAX_HEADS_WIDTH = 512  # block_h * next_pow2(D): a 4096-value tile still holds 8 neighbours a step


def _check_blocks(D: int, block_k: int | None, block_h: int | None) -> None:
    for name, value in (("block_k", block_k), ("block_h", block_h)):
        if value is not None and (value < 1 or value & (value - 1)):
            raise ValueError(f"{name} must be a power of two (Triton's block sizes), got {value}")
    if block_h is not None and block_h * triton.next_power_of_2(D) > _MAX_HEADS_WIDTH:
        raise ValueError(
            f"block_h * next_pow2(D) must be <= {_MAX_HEADS_WIDTH} (a tile of 4096 values holds 8 neighbours a step), "
            f"got block_h={block_h} with D={D}"
        )


def _blocks(K: int, H: int, D: int, block_k: int | None, block_h: int | None) -> tuple[int, int, int, int]:
    """``BLOCK_K`` (neighbours per step of the online softmax), ``BLOCK_H`` (heads per program, at most H's next
    power of two), ``BLOCK_D`` and the warps: a ``(BLOCK_K, BLOCK_H * BLOCK_D)`` tile of keys and one of values stay
    in registers, 4096 values each unless ``block_k`` says otherwise (so more heads a program, fewer neighbours a
    step).

    A warp per 128 values of a tile: each value also holds a 64-bit address, and with fewer warps the backward
    program needs so many registers a thread (ptxas, sm_90) that too few warps stay resident for a kernel that waits
    on gathered loads. One head per program unless told (``block_h``)."""
    _check_blocks(D, block_k, block_h)
    bd = triton.next_power_of_2(D)
    bh = min(block_h or 1, triton.next_power_of_2(H))
    bk = block_k or max(2, min(triton.next_power_of_2(K), 4096 // (bh * bd), 64))
    return bk, bh, bd, max(1, min(8, bk * bh * bd // 128))


def _device(t: Tensor) -> contextlib.AbstractContextManager:
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()  # launch on the tensors' GPU


def _strides(t: Tensor) -> tuple[int, ...]:
    return tuple(t.stride())


def _check(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, mask: Tensor | None) -> None:
    if q.dim() != 4 or k.shape != v.shape or k.dim() != 4 or q.shape[::3] != k.shape[::3] or q.shape[1] != k.shape[1]:
        raise ValueError(f"expected q (B, H, M, D) and k, v (B, H, N, D), got {[tuple(t.shape) for t in (q, k, v)]}")
    B, H, M, D = q.shape
    if idx.dim() != 3 or idx.shape[:2] != (B, M):
        raise ValueError(f"expected idx (B, M, K) = ({B}, {M}, K), got {tuple(idx.shape)}")
    if mask is not None and mask.shape != (B, k.shape[2]):
        raise ValueError(f"expected mask (B, N) = ({B}, {k.shape[2]}), got {tuple(mask.shape)}")
    if D > MAX_HEAD_DIM:  # attention.backends refuses these before they get here
        raise ValueError(f"knn_attention_triton supports head dims D <= {MAX_HEAD_DIM}, got D={D}")


def launch_forward(
    q: Tensor, k: Tensor, v: Tensor, idx: Tensor, mask: Tensor | None, block_k: int | None, block_h: int | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The forward kernel: ``(out, lse, out32)``, out ``(B, H, M, D)`` in q's dtype (a view of ``(B, M, H, D)``), lse
    ``(B, H, M)`` float32, and out unrounded in float32 for a half-precision q (else an empty tensor: out is that).
    Runs as ``torch.ops.attention.knn_attention_triton_fwd`` (declared in :mod:`attention.kernels.ops`)."""
    B, H, M, D = q.shape
    N, K = k.shape[2], idx.shape[-1]
    m8 = mask.contiguous().view(torch.uint8) if mask is not None else idx  # any pointer when unused
    out = torch.empty(B, M, H, D, dtype=q.dtype, device=q.device).transpose(1, 2)  # (B, H, M, D)
    lse = torch.empty(B, H, M, dtype=torch.float32, device=q.device)
    # the backward's delta = g . out from the unrounded output: O(B H M D) float32 kept beside the half one
    low = q.dtype != torch.float32
    out32 = torch.empty(B, M, H, D, dtype=torch.float32, device=q.device).transpose(1, 2) if low else out
    bk, bh, bd, warps = _blocks(K, H, D, block_k, block_h)
    with _device(q):
        _knn_attn_fwd_kernel[(B * M, triton.cdiv(H, bh))](
            q, k, v, idx, m8, out, out32, lse, M, N, K, H, D,
            *_strides(q), *_strides(k), *_strides(v), *_strides(idx), *_strides(out), D**-0.5,
            HAS_MASK=mask is not None, STORE_F32=low, BLOCK_K=bk, BLOCK_H=bh, BLOCK_D=bd,
            num_warps=warps, enable_fp_fusion=True,
        )  # fmt: skip
    return out, lse, out32 if low else out.new_empty(0, dtype=torch.float32)


def launch_backward(
    q: Tensor, k: Tensor, v: Tensor, idx: Tensor, mask: Tensor | None, out32: Tensor, g: Tensor, lse: Tensor,
    block_k: int | None, block_h: int | None,
) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """The backward kernel: ``(dq, dk, dv)`` shaped like q, k, v (dq with out's strides, dk and dv views of
    ``(B, N, H, D)``). Runs as ``torch.ops.attention.knn_attention_triton_bwd``."""
    B, H, M, D = q.shape
    N, K = k.shape[2], idx.shape[-1]
    m8 = mask.contiguous().view(torch.uint8) if mask is not None else idx
    dq = torch.empty(B, M, H, D, dtype=q.dtype, device=q.device).transpose(1, 2)  # strides of out
    # float32 accumulators: many centroids add into one input's row (bf16 atomics would round at every add)
    dk = torch.zeros(B, N, H, D, dtype=torch.float32, device=q.device)
    dv = torch.zeros(B, N, H, D, dtype=torch.float32, device=q.device)
    bk, bh, bd, warps = _blocks(K, H, D, block_k, block_h)
    with _device(q):
        _knn_attn_bwd_kernel[(B * M, triton.cdiv(H, bh))](
            q, k, v, idx, m8, out32, g, lse, dq, dk, dv, M, N, K, H, D,
            *_strides(q), *_strides(k), *_strides(v), *_strides(idx), *_strides(dq), *_strides(g), D**-0.5,
            HAS_MASK=mask is not None, BLOCK_K=bk, BLOCK_H=bh, BLOCK_D=bd,
            num_warps=warps, enable_fp_fusion=True,
        )  # fmt: skip
    return dq, dk.to(k.dtype).transpose(1, 2), dv.to(v.dtype).transpose(1, 2)


class KnnAttentionTriton(torch.autograd.Function):
    """``apply(q, k, v, idx, mask, block_k, block_h)``: q ``(B, H, M, D)``, k and v ``(B, H, N, D)`` (any strides, any
    floating dtype, all the same), idx ``(B, M, K)`` into N, mask ``(B, N)`` bool or None; returns ``(B, H, M, D)`` as
    a view of a ``(B, M, H, D)`` tensor (the layer's layout for its output projection)."""

    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, idx: Tensor, mask: Tensor | None, block_k: int | None,
        block_h: int | None,
    ) -> Tensor:  # fmt: skip
        _check(q, k, v, idx, mask)
        idx = idx.long()
        out, lse, out32 = torch.ops.attention.knn_attention_triton_fwd(q, k, v, idx, mask, block_k, block_h)
        ctx.save_for_backward(q, k, v, idx, mask, out if out32.numel() == 0 else out32, lse)
        ctx.blocks = block_k, block_h
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, idx, mask, out32, lse = ctx.saved_tensors
        dq, dk, dv = torch.ops.attention.knn_attention_triton_bwd(q, k, v, idx, mask, out32, g, lse, *ctx.blocks)
        return dq, dk, dv, None, None, None, None


def knn_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    mask: Tensor | None = None,
    block_k: int | None = None,
    block_h: int | None = None,
) -> Tensor:
    """KNN attention over each centroid's neighbours (softmax over them), forward and backward in Triton.

    Args:
        q: ``(B, H, M, D)`` centroid queries.
        k: ``(B, H, N, D)`` input keys.
        v: ``(B, H, N, D)`` input values.
        idx: ``(B, M, K)`` neighbour indices into N (a repeated index counts each time).
        mask: ``(B, N)`` bool, True for real inputs, or None.
        block_k: neighbours per step of the online softmax (a power of two; default from K and D; tests use small
            ones to cover several steps).
        block_h: heads per program (a power of two, at most ``512 / next_pow2(D)``; default 1; more than H's next
            power of two count as that): a program reads each neighbour's key and value rows of ``block_h`` heads at
            once, one index load for them all, in fewer neighbours a step.

    Returns:
        ``(B, H, M, D)`` in q's dtype, ``attention.centroid_attention(q, k, v, idx, mask=mask)``'s value.
    """
    _check_blocks(q.shape[-1], block_k, block_h)  # here too: a compiled graph calls the kernels at run time only
    dtype = torch.promote_types(torch.promote_types(q.dtype, k.dtype), v.dtype)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)  # no copy when they agree, as in the layer
    return KnnAttentionTriton.apply(q, k, v, idx, mask, block_k, block_h)
