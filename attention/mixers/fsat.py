"""FSAT and FAT: Fourier (sparse) attention over a pooled hidden-state cross.

Zhuang, Zhang and Tu, "Long-range Sequence Modeling with Predictable Sparse Attention", ACL 2022 (FSAT, FAT).

The math (paper section 3), for a sequence ``X = x_0 .. x_{L-1}`` of width C and two feature maps f1, f2::

    C0[k] = sum_{i + j = k} f1(x_i) * f2(x_j)                k = 0 .. 2L-2      (pooled cross, elementwise product)
          = IRFFT( RFFT(f1(X), n) * RFFT(f2(X), n) )[k]       n >= 2L-1          (a linear, zero-padded convolution)
    C[i]  = LayerNorm( C0[2i] + C0[2i+1] - f1(x_i) * f2(x_i) )                   (central-token symmetry fold)

Row i of C joins the antidiagonals 2i and 2i+1 of the ``L x L`` cross matrix ``f1(x_i) * f2(x_j)`` (``C0[2L-1]``
does not exist and counts as zero), minus the i-i term. Cost O(L C log L); the FFT runs in float32 even under
autocast (bf16 has 8 mantissa bits: a sum of L products would lose all of them).

* **FAT** (:class:`FourierAttention`): multi-head attention with queries from X and keys / values from C.
* **FSAT** (:class:`FourierSparseAttention`): for every key j and head h, a sigmoid head predicts M dominant query
  positions ``I_bar = sigmoid(C W_I + b) * L_max``; the edges ``j -> floor(I_bar)`` (joined, in training, by M
  uniformly random query positions) carry a confidence ``s = N(index | I_bar, sigma^2 = L_max)`` (the Gaussian
  density; a random edge is scored against the prediction it is paired with). Each query i attends over the edges
  pointing to it::

      a_e = softmax_{e -> i}( q_i . k_j(e) / sqrt(D) )        o_i = sum_{e -> i} a_e * s_e * v_j(e)

  computed as sparse products over the edge set (:func:`sparse_edge_attention`: scores by a sampled dense-dense
  product, outputs by a sparse-dense one, on ``torch.sparse`` CSR matrices; or by gather / scatter of ``(keys, E, D)``
  blocks, ``backend="gather"``), with ``scatter_reduce(amax)`` / ``index_add`` for the per-query softmax:
  O(L M D) time, O(L M + L D) memory, never an ``L x L`` matrix. The gradient reaching
  the confidences is clamped to (-inf, 0] (paper's gradient truncation, as :class:`TruncateGrad` does; the layer
  fuses it into the confidences' op); the index head learns only through them.
  Inference uses the predicted edges only and is deterministic.

The paper's ablation (its Table 3) switches, each a constructor keyword of :class:`FourierSparseAttention`:
``num_edges`` (FSAT-2 / -4 / -8), ``truncate_grad=False`` (FSAT-No Trunc.: the confidences' gradient passes
unclipped), ``edges="random"`` (FSAT-Only Ir: random query positions only, in training and in inference, each scored
against the prediction it is paired with, so the index head still learns through the confidences) or
``edges="predicted"`` (FSAT-Only Ip: never a random edge), and ``feature_map="separable", kernel_size=5``
(FSAT+DConv-5: depth-wise separable convolution feature maps).

TorchScript compiles FAT (its eager input checks sit behind ``torch.jit.is_scripting()``); FSAT's edge products and
gradient truncation are custom autograd Functions, so scripting FSAT raises an error naming it.

Choices the paper leaves open (documented deviations):

* **Queries that no edge reaches** get a zero attention output (so ``proj`` gives its bias only, and in a residual
  block the token passes through unchanged). Duplicate edges (a random index equal to a predicted one) are kept as
  separate edges: each enters the softmax and the sum once.
* **Sequences shorter than L_max**: ``I_bar`` is scaled by L_max as in the paper (sequences are padded to L_max
  there); predicted indices ``>= L`` point past the sequence and are dropped. Set ``max_len`` to the length you run.
* Feature maps: a two-layer MLP (width C, GELU) by default; ``feature_map="conv"`` is a depth-wise Conv1d along the
  sequence (the paper's Text variant); ``feature_map="separable"`` a depth-wise separable one (the depth-wise Conv1d,
  then a point-wise Linear across channels: the ablation's DConv).
* ``edges="random"`` evaluates on random edges too (there is no prediction to fall back on): its inference is
  stochastic, repeatable under a fixed ``torch.manual_seed``.
"""

from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ..backends import backend_names, resolve
from ..checks import check_heads, check_seq, checks_active, is_compiling, is_tracing
from ..chunking import chunk_budget, chunk_rows

__all__ = [
    "EDGE_BACKENDS",
    "EDGE_SETS",
    "FEATURE_MAPS",
    "ConvFeatureMap",
    "FourierAttention",
    "FourierCross",
    "FourierSparseAttention",
    "MlpFeatureMap",
    "SeparableConvFeatureMap",
    "TruncateGrad",
    "fold_cross",
    "folded_cross",
    "pooled_cross",
    "pooled_cross_reference",
    "sparse_edge_attention",
    "sparse_edge_attention_reference",
]


# --------------------------------------------------------------------------------------------------------------------
# Functional ops and their references
# --------------------------------------------------------------------------------------------------------------------


