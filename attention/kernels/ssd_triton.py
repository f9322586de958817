"""Hydra's quasiseparable mixer (:func:`attention.mixers.functional.quasiseparable_mix`) as chunked SSD Triton kernels.

Each direction (0: forward; 1: backward, which reads the sequence from its end) is a selective scan in its own time
t (memory row ``p = t``, or ``p = L - 1 - t``)::

    z_t = sum_{j <= t} (c_t . b_j) exp(cs_t - cs_j) v_j        cs_t = sum_{s <= t} log a_s
    y   = z^fwd shifted down one row + z^bwd shifted up one row + diag * v

computed in the SSD (state space dual) form of Mamba-2 (Dao and Gu, arXiv:2405.21060) over chunks of T rows: within
a chunk as a masked ``(T, T)`` matrix, across chunks through the ``(N, Dv)`` state entering each chunk::

    S_k     = sum_{j in k} exp(cs_end - cs_j) b_j v_j^T               chunk states, every chunk in parallel
    h_{k+1} = exp(cs_end) h_k + S_k                                state passing, a loop over the chunks
    z_t     = ((C B^T) o seg)_t V + exp(cs_t) c_t^T h_k            chunk outputs, every chunk in parallel

with ``cs`` the cumulative log decay within the chunk and ``seg_tj = exp(cs_t - cs_j)`` for ``j <= t``, else 0.
Each step is one launch over both directions, every batch element and head (and every chunk, but for the state
passing, which runs over blocks of the ``N Dv`` state): ``_chunk_state_kernel``, ``_state_pass_kernel``,
``_chunk_out_kernel``. The backward pass runs the same steps in reverse: the gradient reaching each chunk's outgoing
state, ``dh_k = exp(cs_end) dh_{k+1} + sum_{t in k} exp(cs_t) c_t dz_t^T`` (the chunk sums in parallel, then the same
state-passing kernel walking the chunks backwards), then every gradient of a chunk from its ``(T, T)`` blocks and its
two states in one kernel (``_chunk_grad_kernel``)::

    dC = ((dZ V^T) o seg) B + exp(cs) (dZ h^T)
    dB = ((dZ V^T) o seg)^T C + exp(cs_end - cs) (V g^T)           g = dh_{k+1}, the outgoing state's gradient
    dV = ((C B^T) o seg)^T dZ + exp(cs_end - cs) (B g)

The log decays' gradient needs no kernel: with ``W_tj = (dz_t . v_j) m_tj``, ``log a_s`` enters the pairs
``j < s <= t``, so ``dlog a_s = sum_{t >= s} (dz_t . z_t - v_t . dv_t)`` (W's row sums minus its column sums, whose
diagonals cancel): a reverse cumulative sum of per-row products of tensors the passes already hold.

Work: ``O(L T (N + Dv))`` for the ``(T, T)`` blocks plus ``O(L N Dv)`` for the states, as matrix products
(``tl.dot`` in float32 with ``input_precision="ieee"``: exact float32, not TF32). Memory: the chunk states,
``2 B H (L / T) N Dv`` floats (the forward's, kept for the backward) plus as many for the state gradients, the inputs,
the unshifted outputs and the gradients. The state passing is the only sequential part: ``L / T`` steps over
``N Dv`` values per direction and head, memory-bound. Inputs are float32 (the caller casts). Tested against the
chunked PyTorch scan and the dense matrix under Triton's interpreter on CPU and on CUDA
(``tests/attention/test_ssd_triton.py``), and compiled for sm_90 ahead of time there.
"""

from __future__ import annotations

import contextlib

import torch
import triton
import triton.language as tl
from torch import Tensor
from torch.autograd.function import once_differentiable

from ._triton_compat import loop_bound
from .limits import SSD_TRITON_CHUNK
from .limits import SSD_TRITON_MAX_DIM as MAX_DIM

__all__ = ["MAX_DIM", "QuasiseparableScanTriton", "quasiseparable_mix_triton", "scan_blocks"]


@triton.jit
def _rows(c, L, rev, BLOCK_T: tl.constexpr):
    """Chunk c's scan times ``t``, which exist, their memory rows, and the rows of scan time ``t + 1`` (where it
    exists): the shifted output's rows."""
    t = c * BLOCK_T + tl.arange(0, BLOCK_T)
    p = tl.where(rev, L - 1 - t, t)
    return t < L, p, (t + 1) < L, tl.where(rev, p - 1, p + 1)


