"""Efficient products ``Y = M V`` with structured matrices ``M`` that are never materialized (beyond a chunk).

Every op here has a dense twin in :mod:`attention.mixers.structured` (``materialize``) that the tests compare it
against, outputs and gradients. All ops are plain PyTorch and run on CPU and CUDA (Cauchy and Vandermonde also have
an optional Triton kernel for CUDA); tensors are ``(B, H, L, D)``.

* :func:`cauchy_mix` / :func:`vandermonde_mix`: the matrix entry is a sum over D terms, so materializing it costs
  ``B H L L D``. Here the rows are walked in chunks, in the forward pass and again (recomputing) in the backward
  pass, so that no more than a chunk's ``(chunk, L)`` block and its scratch exist at once: Cauchy sums the D terms in
  groups of ``d_group`` (peak extra memory ``B H chunk L (d_group + 2)`` values), Vandermonde builds each row's cosine
  sums from ``O(D sqrt(L))`` cosines by angle addition. The chunk is picked from a byte budget unless given. This
  chunked path (``backend="torch"``) is the reference. ``backend="triton"``
  (:mod:`attention.kernels.mixers_triton`) is a flash-attention-style tiled kernel, forward and backward, that never
  builds more than a ``(block, block, D)`` tile in registers; ``"auto"`` picks it for CUDA tensors when triton is
  installed and D, Dv <= 64, and the chunked path otherwise (CPU, float64, larger heads): the choice is
  :func:`attention.backends.resolve`'s (ops ``"cauchy_mix"`` / ``"vandermonde_mix"``).
* :func:`toeplitz_mix`: FFT convolution with a kernel of length 2L-1, O(L log L).
* :func:`quasiseparable_mix`: Hydra's bidirectional quasiseparable matrix (a forward and a backward SSM, shift and
  free diagonal) as one batched chunked selective scan (SSD form): O(L T D) for chunk length T, O(L / T) sequential
  steps, no ``(L, L)`` tensor. Plain autograd (no custom Function), so TorchScript can compile it; that chunked scan
  (``backend="torch"``) is the reference. ``backend="triton"`` (:mod:`attention.kernels.ssd_triton`) runs the same
  SSD form as a few Triton launches over every chunk, both directions at once; :func:`hydra_mix` can also run
  Mamba-2's kernels (``backend="mamba"``, the ``mamba_ssm`` package, explicit only). ``"auto"``: the Triton kernels
  for CUDA tensors (float32 / bf16, N and Dv <= 64), else the chunked scan (op ``"quasiseparable_mix"`` of
  :func:`attention.backends.resolve`).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from ..backends import HAS_TRITON, resolve
from ..chunking import chunk_budget, chunk_rows

__all__ = [
    "HAS_TRITON",
    "cauchy_mix",
    "hydra_factors",
    "hydra_mix",
    "quasiseparable_mix",
    "toeplitz_mix",
    "vandermonde_mix",
]


def _mix_backend(op: str, backend: str, x: Tensor, v: Tensor) -> str:
    """``"torch"`` or ``"triton"`` for :func:`cauchy_mix` / :func:`vandermonde_mix` on these inputs (the switchboard's
    choice: float64 stays on the reference under ``"auto"``; an explicit ``"triton"`` on CPU needs Triton's
    interpreter)."""
    return resolve(op, backend, x.device, {"D": x.shape[-1], "Dv": v.shape[-1]}, x.dtype)


def _chunk(op: str, row_bytes: int, L: int, device: torch.device) -> int:
    """Rows per chunk so that ``rows * row_bytes`` of scratch fit the op's chunk budget."""
    return chunk_rows(L, row_bytes, chunk_budget(op, device))


def _acc(t: Tensor) -> torch.dtype:
    return torch.promote_types(t.dtype, torch.float32)  # float32 math for bf16 / fp16 inputs


# --------------------------------------------------------------------------------------------------------------------
# Cauchy: y_i = sum_j sum_d v_j / (a_id + b_jd)
# --------------------------------------------------------------------------------------------------------------------