def pooled_cross(a: Tensor, b: Tensor) -> Tensor:
    """``C0[k] = sum_{i+j=k} a_i * b_j`` by a zero-padded real FFT along the sequence, in float32 (or float64).

    Args:
        a: ``(B, L, C)``, f1(X).
        b: ``(B, L, C)``, f2(X).

    Returns:
        ``(B, 2L-1, C)`` float32 (float64 for float64 inputs: the FFT never runs below float32, and float64 inputs keep
        float64 so that CPU and CUDA agree to float64 rounding; pocketfft and cuFFT round float32 differently).
    """
    if not torch.jit.is_scripting():  # eager validation (TorchScript skips the branch, its condition included)
        _check_feature_maps(a, b)
    L = a.shape[1]
    n = 1
    while n < 2 * L - 1:  # a power of two >= 2L-1: linear, not circular, convolution
        n *= 2
    acc = torch.promote_types(a.dtype, torch.float32)
    if torch.jit.is_scripting():  # TorchScript cannot enter torch.autocast with a runtime device type
        return _cross_fft(a.to(acc), b.to(acc), n)[:, : 2 * L - 1]
    with torch.autocast(device_type=a.device.type, enabled=False):
        return _cross_fft(a.to(acc), b.to(acc), n)[:, : 2 * L - 1]  # (B, 2L-1, C)


@torch.jit.unused
def _check_feature_maps(a: Tensor, b: Tensor) -> None:
    check_seq(a, "a")
    if a.shape != b.shape:
        raise ValueError(f"a and b must have the same shape (B, L, C), got {tuple(a.shape)} and {tuple(b.shape)}")


def _cross_fft(a: Tensor, b: Tensor, n: int) -> Tensor:
    """``IRFFT(RFFT(a, n) * RFFT(b, n))`` along the sequence (dim 1): the zero-padded linear convolution, ``(B, n, C)``.

    The transforms run along the last, contiguous dimension of ``(B, C, L)`` copies: faster than strided transforms
    along dim 1, and the layout whose output strides inductor predicts on every supported torch (torch 2.11
    mispredicts those of an RFFT along dim 1).
    """
    a, b = a.transpose(1, 2).contiguous(), b.transpose(1, 2).contiguous()  # (B, C, L)
    return torch.fft.irfft(torch.fft.rfft(a, n=n) * torch.fft.rfft(b, n=n), n=n).transpose(1, 2)


def pooled_cross_reference(a: Tensor, b: Tensor) -> Tensor:
    """O(L^2 C) reference of :func:`pooled_cross`: adds ``a_i * b_j`` into row ``i + j`` for every pair."""
    B, L, C = a.shape
    acc = torch.promote_types(a.dtype, torch.float32)
    out = a.new_zeros(B, 2 * L - 1, C, dtype=acc)
    for i in range(L):
        out[:, i : i + L] += a[:, i : i + 1].to(acc) * b.to(acc)  # row i + j for j = 0 .. L-1
    return out


