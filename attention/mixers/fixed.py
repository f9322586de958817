"""The matrix mixer framework's two mixers with no data dependence at all: Dense (a free matrix) and DFT (FNet).

Hwang, Lahoti, Dao, Gu, "Hydra: Bidirectional State Space Models Through Generalized Matrix Mixers",
arXiv:2407.09941 (Dense and DFT rows of its matrix-mixer ablation; reference code: goombalab/hydra
``hydra/modules/matrix_mixers/dense.py``); Lee-Thorp, Ainslie, Eckstein, Ontanon, "FNet: Mixing Tokens with Fourier
Transforms", NAACL 2022, arXiv:2105.03824 (the DFT mixer).

* **Dense** (:class:`DenseMixer`): per head a learned ``L_max x L_max`` matrix, ``y_h = (W_h[:L, :L] / sqrt(L_max))
  v_h``, with ``v = x W_v`` and an output projection as in every :class:`~attention.mixers.MatrixMixer`. Like the
  reference (``M`` Xavier-normal, times ``std = 1 / sqrt(max_seq_len)``); the reference acts on the block's hidden
  states directly and adds the identity, ours projects values and leaves the skip to the block's residual. The
  matrix is full (bidirectional, as every mixer here); a sequence shorter than ``L_max`` uses its top-left block.
* **DFT** (:class:`FourierMixer`): FNet's token mixing, the real part of the two-dimensional discrete Fourier
  transform over the sequence and hidden dimensions, ``y = Re(F_L x F_C)``, no parameters. FNet uses the
  unnormalized DFT inside post-norm blocks; the blocks here are pre-norm (the mixer's output is added to the residual
  stream unnormalized), so ours is the orthonormal DFT (``norm="ortho"``, a factor ``1 / sqrt(L C)``), which keeps
  the output's scale at the input's at every length. ``num_heads`` and ``qkv_bias`` are accepted for the shared
  mixer surface and ignored.

Both take no ``attn_mask`` (as the structured mixers but softmax) and script with TorchScript.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from ..checks import check_heads, check_seq

__all__ = ["DenseMixer", "FourierMixer"]


class DenseMixer(nn.Module):
    """Multi-head mixer, a free learned ``L_max x L_max`` matrix per head: ``proj([W_h[:L, :L] v_h / sqrt(L_max)])``.

    Args:
        dim: width C.
        num_heads: heads H (C divisible by H).
        max_len: L_max, the longest sequence (the matrix's size).
        qkv_bias: bias of the value projection.
        proj_drop: dropout on the output.

    Shapes:
        x: ``(B, L, C)`` with L <= max_len; output: ``(B, L, C)``.
    """

    def __init__(
        self, dim: int, num_heads: int = 8, max_len: int | None = None, qkv_bias: bool = False, proj_drop: float = 0.0
    ) -> None:
        super().__init__()
        check_heads(dim, num_heads)
        if max_len is None or max_len < 1:
            raise ValueError(f"the dense mixer needs max_len >= 1 (its matrix's size), got {max_len}")
        self.dim, self.num_heads, self.head_dim, self.max_len = dim, num_heads, dim // num_heads, max_len
        self.scale = max_len**-0.5  # the reference's std_dev
        self.matrix = nn.Parameter(torch.empty(num_heads, max_len, max_len))  # (H, L_max, L_max)
        nn.init.xavier_normal_(self.matrix)
        self.v = nn.Linear(dim, dim, bias=qkv_bias)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def extra_repr(self) -> str:
        return f"max_len={self.max_len}"

    def materialize(self, x: Tensor) -> Tensor:
        """The mixing matrix ``(H, L, L)`` for ``x``'s length (the same for every input of that length)."""
        L = x.shape[1]
        return self.matrix[:, :L, :L] * self.scale

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        if not torch.jit.is_scripting():  # eager validation (TorchScript skips the branch, its condition included)
            check_seq(x, "x", channels=self.dim, max_len=self.max_len)
        if attn_mask is not None:
            raise ValueError("attn_mask is supported by the softmax matrix only, not 'dense': pass None")
        B, L, C = x.shape
        H, D = self.num_heads, self.head_dim
        v = self.v(x).view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        y = torch.matmul(self.materialize(x).to(v.dtype), v)  # (H, L, L) @ (B, H, L, D) -> (B, H, L, D)
        return self.proj_drop(self.proj(y.transpose(1, 2).reshape(B, L, C)))


class FourierMixer(nn.Module):
    """FNet's parameter-free token mixing: ``Re(DFT_L(DFT_C(x)))``, orthonormal (see the module docstring).

    Args:
        dim: width C.
        num_heads: ignored (the shared mixer surface).
        qkv_bias: ignored (no projections).

    Shapes:
        x: ``(B, L, C)``; output: ``(B, L, C)`` in x's dtype (the FFT runs in float32 or float64).
    """

    def __init__(self, dim: int, num_heads: int = 8, qkv_bias: bool = False) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        if not torch.jit.is_scripting():  # eager validation (TorchScript skips the branch, its condition included)
            check_seq(x, "x", channels=self.dim)
        if attn_mask is not None:
            raise ValueError("attn_mask is supported by the softmax matrix only, not 'dft': pass None")
        acc = torch.promote_types(x.dtype, torch.float32)  # bf16 has no FFT kernels on CPU, and too few bits for L C
        return torch.real(torch.fft.fftn(x.to(acc), dim=[1, 2], norm="ortho")).to(x.dtype)

    @staticmethod
    def dft_matrix(n: int, dtype: torch.dtype = torch.complex128) -> Tensor:
        """The orthonormal ``n x n`` DFT matrix ``F[j, k] = exp(-2 pi i j k / n) / sqrt(n)`` (tests' reference)."""
        j = torch.arange(n, dtype=torch.float64)
        return (torch.exp(-2j * math.pi * torch.outer(j, j) / n) / math.sqrt(n)).to(dtype)