def _cauchy_block(a_c: Tensor, b: Tensor, d_group: int) -> Tensor:
    """``m_ij = sum_d 1 / (a_id + b_jd)`` for the rows of ``a_c`` ``(B, H, c, D)``: ``(B, H, c, L)``."""
    m = None
    for d0 in range(0, a_c.shape[-1], d_group):
        r = (a_c[..., :, None, d0 : d0 + d_group] + b[..., None, :, d0 : d0 + d_group]).reciprocal_()  # (B,H,c,L,g)
        m = r.sum(-1) if m is None else m.add_(r.sum(-1))
    return m


class _CauchyMix(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor, v: Tensor, chunk: int, d_group: int) -> Tensor:
        ctx.save_for_backward(a, b, v)
        ctx.chunk, ctx.d_group = chunk, d_group
        y = torch.empty_like(v)
        for i0 in range(0, a.shape[2], chunk):
            y[:, :, i0 : i0 + chunk] = _cauchy_block(a[:, :, i0 : i0 + chunk], b, d_group) @ v  # (B, H, c, Dv)
        return y

    @staticmethod
    def backward(ctx, gy: Tensor) -> tuple[Tensor | None, ...]:
        a, b, v = ctx.saved_tensors
        chunk, d_group = ctx.chunk, ctx.d_group
        ga, gb, gv = torch.zeros_like(a), torch.zeros_like(b), torch.zeros_like(v)
        for i0 in range(0, a.shape[2], chunk):
            a_c, gy_c = a[:, :, i0 : i0 + chunk], gy[:, :, i0 : i0 + chunk]
            g = (gy_c @ v.transpose(-1, -2)).unsqueeze(-1)  # (B, H, c, L, 1): dLoss / dm_ij
            m = None
            for d0 in range(0, a.shape[-1], d_group):
                d1 = d0 + d_group
                r = (a_c[..., :, None, d0:d1] + b[..., None, :, d0:d1]).reciprocal_()  # (B, H, c, L, g)
                m = r.sum(-1) if m is None else m.add_(r.sum(-1))
                t = r.square_().mul_(g)  # d m_ij / d a_id = d m_ij / d b_jd = -r^2 (r is not needed after this)
                ga[:, :, i0 : i0 + chunk, d0:d1] = -t.sum(3)
                gb[..., d0:d1] -= t.sum(2)
            gv += m.transpose(-1, -2) @ gy_c  # (B, H, L, Dv)
        return ga, gb, gv, None, None