def fold_cross(c0: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """Central-token-symmetry fold ``C[i] = C0[2i] + C0[2i+1] - a_i * b_i`` (before the LayerNorm).

    Args:
        c0: ``(B, 2L-1, C)`` pooled cross.
        a, b: ``(B, L, C)`` the two feature maps (for the i-i term).

    Returns:
        ``(B, L, C)`` in ``c0``'s dtype.
    """
    if not torch.jit.is_scripting():  # eager validation (TorchScript skips the branch, its condition included)
        B, L, C = a.shape
        if c0.shape != (B, 2 * L - 1, C):
            raise ValueError(f"c0 must be (B, 2L-1, C) = {(B, 2 * L - 1, C)}, got {tuple(c0.shape)}")
    even = c0[:, 0::2]  # (B, L, C): antidiagonals 0, 2, .., 2L-2
    odd = F.pad(c0[:, 1::2], (0, 0, 0, 1))  # (B, L, C): 1, 3, .., 2L-3, then a zero row
    return even + odd - a.to(c0.dtype) * b.to(c0.dtype)


def folded_cross(a: Tensor, b: Tensor) -> Tensor:
    """``fold_cross(pooled_cross(a, b), a, b)`` as one autograd op with a hand-written backward, in float32 (float64).

    The same values as the two-step form to float32 rounding, in fewer kernels: one transform of ``a`` and ``b``
    stacked, one product, one inverse transform and the fold read straight from it; the backward is one transform of
    the output gradient (each fold row's gradient feeds antidiagonals 2i and 2i+1), the two correlations with the saved
    spectra in one inverse transform, and the i-i terms. Autograd through the two-step form runs full-length complex
    transforms and a chain of pads, conjugates and scalings instead (``tools/bench_mixers.py`` times FSAT with it).

    A second backward (``create_graph=True``) differentiates the backward's plain ops. TorchScript, FX,
    ``torch.jit.trace``, ``torch.export`` and ``torch.func`` transforms run the two-step form, whose graph is plain
    aten ops; ``torch.compile`` runs this op.

    Args:
        a, b: ``(B, L, C)``, f1(X) and f2(X).

    Returns:
        ``(B, L, C)`` float32 (float64 for float64 inputs), before the LayerNorm.
    """
    if not torch.jit.is_scripting():  # TorchScript skips the branch, condition included
        if _two_step_only():
            return fold_cross(pooled_cross(a, b), a, b)
        _check_feature_maps(a, b)
        with torch.autocast(device_type=a.device.type, enabled=False):
            return _FoldedCross.apply(a, b)
    return fold_cross(pooled_cross(a, b), a, b)


def _two_step_only() -> bool:
    """Whether a tracer or a ``torch.func`` transform (which needs an autograd Function's ``setup_context`` form) sees
    the caller: :func:`folded_cross` then takes the two-step form."""
    if is_compiling():  # (dynamo traces through the op's forward and backward)
        return False
    return is_tracing() or torch._C._are_functorch_transforms_active()


class _FoldedCross(torch.autograd.Function):
    """``C[i] = C0[2i] + C0[2i+1] - a_i b_i`` with ``C0 = IRFFT(RFFT(a, n) RFFT(b, n))``, ``n >= 2L`` a power of two.

    ``n >= 2L`` (not only ``2L - 1``) puts the missing antidiagonal ``2L - 1`` inside the transform, where it is zero
    but for rounding, so the fold is two strided reads of the inverse transform. Backward, with ``g`` the gradient of
    C and ``g0[k] = g[k // 2]`` (k < 2L) that of C0: ``da_i = sum_j g0[i + j] b_j - g_i b_i``, a correlation:
    ``IRFFT(RFFT(g0, n) conj(RFFT(b, n)))[i]`` (no wrap-around: i + j < 2L <= n); the same for ``db`` with a.
    """

    @staticmethod
    def forward(ctx, a: Tensor, b: Tensor) -> Tensor:
        B, L, C = a.shape
        n = 2
        while n < 2 * L:  # the power of two >= 2L (a loop: guards only a range of a dynamic L under torch.compile)
            n *= 2
        acc = torch.promote_types(a.dtype, torch.float32)
        ab = torch.empty(2, B, C, L, device=a.device, dtype=acc)  # transforms along the last, contiguous dimension
        ab[0].copy_(a.transpose(1, 2))
        ab[1].copy_(b.transpose(1, 2))
        spec = torch.fft.rfft(ab, n=n)  # (2, B, C, n / 2 + 1)
        c0 = torch.fft.irfft(spec[0] * spec[1], n=n).transpose(1, 2)  # (B, n, C), strided
        even, odd = c0[:, 0 : 2 * L : 2], c0[:, 1 : 2 * L : 2]
        ctx.save_for_backward(a, b, spec)
        if torch.compiler.is_compiling():  # see backward
            return (even + odd - a.to(acc) * b.to(acc)).contiguous()
        out = torch.empty(B, L, C, device=a.device, dtype=acc)  # contiguous, as the LayerNorm after it reads it
        torch.add(even, odd, out=out)
        return out.addcmul_(a, b, value=-1)

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor, Tensor]:
        a, b, spec = ctx.saved_tensors
        B, L, C = a.shape
        n = 2 * (spec.shape[-1] - 1)
        g0 = g.transpose(1, 2).unsqueeze(-1).expand(B, C, L, 2).reshape(B, C, 2 * L)  # g0[k] = g[k // 2], k < 2L
        gspec = torch.fft.rfft(g0, n=n)
        compiling = torch.compiler.is_compiling()
        if torch.is_grad_enabled() or compiling:  # backward(create_graph=True), or inductor tracing it
            # Plain ops: a second backward differentiates them (through a and b, so the spectra are recomputed from
            # them: the saved ones have no history), and inductor fuses them (its tracing of out= can lose out's
            # strides, and the Linear layers before this op then cannot view their gradients).
            if not compiling:
                acc = torch.promote_types(a.dtype, torch.float32)
                spec = torch.fft.rfft(torch.stack([a, b]).transpose(2, 3).to(acc), n=n)
            corr = torch.fft.irfft(gspec * spec.flip(0).conj(), n=n)[..., :L].transpose(2, 3)  # (2, B, L, C)
            return (corr[0] - g * b).contiguous().to(a.dtype), (corr[1] - g * a).contiguous().to(b.dtype)
        prod = torch.empty_like(spec)
        torch.mul(gspec, spec[1].conj(), out=prod[0])  # correlate with b for da, with a for db
        torch.mul(gspec, spec[0].conj(), out=prod[1])
        corr = torch.fft.irfft(prod, n=n)[..., :L].transpose(2, 3)  # (2, B, L, C), strided
        da = torch.empty(B, L, C, device=a.device, dtype=a.dtype)  # contiguous, in one kernel each
        db = torch.empty(B, L, C, device=b.device, dtype=b.dtype)
        torch.addcmul(corr[0], g, b, value=-1, out=da)
        torch.addcmul(corr[1], g, a, value=-1, out=db)
        return da, db


EDGE_BACKENDS = tuple(backend_names("fsat_edges"))  # declared in attention.backends


