"""Structured matrix mixers (the SAM / matrix-mixer family): ``Y = M V`` with M built from queries and keys.

Hwang, Lahoti, Dao, Gu, "Hydra: Bidirectional State Space Models Through Generalized Matrix Mixers",
arXiv:2407.09941 (the matrix mixer framework, the quasiseparable mixer, and the Cauchy / Vandermonde / Toeplitz /
low-rank / attention mixers with their non-data-dependent twins).

Per head, with ``q_i, k_j`` in R^D from X and ``v_j`` the values (all mixers here are **bidirectional**: every
output sees every position; none offers a causal mode)::

    softmax         m_ij = softmax_j(q_i . k_j / sqrt(D))                    scaled_dot_product_attention
    linear          m_ij = phi(q_i) . phi(k_j) / sum_j' phi(q_i) . phi(k_j')    phi = elu + 1; O(L D^2)
    toeplitz        m_ij = t_{i-j} / L per channel d, t_s = q_{s,d} (s > 0), k_{-s,d} (s < 0), q_0 + k_0 (s = 0)
                    (the kernel of length 2L-1 read off q and k by offset)     FFT convolution, O(L log L)
    cauchy          m_ij = (1/L) sum_d 1 / (q'_id - k'_jd + c)                   chunked, O(B H chunk L) memory
                    q' = softplus(q) >= 0, k' = -softplus(k) <= 0, c = softplus(c_raw) + c_min >= c_min > 0, so
                    every denominator is >= c_min: no poles by construction (c trainable, one per head)
    vandermonde     m_ij = (1/L) sum_d cos(2 pi f q_id j) - cos(2 pi f k_jd i),  f = freq_scale / L   chunked
    quasiseparable  m_ij = (q_i . k_j / sqrt(D)) prod_{t=j+1}^{i} a_t (i >= j),  prod_{t=i}^{j-1} b_t (i < j)
    (Hydra)         a_t, b_t = sigmoid of a projection of x_t (two gates per head)   chunked scans, O(L)

The 1/L factors keep outputs O(1) at any length for the mixers without a normalization of their own. Cauchy and
Vandermonde take ``backend=``: on CUDA, ``"auto"`` runs the tiled Triton kernels of
:mod:`attention.kernels.mixers_triton` (no tile beyond ``(block, block, D)``) instead of the chunked PyTorch path.
**Non-data-dependent twins** (``data_dependent=False``, the paper's ablation): the same matrix class with q, k (and
the Hydra gates) replaced by learned parameters sized to ``max_len`` (the first L rows are used): M no longer depends
on the input; only V does.

Each core has ``forward(q, k, v, g)`` (the efficient path) and ``materialize(q, k, g)``, the dense matrix used only
by the tests as the reference (``(B, H, L, L)``, or ``(B, H, D, L, L)`` for the per-channel Toeplitz).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .functional import MIX_BACKENDS, cauchy_mix, quasiseparable_mix, toeplitz_mix, vandermonde_mix

__all__ = [
    "MATRIX_MIXERS",
    "CauchyMatrix",
    "LowRankMatrix",
    "MatrixMixer",
    "QuasiseparableMatrix",
    "SoftmaxMatrix",
    "ToeplitzMatrix",
    "VandermondeMatrix",
    "apply_matrix",
]


def _check_backend(backend: str) -> None:
    if backend not in ("auto", *MIX_BACKENDS):
        raise ValueError(f"unknown backend {backend!r}; choose one of {['auto', *MIX_BACKENDS]}")


def apply_matrix(m: Tensor, v: Tensor) -> Tensor:
    """``Y = M V`` for a dense ``(B, H, L, L)`` matrix, or a per-channel ``(B, H, D, L, L)`` one."""
    if m.dim() == 5:
        return torch.einsum("bhdij,bhjd->bhid", m, v)
    return m @ v


class SoftmaxMatrix(nn.Module):
    """Softmax attention; ``sdpa=False`` runs the explicit ``softmax(q k^T) v`` matmuls (the bench's vanilla)."""

    num_gates = 0

    def __init__(self, head_dim: int, sdpa: bool = True) -> None:
        super().__init__()
        self.scale, self.sdpa = head_dim**-0.5, sdpa

    def materialize(self, q: Tensor, k: Tensor, g: Tensor | None = None) -> Tensor:
        return torch.softmax((q @ k.transpose(-1, -2)) * self.scale, dim=-1)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None, attn_mask: Tensor | None = None):
        if self.sdpa:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
        s = (q @ k.transpose(-1, -2)) * self.scale  # (B, H, L, L)
        if attn_mask is not None:
            s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
        return torch.softmax(s, dim=-1) @ v