def cauchy_mix(
    a: Tensor, b: Tensor, v: Tensor, chunk: int | None = None, d_group: int = 16, backend: str = "auto"
) -> Tensor:
    """``y_i = sum_j (sum_d 1 / (a_id + b_jd)) v_j`` without building the ``(B, H, L, L, D)`` tensor.

    The caller keeps ``a_id + b_jd`` away from zero (the structured mixer makes both positive).

    Args:
        a: ``(B, H, L, D)`` row terms.
        b: ``(B, H, L, D)`` column terms.
        v: ``(B, H, L, Dv)``.
        chunk: query rows per chunk (default: from ``attention.chunking.chunk_budget("cauchy_mix", device)``: 8 MiB
            of scratch on CPU, 64 MiB on CUDA); chunked path only.
        d_group: D terms summed per step; chunked path only.
        backend: ``"torch"`` (the chunked path), ``"triton"`` (CUDA, D and Dv <= 64; CPU tensors only under
            ``TRITON_INTERPRET=1``) or ``"auto"`` (triton for CUDA tensors when it applies, else torch).

    Returns:
        ``(B, H, L, Dv)`` in ``v``'s dtype (computed in float32 for half-precision inputs; the Triton kernel also
        computes float64 inputs in float32).
    """
    B, H, L, D = a.shape
    if _mix_backend("cauchy_mix", backend, a, v) == "triton":
        from ..kernels.mixers_triton import CauchyMixTriton

        with torch.autocast(device_type=v.device.type, enabled=False):
            y = CauchyMixTriton.apply(a.float(), b.float(), v.float(), None, None)
        return y.to(v.dtype)
    acc = _acc(v)
    d_group = max(1, min(d_group, D))
    chunk = chunk or _chunk("cauchy_mix", B * H * L * (d_group + 2) * (torch.finfo(acc).bits // 8), L, v.device)
    with torch.autocast(device_type=v.device.type, enabled=False):
        y = _CauchyMix.apply(a.to(acc), b.to(acc), v.to(acc), chunk, d_group)
    return y.to(v.dtype)


# --------------------------------------------------------------------------------------------------------------------
# Vandermonde: y_i = sum_j (sum_d cos(w q_id j) - cos(w k_jd i)) v_j, w = 2 pi freq
# --------------------------------------------------------------------------------------------------------------------


def _grid_side(n: int) -> int:
    """The side ``S = ceil(sqrt(n))`` (at least 1) of the ``p = a S + b`` grid of :func:`_cos_sums`."""
    return math.isqrt(max(n - 1, 0)) + 1


def _cos_sums(theta: Tensor, n: int) -> Tensor:
    """``t_rp = sum_d cos(theta_rd p)`` for ``p = 0 .. n-1``: ``(..., R, D) -> (..., R, n)``.

    With ``p = a S + b`` and ``S ~ sqrt(n)``, ``cos(theta (aS + b)) = cos(aS theta) cos(b theta) - sin(aS theta)
    sin(b theta)``: ``2 D (n / S + S)`` cosines and sines per row instead of ``D n``, and the sum over d becomes one
    batched ``(n / S, 2D) @ (2D, S)`` product per row.
    """
    S = _grid_side(n)
    A = -(-n // S)
    ta = theta.unsqueeze(-1) * (S * torch.arange(A, device=theta.device, dtype=theta.dtype))  # (..., R, D, A)
    tb = theta.unsqueeze(-1) * torch.arange(S, device=theta.device, dtype=theta.dtype)  # (..., R, D, S)
    left = torch.cat([ta.cos(), ta.sin()], -2).transpose(-1, -2)  # (..., R, A, 2D)
    right = torch.cat([tb.cos(), tb.sin().neg()], -2)  # (..., R, 2D, S)
    return (left @ right).flatten(-2)[..., :n]


def _rows_mix(theta_c: Tensor, v: Tensor) -> Tensor:
    """``sum_j (sum_d cos(theta_id j)) v_j`` for one chunk of rows i: ``(B, H, c, Dv)``."""
    return _cos_sums(theta_c, v.shape[-2]) @ v


def _cols_mix(theta_c: Tensor, v_c: Tensor, L: int) -> Tensor:
    """``sum_{j in chunk} (sum_d cos(theta_jd i)) v_j`` for ``i = 0 .. L-1``: ``(B, H, L, Dv)``."""
    return _cos_sums(theta_c, L).transpose(-1, -2) @ v_c


def _vandermonde_chunked(q: Tensor, k: Tensor, v: Tensor, w: float, chunk: int) -> Tensor:
    """The two sums of :func:`vandermonde_mix`, each over chunks of its own rows (q's for the first, k's for the
    second), every chunk recomputed in the backward pass (activation checkpointing)."""
    L = q.shape[2]
    grad = torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v))

    def run(fn, *args: Tensor) -> Tensor:
        return checkpoint(fn, *args, use_reentrant=False) if grad else fn(*args)

    first = torch.cat([run(_rows_mix, w * q[:, :, i0 : i0 + chunk], v) for i0 in range(0, L, chunk)], 2)
    second = None
    for j0 in range(0, L, chunk):
        part = run(_cols_mix, w * k[:, :, j0 : j0 + chunk], v[:, :, j0 : j0 + chunk], L)
        second = part if second is None else second + part
    return first - second


def vandermonde_mix(
    q: Tensor, k: Tensor, v: Tensor, freq: float, chunk: int | None = None, backend: str = "auto"
) -> Tensor:
    """``y_i = sum_j (sum_d cos(2 pi freq q_id j) - cos(2 pi freq k_jd i)) v_j`` in real arithmetic, chunked.

    The chunked path (``backend="torch"``) computes the two sums apart, ``sum_j (sum_d cos(w q_id j)) v_j`` over
    chunks of rows i and ``sum_j (sum_d cos(w k_jd i)) v_j`` over chunks of j, and builds each chunk's ``(chunk, L)``
    block of cosine sums with the angle-addition formula (``O(D sqrt(L))`` cosines per row; the sum over d is a
    matrix product): peak extra memory about ``B H chunk (2 L + 12 D sqrt(L))`` values. The backward pass recomputes
    each chunk.

    Args:
        q, k: ``(B, H, L, D)``.
        v: ``(B, H, L, Dv)``.
        freq: the frequency scale (cycles per position per unit of q / k).
        chunk: rows per chunk (default: from ``attention.chunking.chunk_budget("vandermonde_mix", device)``); chunked
            path only.
        backend: as :func:`cauchy_mix`.

    Returns:
        ``(B, H, L, Dv)`` in ``v``'s dtype.
    """
    B, H, L, D = q.shape
    if _mix_backend("vandermonde_mix", backend, q, v) == "triton":
        from ..kernels.mixers_triton import VandermondeMixTriton

        with torch.autocast(device_type=v.device.type, enabled=False):
            y = VandermondeMixTriton.apply(q.float(), k.float(), v.float(), freq, None, None)
        return y.to(v.dtype)
    acc = _acc(v)
    row_values = 2 * L + 12 * D * _grid_side(L)
    chunk = chunk or _chunk("vandermonde_mix", B * H * row_values * (torch.finfo(acc).bits // 8), L, v.device)
    with torch.autocast(device_type=v.device.type, enabled=False):
        y = _vandermonde_chunked(q.to(acc), k.to(acc), v.to(acc), 2 * math.pi * freq, chunk)
    return y.to(v.dtype)


# --------------------------------------------------------------------------------------------------------------------
# Toeplitz: y_i = sum_j t_{i-j} v_j, per channel, by FFT
# --------------------------------------------------------------------------------------------------------------------


def toeplitz_mix(kernel: Tensor, v: Tensor) -> Tensor:
    """``y_i = sum_j t_{i-j} v_j`` per channel, by a zero-padded FFT convolution (float32 under autocast).

    Args:
        kernel: ``(B, H, 2L-1, D)``; row ``s + L - 1`` holds ``t_s`` for offsets ``s = -(L-1) .. L-1``.
        v: ``(B, H, L, D)``.

    Returns:
        ``(B, H, L, D)``.
    """
    L = v.shape[2]
    if kernel.shape[2] != 2 * L - 1:
        raise ValueError(f"kernel must have 2L-1 = {2 * L - 1} offsets on dim 2, got shape {list(kernel.shape)}")
    n = 1
    while n < 3 * L - 2:  # a power of two >= 3L-2: the full linear convolution fits
        n *= 2
    acc = _acc(v)
    if torch.jit.is_scripting():  # TorchScript cannot enter torch.autocast with a runtime device type
        return _toeplitz_fft(kernel.to(acc), v.to(acc), n)[:, :, L - 1 : 2 * L - 1].to(v.dtype)
    with torch.autocast(device_type=v.device.type, enabled=False):
        full = _toeplitz_fft(kernel.to(acc), v.to(acc), n)
    return full[:, :, L - 1 : 2 * L - 1].to(v.dtype)  # y_i = full[i + L - 1]


def _toeplitz_fft(kernel: Tensor, v: Tensor, n: int) -> Tensor:
    """``full[m] = sum_j kernel[m - j] v_j`` (the linear convolution along dim 2) by real FFTs of size ``n``."""
    return torch.fft.irfft(torch.fft.rfft(kernel, n=n, dim=2) * torch.fft.rfft(v, n=n, dim=2), n=n, dim=2)


# --------------------------------------------------------------------------------------------------------------------
# Quasiseparable (Hydra): a forward and a backward selective scan, chunked
# --------------------------------------------------------------------------------------------------------------------


def _causal_scan(q: Tensor, k: Tensor, v: Tensor, log_a: Tensor, chunk: int) -> Tensor:
    """``y_i = sum_{j <= i} (q_i . k_j) prod_{t=j+1}^{i} a_t v_j``, chunked (the SSD form of a selective scan).

    Memory and time O(L T (N + Dv) + L / T N Dv) for chunk length T: the ``(T, T)`` blocks of the chunks' diagonal,
    the ``(N, Dv)`` state carried across chunks by a loop of ``L / T`` steps.

    Args:
        q, k: ``(B, H, L, N)``; v: ``(B, H, L, Dv)``; log_a: ``(B, H, L)`` log decays (<= 0).
    """
    B, H, L, N = q.shape
    Dv = v.shape[-1]
    T = min(chunk, L)
    pad = (-L) % T
    if pad:  # zero keys / values and unit decays after the end change nothing before it
        q, k, v = F.pad(q, (0, 0, 0, pad)), F.pad(k, (0, 0, 0, pad)), F.pad(v, (0, 0, 0, pad))
        log_a = F.pad(log_a, (0, pad))
    n = (L + pad) // T
    qc, kc, vc = q.view(B, H, n, T, N), k.view(B, H, n, T, N), v.view(B, H, n, T, Dv)  # (B, H, n, T, .)
    cs = log_a.view(B, H, n, T).cumsum(-1)  # (B, H, n, T): log prod_{t=start}^{i} a_t
    ii = torch.arange(T, device=q.device)
    causal = ii[:, None] >= ii[None, :]  # (T, T)
    seg = (cs.unsqueeze(-1) - cs.unsqueeze(-2)).masked_fill(~causal, float("-inf")).exp()  # (B, H, n, T, T)
    y = ((qc @ kc.transpose(-1, -2)) * seg) @ vc  # intra-chunk, (B, H, n, T, Dv)
    # Chunk states: S_c = sum_{j in c} prod_{t=j+1}^{end} a_t k_j v_j^T, carried across chunks with the chunk decay.
    states = (kc * (cs[..., -1:] - cs).exp().unsqueeze(-1)).transpose(-1, -2) @ vc  # (B, H, n, N, Dv)
    # unbind once: indexing chunk c inside the loop would make autograd build a full-size zero gradient per step
    decays, chunk_states = cs[..., -1].exp().unbind(2), states.unbind(2)  # n x (B, H), n x (B, H, N, Dv)
    carried = [torch.zeros_like(chunk_states[0])]
    for c in range(n - 1):
        carried.append(decays[c][:, :, None, None] * carried[-1] + chunk_states[c])
    prev = torch.stack(carried, dim=2)  # (B, H, n, N, Dv): state entering chunk c
    y = y + cs.exp().unsqueeze(-1) * (qc @ prev)  # inter-chunk
    return y.reshape(B, H, n * T, Dv)[:, :, :L]


def _scan_backend(backend: str, v: Tensor, N: int, separate_dt: bool) -> str:
    """The switchboard's choice for Hydra's scan (``"auto"`` is the chunked scan while tracing, on CPU, in float64)."""
    return resolve("quasiseparable_mix", backend, v.device, {"N": N, "Dv": v.shape[-1], "separate_dt": separate_dt},
                   v.dtype)  # fmt: skip


def _quasiseparable_mix_triton(*factors: Tensor) -> Tensor:
    """:func:`quasiseparable_mix`'s eight tensors, in its order, by the SSD kernels (in float32, back to v's dtype)."""
    from ..kernels.ssd_triton import quasiseparable_mix_triton

    with torch.autocast(device_type=factors[4].device.type, enabled=False):
        return quasiseparable_mix_triton(*(t.float() for t in factors)).to(factors[4].dtype)


def quasiseparable_mix(
    c_fwd: Tensor,
    b_fwd: Tensor,
    c_bwd: Tensor,
    b_bwd: Tensor,
    v: Tensor,
    log_fwd: Tensor,
    log_bwd: Tensor,
    diag: Tensor,
    chunk: int = 64,
    backend: str = "auto",
) -> Tensor:
    """Hydra's quasiseparable mixer ``y = M v`` by two chunked selective scans, never an ``(L, L)`` matrix::

        m_ij = c_fwd_{i-1} . b_fwd_j  prod_{t=j+1}^{i-1} a_t     i > j   (forward SSM, shifted down by one)
        m_ii = diag_i                                                     (free diagonal)
        m_ij = c_bwd_{i+1} . b_bwd_j  prod_{t=i+1}^{j-1} a'_t    i < j   (backward SSM: flip, scan, shift, flip)

    with ``a_t = exp(log_fwd_t)``, ``a'_t = exp(log_bwd_t)``. In Hydra ``b_j = dt_j B_j`` and ``log a_t = A dt_t``
    (the caller folds dt in). Time O(L T (N + Dv)), memory O(L (T + N Dv / T)) for chunk length T.

    Args:
        c_fwd, b_fwd, c_bwd, b_bwd: ``(B, H, L, N)`` rows (C) and columns (dt B) of the two SSMs.
        v: ``(B, H, L, Dv)``.
        log_fwd, log_bwd: ``(B, H, L)`` log decays (<= 0).
        diag: ``(B, H, L)`` the diagonal.
        chunk: scan chunk length T of the chunked PyTorch scan.
        backend: ``"torch"`` (the chunked scan), ``"triton"`` (CUDA, N and Dv <= 64; CPU tensors only under
            ``TRITON_INTERPRET=1``) or ``"auto"`` (triton for CUDA tensors when it applies, else torch).

    Returns:
        ``(B, H, L, Dv)`` in ``v``'s dtype (computed in float32 for half-precision inputs; the Triton kernels also
        compute float64 inputs in float32).
    """
    if not torch.jit.is_scripting():  # TorchScript compiles the chunked scan only
        if _scan_backend(backend, v, c_fwd.shape[-1], separate_dt=False) == "triton":
            return _quasiseparable_mix_triton(c_fwd, b_fwd, c_bwd, b_bwd, v, log_fwd, log_bwd, diag)
    acc = _acc(v)
    # both directions in one scan (the backward one on the flipped sequence), batched like the reference does
    c = torch.cat([c_fwd, c_bwd.flip(2)], dim=0).to(acc)
    b = torch.cat([b_fwd, b_bwd.flip(2)], dim=0).to(acc)
    la = torch.cat([log_fwd, log_bwd.flip(2)], dim=0).to(acc)
    vv = torch.cat([v, v.flip(2)], dim=0).to(acc)
    if torch.jit.is_scripting():  # TorchScript cannot enter torch.autocast with a runtime device type
        z = _causal_scan(c, b, vv, la, chunk)
    else:
        with torch.autocast(device_type=v.device.type, enabled=False):
            z = _causal_scan(c, b, vv, la, chunk)  # (2B, H, L, Dv), diagonal included
    z = F.pad(z[:, :, :-1], (0, 0, 1, 0))  # the shift: row i takes the scan's row i - 1 (row 0 gets zeros)
    Bsz = v.shape[0]
    return (z[:Bsz] + z[Bsz:].flip(2) + diag.to(acc).unsqueeze(-1) * v.to(acc)).to(v.dtype)


def hydra_factors(
    q: Tensor, k: Tensor, g: Tensor, A_log: Tensor, state_dim: int
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The factors of Hydra's matrix from the mixer's inputs (see :class:`attention.mixers.QuasiseparableMatrix`).

    Args:
        q: ``(B, H, L, N)`` or ``(B, H, L, 2N)``: C (both directions) or ``[C | C']``.
        k: the same for B or ``[B | B']``.
        g: ``(B, H, L, 3)``: pre-softplus dt, dt' and the diagonal.
        A_log: ``(H,)``; ``A = -exp(A_log)``.
        state_dim: N.

    Returns:
        C, dt B, C', dt' B' ``(B, H, L, N)``, the log decays ``A dt``, ``A dt'`` and the diagonal ``(B, H, L)``
        (the gates' terms in float32 at least).
    """
    N = state_dim
    g = g.to(torch.promote_types(g.dtype, torch.float32))
    dt = F.softplus(g[..., :2])  # (B, H, L, 2)
    A = -torch.exp(A_log.to(g.dtype)).view(1, -1, 1)  # (1, H, 1)
    c_f, c_b = q[..., :N], q[..., -N:]  # the same slice twice when q holds one C
    b_f, b_b = k[..., :N] * dt[..., 0:1], k[..., -N:] * dt[..., 1:2]
    return c_f, b_f, c_b, b_b, A * dt[..., 0], A * dt[..., 1], g[..., 2]


def _hydra_mix_mamba(q: Tensor, k: Tensor, v: Tensor, g: Tensor, A_log: Tensor, state_dim: int, chunk: int) -> Tensor:
    """:func:`hydra_mix` through Mamba-2's ``mamba_chunk_scan_combined``, as Hydra's own code calls it: one scan over
    the forward and the flipped backward stream stacked on the batch, then the shift, the flip and the diagonal."""
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined

    N, Bsz = state_dim, v.shape[0]
    blh = lambda t: t.transpose(1, 2)  # noqa: E731  (B, H, L, .) -> (B, L, H, .), Mamba's layout
    dt = F.softplus(g[..., :2].float())  # (B, H, L, 2)
    xs = blh(torch.cat([v, v.flip(2)]))  # (2B, L, H, Dv)
    dts = blh(torch.cat([dt[..., 0], dt[..., 1].flip(2)]))  # (2B, L, H)
    bs = blh(torch.cat([k[..., :N], k[..., -N:].flip(2)])).to(v.dtype)  # (2B, L, H, N): one group per head
    cs = blh(torch.cat([q[..., :N], q[..., -N:].flip(2)])).to(v.dtype)
    z = mamba_chunk_scan_combined(xs, dts, -torch.exp(A_log.float()), bs, cs, chunk)  # (2B, L, H, Dv)
    z = F.pad(z.transpose(1, 2)[:, :, :-1], (0, 0, 1, 0))  # (2B, H, L, Dv), shifted down one row
    return (z[:Bsz] + z[Bsz:].flip(2) + g[..., 2:3].to(z.dtype) * v).to(v.dtype)


def hydra_mix(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    A_log: Tensor,
    state_dim: int,
    chunk: int = 64,
    backend: str = "auto",
) -> Tensor:
    """Hydra's mixer ``y = M v`` from the mixer's inputs: :func:`hydra_factors`, then :func:`quasiseparable_mix`.

    ``backend``: as :func:`quasiseparable_mix`, or ``"mamba"``: Mamba-2's SSD kernels (``mamba_ssm``, CUDA), called on
    the steps dt and rates A before they are folded into the factors.
    """
    if not torch.jit.is_scripting():  # TorchScript compiles the chunked scan only
        if _scan_backend(backend, v, state_dim, separate_dt=True) == "mamba":
            return _hydra_mix_mamba(q, k, v, g, A_log, state_dim, chunk)
    c_f, b_f, c_b, b_b, log_f, log_b, diag = hydra_factors(q, k, g, A_log, state_dim)
    return quasiseparable_mix(c_f, b_f, c_b, b_b, v, log_f, log_b, diag, chunk=chunk, backend=backend)