def sparse_edge_attention(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, conf: Tensor, backend: str = "auto") -> Tensor:
    """Each query attends over the edges pointing to it: softmax over those edges, times the edge confidences.

    Key j of head h owns E edges ``j -> idx[b, h, j, e]`` (a query position; ``< 0`` marks an absent edge). For query
    i, ``o_i = sum_{e -> i} softmax_{e -> i}(q_i . k_j / sqrt(D)) * conf_e * v_j``; a query no edge reaches gets 0.
    Over a flat ``(B H L)`` axis the edges form a sparse ``(B H L) x (B H L)`` matrix with ``B H L E`` entries, and
    the two products are sparse ones: the scores are a sampled dense-dense product (SDDMM), the output a sparse-dense
    product (SpMM). O(L E D) time, O(L E + L D) memory, never an ``L x L`` matrix.

    Backends: ``"csr"`` runs both products on ``torch.sparse`` CSR matrices (``sampled_addmm`` and CSR @ dense, with
    the keys' rows and a destination-sorted copy for the transposed products), nothing of size ``(B H L, E, D)`` is
    formed; ``"gather"`` gathers ``(keys, E, D)`` blocks a chunk of keys at a time (``index_select``, ``index_add``);
    ``"triton"`` (CUDA, D <= 128) is one fused kernel per pass (:mod:`attention.kernels.fsat_triton`: edges grouped
    by query with one sort, online softmax, saved normalizer; float32 math, dq by atomic adds).
    ``"auto"``: csr on CPU (far faster there than gathering); on CUDA triton for float32 / bf16 inputs it supports,
    else gather (CUDA's ``index_add`` is fast; the csr path is not measured on a GPU). All are tested against the
    dense reference.

    Args:
        q, k, v: ``(B, H, L, D)``.
        idx: ``(B, H, L, E)`` int64 query positions in ``[0, L)``, or negative for no edge.
        conf: ``(B, H, L, E)`` edge confidences.
        backend: ``"auto"``, ``"csr"``, ``"gather"`` or ``"triton"``.

    Returns:
        ``(B, H, L, D)``.
    """
    B, H, L, D = q.shape
    E = idx.shape[-1]
    if idx.shape != (B, H, L, E) or conf.shape != idx.shape:
        raise ValueError(f"idx and conf must be (B, H, L, E) = {(B, H, L, E)}, got {tuple(idx.shape)}, {conf.shape}")
    if checks_active() and idx.numel() and int(idx.max()) >= L:  # reads a value back: FSAT's own edges skip it
        raise ValueError(f"idx must hold query positions < L = {L} (or < 0 for no edge), got max {int(idx.max())}")
    return _edge_attention(q, k, v, idx, conf, backend)


def _edge_attention(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, conf: Tensor, backend: str) -> Tensor:
    """:func:`sparse_edge_attention` on edges already known to be in range (FSAT's, by construction)."""
    B, H, L, D = q.shape
    E = idx.shape[-1]
    backend = resolve("fsat_edges", backend, q.device, {"D": D, "E": E}, q.dtype)  # attention.backends decides
    if backend == "triton":
        from ..kernels.fsat_triton import EdgeAttentionTriton

        ins = [t.float() if t.dtype == torch.float64 else t for t in (q, k, v)]  # the kernel computes in float32
        # no truncation here: the module truncates the confidences' gradient itself (in edges())
        return EdgeAttentionTriton.apply(*ins, idx, conf, False, None).to(v.dtype)
    acc = torch.promote_types(q.dtype, torch.float32)  # softmax in float32 (or float64) even for bf16 inputs
    N = B * H * L
    valid = (idx >= 0).reshape(N, E)
    base = torch.arange(B * H, device=q.device).view(B, H, 1, 1) * L
    flat = (base + idx.clamp_min(0)).reshape(-1)  # (N E,): the query row of every edge in the flat (B H L) axis
    q2, k2, v2 = q.reshape(N, D), k.reshape(N, D), v.reshape(N, D)  # row r = key r's (b, h, j)
    if backend == "csr":
        q2, k2, v2 = q2.to(acc), k2.to(acc), v2.to(acc)  # torch.sparse has no bf16 / fp16 CPU kernels
        Dot, Scatter, edge_args = _CsrEdgeDot, _CsrEdgeScatter, (_CsrEdges(flat, N, E),)
    else:
        chunk = chunk_rows(N, E * D * q.element_size(), chunk_budget("fsat_edges", q.device))  # (rows, E, D) blocks
        Dot, Scatter, edge_args = _EdgeDot, _EdgeScatter, (flat, chunk)
    scores = Dot.apply(q2, k2, *edge_args).to(acc) / math.sqrt(D)  # (N, E)
    scores = scores.masked_fill(~valid, float("-inf"))
    # Stable softmax over the edges of each query: subtract the per-query max (a constant: no gradient needed).
    mx = torch.full((N,), float("-inf"), device=q.device, dtype=acc).scatter_reduce(
        0, flat, scores.detach().reshape(-1), reduce="amax", include_self=True
    )
    mx = torch.where(torch.isfinite(mx), mx, torch.zeros_like(mx))
    ex = torch.exp(scores - mx.index_select(0, flat).view(N, E))  # 0 on absent edges
    denom = torch.zeros(N, device=q.device, dtype=acc).index_add(0, flat, ex.reshape(-1))
    w = ex / denom.index_select(0, flat).view(N, E).clamp_min(1e-30) * conf.reshape(N, E).to(acc)  # (N, E)
    return Scatter.apply(w.to(v2.dtype), v2, *edge_args).view(B, H, L, D).to(v.dtype)