@triton.jit
def _cumlog(la_ptr, p, mask):
    """The chunk's cumulative log decays (padded rows decay nothing) and their total."""
    la = tl.load(la_ptr + p, mask=mask, other=0.0)
    return tl.cumsum(la, axis=0), tl.sum(la, axis=0)


@triton.jit
def _chunk(la_ptr, BH, L, N, DV, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_DV: tl.constexpr):
    """What every chunk kernel's program starts from: its chunk ``c`` and stream ``z`` (direction * BH + bh) with the
    head ``bh``, the chunk's rows (:func:`_rows`), the state's column offsets and masks, and the chunk's cumulative
    log decays and their total (:func:`_cumlog`)."""
    c = tl.program_id(0)
    z = tl.program_id(1).to(tl.int64)
    mask_t, p, mask_t1, p1 = _rows(c, L, z >= BH, BLOCK_T)
    offs_n, offs_dv = tl.arange(0, BLOCK_N), tl.arange(0, BLOCK_DV)
    cs, total = _cumlog(la_ptr + z * L, p, mask_t)
    return c, z, z % BH, mask_t, p, mask_t1, p1, offs_n, offs_dv, offs_n < N, offs_dv < DV, cs, total


@triton.jit
def _chunk_state_kernel(
    x_ptr,  # (2, BH, L, N): b (forward pass) or c (backward pass)
    y_ptr,  # (BH, L, DV): the values (forward) or the output gradient (backward)
    la_ptr,  # (2, BH, L) log decays
    s_ptr,  # (2, BH, NC, N, DV) written: each chunk's sum
    tot_ptr,  # (2, BH, NC) written by the forward pass: each chunk's total log decay
    BH,
    L,
    N,
    DV,
    NC,
    BACKWARD: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    c, z, bh, mask_t, p, mask_t1, p1, offs_n, offs_dv, mask_n, mask_dv, cs, total = _chunk(
        la_ptr, BH, L, N, DV, BLOCK_T, BLOCK_N, BLOCK_DV
    )
    x = tl.load(x_ptr + z * L * N + p[:, None] * N + offs_n[None, :], mask=mask_t[:, None] & mask_n[None, :], other=0.0)
    y_base = y_ptr + bh * L * DV + offs_dv[None, :]
    if BACKWARD:  # sum_t exp(cs_t) c_t dz_t^T; dz_t is the output gradient at scan time t + 1's row
        x = x * tl.exp(cs)[:, None]
        y = tl.load(y_base + p1[:, None] * DV, mask=mask_t1[:, None] & mask_dv[None, :], other=0.0)
    else:  # sum_j exp(cs_end - cs_j) b_j v_j^T
        x = x * tl.exp(total - cs)[:, None]
        y = tl.load(y_base + p[:, None] * DV, mask=mask_t[:, None] & mask_dv[None, :], other=0.0)
        tl.store(tot_ptr + z * NC + c, total)
    s = tl.dot(tl.trans(x), y, input_precision="ieee")  # (BLOCK_N, BLOCK_DV)
    out = s_ptr + (z * NC + c) * N * DV + offs_n[:, None] * DV + offs_dv[None, :]
    tl.store(out, s, mask=mask_n[:, None] & mask_dv[None, :])


@triton.jit
def _state_pass_kernel(
    s_ptr,  # (2, BH, NC, NDV): each chunk's sum in; the state entering (backward: the gradient leaving) it out
    tot_ptr,  # (2, BH, NC) each chunk's total log decay
    NDV,
    NC,
    BACKWARD: tl.constexpr,
    BLOCK: tl.constexpr,
):
    z = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < NDV
    h = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(0, loop_bound(NC)):
        if BACKWARD:
            c = NC - 1 - i
        else:
            c = i
        ptr = s_ptr + (z * NC + c) * NDV + offs
        s = tl.load(ptr, mask=mask, other=0.0)
        tl.store(ptr, h, mask=mask)
        h = tl.exp(tl.load(tot_ptr + z * NC + c)) * h + s


@triton.jit
def _seg(cs, BLOCK_T: tl.constexpr):
    """``seg_tj = exp(cs_t - cs_j)`` for ``j <= t``, else 0: the decays within a chunk, ``(BLOCK_T, BLOCK_T)``."""
    i = tl.arange(0, BLOCK_T)
    diff = tl.where(i[:, None] >= i[None, :], cs[:, None] - cs[None, :], float("-inf"))
    return tl.exp(diff)


@triton.jit
def _chunk_out_kernel(
    q_ptr,  # (2, BH, L, N): c
    k_ptr,  # (2, BH, L, N): b
    v_ptr,  # (BH, L, DV)
    la_ptr,  # (2, BH, L)
    h_ptr,  # (2, BH, NC, N, DV): the state entering each chunk
    z_ptr,  # (2, BH, L, DV) written: each direction's scan output at the row of scan time t + 1 (the shift)
    BH,
    L,
    N,
    DV,
    NC,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    c, z, bh, mask_t, p, mask_t1, p1, offs_n, offs_dv, mask_n, mask_dv, cs, total = _chunk(
        la_ptr, BH, L, N, DV, BLOCK_T, BLOCK_N, BLOCK_DV
    )
    tn = mask_t[:, None] & mask_n[None, :]
    q = tl.load(q_ptr + z * L * N + p[:, None] * N + offs_n[None, :], mask=tn, other=0.0)
    k = tl.load(k_ptr + z * L * N + p[:, None] * N + offs_n[None, :], mask=tn, other=0.0)
    v = tl.load(v_ptr + bh * L * DV + p[:, None] * DV + offs_dv[None, :],
                mask=mask_t[:, None] & mask_dv[None, :], other=0.0)  # fmt: skip
    h = tl.load(h_ptr + (z * NC + c) * N * DV + offs_n[:, None] * DV + offs_dv[None, :],
                mask=mask_n[:, None] & mask_dv[None, :], other=0.0)  # fmt: skip
    m = tl.dot(q, tl.trans(k), input_precision="ieee") * _seg(cs, BLOCK_T)  # (T, T)
    out = tl.dot(m, v, input_precision="ieee")
    out += tl.exp(cs)[:, None] * tl.dot(q, h, input_precision="ieee")
    tl.store(z_ptr + z * L * DV + p1[:, None] * DV + offs_dv[None, :], out, mask=mask_t1[:, None] & mask_dv[None, :])


@triton.jit
def _chunk_grad_kernel(
    q_ptr,  # (2, BH, L, N): c
    k_ptr,  # (2, BH, L, N): b
    v_ptr,  # (BH, L, DV)
    dy_ptr,  # (BH, L, DV): the output's gradient
    la_ptr,  # (2, BH, L)
    h_ptr,  # (2, BH, NC, N, DV): the state entering each chunk
    g_ptr,  # (2, BH, NC, N, DV): the gradient reaching the state leaving each chunk
    dq_ptr,  # (2, BH, L, N) written
    dk_ptr,  # (2, BH, L, N) written
    dv_ptr,  # (2, BH, L, DV) written: each direction's share
    BH,
    L,
    N,
    DV,
    NC,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    c, z, bh, mask_t, p, mask_t1, p1, offs_n, offs_dv, mask_n, mask_dv, cs, total = _chunk(
        la_ptr, BH, L, N, DV, BLOCK_T, BLOCK_N, BLOCK_DV
    )
    tn, tdv = mask_t[:, None] & mask_n[None, :], mask_t[:, None] & mask_dv[None, :]
    ndv = mask_n[:, None] & mask_dv[None, :]
    rows_n = z * L * N + p[:, None] * N + offs_n[None, :]
    q = tl.load(q_ptr + rows_n, mask=tn, other=0.0)
    k = tl.load(k_ptr + rows_n, mask=tn, other=0.0)
    v = tl.load(v_ptr + bh * L * DV + p[:, None] * DV + offs_dv[None, :], mask=tdv, other=0.0)
    dz = tl.load(dy_ptr + bh * L * DV + p1[:, None] * DV + offs_dv[None, :],
                 mask=mask_t1[:, None] & mask_dv[None, :], other=0.0)  # fmt: skip
    state = (z * NC + c) * N * DV + offs_n[:, None] * DV + offs_dv[None, :]
    seg = _seg(cs, BLOCK_T)
    decay_in, decay_out = tl.exp(cs), tl.exp(total - cs)  # (T,): into row t from the chunk start; from t to its end
    dm = tl.dot(dz, tl.trans(v), input_precision="ieee") * seg  # (T, T): dLoss / d m_tj
    h = tl.load(h_ptr + state, mask=ndv, other=0.0)
    dq = tl.dot(dm, k, input_precision="ieee") + decay_in[:, None] * tl.dot(dz, tl.trans(h), input_precision="ieee")
    tl.store(dq_ptr + rows_n, dq, mask=tn)
    g = tl.load(g_ptr + state, mask=ndv, other=0.0)
    dk = tl.dot(tl.trans(dm), q, input_precision="ieee")
    dk += decay_out[:, None] * tl.dot(v, tl.trans(g), input_precision="ieee")
    tl.store(dk_ptr + rows_n, dk, mask=tn)
    m = tl.dot(q, tl.trans(k), input_precision="ieee") * seg
    dv = tl.dot(tl.trans(m), dz, input_precision="ieee") + decay_out[:, None] * tl.dot(k, g, input_precision="ieee")
    tl.store(dv_ptr + z * L * DV + p[:, None] * DV + offs_dv[None, :], dv, mask=tdv)


def scan_blocks(L: int, N: int, Dv: int, chunk: int | None = None) -> dict[str, int]:
    """Chunk length T and tile sizes (>= 16 where ``tl.dot`` needs it).

    T = 16 by default: float32 products run on the FMA units, where a smaller chunk costs fewer operations
    (``O(L T (N + Dv))``) and only adds state traffic (``O(L N Dv / T)``); and at N = Dv = 64 the gradient kernel's
    tiles fit 4 warps' registers at T = 16 but spill at T = 32 and 64 (``tests/attention/test_ssd_triton.py`` reads
    the sm_90 cubin's).
    """
    bn, bdv = max(16, triton.next_power_of_2(N)), max(16, triton.next_power_of_2(Dv))
    return {"BLOCK_T": chunk or SSD_TRITON_CHUNK, "BLOCK_N": bn, "BLOCK_DV": bdv, "num_warps": 4}


def _device(t: Tensor) -> contextlib.AbstractContextManager:
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()  # launch on the tensors' GPU


def _scan_pass(sums: tuple, chunk_kernel: triton.JITFunction, chunk_args: tuple, blk: dict, backward: bool) -> None:
    """One pass of the scan, on the tensors' GPU: each chunk's sum of ``sums`` = ``(x, y, log_a, states, tot)``, then
    the state passing over them in place (forward: the states entering the chunks; backward: the gradients reaching
    the states leaving them), then ``chunk_kernel`` on ``chunk_args`` (the chunk outputs, or every gradient) over
    every chunk of both directions."""
    x, y, la, states, tot = sums
    BH, nc, L, N, Dv = states.shape[1], states.shape[2], x.shape[-2], x.shape[-1], y.shape[-1]
    grid = (nc, 2 * BH)
    tiles = dict(BLOCK_T=blk["BLOCK_T"], BLOCK_N=blk["BLOCK_N"], BLOCK_DV=blk["BLOCK_DV"])
    launch = dict(num_warps=blk["num_warps"], enable_fp_fusion=True)
    ndv = N * Dv
    block = min(1024, triton.next_power_of_2(ndv))
    with _device(y):
        _chunk_state_kernel[grid](x, y, la, states, tot, BH, L, N, Dv, nc, BACKWARD=backward, **tiles, **launch)
        _state_pass_kernel[(triton.cdiv(ndv, block), 2 * BH)](states, tot, ndv, nc, BACKWARD=backward, BLOCK=block,
                                                              num_warps=4, enable_fp_fusion=True)  # fmt: skip
        chunk_kernel[grid](*chunk_args, BH, L, N, Dv, nc, **tiles, **launch)


def launch_forward(c: Tensor, b: Tensor, v: Tensor, log_a: Tensor, chunk: int | None) -> tuple[Tensor, Tensor, Tensor]:
    """The forward pass's three launches: ``(states, tot, z)``, the states entering every chunk ``(2, B H, chunks, N,
    Dv)``, each chunk's total log decay ``(2, B H, chunks)`` and both directions' shifted outputs ``(2, B, H, L, Dv)``,
    float32. Runs as ``torch.ops.attention.ssd_scan_fwd`` (declared in :mod:`attention.kernels.ops`)."""
    _, B, H, L, N = c.shape
    Dv = v.shape[-1]
    c, b, v, log_a = c.contiguous(), b.contiguous(), v.contiguous(), log_a.contiguous()
    blk = scan_blocks(L, N, Dv, chunk)
    nc = triton.cdiv(L, blk["BLOCK_T"])
    states = torch.empty(2, B * H, nc, N, Dv, device=v.device, dtype=torch.float32)
    tot = torch.empty(2, B * H, nc, device=v.device, dtype=torch.float32)
    z = torch.zeros(2, B, H, L, Dv, device=v.device, dtype=torch.float32)  # rows no shifted output reaches: 0
    _scan_pass((b, v, log_a, states, tot), _chunk_out_kernel, (c, b, v, log_a, states, z), blk, backward=False)
    return states, tot, z


def launch_backward(
    c: Tensor, b: Tensor, v: Tensor, log_a: Tensor, states: Tensor, tot: Tensor, dy: Tensor, chunk: int | None
) -> tuple[Tensor, Tensor, Tensor]:
    """The backward pass's three launches: ``(dc, db, dv)``, dv per direction ``(2, B, H, L, Dv)``, float32. Runs as
    ``torch.ops.attention.ssd_scan_bwd``."""
    _, B, H, L, N = c.shape
    c, b, v, log_a, dy = c.contiguous(), b.contiguous(), v.contiguous(), log_a.contiguous(), dy.float().contiguous()
    blk = scan_blocks(L, N, v.shape[-1], chunk)
    grads = torch.empty_like(states)
    dc, db = torch.empty_like(c), torch.empty_like(b)
    dv = torch.empty(2, B, H, L, v.shape[-1], device=v.device, dtype=torch.float32)
    grad_args = (c, b, v, dy, log_a, states, grads, dc, db, dv)
    _scan_pass((c, dy, log_a, grads, tot), _chunk_grad_kernel, grad_args, blk, backward=True)
    return dc, db, dv


class QuasiseparableScanTriton(torch.autograd.Function):
    """``apply(c, b, v, log_a, chunk)``: both directions' scans, shifted and summed (without the diagonal).

    ``c``, ``b``: ``(2, B, H, L, N)`` (forward SSM, then backward SSM, both in memory order); ``v``: ``(B, H, L, Dv)``;
    ``log_a``: ``(2, B, H, L)``; float32. Returns ``(B, H, L, Dv)``.
    """

    @staticmethod
    def forward(ctx, c: Tensor, b: Tensor, v: Tensor, log_a: Tensor, chunk: int | None) -> Tensor:
        states, tot, z = torch.ops.attention.ssd_scan_fwd(c, b, v, log_a, chunk)
        ctx.save_for_backward(c, b, v, log_a, states, tot, z)
        ctx.chunk = chunk
        return z[0] + z[1]

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: Tensor) -> tuple[Tensor | None, ...]:
        c, b, v, log_a, states, tot, z = ctx.saved_tensors
        dc, db, dv = torch.ops.attention.ssd_scan_bwd(c, b, v, log_a, states, tot, dy, ctx.chunk)
        # dlog a_s = sum over scan times t >= s of dz_t . z_t - v_t . dv_t. z holds z_t at the row of scan time
        # t + 1, where the output gradient is dz_t: their product is shifted back one row in scan time.
        zz = (dy.float().unsqueeze(0) * z).sum(-1)  # (2, B, H, L): dz_t . z_t at the row of scan time t + 1
        vv = (v.unsqueeze(0) * dv).sum(-1)  # v_t . dv_t at the row of t
        fwd = torch.nn.functional.pad(zz[0, ..., 1:], (0, 1)) - vv[0]  # forward scan: row t + 1 -> t
        bwd = torch.nn.functional.pad(zz[1, ..., :-1], (1, 0)) - vv[1]  # backward scan: row p - 1 -> p
        dla = torch.stack([fwd.flip(-1).cumsum(-1).flip(-1), bwd.cumsum(-1)])  # t >= s: rows >= s / rows <= p
        return dc, db, dv[0] + dv[1], dla, None


def quasiseparable_mix_triton(
    c_fwd: Tensor,
    b_fwd: Tensor,
    c_bwd: Tensor,
    b_bwd: Tensor,
    v: Tensor,
    log_fwd: Tensor,
    log_bwd: Tensor,
    diag: Tensor,
    chunk: int | None = None,
) -> Tensor:
    """:func:`attention.mixers.functional.quasiseparable_mix` by the SSD kernels (float32; N, Dv <= :data:`MAX_DIM`).

    ``chunk`` is the kernels' chunk length T, a power of two >= 16 (default: :func:`scan_blocks`').
    """
    N, Dv = c_fwd.shape[-1], v.shape[-1]
    if max(N, Dv) > MAX_DIM:
        raise ValueError(f"the Triton quasiseparable scan supports N, Dv <= {MAX_DIM}, got N={N}, Dv={Dv}")
    if any(t.dtype != torch.float32 for t in (c_fwd, b_fwd, c_bwd, b_bwd, v, log_fwd, log_bwd, diag)):
        raise ValueError("the Triton quasiseparable scan takes float32 tensors (the caller casts)")
    c, b = torch.stack([c_fwd, c_bwd]), torch.stack([b_fwd, b_bwd])  # (2, B, H, L, N)
    y = QuasiseparableScanTriton.apply(c, b, v, torch.stack([log_fwd, log_bwd]), chunk)
    return y + diag.unsqueeze(-1) * v
