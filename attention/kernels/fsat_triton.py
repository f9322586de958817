"""FSAT's edge attention (:func:`attention.mixers.fsat.sparse_edge_attention`) as two fused Triton kernels.

Key r (a flat ``(b, h, j)`` row) owns E edges ``r -> i = idx[r, e]`` (a query of the same ``(b, h)``; ``< 0``: no
edge) with confidences ``c[r, e]``. For each query i, over the edges pointing to it::

    s_e = q_i . k_r / sqrt(D)      p_e = softmax_{e -> i}(s_e)      o_i = sum_{e -> i} p_e c_e v_r

**Forward** (:func:`_edge_fwd_kernel`): the edges are grouped by query once per call (one stable sort of their
query rows and a ``searchsorted`` for the row starts: a CSR on the device, no host sync). A program owns BLOCK_Q
queries and walks their edge lists in step, BLOCK_E edges of each query a step: the edge ids, then the key and value
rows of the whole (query, edge) tile are read by index (independent loads: a step waits on one round of reads, not
on one per edge), and the scores, the online-softmax rescaling (FlashAttention's running max and sum)
and the weighted sum of values happen in registers; only the output and the normalizer ``lse_i = log sum_e
exp(s_e)`` are written. Nothing of size ``(edges, D)`` exists; the forward reads each edge's key and value row once
(``2 D`` values per edge).

**Backward** (:func:`_edge_bwd_kernel`), from the saved normalizer, without the sort: with ``do`` the output
gradient and ``delta_i = do_i . o_i``::

    dc_e = p_e (do_i . v_r)          ds_e = p_e (c_e (do_i . v_r) - delta_i)
    dv_r = sum_e p_e c_e do_i        dk_r = sum_e ds_e q_i / sqrt(D)        dq_i += ds_e k_r / sqrt(D)

Every key owns exactly E edges, so a program owns BLOCK_K keys and loops over their E edge slots, BLOCK_E at a
time, reading the query, output-gradient, normalizer and delta rows by index: dk, dv and the confidences' gradients
are plain sums in registers (deterministic), and only dq is scattered, with float32 atomic adds. The order of those
adds varies from run to run, so dq varies in its last bits between identical calls (under
``torch.use_deterministic_algorithms(True)`` the switchboard does not take this kernel); everything else is
deterministic (the forward's per-query order is fixed by the stable sort). ``truncate_conf_grad`` clamps ``dc`` to
(-inf, 0] in the kernel (the paper's gradient truncation); FSAT's module applies its own truncation to the confidences
before this op, so it calls the kernel without it.

Work and traffic: the forward reads ``2 D`` values per edge plus ``D`` per query, the backward ``2 D`` per edge
(q_i, do_i) plus ``2 D`` per key and ``D`` atomics per edge; the arithmetic is ``O(E D)`` per key, a few flops per
value read: both kernels are bound by memory traffic (gathered rows of ``D`` contiguous values). A query with many
incoming edges is walked by one program: the forward's time is at least its in-degree times ``2 D`` values read at
one SM's bandwidth (FSAT's predicted indices can pile onto one query at initialization).

Computed in float32 whatever the inputs' dtype (bf16 / fp16 rows are converted as they are loaded; the caller casts
float64 to float32). Tested against the dense reference (:func:`attention.mixers.fsat.sparse_edge_attention_reference`)
under Triton's interpreter on CPU and on CUDA (``tests/attention/test_fsat_triton.py``), and compiled for sm_90 ahead
of time there.
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
from .limits import FSAT_TRITON_MAX_HEAD_DIM as MAX_HEAD_DIM

__all__ = [
    "MAX_HEAD_DIM",
    "EdgeAttentionTriton",
    "edge_blocks",
    "group_edges_by_query",
    "launch_backward",
    "launch_forward",
    "rows_like",
    "sparse_edge_attention_triton",
]

_LOG2E: tl.constexpr = tl.constexpr(1.4426950408889634)
_NEG_BIG: tl.constexpr = tl.constexpr(-1.0e30)  # the running max before any edge: finite, so exp2(m - m_new) is 1
_TILE = 512  # values of a (rows, edges, D) tile: see edge_blocks


@triton.jit
def _row(r, H, L, sb, sh, sl):
    """The offset of flat row ``r = (b H + h) L + l`` of a ``(B, H, L, ...)`` tensor with strides ``sb, sh, sl``."""
    return (r // (H * L)) * sb + ((r // L) % H) * sh + (r % L) * sl


@triton.jit
def _edge_fwd_kernel(
    q_ptr,  # (B, H, L, D) queries, strides (sqb, sqh, sql, 1) (float32 / bf16 / fp16)
    k_ptr,  # (B, H, L, D) keys, strides (skb, skh, skl, 1)
    v_ptr,  # (B, H, L, D) values, strides (svb, svh, svl, 1)
    conf_ptr,  # (N E,) float32 edge confidences, edge r E + e
    crow_ptr,  # (N + 1,) int32: query i's edges are order[crow[i]:crow[i + 1]]
    order_ptr,  # (N E,) int64: edge ids sorted by query
    out_ptr,  # (B, H, L, D) written, in the values' dtype, strides (sob, soh, sol, 1)
    lse_ptr,  # (N,) float32 written: log2 of the softmax normalizer (-inf for a query no edge reaches)
    N,
    H,
    L,
    D,
    E,
    sqb,
    sqh,
    sql,
    skb,
    skh,
    skl,
    svb,
    svh,
    svl,
    sob,
    soh,
    sol,
    qk_scale,  # log2(e) / sqrt(D): the scores in base-2 units
    BLOCK_Q: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    offs_q = tl.program_id(0) * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_e = tl.arange(0, BLOCK_E)
    offs_d = tl.arange(0, BLOCK_D)
    mask_q, mask_d = offs_q < N, offs_d < D
    start = tl.load(crow_ptr + offs_q, mask=mask_q, other=0)
    deg = tl.load(crow_ptr + offs_q + 1, mask=mask_q, other=0) - start
    md = mask_q[:, None] & mask_d[None, :]
    q_rows = _row(offs_q, H, L, sqb, sqh, sql)
    q = tl.load(q_ptr + q_rows[:, None] + offs_d[None, :], mask=md, other=0.0).to(tl.float32) * qk_scale
    m = tl.full([BLOCK_Q], _NEG_BIG, dtype=tl.float32)
    s_sum = tl.zeros([BLOCK_Q], dtype=tl.float32)
    acc = tl.zeros([BLOCK_Q, BLOCK_D], dtype=tl.float32)
    # BLOCK_E edges of every query a step, up to the block's largest in-degree (shorter lists are masked): the edge
    # ids, then the key and value rows of the whole (query, edge) tile are loads independent of each other.
    for t0 in range(0, loop_bound(tl.max(deg, axis=0)), BLOCK_E):
        t = t0 + offs_e
        valid = t[None, :] < deg[:, None]  # (BLOCK_Q, BLOCK_E)
        eid = tl.load(order_ptr + start[:, None] + t[None, :], mask=valid, other=0).to(tl.int32)
        key = eid // E  # the key row that owns edge eid
        c = tl.load(conf_ptr + eid, mask=valid, other=0.0)
        vd = valid[:, :, None] & mask_d[None, None, :]
        k_rows = _row(key, H, L, skb, skh, skl)[:, :, None] + offs_d[None, None, :]
        v_rows = _row(key, H, L, svb, svh, svl)[:, :, None] + offs_d[None, None, :]
        kt = tl.load(k_ptr + k_rows, mask=vd, other=0.0).to(tl.float32)  # (BLOCK_Q, BLOCK_E, BLOCK_D)
        vt = tl.load(v_ptr + v_rows, mask=vd, other=0.0).to(tl.float32)
        s = tl.where(valid, tl.sum(q[:, None, :] * kt, axis=2), float("-inf"))
        m_new = tl.maximum(m, tl.max(s, axis=1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])  # 0 on the masked lanes
        s_sum = s_sum * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.sum((p * c)[:, :, None] * vt, axis=1)
        m = m_new
    reached = s_sum > 0.0
    s_sum = tl.where(reached, s_sum, 1.0)
    out = acc / s_sum[:, None]  # a query no edge reaches: 0
    o_rows = _row(offs_q, H, L, sob, soh, sol)
    tl.store(out_ptr + o_rows[:, None] + offs_d[None, :], out.to(out_ptr.dtype.element_ty), mask=md)
    tl.store(lse_ptr + offs_q, tl.where(reached, m + tl.log2(s_sum), float("-inf")), mask=mask_q)


@triton.jit
def _edge_bwd_kernel(
    q_ptr,  # (B, H, L, D), strides (sqb, sqh, sql, 1)
    k_ptr,  # (B, H, L, D), strides (skb, skh, skl, 1)
    v_ptr,  # (B, H, L, D), strides (svb, svh, svl, 1)
    idx_ptr,  # (N E,) int64: the query position (within the sequence) of edge r E + e, < 0 for none
    conf_ptr,  # (N E,) float32
    do_ptr,  # (B, H, L, D) output gradient, strides (sgb, sgh, sgl, 1)
    lse_ptr,  # (N,) float32, from the forward
    delta_ptr,  # (B, H, L) float32: do_i . o_i, strides (seb, seh, sel)
    dq_ptr,  # (B, H, L, D) float32, zeroed: atomic adds; strides (sdb, sdh, sdl, 1), as dk's and dv's
    dk_ptr,  # (B, H, L, D) written, in the keys' dtype
    dv_ptr,  # (B, H, L, D) written, in the values' dtype
    dconf_ptr,  # (N E,) float32 written
    N,
    H,
    L,
    D,
    E,
    sqb,
    sqh,
    sql,
    skb,
    skh,
    skl,
    svb,
    svh,
    svl,
    sgb,
    sgh,
    sgl,
    seb,
    seh,
    sel,
    sdb,
    sdh,
    sdl,
    qk_scale,  # log2(e) / sqrt(D)
    sm_scale,  # 1 / sqrt(D)
    TRUNCATE: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    offs_r = tl.program_id(0) * BLOCK_K + tl.arange(0, BLOCK_K)
    offs_e = tl.arange(0, BLOCK_E)
    offs_d = tl.arange(0, BLOCK_D)
    mask_r, mask_d = offs_r < N, offs_d < D
    md = mask_r[:, None] & mask_d[None, :]
    base = (offs_r // L) * L  # the first row of key r's (b, h): edges stay within it
    kr = tl.load(k_ptr + _row(offs_r, H, L, skb, skh, skl)[:, None] + offs_d[None, :], mask=md, other=0.0)
    vr = tl.load(v_ptr + _row(offs_r, H, L, svb, svh, svl)[:, None] + offs_d[None, :], mask=md, other=0.0)
    kr, vr = kr.to(tl.float32)[:, None, :], vr.to(tl.float32)[:, None, :]  # (BLOCK_K, 1, BLOCK_D)
    dk = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)
    dv = tl.zeros([BLOCK_K, BLOCK_D], dtype=tl.float32)
    for e0 in range(0, loop_bound(E), BLOCK_E):  # BLOCK_E edge slots of every key a step
        e = e0 + offs_e
        slot = offs_r[:, None] * E + e[None, :]  # (BLOCK_K, BLOCK_E): edge ids
        ms = mask_r[:, None] & (e[None, :] < E)
        pos = tl.load(idx_ptr + slot, mask=ms, other=-1).to(tl.int32)
        valid = pos >= 0
        i = base[:, None] + tl.where(valid, pos, 0)  # the query rows
        vd = valid[:, :, None] & mask_d[None, None, :]
        q_rows = _row(i, H, L, sqb, sqh, sql)[:, :, None] + offs_d[None, None, :]
        g_rows = _row(i, H, L, sgb, sgh, sgl)[:, :, None] + offs_d[None, None, :]
        qi = tl.load(q_ptr + q_rows, mask=vd, other=0.0).to(tl.float32)  # (BLOCK_K, BLOCK_E, BLOCK_D)
        doi = tl.load(do_ptr + g_rows, mask=vd, other=0.0).to(tl.float32)
        lse = tl.load(lse_ptr + i, mask=valid, other=0.0)
        delta = tl.load(delta_ptr + _row(i, H, L, seb, seh, sel), mask=valid, other=0.0)
        c = tl.load(conf_ptr + slot, mask=valid, other=0.0)
        p = tl.where(valid, tl.exp2(tl.sum(qi * kr, axis=2) * qk_scale - lse), 0.0)
        dov = tl.sum(doi * vr, axis=2)  # do_i . v_r
        dc = p * dov
        if TRUNCATE:
            dc = tl.minimum(dc, 0.0)
        tl.store(dconf_ptr + slot, dc, mask=ms)
        dv += tl.sum((p * c)[:, :, None] * doi, axis=1)
        ds = p * (c * dov - delta)
        dk += tl.sum(ds[:, :, None] * qi, axis=1)
        dq_rows = _row(i, H, L, sdb, sdh, sdl)[:, :, None] + offs_d[None, None, :]
        tl.atomic_add(dq_ptr + dq_rows, ds[:, :, None] * kr * sm_scale, mask=vd)
    d_rows = _row(offs_r, H, L, sdb, sdh, sdl)[:, None] + offs_d[None, :]
    tl.store(dk_ptr + d_rows, (dk * sm_scale).to(dk_ptr.dtype.element_ty), mask=md)
    tl.store(dv_ptr + d_rows, dv.to(dv_ptr.dtype.element_ty), mask=md)


def edge_blocks(D: int, E: int) -> dict[str, int]:
    """Tile sizes for head dimension D and E edges per key: BLOCK_E edges (E rounded up to a power of two, at most 8)
    of BLOCK_Q queries (forward) or BLOCK_K keys (backward) a step, 1 to 4 rows, so that a ``(rows, BLOCK_E, D)`` tile
    holds about 512 values (1,024 at D = 128: one row at least): both kernels then fit their registers on sm_90 with
    triton 3.6 to 3.9 (larger tiles spill; ``tests/attention/test_fsat_triton.py`` reads the cubin's)."""
    bd = triton.next_power_of_2(D)
    be = min(8, triton.next_power_of_2(max(E, 1)))
    rows = max(1, min(4, _TILE // (bd * be)))
    return {"BLOCK_Q": rows, "BLOCK_K": rows, "BLOCK_E": be, "BLOCK_D": bd, "num_warps": 4}


def group_edges_by_query(idx: Tensor) -> tuple[Tensor, Tensor]:
    """The CSR of the edges by query: ``(crow (N + 1,) int32, order (N E,) int64)``; query row i's edges are
    ``order[crow[i]:crow[i + 1]]`` (ids ``r E + e``, in key order), absent edges (``idx < 0``) in none.

    One stable sort of the edges' flat query rows (int32 keys: half the radix passes of int64) and a
    ``searchsorted`` for the row starts, on the tensors' device, without a host sync.
    """
    B, H, L, E = idx.shape
    N = B * H * L
    base = torch.arange(B * H, device=idx.device, dtype=torch.int32).view(B, H, 1, 1) * L
    rows = torch.where(idx >= 0, base + idx.to(torch.int32), N)  # absent edges sort after every query row
    sorted_rows, order = torch.sort(rows.reshape(-1), stable=True)
    crow = torch.searchsorted(sorted_rows, torch.arange(N + 1, device=idx.device, dtype=torch.int32), out_int32=True)
    return crow, order


def _device(t: Tensor) -> contextlib.AbstractContextManager:
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()  # launch on the tensors' GPU


def rows_like(q: Tensor, dtype: torch.dtype) -> Tensor:
    """An empty ``(B, H, L, D)`` tensor laid out as ``(B, L, H, D)``: the kernels' outputs, whose transpose back to
    ``(B, L, H D)`` (the projections' layout, where the heads are split off) is a view, not a copy."""
    B, H, L, D = q.shape
    return torch.empty(B, L, H, D, device=q.device, dtype=dtype).transpose(1, 2)


def _in_place(t: Tensor) -> bool:
    """Whether the kernels read ``t`` where it is: a contiguous last dimension and offsets that fit int32."""
    return t.stride(-1) == 1 and sum((n - 1) * st for n, st in zip(t.shape, t.stride())) < 2**31


def _check_rows(*rows: Tensor) -> None:
    for t in rows:  # the autograd Function copies what fails this; a direct call of the operators gets an error
        if not _in_place(t):
            raise ValueError(f"the FSAT edge kernels read rows with a contiguous last dimension and int32 offsets, "
                             f"got a {tuple(t.shape)} tensor of strides {t.stride()}")  # fmt: skip


def launch_forward(
    q: Tensor, k: Tensor, v: Tensor, conf: Tensor, crow: Tensor, order: Tensor, block: int | None
) -> tuple[Tensor, Tensor]:  # fmt: skip
    """The forward kernel: ``(out, lse)``, ``(B, H, L, D)`` in v's dtype laid out as ``(B, L, H, D)``
    (:func:`rows_like`) and ``(N,)`` float32 (N = B H L), from ``(B, H, L, D)`` q, k, v of any strides with a
    contiguous last dimension, float32 conf ``(N E,)`` and the edges grouped by query (:func:`group_edges_by_query`).
    Runs as ``torch.ops.attention.fsat_edges_fwd`` (declared in :mod:`attention.kernels.ops`)."""
    _check_rows(q, k, v)
    B, H, L, D = q.shape
    N = B * H * L
    E = conf.numel() // N
    blk = edge_blocks(D, E)
    bq = block or blk["BLOCK_Q"]
    out = rows_like(q, v.dtype)
    lse = torch.empty(N, device=q.device, dtype=torch.float32)
    with _device(q):
        _edge_fwd_kernel[(triton.cdiv(N, bq),)](
            q, k, v, conf, crow, order, out, lse, N, H, L, D, E,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *out.stride()[:3], _LOG2E.value / math.sqrt(D),
            BLOCK_Q=bq, BLOCK_E=blk["BLOCK_E"], BLOCK_D=blk["BLOCK_D"], num_warps=blk["num_warps"],
            enable_fp_fusion=True,
        )  # fmt: skip
    return out, lse


def launch_backward(
    q: Tensor, k: Tensor, v: Tensor, idx: Tensor, conf: Tensor, lse: Tensor, delta: Tensor, do: Tensor,
    truncate: bool, block: int | None,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """The backward kernel: ``(dq, dk, dv, dconf)``, each of dq (float32, summed by atomics), dk and dv (in k's and
    v's dtypes) ``(B, H, L, D)`` laid out as ``(B, L, H, D)``, dconf ``(N E,)`` float32, from the forward's inputs
    (idx ``(B, H, L, E)``), its normalizer, the output gradient ``do`` ``(B, H, L, D)`` (any strides, a contiguous
    last dimension) and ``delta = do . out`` ``(B, H, L)`` (any strides). Runs as
    ``torch.ops.attention.fsat_edges_bwd``."""
    _check_rows(q, k, v, do)
    B, H, L, D = q.shape
    N, E = B * H * L, idx.shape[-1]
    dq = rows_like(q, torch.float32).zero_()
    dk, dv = rows_like(k, k.dtype), rows_like(v, v.dtype)
    dconf = torch.empty(N * E, device=q.device, dtype=torch.float32)
    blk = edge_blocks(D, E)
    bk = block or blk["BLOCK_K"]
    with _device(q):
        _edge_bwd_kernel[(triton.cdiv(N, bk),)](
            q, k, v, idx, conf, do, lse, delta, dq, dk, dv, dconf, N, H, L, D, E,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *do.stride()[:3], *delta.stride(), *dq.stride()[:3],
            _LOG2E.value / math.sqrt(D), 1.0 / math.sqrt(D),
            TRUNCATE=truncate, BLOCK_K=bk, BLOCK_E=blk["BLOCK_E"], BLOCK_D=blk["BLOCK_D"], num_warps=blk["num_warps"],
            enable_fp_fusion=True,
        )  # fmt: skip
    return dq, dk, dv, dconf


def _rows(t: Tensor) -> Tensor:
    """``t`` as the kernels read it: in place (:func:`_in_place`), else a contiguous copy."""
    return t if _in_place(t) else t.contiguous()


class EdgeAttentionTriton(torch.autograd.Function):
    """``apply(q, k, v, idx, conf, truncate_conf_grad, block)``: see :func:`sparse_edge_attention_triton`.

    q, k, v and the output gradient are read in place (FSAT's are views of its projections, heads split off), and the
    output and the q, k, v gradients are written laid out as ``(B, L, H, D)``, so that the heads' transposes back to
    ``(B, L, H D)`` are views."""

    @staticmethod
    def forward(
        ctx, q: Tensor, k: Tensor, v: Tensor, idx: Tensor, conf: Tensor, truncate: bool, block: int | None
    ) -> Tensor:
        B, H, L, D = q.shape
        E = idx.shape[-1]
        N = B * H * L
        if N * max(D, E) >= 2**31:
            raise ValueError(
                f"the Triton edge attention indexes in int32: needs B H L max(D, E) < 2^31, got {N * max(D, E)}"
            )
        q, k, v = _rows(q), _rows(k), _rows(v)
        idx = idx.contiguous()
        conf2 = conf.reshape(N * E).float().contiguous()
        crow, order = group_edges_by_query(idx)
        out, lse = torch.ops.attention.fsat_edges_fwd(q, k, v, conf2, crow, order, block)
        ctx.save_for_backward(q, k, v, idx, conf2, out, lse)
        ctx.truncate, ctx.block, ctx.conf_dtype = truncate, block, conf.dtype
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, idx, conf2, out, lse = ctx.saved_tensors
        do = _rows(g)
        delta = (do.float() * out.float()).sum(-1)  # (B, H, L): do_i . o_i, the softmax's correction term
        dq, dk, dv, dconf = torch.ops.attention.fsat_edges_bwd(
            q, k, v, idx, conf2, lse, delta, do, ctx.truncate, ctx.block
        )
        return dq.to(q.dtype), dk, dv, None, dconf.view(idx.shape).to(ctx.conf_dtype), None, None


def sparse_edge_attention_triton(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    conf: Tensor,
    truncate_conf_grad: bool = False,
    block: int | None = None,
) -> Tensor:
    """Each query attends over the edges pointing to it (:func:`attention.mixers.fsat.sparse_edge_attention`).

    Args:
        q, k, v: ``(B, H, L, D)`` float32, bf16 or fp16 (D <= :data:`MAX_HEAD_DIM`).
        idx: ``(B, H, L, E)`` int64 query positions in ``[0, L)``, or negative for no edge.
        conf: ``(B, H, L, E)`` edge confidences (any float dtype; used in float32).
        truncate_conf_grad: clamp the confidences' gradient to (-inf, 0] (FSAT's gradient truncation).
        block: queries (forward) and keys (backward) per program, a power of two (default from :func:`edge_blocks`;
            the tests use small ones).

    Returns:
        ``(B, H, L, D)`` in ``v``'s dtype, laid out as ``(B, L, H, D)`` (not contiguous: ``reshape``, not ``view``).
    """
    if q.shape != k.shape or q.shape != v.shape or idx.shape[:3] != q.shape[:3] or conf.shape != idx.shape:
        shapes = [tuple(t.shape) for t in (q, k, v, idx, conf)]
        raise ValueError(f"expected q, k, v (B, H, L, D) and idx, conf (B, H, L, E), got {shapes}")
    if q.shape[-1] > MAX_HEAD_DIM:
        raise ValueError(f"the Triton edge attention supports D <= {MAX_HEAD_DIM}, got D={q.shape[-1]}")
    return EdgeAttentionTriton.apply(q, k, v, idx, conf, truncate_conf_grad, block)