class _CsrEdges:
    """The edge set as two CSR patterns over the flat ``(B H L)`` axis, built once per call.

    ``by_key``: row r = key r, its E entries at columns ``flat[r E : (r + 1) E]`` (the edges' own order, so entry
    values are the ``(N, E)`` edge tensors flattened). ``by_query``: row i = query i, its entries at the keys of the
    edges pointing to it (a stable sort of the edges by query). ``A_key @ X`` sums over each key's edges,
    ``A_query @ X`` over each query's edges.
    """

    def __init__(self, flat: Tensor, N: int, E: int) -> None:
        self.N, self.E, self.flat = N, E, flat
        self.key_crow = torch.arange(0, N * E + 1, E, device=flat.device)
        self.order = torch.argsort(flat, stable=True)  # edges sorted by query
        self.query_crow = torch.zeros(N + 1, dtype=torch.long, device=flat.device)
        self.query_crow[1:] = torch.bincount(flat, minlength=N).cumsum(0)
        self.query_col = torch.div(self.order, E, rounding_mode="floor")  # the key of every query-sorted edge

    def _csr(self, crow: Tensor, col: Tensor, values: Tensor) -> Tensor:
        with warnings.catch_warnings():  # torch warns once per process that CSR support is "beta"
            warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
            return torch.sparse_csr_tensor(crow, col, values, (self.N, self.N), check_invariants=False)

    def by_key(self, values: Tensor) -> Tensor:
        return self._csr(self.key_crow, self.flat, values.reshape(-1))

    def by_query(self, values: Tensor) -> Tensor:
        return self._csr(self.query_crow, self.query_col, values.reshape(-1).index_select(0, self.order))

    def sample(self, rows: Tensor, cols: Tensor) -> Tensor:
        """``(N, E)``: ``rows[r] . cols[flat[r E + e]]`` for every edge (SDDMM on the key pattern)."""
        pattern = self.by_key(rows.new_zeros(self.N * self.E))
        return torch.sparse.sampled_addmm(pattern, rows, cols.t(), beta=0.0).values().view(self.N, self.E)


class _CsrEdgeDot(torch.autograd.Function):
    """``s[r, e] = q[flat[r E + e]] . k[r]`` as an SDDMM; the gradients are two SpMMs."""

    @staticmethod
    def forward(ctx, q2: Tensor, k2: Tensor, edges: _CsrEdges) -> Tensor:
        ctx.save_for_backward(q2, k2)
        ctx.edges = edges
        with torch.autocast(device_type=q2.device.type, enabled=False):  # the sparse kernels are float32 / 64 only
            return edges.sample(k2, q2)

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:
        q2, k2 = ctx.saved_tensors
        edges, g = ctx.edges, g.to(q2.dtype).contiguous()
        gk = edges.by_key(g) @ q2  # gk[r] = sum_e g[r, e] q[flat[r E + e]]
        gq = edges.by_query(g) @ k2  # gq[i] = sum over edges into i of g * k[key]
        return gq, gk, None


class _CsrEdgeScatter(torch.autograd.Function):
    """``out[i] = sum_{edges r -> i} w[r, e] v[r]`` as an SpMM; the gradients are an SpMM and an SDDMM."""

    @staticmethod
    def forward(ctx, w: Tensor, v2: Tensor, edges: _CsrEdges) -> Tensor:
        ctx.save_for_backward(w, v2)
        ctx.edges = edges
        with torch.autocast(device_type=v2.device.type, enabled=False):
            return edges.by_query(w) @ v2

    @staticmethod
    def backward(ctx, gout: Tensor) -> tuple[Tensor | None, ...]:
        w, v2 = ctx.saved_tensors
        edges, gout = ctx.edges, gout.to(v2.dtype).contiguous()
        gv = edges.by_key(w) @ gout  # gv[r] = sum_e w[r, e] gout[flat[r E + e]]
        gw = edges.sample(v2, gout)  # gw[r, e] = v[r] . gout[flat[r E + e]]
        return gw, gv, None


class _EdgeDot(torch.autograd.Function):
    """``s[r, e] = q[flat[r E + e]] . k[r]``, gathering the queries of one chunk of key rows at a time (forward and
    backward), so no ``(N, E, D)`` tensor is kept."""

    @staticmethod
    def forward(ctx, q2: Tensor, k2: Tensor, flat: Tensor, chunk: int) -> Tensor:
        N, D = k2.shape
        E = flat.numel() // max(N, 1)
        out = q2.new_empty(N, E)
        for r0 in range(0, N, chunk):
            r1 = min(N, r0 + chunk)
            qe = q2.index_select(0, flat[r0 * E : r1 * E]).view(r1 - r0, E, D)
            out[r0:r1] = (qe @ k2[r0:r1].unsqueeze(-1)).squeeze(-1)
        ctx.save_for_backward(q2, k2, flat)
        ctx.chunk, ctx.E = chunk, E
        return out

    @staticmethod
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:
        q2, k2, flat = ctx.saved_tensors
        chunk, E = ctx.chunk, ctx.E
        N, D = k2.shape
        g = g.to(q2.dtype)
        gq, gk = torch.zeros_like(q2), torch.empty_like(k2)
        for r0 in range(0, N, chunk):
            r1 = min(N, r0 + chunk)
            fl = flat[r0 * E : r1 * E]
            qe = q2.index_select(0, fl).view(r1 - r0, E, D)
            gk[r0:r1] = (g[r0:r1].unsqueeze(1) @ qe).squeeze(1)
            gq.index_add_(0, fl, (g[r0:r1].unsqueeze(-1) * k2[r0:r1].unsqueeze(1)).reshape(-1, D))
        return gq, gk, None, None