class LowRankMatrix(nn.Module):
    """Normalized linear attention (rank <= D): ``(phi(Q) (phi(K)^T V)) / (phi(Q) sum_j phi(k_j))``, O(L D^2)."""

    num_gates = 0

    def __init__(self, head_dim: int) -> None:
        super().__init__()

    @staticmethod
    def _phi(t: Tensor) -> Tensor:
        return F.elu(t) + 1.0

    def materialize(self, q: Tensor, k: Tensor, g: Tensor | None = None) -> Tensor:
        s = self._phi(q) @ self._phi(k).transpose(-1, -2)  # (B, H, L, L), positive
        return s / s.sum(-1, keepdim=True)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None) -> Tensor:
        pq, pk = self._phi(q), self._phi(k)
        kv = pk.transpose(-1, -2) @ v  # (B, H, D, Dv)
        z = pq @ pk.sum(2, keepdim=True).transpose(-1, -2)  # (B, H, L, 1)
        return (pq @ kv) / z


class ToeplitzMatrix(nn.Module):
    """Per-channel Toeplitz matrix whose kernel of length 2L-1 is read off q (offsets >= 0) and k (offsets <= 0)."""

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

    def forward(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None) -> Tensor:
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

    def forward(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None) -> Tensor:
        a, b = self._terms(q, k)
        return cauchy_mix(a, b, v / q.shape[2], chunk=self.chunk_size, backend=self.backend)


class VandermondeMatrix(nn.Module):
    """``m_ij = (1/L) sum_d cos(2 pi f q_id j) - cos(2 pi f k_jd i)`` with ``f = freq_scale / L`` (real arithmetic).

    Args:
        head_dim: D.
        freq_scale: cycles across the sequence per unit of q or k.
        chunk_size, backend: as :class:`CauchyMatrix`.
    """

    num_gates = 0

    def __init__(
        self, head_dim: int, freq_scale: float = 1.0, chunk_size: int | None = None, backend: str = "auto"
    ) -> None:
        super().__init__()
        _check_backend(backend)
        self.freq_scale, self.chunk_size, self.backend = freq_scale, chunk_size, backend

    def materialize(self, q: Tensor, k: Tensor, g: Tensor | None = None) -> Tensor:
        L = q.shape[2]
        w = 2 * math.pi * self.freq_scale / L
        pos = torch.arange(L, device=q.device, dtype=q.dtype)
        m = torch.cos(w * q.unsqueeze(3) * pos[:, None]) - torch.cos(w * k.unsqueeze(2) * pos[:, None, None])
        return m.sum(-1) / L  # (B, H, L, L) via B H L L D

    def forward(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None) -> Tensor:
        L = q.shape[2]
        return vandermonde_mix(q, k, v / L, self.freq_scale / L, chunk=self.chunk_size, backend=self.backend)


class QuasiseparableMatrix(nn.Module):
    """Hydra's quasiseparable matrix: a forward (diagonal included) and a backward selective scan.

    ``g[..., 0]`` and ``g[..., 1]`` are the pre-sigmoid forward and backward gates of each position.

    Args:
        head_dim: D.
        chunk_size: scan chunk length T.
    """

    num_gates = 2

    def __init__(self, head_dim: int, chunk_size: int = 64) -> None:
        super().__init__()
        self.scale, self.chunk_size = head_dim**-0.5, chunk_size

    def materialize(self, q: Tensor, k: Tensor, g: Tensor | None = None) -> Tensor:
        L = q.shape[2]
        log_a, log_b = F.logsigmoid(g.to(torch.promote_types(g.dtype, torch.float32))).unbind(-1)  # (B, H, L) each
        s = log_a.cumsum(-1)  # log prod_{t<=i} a_t
        e = F.pad(log_b.cumsum(-1), (1, 0))[..., :L]  # log prod_{t<j} b_t
        i, j = torch.arange(L, device=q.device)[:, None], torch.arange(L, device=q.device)[None, :]
        lower = (s.unsqueeze(-1) - s.unsqueeze(-2)).masked_fill(i < j, float("-inf"))  # sum_{t=j+1}^{i} log a_t
        upper = (e.unsqueeze(-2) - e.unsqueeze(-1)).masked_fill(i >= j, float("-inf"))  # sum_{t=i}^{j-1} log b_t
        decay = lower.exp() + upper.exp()
        return (q @ k.transpose(-1, -2)) * self.scale * decay.to(q.dtype)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor | None = None) -> Tensor:
        log_a, log_b = F.logsigmoid(g.to(torch.promote_types(g.dtype, torch.float32))).unbind(-1)
        return quasiseparable_mix(q * self.scale, k, v, log_a, log_b, chunk=self.chunk_size)


