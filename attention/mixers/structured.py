"""Structured matrix mixers (the SAM / matrix-mixer family): ``Y = M V`` with M built from queries and keys.

Hwang, Lahoti, Dao, Gu, "Hydra: Bidirectional State Space Models Through Generalized Matrix Mixers",
arXiv:2407.09941 (the matrix mixer framework, the quasiseparable mixer, and the Cauchy / Vandermonde / Toeplitz /
low-rank / attention mixers with their non-data-dependent twins); reference code: goombalab/hydra
(``hydra/modules/hydra.py``, ``hydra/modules/matrix_mixers/*.py``).

Per head, with ``q_i, k_j`` from X and ``v_j`` the values, the matrix each mixer computes (all mixers here are
**bidirectional**: every output sees every position; none offers a causal mode)::

    softmax         m_ij = softmax_j(q_i . k_j / sqrt(D))                            scaled_dot_product_attention
    linear          m_ij = phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j')   phi = elu + 1   (linear attention;
                    normalized, rows sum to 1)                                                        O(L D^2)
    lowrank         m_ij = q_i . k_j / sqrt(L D)   (the framework's low-rank mixer, unnormalized)        O(L D^2)
    toeplitz        m_ij = t_{i-j} / L per channel d, t_s = q_{s,d} (s > 0), k_{-s,d} (s < 0), q_0 + k_0 (s = 0)
                                                                              FFT convolution, O(L log L D)
    cauchy          m_ij = (1/L) sum_d 1 / (softplus(q_id) + softplus(k_jd) + c),  c = softplus(c_raw) + c_min
                    (every denominator >= c_min > 0: no poles by construction; c trainable, one per head)
                                                                   chunked, O(L^2 D) time, O(B H chunk L) memory
    vandermonde     m_ij = (1/L) sum_d cos(2 pi f q_id j) - cos(2 pi f k_jd i),  f = freq_scale / L (default),
                    or a fixed f = freq (``freq=1e-3``: the reference's eps)                 chunked, as cauchy
    hydra           m_ij = C_{i-1} . B_j dt_j prod_{t=j+1}^{i-1} exp(A dt_t)         (i > j, forward SSM)
                    m_ii = fc_D(x_i) + D                                             (free diagonal)
                    m_ij = C'_{i+1} . B'_j dt'_j prod_{t=i+1}^{j-1} exp(A dt'_t)     (i < j, backward SSM)
                    q = [C | C'], k = [B | B'], dt = softplus(gate)           chunked scans, O(L) time and memory
    quasiseparable  hydra with one (C, B) for both directions (C' = C, B' = B)

The reference computes the same products with other parameterizations where noted:

* Cauchy: ``m_ij = std sum_d 1 / (q'_id + k'_jd + tol)`` with ``q' = exp(q) + b``, ``k' = exp(k) + b`` (b a
  scalar, init 0.5, tol 1e-8, ``std = 1 / sqrt(max_seq_len D)``): positive only while ``b > 0``. Ours uses softplus
  and a per-head ``c >= c_min``, which keeps every denominator away from zero whatever the parameters do.
* Vandermonde: ``std = 1 / sqrt(2 max_seq_len D)`` and a frequency fixed per absolute position, ``f = eps = 1e-3``
  (``freq=1e-3`` here); our default ``f = freq_scale / L`` scales with the length, so the phases span the same range
  at any L.
* Toeplitz: the reference's kernel is one scalar per head and offset (two projections of x, ``forward_conv`` and
  ``reverse_conv``, ``std = 0.5 / sqrt(max_seq_len)``) applied by a circular FFT of size 2L-1, which reads it off as
  ``t_s = forward_{s+1}`` (-1 <= s <= L-2), ``t_s = reverse_{-s-1}`` (s <= -2) and ``t_{L-1} = reverse_{L-1}``
  (wrap-around). Ours is per channel with the read-off above and a zero-padded (linear) FFT.
* Low-rank: ``std = 1 / sqrt(max_seq_len D)``; ours uses the input's L.
* Every reference mixer adds the identity (``+ v``) after its product (Hydra adds its diagonal instead); ours leave
  the skip to the block's residual connection.

The 1/L factors keep outputs O(1) at any length for the mixers without a normalization of their own. Cauchy and
Vandermonde take ``backend=``: on CUDA, ``"auto"`` runs the tiled Triton kernels of
:mod:`attention.kernels.mixers_triton` (no tile beyond ``(block, block, D)``) instead of the chunked PyTorch path;
Hydra's too: the chunked SSD kernels of :mod:`attention.kernels.ssd_triton` instead of the chunked PyTorch scan.
**Non-data-dependent twins** (``data_dependent=False``, the paper's ablation): the same matrix class with q, k (and
the Hydra gates: dt, dt' and the diagonal, per position) replaced by learned parameters sized to ``max_len`` (the
first L rows are used): M no longer depends on the input; only V does. (The reference's Hydra twin keeps a
data-dependent diagonal ``fc_D(x)`` and one dt per head.)

Each core has ``forward(q, k, v, g, attn_mask)`` (the efficient path; only softmax reads ``attn_mask``, the
:class:`MatrixMixer` rejects one for the others) and ``materialize(q, k, g)``, the dense matrix used only by the tests
as the reference (``(B, H, L, L)``, or ``(B, H, D, L, L)`` for the per-channel Toeplitz).

TorchScript compiles every :class:`MatrixMixer` (one forward; its eager input checks sit behind
``torch.jit.is_scripting()``) except those in :data:`UNSCRIPTABLE_MATRICES`, Cauchy and Vandermonde, whose products
are custom autograd Functions: scripting one raises an error naming it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..backends import backend_names
from ..checks import check_heads, check_seq
from .functional import cauchy_mix, hydra_factors, hydra_mix, toeplitz_mix, vandermonde_mix

__all__ = [
    "MATRIX_MIXERS",
    "UNSCRIPTABLE_MATRICES",
    "CauchyMatrix",
    "LinearAttentionMatrix",
    "LowRankMatrix",
    "MatrixMixer",
    "QuasiseparableMatrix",
    "SoftmaxMatrix",
    "ToeplitzMatrix",
    "VandermondeMatrix",
    "apply_matrix",
]


# FX: the chunked scan loops over L / T chunks, so symbolic tracing records the whole op as one call (a leaf)
torch.fx.wrap("hydra_mix")


def _check_backend(backend: str) -> None:
    """At construction: ``backend`` must name a backend of the Cauchy and Vandermonde products (they share their
    names in attention.backends); whether it can take the device and shapes is resolved when the mixer runs."""
    names = backend_names("cauchy_mix")
    if backend not in ("auto", *names):
        raise ValueError(f"unknown backend {backend!r}; choose one of {['auto', *names]}")


def apply_matrix(m: Tensor, v: Tensor) -> Tensor:
    """``Y = M V`` for a dense ``(B, H, L, L)`` matrix, or a per-channel ``(B, H, D, L, L)`` one."""
    if m.dim() == 5:
        return torch.einsum("bhdij,bhjd->bhid", m, v)
    return m @ v


class SoftmaxMatrix(nn.Module):
    """Softmax attention, ``m_ij = softmax_j(q_i . k_j / sqrt(D))`` (the reference's ``attention`` mixer computes the
    same product); ``sdpa=False`` runs the explicit ``softmax(q k^T) v`` matmuls (the bench's vanilla)."""

    num_gates = 0

    def __init__(self, head_dim: int, sdpa: bool = True) -> None:
        super().__init__()
        self.scale, self.sdpa = head_dim**-0.5, sdpa

    def materialize(self, q: Tensor, k: Tensor, g: Tensor | None = None) -> Tensor:
        return torch.softmax((q @ k.transpose(-1, -2)) * self.scale, dim=-1)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        if self.sdpa:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        s = (q @ k.transpose(-1, -2)) * self.scale  # (B, H, L, L)
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
        return torch.softmax(s, dim=-1) @ v


class LinearAttentionMatrix(nn.Module):
    """Normalized linear attention (Katharopoulos et al., 2020; rank <= D, every row sums to 1):
    ``m_ij = phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j')`` with ``phi = elu + 1``, computed as
    ``(phi(Q) (phi(K)^T V)) / (phi(Q) sum_j phi(k_j))`` in O(L D^2). Not the framework's low-rank mixer, which is
    unnormalized (:class:`LowRankMatrix`)."""

    num_gates = 0

    def __init__(self, head_dim: int) -> None:
        super().__init__()

    @staticmethod
    def _phi(t: Tensor) -> Tensor:
        return F.elu(t) + 1.0

    def materialize(self, q: Tensor, k: Tensor, g: Tensor | None = None) -> Tensor:
        s = self._phi(q) @ self._phi(k).transpose(-1, -2)  # (B, H, L, L), positive
        return s / s.sum(-1, keepdim=True)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        pq, pk = self._phi(q), self._phi(k)
        kv = pk.transpose(-1, -2) @ v  # (B, H, D, Dv)
        z = pq @ pk.sum(2, keepdim=True).transpose(-1, -2)  # (B, H, L, 1)
        return (pq @ kv) / z


class LowRankMatrix(nn.Module):
    """The matrix-mixer framework's low-rank mixer: ``m_ij = std q_i . k_j``, ``std = 1 / sqrt(L D)``, unnormalized.

    Computed as ``std Q (K^T V)`` in O(L D^2). The reference (goombalab/hydra ``matrix_mixers/low_rank.py``) takes
    ``std = 1 / sqrt(max_seq_len D)`` and adds the identity (``+ v``) after the product, as it does after every one of
    its mixers; here ``L`` is the input's length and the skip is the block's residual.
    """

    num_gates = 0

    def __init__(self, head_dim: int) -> None:
        super().__init__()

    def materialize(self, q: Tensor, k: Tensor, g: Tensor | None = None) -> Tensor:
        return (q @ k.transpose(-1, -2)) * (q.shape[2] * q.shape[3]) ** -0.5  # (B, H, L, L)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        return (q * (q.shape[2] * q.shape[3]) ** -0.5) @ (k.transpose(-1, -2) @ v)  # (B, H, D, Dv) in the middle


class ToeplitzMatrix(nn.Module):
    """Per-channel Toeplitz matrix ``m_ij = t_{i-j} / L`` for each channel d, its kernel of length 2L-1 read off q and
    k by offset: ``t_s = q_{s,d}`` (s > 0), ``t_0 = q_{0,d} + k_{0,d}``, ``t_s = k_{-s,d}`` (s < 0).

    The reference builds one kernel per head (not per channel) from two projections and reads it off circularly (see
    the module docstring); both are Toeplitz matrices from a data-dependent kernel.
    """

    num_gates = 0

    def __init__(self, head_dim: int) -> None:
        super().__init__()

    @staticmethod
    def kernel(q: Tensor, k: Tensor) -> Tensor:
        """``(B, H, 2L-1, D)``: row ``s + L - 1`` is ``t_s / L``."""
        L = q.shape[2]
        t = torch.cat([k[:, :, 1:].flip(2), q[:, :, :1] + k[:, :, :1], q[:, :, 1:]], dim=2)
        return t / L

    def materialize(self, q: Tensor, k: Tensor, g: Tensor | None = None) -> Tensor:
        L = q.shape[2]
        t = self.kernel(q, k)  # (B, H, 2L-1, D)
        pos = torch.arange(L, device=q.device)
        offset = pos[:, None] - pos[None, :] + L - 1  # (L, L): i - j + L - 1
        return t[:, :, offset].permute(0, 1, 4, 2, 3)  # (B, H, D, L, L)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        return toeplitz_mix(self.kernel(q, k), v)


class CauchyMatrix(nn.Module):
    """``m_ij = (1/L) sum_d 1 / (softplus(q_id) + softplus(k_jd) + c)``, c >= c_min > 0 per head (no poles).

    Args:
        head_dim: D.
        num_heads: H (one trainable c per head).
        c_min: the smallest allowed denominator.
        chunk_size: query rows per chunk of the chunked PyTorch path (default: from a 64 MiB budget).
        backend: ``"auto"`` (the Triton kernel for CUDA tensors when triton is installed, else the chunked path),
            ``"torch"`` or ``"triton"``: see :func:`attention.mixers.functional.cauchy_mix`.
    """

    num_gates = 0

    def __init__(
        self,
        head_dim: int,
        num_heads: int = 1,
        c_min: float = 0.5,
        chunk_size: int | None = None,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        if c_min <= 0:
            raise ValueError(f"c_min must be > 0 (it bounds the denominators away from zero), got {c_min}")
        _check_backend(backend)
        self.c_min, self.chunk_size, self.backend = c_min, chunk_size, backend
        self.c_raw = nn.Parameter(torch.full((num_heads,), math.log(math.e - 1)))  # softplus -> 1, c = 1 + c_min

    def _terms(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        c = (F.softplus(self.c_raw) + self.c_min).view(1, -1, 1, 1)
        return F.softplus(q) + c, F.softplus(k)  # a_id + b_jd = q'_id - k'_jd + c >= c_min

    def materialize(self, q: Tensor, k: Tensor, g: Tensor | None = None) -> Tensor:
        a, b = self._terms(q, k)
        return (a.unsqueeze(3) + b.unsqueeze(2)).reciprocal().sum(-1) / q.shape[2]  # (B, H, L, L) via B H L L D

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        a, b = self._terms(q, k)
        return cauchy_mix(a, b, v / q.shape[2], chunk=self.chunk_size, backend=self.backend)


class VandermondeMatrix(nn.Module):
    """``m_ij = (1/L) sum_d cos(2 pi f q_id j) - cos(2 pi f k_jd i)`` (real arithmetic), ``f = freq_scale / L``.

    The reference fixes the frequency per absolute position instead (``f = eps = 1e-3``, whatever L): pass
    ``freq=1e-3`` for that.

    Args:
        head_dim: D.
        freq_scale: cycles across the sequence per unit of q or k (used when ``freq`` is None).
        chunk_size, backend: as :class:`CauchyMatrix`.
        freq: a fixed frequency f (cycles per position per unit of q or k), independent of L.
    """

    num_gates = 0

    def __init__(
        self,
        head_dim: int,
        freq_scale: float = 1.0,
        chunk_size: int | None = None,
        backend: str = "auto",
        freq: float | None = None,
    ) -> None:
        super().__init__()
        _check_backend(backend)
        self.freq_scale, self.chunk_size, self.backend, self.freq = freq_scale, chunk_size, backend, freq

    def _freq(self, L: int) -> float:
        return self.freq if self.freq is not None else self.freq_scale / L

    def materialize(self, q: Tensor, k: Tensor, g: Tensor | None = None) -> Tensor:
        L = q.shape[2]
        w = 2 * math.pi * self._freq(L)
        pos = torch.arange(L, device=q.device, dtype=q.dtype)
        m = torch.cos(w * q.unsqueeze(3) * pos[:, None]) - torch.cos(w * k.unsqueeze(2) * pos[:, None, None])
        return m.sum(-1) / L  # (B, H, L, L) via B H L L D

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        L = q.shape[2]
        return vandermonde_mix(q, k, v / L, self._freq(L), chunk=self.chunk_size, backend=self.backend)


class QuasiseparableMatrix(nn.Module):
    """Hydra's quasiseparable matrix (Hwang et al., arXiv:2407.09941): a forward and a backward SSM, shift, diagonal.

    Per head, from x: for each direction its own C_t, B_t in R^N (the mixer's q and k) and step dt_t; one scalar
    decay rate A < 0 per head; a free diagonal d_t::

        m_ij = C_{i-1} . B_j dt_j prod_{t=j+1}^{i-1} exp(A dt_t)        i > j  (forward SSM, shifted down by one)
        m_ii = d_i = fc_D(x_i) + D                                             (diagonal)
        m_ij = C'_{i+1} . B'_j dt'_j prod_{t=i+1}^{j-1} exp(A dt'_t)    i < j  (backward SSM: flip, scan, shift, flip)

    ``q = [C | C']`` and ``k = [B | B']`` (``(B, H, L, 2N)``, or ``(B, H, L, N)`` used by both directions with
    ``shared_bc=True``), ``g[..., 0]`` and ``g[..., 1]`` are the pre-softplus ``dt``, ``dt'`` and ``g[..., 2]`` the
    diagonal (its gate bias is Hydra's D, 1 at init). Computed by :func:`attention.mixers.functional.quasiseparable_mix`
    (chunked scans, O(L) time and memory). The off-diagonal blocks have rank <= N; the lower triangle depends only on
    the forward parameters (C, B, dt) and A, the upper one only on the backward ones and A.

    Compared against the paper's code (goombalab/hydra, ``hydra/modules/hydra.py`` ``Hydra.forward``: one
    ``mamba_chunk_scan_combined`` over ``cat(x, flip(x))`` with the forward and flipped backward B, C, dt, then
    ``roll(1)`` with row 0 zeroed, flip, ``+ x * (fc_D(x) + D)``): the same matrix. ``shared_bc=True`` is its
    ``matrix_mixers/quasiseparable.py`` (one B, C for both directions, "Hydra that shares BC"). Where ours differs:
    B and C are per head (ngroups = H, N = ``state_dim``, default the head dim) rather than one group shared by all
    heads; the diagonal's projection reads the block input x instead of the post-conv values (both are linear maps of
    x here, since our values are a linear projection); the forward and backward dt have separate biases (the
    reference shares ``dt_bias``; both start from the same log-uniform draw in ``[dt_min, dt_max]``); the Hydra block
    around the matrix (short depthwise conv, SiLU, gate z, RMSNorm, expand = 2) is not part of the mixer.

    Args:
        head_dim: D (the values' width per head).
        num_heads: H (one A per head).
        state_dim: N, the state size of each SSM (default: D).
        shared_bc: one (C, B) pair for both directions (the reference's ``quasiseparable`` mixer).
        chunk_size: scan chunk length T (of the chunked PyTorch scan and of Mamba-2's kernels).
        dt_min, dt_max: range of the initial step sizes.
        backend: ``"auto"`` (the SSD Triton kernels for CUDA tensors when triton is installed, else the chunked
            scan), ``"torch"``, ``"triton"`` or ``"mamba"`` (Mamba-2's kernels, from ``mamba_ssm``): see
            :func:`attention.mixers.functional.hydra_mix`.
    """

    num_gates = 3

    def __init__(
        self,
        head_dim: int,
        num_heads: int = 1,
        state_dim: int | None = None,
        shared_bc: bool = False,
        chunk_size: int = 64,
        dt_min: float = 1e-3,
        dt_max: float = 0.1,
        backend: str = "auto",
    ) -> None:
        super().__init__()
        names = backend_names("quasiseparable_mix")
        if backend not in ("auto", *names):
            raise ValueError(f"unknown backend {backend!r}; choose one of {['auto', *names]}")
        if not 0 < dt_min <= dt_max:
            raise ValueError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        if chunk_size < 1:
            raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
        self.num_heads, self.state_dim = num_heads, state_dim or head_dim
        self.shared_bc, self.chunk_size, self.dt_min, self.dt_max = shared_bc, chunk_size, dt_min, dt_max
        self.backend = backend
        self.qk_dim = self.state_dim if shared_bc else 2 * self.state_dim  # width of q and k per head
        self.A_log = nn.Parameter(torch.zeros(num_heads))  # A = -exp(A_log) = -1 at init, as the reference

    def extra_repr(self) -> str:
        return f"state_dim={self.state_dim}, shared_bc={self.shared_bc}, chunk_size={self.chunk_size}"

    def gate_init(self) -> Tensor:
        """``(H, 3)`` initial gate biases: inverse softplus of a log-uniform dt per head (both directions), D = 1."""
        lo, hi = math.log(self.dt_min), math.log(self.dt_max)
        dt = torch.exp(torch.rand(self.num_heads) * (hi - lo) + lo).clamp(min=1e-4)
        inv_dt = dt + torch.log(-torch.expm1(-dt))  # softplus(inv_dt) = dt
        return torch.stack([inv_dt, inv_dt, torch.ones(self.num_heads)], dim=-1)

    def materialize(self, q: Tensor, k: Tensor, g: Tensor | None = None) -> Tensor:
        """The dense ``(B, H, L, L)`` matrix, entry by entry from the definition above (the tests' reference)."""
        if g is None:
            raise ValueError("the quasiseparable matrix needs its gates g (B, H, L, 3)")
        L = q.shape[2]
        c_f, b_f, c_b, b_b, log_f, log_b, diag = hydra_factors(q, k, g, self.A_log, self.state_dim)
        s_f, s_b = log_f.cumsum(-1), log_b.cumsum(-1)  # s_i = sum_{t <= i} A dt_t
        i, j = torch.arange(L, device=q.device)[:, None], torch.arange(L, device=q.device)[None, :]
        c_prev = F.pad(c_f, (0, 0, 1, 0))[:, :, :L]  # row i: C_{i-1}
        s_prev = F.pad(s_f, (1, 0))[..., :L]  # s_{i-1}
        lower = (s_prev.unsqueeze(-1) - s_f.unsqueeze(-2)).masked_fill(i <= j, float("-inf")).exp()  # (B, H, L, L)
        lower = (c_prev @ b_f.transpose(-1, -2)).to(lower.dtype) * lower
        c_next = F.pad(c_b, (0, 0, 0, 1))[:, :, 1:]  # row i: C'_{i+1}
        sb_prev = F.pad(s_b, (1, 0))[..., :L]  # s'_{j-1}
        upper = (sb_prev.unsqueeze(-2) - s_b.unsqueeze(-1)).masked_fill(i >= j, float("-inf")).exp()
        upper = (c_next @ b_b.transpose(-1, -2)).to(upper.dtype) * upper
        return (lower + upper + torch.diag_embed(diag)).to(q.dtype)

    def forward(
        self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, attn_mask: Tensor | None = None
    ) -> Tensor:
        assert g is not None, "the quasiseparable matrix needs its gates g (B, H, L, 3)"
        return hydra_mix(q, k, v, g, self.A_log, self.state_dim, self.chunk_size, self.backend)


MATRIX_MIXERS: dict[str, Callable[..., nn.Module]] = {
    "softmax": SoftmaxMatrix,
    "linear": LinearAttentionMatrix,
    "lowrank": LowRankMatrix,
    "toeplitz": ToeplitzMatrix,
    "cauchy": CauchyMatrix,
    "vandermonde": VandermondeMatrix,
    "hydra": QuasiseparableMatrix,
    "quasiseparable": partial(QuasiseparableMatrix, shared_bc=True),
}
_PER_HEAD_PARAMS = ("cauchy", "hydra", "quasiseparable")  # matrices that take num_heads
# matrices whose product is a custom autograd Function (the chunked path, the Triton kernels): TorchScript cannot
# compile them, so MatrixMixer names them when scripted; every other matrix scripts (model and FX graph)
UNSCRIPTABLE_MATRICES = ("cauchy", "vandermonde")


class MatrixMixer(nn.Module):
    """Multi-head token mixer ``proj([M_h V_h]_h)`` with a structured matrix per head (timm's attention surface).

    Args:
        dim: width C.
        num_heads: heads H (C divisible by H).
        matrix: a key of :data:`MATRIX_MIXERS`.
        data_dependent: False builds the non-data-dependent twin (q, k, gates are parameters; needs ``max_len``).
        max_len: the longest sequence of the twin.
        qkv_bias: bias of the input projections.
        proj_drop: dropout on the output.
        **matrix_kwargs: passed to the matrix class (``chunk_size``, ``c_min``, ``freq_scale`` / ``freq``, ``sdpa``,
            ``backend`` of cauchy / vandermonde, ``state_dim`` / ``dt_min`` / ``dt_max`` of hydra).

    Shapes:
        x: ``(B, L, C)``; attn_mask (softmax only): broadcastable to ``(B, H, L, L)``; output: ``(B, L, C)``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        matrix: str = "softmax",
        data_dependent: bool = True,
        max_len: int | None = None,
        qkv_bias: bool = False,
        proj_drop: float = 0.0,
        **matrix_kwargs,
    ) -> None:
        super().__init__()
        if matrix not in MATRIX_MIXERS:
            raise ValueError(f"unknown matrix {matrix!r}; choose one of {sorted(MATRIX_MIXERS)}")
        check_heads(dim, num_heads)
        if not data_dependent and (max_len is None or max_len < 1):
            raise ValueError(f"the non-data-dependent twin needs max_len >= 1 (its parameters' length), got {max_len}")
        H, D = num_heads, dim // num_heads
        self.dim, self.num_heads, self.head_dim = dim, H, D
        self.matrix_name, self.data_dependent, self.max_len = matrix, data_dependent, max_len
        self.scriptable = matrix not in UNSCRIPTABLE_MATRICES  # TorchScript can compile it (model and FX graph)
        if matrix in _PER_HEAD_PARAMS:
            matrix_kwargs.setdefault("num_heads", H)
        self.matrix = MATRIX_MIXERS[matrix](D, **matrix_kwargs)
        G = self.matrix.num_gates
        self.qk_dim = getattr(self.matrix, "qk_dim", D)  # width of q and k per head (Hydra: both SSMs' C, B)
        gate_init = self.matrix.gate_init() if G else None  # (H, G)
        # the other variant's modules and parameters are None: TorchScript compiles only the branch that exists
        self.qkv = self.gate = self.gate_bias = self.v = self.q_param = self.k_param = self.gate_param = None
        if data_dependent:
            self.qkv = nn.Linear(dim, 2 * H * self.qk_dim + dim, bias=qkv_bias)  # [q | k | v]
            # the gates' bias is a parameter of its own so that model-wide Linear inits (timm's zero biases) keep it
            self.gate = nn.Linear(dim, H * G, bias=False) if G else None
            self.gate_bias = nn.Parameter(gate_init.flatten()) if G else None
        else:
            self.v = nn.Linear(dim, dim, bias=qkv_bias)
            self.q_param = nn.Parameter(torch.randn(1, H, max_len, self.qk_dim))  # (1, H, L_max, D)
            self.k_param = nn.Parameter(torch.randn(1, H, max_len, self.qk_dim))
            self.gate_param = nn.Parameter(gate_init[None, :, None].repeat(1, 1, max_len, 1)) if G else None
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def extra_repr(self) -> str:
        return f"matrix={self.matrix_name!r}, data_dependent={self.data_dependent}, max_len={self.max_len}"

    def inputs(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """``q, k`` ``(B, H, L, qk_dim)``, ``v`` ``(B, H, L, D)`` and the gates ``(B, H, L, G)`` (or None) of ``x``."""
        B, L, C = x.shape
        H, D = self.num_heads, self.head_dim
        g: Tensor | None = None
        if self.qkv is not None:  # data-dependent
            qk, v = self.qkv(x).split([2 * H * self.qk_dim, C], dim=-1)
            q, k = qk.view(B, L, 2, H, self.qk_dim).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, L, qk_dim) each
            v = v.view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
            if self.gate is not None and self.gate_bias is not None:
                g = (self.gate(x) + self.gate_bias).view(B, L, H, -1).transpose(1, 2)  # (B, H, L, G)
            return q, k, v, g
        assert self.v is not None and self.q_param is not None and self.k_param is not None and self.max_len is not None
        if L > self.max_len:
            raise ValueError(f"sequence length L={L} exceeds max_len={self.max_len} of the non-data-dependent twin")
        v = self.v(x).view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        q = self.q_param[:, :, :L].expand(B, -1, -1, -1).to(v.dtype)
        k = self.k_param[:, :, :L].expand(B, -1, -1, -1).to(v.dtype)
        if self.gate_param is not None:
            g = self.gate_param[:, :, :L].expand(B, -1, -1, -1)
        return q, k, v, g

    def _out(self, y: Tensor, B: int, L: int) -> Tensor:
        return self.proj_drop(self.proj(y.transpose(1, 2).reshape(B, L, self.dim)))  # (B, L, C)

    def __prepare_scriptable__(self) -> nn.Module:
        # torch.jit.script calls this before compiling: name the mixer instead of a TorchScript compiler error.
        if not self.scriptable:
            raise RuntimeError(
                f"the {self.matrix_name!r} sequence mixer cannot be compiled by TorchScript "
                "(its chunked product is a custom autograd Function); "
                "use torch.fx, torch.compile or torch.export instead "
                "(timm: build the model outside set_scriptable(True))"
            )
        return self

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        if not torch.jit.is_scripting():  # eager validation (TorchScript skips the branch, its condition included)
            check_seq(x, "x", channels=self.dim)
        if attn_mask is not None and self.matrix_name != "softmax":
            raise ValueError(f"attn_mask is supported by the softmax matrix only, not '{self.matrix_name}': pass None")
        B, L, _ = x.shape
        q, k, v, g = self.inputs(x)
        return self._out(self.matrix(q, k, v, g, attn_mask), B, L)

    def materialize(self, x: Tensor) -> Tensor:
        """The dense mixing matrix of ``x`` (tests only): ``(B, H, L, L)`` or ``(B, H, D, L, L)``."""
        q, k, _, g = self.inputs(x)
        return self.matrix.materialize(q, k, g)

    def forward_reference(self, x: Tensor) -> Tensor:
        """:meth:`forward` through the dense matrix (tests only)."""
        check_seq(x, "x", channels=self.dim)
        B, L, _ = x.shape
        q, k, v, g = self.inputs(x)
        return self._out(apply_matrix(self.matrix.materialize(q, k, g), v), B, L)