class _EdgeScatter(torch.autograd.Function):
    """``out[flat[r E + e]] += w[r, e] v[r]`` (index_add), one chunk of key rows at a time (forward and backward)."""

    @staticmethod
    def forward(ctx, w: Tensor, v2: Tensor, flat: Tensor, chunk: int) -> Tensor:
        N, D = v2.shape
        E = w.shape[1]
        out = torch.zeros_like(v2)
        for r0 in range(0, N, chunk):
            r1 = min(N, r0 + chunk)
            # out of place: after an in-place index_add_ here, torch 2.11's compiled backward gets wrong gradients
            rows = (w[r0:r1].unsqueeze(-1) * v2[r0:r1].unsqueeze(1)).reshape(-1, D)
            out = out.index_add(0, flat[r0 * E : r1 * E], rows)
        ctx.save_for_backward(w, v2, flat)
        ctx.chunk = chunk
        return out

    @staticmethod
    def backward(ctx, gout: Tensor) -> tuple[Tensor | None, ...]:
        w, v2, flat = ctx.saved_tensors
        chunk = ctx.chunk
        N, D = v2.shape
        E = w.shape[1]
        gout = gout.to(v2.dtype)
        gw, gv = torch.empty_like(w), torch.empty_like(v2)
        for r0 in range(0, N, chunk):
            r1 = min(N, r0 + chunk)
            ge = gout.index_select(0, flat[r0 * E : r1 * E]).view(r1 - r0, E, D)  # output gradient at each edge
            gw[r0:r1] = (ge @ v2[r0:r1].unsqueeze(-1)).squeeze(-1)
            gv[r0:r1] = (w[r0:r1].unsqueeze(1) @ ge).squeeze(1)
        return gw, gv, None, None


def sparse_edge_attention_reference(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, conf: Tensor) -> Tensor:
    """Dense masked-attention reference of :func:`sparse_edge_attention` (builds ``(B, H, L, L)``; tests only).

    With ``n_ij`` the number of edges ``j -> i`` and ``S_ij`` the sum of their confidences, the softmax over edges
    is a softmax over keys with logits ``q_i . k_j / sqrt(D) + log n_ij``, and each edge's share is ``S_ij / n_ij``.
    """
    B, H, L, D = q.shape
    acc = torch.promote_types(q.dtype, torch.float32)
    valid = idx >= 0
    qi = idx.clamp_min(0)
    kj = torch.arange(L, device=q.device).view(1, 1, L, 1).expand_as(idx)
    count = torch.zeros(B, H, L, L, device=q.device, dtype=acc)  # (B, H, i, j)
    confs = torch.zeros(B, H, L, L, device=q.device, dtype=acc)
    b_i = torch.arange(B, device=q.device).view(B, 1, 1, 1).expand_as(idx)
    h_i = torch.arange(H, device=q.device).view(1, H, 1, 1).expand_as(idx)
    at = (b_i[valid], h_i[valid], qi[valid], kj[valid])
    count = count.index_put(at, torch.ones_like(conf[valid]).to(acc), accumulate=True)
    confs = confs.index_put(at, conf[valid].to(acc), accumulate=True)
    logits = (q.to(acc) @ k.to(acc).transpose(-1, -2)) / math.sqrt(D) + torch.log(count.clamp_min(1))
    logits = logits.masked_fill(count == 0, float("-inf"))
    reached = (count > 0).any(-1, keepdim=True)  # (B, H, L, 1)
    p = torch.softmax(logits.masked_fill(~reached, 0.0), dim=-1) * reached  # rows without edges: 0
    w = p * confs / count.clamp_min(1)
    return (w @ v.to(acc)).to(v.dtype)


class TruncateGrad(torch.autograd.Function):
    """Identity forward; backward clamps the incoming gradient to (-inf, 0] (FSAT's confidence gradient truncation)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.clamp(max=0.0)


class _GaussianConfidence(torch.autograd.Function):
    """``apply(idx, mean, var, truncate)``: the edge confidences ``N(idx | mean, var) = exp(-d^2 / 2 var) /
    sqrt(2 pi var)``, ``d = idx - mean``, in ``mean``'s dtype, with the gradient ``conf d / var`` reaching ``mean``
    (clamped to (-inf, 0] first where ``truncate``: :class:`TruncateGrad`'s truncation). In eager mode every
    elementwise op is a kernel: five forward and four backward here, against about twice that through autograd."""

    @staticmethod
    def forward(ctx, idx: Tensor, mean: Tensor, var: float, truncate: bool) -> Tensor:
        d = torch.sub(idx, mean)  # the integer positions promote to mean's dtype
        # (exp out of place: torch 2.11's compiled backward reads a saved tensor that an in-place op made as zeros)
        conf = torch.exp(torch.square(d).mul_(-0.5 / var).add_(-0.5 * math.log(2 * math.pi * var)))
        ctx.save_for_backward(d, conf)
        ctx.var, ctx.truncate = var, truncate
        return conf

    @staticmethod
    @once_differentiable
    def backward(ctx, g: Tensor) -> tuple[Tensor | None, ...]:
        d, conf = ctx.saved_tensors
        g = g.clamp(max=0.0) if ctx.truncate else g
        return None, torch.mul(g, conf).mul_(d).mul_(1.0 / ctx.var), None, None


# --------------------------------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------------------------------


class MlpFeatureMap(nn.Module):
    """Token-wise two-layer MLP ``Linear -> GELU -> Linear`` (width C): the default f1 / f2."""

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(dim, dim), nn.GELU(), nn.Linear(dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(x)))


class ConvFeatureMap(nn.Module):
    """Depth-wise Conv1d along the sequence (``kernel_size``, same padding): the paper's Text-variant f1 / f2."""

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"kernel_size must be odd (same-length output), got {kernel_size}")
        self.conv = nn.Conv1d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)

    def forward(self, x: Tensor) -> Tensor:
        return self.conv(x.transpose(1, 2)).transpose(1, 2)  # (B, L, C)