MATRIX_MIXERS: dict[str, type[nn.Module]] = {
    "softmax": SoftmaxMatrix,
    "linear": LowRankMatrix,
    "toeplitz": ToeplitzMatrix,
    "cauchy": CauchyMatrix,
    "vandermonde": VandermondeMatrix,
    "quasiseparable": QuasiseparableMatrix,
}


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
        **matrix_kwargs: passed to the matrix class (``chunk_size``, ``c_min``, ``freq_scale``, ``sdpa``, and
            ``backend`` of cauchy / vandermonde).

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
        if dim % num_heads:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        if not data_dependent and (max_len is None or max_len < 1):
            raise ValueError(f"the non-data-dependent twin needs max_len >= 1 (its parameters' length), got {max_len}")
        H, D = num_heads, dim // num_heads
        self.dim, self.num_heads, self.head_dim = dim, H, D
        self.matrix_name, self.data_dependent, self.max_len = matrix, data_dependent, max_len
        if matrix == "cauchy":
            matrix_kwargs.setdefault("num_heads", H)
        self.matrix = MATRIX_MIXERS[matrix](D, **matrix_kwargs)
        G = self.matrix.num_gates
        if data_dependent:
            self.qkv = nn.Linear(dim, 3 * dim, bias=qkv_bias)
            # gates start near sigmoid(3) = 0.95 (a decay that reaches a few dozen tokens); the bias is a parameter
            # of its own so that model-wide Linear inits (timm's zero biases) keep it
            self.gate = nn.Linear(dim, H * G, bias=False) if G else None
            self.gate_bias = nn.Parameter(torch.full((H * G,), 3.0)) if G else None
        else:
            self.v = nn.Linear(dim, dim, bias=qkv_bias)
            self.q_param = nn.Parameter(torch.randn(1, H, max_len, D))  # (1, H, L_max, D)
            self.k_param = nn.Parameter(torch.randn(1, H, max_len, D))
            self.gate_param = nn.Parameter(torch.full((1, H, max_len, G), 3.0)) if G else None
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def extra_repr(self) -> str:
        return f"matrix={self.matrix_name!r}, data_dependent={self.data_dependent}, max_len={self.max_len}"

    def inputs(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor | None]:
        """``q, k, v`` ``(B, H, L, D)`` and the gates ``(B, H, L, G)`` (or None) of ``x`` ``(B, L, C)``."""
        B, L, C = x.shape
        H, D = self.num_heads, self.head_dim
        if self.data_dependent:
            q, k, v = self.qkv(x).view(B, L, 3, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, L, D) each
            g = None
            if self.gate is not None:
                g = (self.gate(x) + self.gate_bias).view(B, L, H, -1).transpose(1, 2)  # (B, H, L, G)
            return q, k, v, g
        if L > self.max_len:
            raise ValueError(f"sequence length L={L} exceeds max_len={self.max_len} of the non-data-dependent twin")
        v = self.v(x).view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        q = self.q_param[:, :, :L].expand(B, -1, -1, -1).to(v.dtype)
        k = self.k_param[:, :, :L].expand(B, -1, -1, -1).to(v.dtype)
        g = self.gate_param[:, :, :L].expand(B, -1, -1, -1) if self.gate_param is not None else None
        return q, k, v, g

    def _check(self, x: Tensor, attn_mask: Tensor | None) -> None:
        if not isinstance(x, Tensor) or x.dim() != 3 or x.shape[-1] != self.dim:
            got = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
            raise ValueError(f"x must be (B, L, {self.dim}), got {got}")
        if x.shape[1] < 1:
            raise ValueError("x must hold at least one token")
        if attn_mask is not None and self.matrix_name != "softmax":
            raise ValueError(f"attn_mask is supported by the softmax matrix only, not {self.matrix_name!r}: pass None")

    def _out(self, y: Tensor, B: int, L: int) -> Tensor:
        return self.proj_drop(self.proj(y.transpose(1, 2).reshape(B, L, self.dim)))  # (B, L, C)

    def __prepare_scriptable__(self) -> nn.Module:
        # torch.jit.script calls this before compiling: name the mixer instead of a TorchScript compiler error.
        raise RuntimeError(
            f"the {self.matrix_name!r} sequence mixer cannot be compiled by TorchScript "
            "(the matrix mixers use custom autograd Functions, chunked loops and untyped Python); "
            "use torch.fx, torch.compile or torch.export instead (timm: build the model outside set_scriptable(True))"
        )

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        self._check(x, attn_mask)
        B, L, _ = x.shape
        q, k, v, g = self.inputs(x)
        y = self.matrix(q, k, v, g, attn_mask=attn_mask) if attn_mask is not None else self.matrix(q, k, v, g)
        return self._out(y, B, L)

    def materialize(self, x: Tensor) -> Tensor:
        """The dense mixing matrix of ``x`` (tests only): ``(B, H, L, L)`` or ``(B, H, D, L, L)``."""
        q, k, _, g = self.inputs(x)
        return self.matrix.materialize(q, k, g)

    def forward_reference(self, x: Tensor) -> Tensor:
        """:meth:`forward` through the dense matrix (tests only)."""
        self._check(x, None)
        B, L, _ = x.shape
        q, k, v, g = self.inputs(x)
        return self._out(apply_matrix(self.matrix.materialize(q, k, g), v), B, L)