class SeparableConvFeatureMap(nn.Module):
    """Depth-wise separable Conv1d: the depth-wise conv of :class:`ConvFeatureMap` (``kernel_size``, same padding),
    then a point-wise (kernel 1) mix across channels, ``y_i = W (sum_t w_t * x_{i+t}) + b``: the ablation's DConv."""

    def __init__(self, dim: int, kernel_size: int = 3) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(f"kernel_size must be odd (same-length output), got {kernel_size}")
        self.depthwise = nn.Conv1d(dim, dim, kernel_size, padding=kernel_size // 2, groups=dim)
        self.pointwise = nn.Linear(dim, dim)  # a kernel-1 Conv1d, applied token-wise

    def forward(self, x: Tensor) -> Tensor:
        return self.pointwise(self.depthwise(x.transpose(1, 2)).transpose(1, 2))  # (B, L, C)


FEATURE_MAPS: dict[str, type[nn.Module]] = {
    "mlp": MlpFeatureMap,
    "conv": ConvFeatureMap,
    "separable": SeparableConvFeatureMap,
}

# Which edges each key gets (FSAT's ablation): predicted ones joined in training by random ones (the paper's FSAT),
# random ones only (in training and inference), or predicted ones only.
EDGE_SETS = ("predicted+random", "random", "predicted")


class FourierCross(nn.Module):
    """``C = LayerNorm(fold(pooled_cross(f1(X), f2(X))))``: the pooled hidden-state cross of FAT / FSAT.

    Shapes:
        x: ``(B, L, C)``; output: ``(B, L, C)``.
    """

    def __init__(self, dim: int, feature_map: str = "mlp", kernel_size: int = 3) -> None:
        super().__init__()
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"unknown feature_map {feature_map!r}; choose one of {sorted(FEATURE_MAPS)}")
        self.f1 = FEATURE_MAPS[feature_map](dim, kernel_size=kernel_size)
        self.f2 = FEATURE_MAPS[feature_map](dim, kernel_size=kernel_size)
        self.norm = nn.LayerNorm(dim)

    def forward(self, x: Tensor) -> Tensor:
        a, b = self.f1(x), self.f2(x)  # (B, L, C)
        c = folded_cross(a, b)  # (B, L, C) float32
        return self.norm(c.to(a.dtype))  # a's dtype: bf16 under autocast (LayerNorm then runs in float32)


def _check_input(x: Tensor, dim: int, max_len: int | None, attn_mask: Tensor | None, supports_mask: bool) -> None:
    check_seq(x, "x", channels=dim, max_len=max_len)
    if attn_mask is not None and not supports_mask:
        raise ValueError("FourierSparseAttention takes no attn_mask (its edges are predicted): pass attn_mask=None")


class FourierAttention(nn.Module):
    """FAT: multi-head attention with queries from X and keys / values from the pooled cross C.

    Args:
        dim: width C.
        num_heads: heads H (C divisible by H).
        feature_map: ``"mlp"``, ``"conv"`` or ``"separable"`` (see :data:`FEATURE_MAPS`).
        kernel_size: kernel of the conv feature maps (odd).
        qkv_bias: bias of the q / kv projections.
        attn_drop, proj_drop: dropout on the attention weights / the output.

    Shapes:
        x: ``(B, L, C)``; attn_mask: anything ``scaled_dot_product_attention`` broadcasts to ``(B, H, L, L)``;
        output: ``(B, L, C)``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        feature_map: str = "mlp",
        qkv_bias: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        kernel_size: int = 3,
    ) -> None:
        super().__init__()
        check_heads(dim, num_heads)
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.cross = FourierCross(dim, feature_map, kernel_size)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        if not torch.jit.is_scripting():  # eager validation (TorchScript skips the branch, its condition included)
            _check_input(x, self.dim, None, attn_mask, supports_mask=True)
        B, L, C = x.shape
        H, D = self.num_heads, self.head_dim
        c = self.cross(x)  # (B, L, C)
        q = self.q(x).view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        k, v = self.kv(c).view(B, L, 2, H, D).permute(2, 0, 3, 1, 4).unbind(0)  # (B, H, L, D) each
        p = self.attn_drop if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=p)  # (B, H, L, D)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, L, C)))


class FourierSparseAttention(nn.Module):
    """FSAT: predictable sparse attention over edges predicted from the pooled cross (see the module docstring).

    Args:
        dim: width C.
        num_heads: heads H.
        max_len: L_max; scales the predicted indices and the Gaussian's variance; longer inputs are errors.
        num_edges: M, predicted query positions per key and head.
        num_random: random query positions per key and head (default: M; 0 for none, only with
            ``edges="predicted+random"``); added in training, or the whole edge set with ``edges="random"``.
        feature_map: ``"mlp"``, ``"conv"`` or ``"separable"``.
        qkv_bias: bias of the q / kv projections.
        proj_drop: dropout on the output.
        kernel_size: kernel of the conv feature maps (odd).
        edge_backend: ``"auto"``, ``"csr"``, ``"gather"`` or ``"triton"`` (see :func:`sparse_edge_attention`).
        edges: the edge set, one of :data:`EDGE_SETS`: ``"predicted+random"`` (the paper's FSAT), ``"random"``
            (FSAT-Only Ir) or ``"predicted"`` (FSAT-Only Ip).
        truncate_grad: clamp the gradient reaching the confidences to (-inf, 0] (the paper's truncation; False:
            FSAT-No Trunc.).

    Shapes:
        x: ``(B, L, C)`` with L <= max_len; output: ``(B, L, C)``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        max_len: int = 1024,
        num_edges: int = 4,
        num_random: int | None = None,
        feature_map: str = "mlp",
        qkv_bias: bool = False,
        proj_drop: float = 0.0,
        kernel_size: int = 3,
        edge_backend: str = "auto",
        edges: str = "predicted+random",
        truncate_grad: bool = True,
    ) -> None:
        super().__init__()
        check_heads(dim, num_heads)
        if edge_backend not in ("auto", *EDGE_BACKENDS):
            raise ValueError(f"unknown edge_backend {edge_backend!r}; choose one of {('auto', *EDGE_BACKENDS)}")
        if edges not in EDGE_SETS:
            raise ValueError(f"unknown edges {edges!r}; choose one of {list(EDGE_SETS)}")
        self.edge_backend = edge_backend
        if max_len < 1 or num_edges < 1:
            raise ValueError(f"max_len and num_edges must be >= 1, got {max_len} and {num_edges}")
        self.dim, self.num_heads, self.head_dim = dim, num_heads, dim // num_heads
        self.max_len, self.num_edges = max_len, num_edges
        if edges == "predicted":
            if num_random:
                raise ValueError(f'edges="predicted" has no random edges: drop num_random={num_random}')
            num_random = 0
        self.num_random = num_edges if num_random is None else num_random
        if edges == "random" and self.num_random < 1:
            raise ValueError(f'edges="random" needs num_random >= 1 (or None: num_edges), got {num_random}')
        self.edge_set, self.truncate_grad = edges, truncate_grad
        self.cross = FourierCross(dim, feature_map, kernel_size)
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.index_head = nn.Linear(dim, num_heads * num_edges)  # W_I, b
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def extra_repr(self) -> str:
        return (
            f"max_len={self.max_len}, num_edges={self.num_edges}, num_random={self.num_random}, "
            f"edges={self.edge_set!r}, truncate_grad={self.truncate_grad}"
        )

    def edges(self, c: Tensor) -> tuple[Tensor, Tensor]:
        """Edges of every key: ``(idx, conf)``, each ``(B, H, L, E)``: E = M predicted, plus ``num_random`` random ones
        in training (``edges="predicted+random"``); M predicted (``"predicted"``); ``num_random`` random ones
        (``"random"``)."""
        B, L, _ = c.shape
        H, M, L_max = self.num_heads, self.num_edges, self.max_len
        acc = torch.promote_types(c.dtype, torch.float32)  # indices in float32: bf16 cannot count to L_max
        with torch.autocast(device_type=c.device.type, enabled=False):
            w, b = self.index_head.weight.to(acc), self.index_head.bias.to(acc)
            i_bar = torch.sigmoid(F.linear(c.to(acc), w, b)) * L_max  # (B, L, H M)
        i_bar = i_bar.view(B, L, H, M).transpose(1, 2)  # (B, H, L, M) predicted query positions of key j
        idx = i_bar.detach().clamp_max(L_max - 1).long()  # floor: i_bar >= 0
        mean = i_bar
        random_only = self.edge_set == "random"
        if random_only or (self.training and self.num_random > 0):
            rand = torch.randint(0, L, (B, H, L, self.num_random), device=c.device)
            # random edge r is scored by prediction r mod M (no index op in the default num_random == M)
            paired = i_bar if self.num_random == M else i_bar[..., torch.arange(self.num_random, device=c.device) % M]
            if random_only:
                idx, mean = rand, paired  # (B, H, L, num_random)
            else:
                idx, mean = torch.cat([idx, rand], -1), torch.cat([i_bar, paired], -1)  # (B, H, L, E)
        conf = _GaussianConfidence.apply(idx, mean, float(L_max), self.truncate_grad)
        if L < L_max:  # (at L = L_max every index is in range)
            idx = idx.masked_fill(idx >= L, -1)  # past the sequence: dropped
        return idx, conf

    def __prepare_scriptable__(self) -> nn.Module:
        # torch.jit.script calls this before compiling: name the mixer instead of a TorchScript compiler error.
        raise RuntimeError(
            "the FSAT sequence mixer cannot be compiled by TorchScript "
            "(its sparse edge products are custom autograd Functions); "
            "use torch.fx, torch.compile or torch.export instead (timm: build the model outside set_scriptable(True))"
        )

    def forward(self, x: Tensor, attn_mask: Tensor | None = None) -> Tensor:
        _check_input(x, self.dim, self.max_len, attn_mask, supports_mask=False)
        B, L, C = x.shape
        H, D = self.num_heads, self.head_dim
        c = self.cross(x)  # (B, L, C)
        q = self.q(x).view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
        k, v = (t.transpose(1, 2) for t in self.kv(c).view(B, L, 2, H, D).unbind(2))  # (B, H, L, D) each
        idx, conf = self.edges(c)
        out = _edge_attention(q, k, v, idx, conf, self.edge_backend)  # (B, H, L, D); edges() keeps idx < L
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, L, C).to(x.dtype)))
