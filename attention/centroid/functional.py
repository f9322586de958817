"""Centroid attention: attention from M centroids to N inputs, the layer that lets a network shorten its sequence.

Wu et al., "Centroid Transformers: Learning to Abstract with Attention", arXiv:2102.08606.

Inputs ``x_1..x_N``, centroids ``u_1..u_M`` (M <= N). Unrolling T gradient steps of a soft k-means objective under a
learned similarity gives the update (paper eq. 4-6, in its multi-head, pre-norm transformer form)::

    u^0     = I(x)                                                        # an init: FPS, random, mean pool, ...
    u^{t+1} = u^t + W_o [ sum_i softmax_i( q_h(u^t) . k_h(x_i) / sqrt(D) ) v_h(x_i) ]_h      t = 0 .. T-1

followed by an MLP with a residual, as in a transformer block. Self-attention is the special case M = N,
``u^0 = x``, T = 1. With ``num_neighbors=K`` each centroid attends only to its K nearest inputs in feature space,
cost O(M K D) and memory O(M K) instead of O(M N): the ``(B, H, M, N)`` score matrix is never built, and the
neighbours' keys and values are gathered one chunk of centroids at a time (in the forward pass and again in the
backward pass), so the KNN path's memory is O(M K H) plus a fixed chunk. The KNN path has a second form,
``backend="masked"`` (:func:`masked_knn_attention`): the dense products under a (B, M, N) neighbour mask, O(M N D)
work in matrix products instead of O(M K D) in gathers and scatters, which is faster where N / K is small.

Two normalizations of the attention weights:

* ``normalize="inputs"`` (default): softmax over the inputs of each centroid, i.e. ordinary attention.
* ``normalize="centroids"``: the soft k-means form, where each input's weights are a softmax over the centroids
  (its soft assignment, paper eq. 3); each centroid's row is then divided by its total mass, so the update is the
  assignment-weighted mean of the values (the k-means step with step size 1 / mass). With KNN the softmax runs over
  the centroids that selected the input: an input picked by a single centroid gives it weight 1 whatever its score.

Deviations from the paper: the same projections are shared by all T steps (the unrolled steps descend one
objective); KNN neighbours are recomputed at every step from the current centroids (the paper leaves it open).

Cost accounting: with K neighbours, the keys and values are projected once per input and then gathered per
(centroid, neighbour) edge. Gathering the inputs first and projecting per edge computes the same function with K times
the projection MACs; ``tools/model_stats.py`` swaps :class:`attention.CentroidAttention` for such a per-edge module
to set our point model next to the paper's GMACs (tested equal to the default path). The layer's own forward has no
such switch.

Tracing: :func:`centroid_attention` validates its inputs and dispatches; :func:`dense_centroid_attention` (the path
of every vision model) is plain tensor code that FX, TorchScript, dynamo, ``torch.export`` and ONNX follow.
:func:`knn_centroid_attention` runs two custom autograd Functions (chunked gather products) that TorchScript cannot
compile; it is registered as an FX leaf (``torch.fx.wrap`` and timm's ``register_notrace_function``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.utils import flop_counter
from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

from ..backends import resolve
from ..checks import checks_active
from ..chunking import chunk_budget, chunk_rows
from ..points import gather

__all__ = [
    "NORMALIZATIONS",
    "centroid_attention",
    "check_neighbor_idx",
    "dense_centroid_attention",
    "edge_attention",
    "knn_centroid_attention",
    "masked_knn_attention",
]

NORMALIZATIONS = ("inputs", "centroids")


# --------------------------------------------------------------------------------------------------------------------
# Functional reference op
# --------------------------------------------------------------------------------------------------------------------


def _sparse_softmax_over_centroids(scores: Tensor, idx: Tensor, num_inputs: int, valid: Tensor | None) -> Tensor:
    """Softmax of KNN scores over the centroids that picked the same input (each input's soft assignment).

    Args:
        scores: ``(B, H, M, K)`` scores of centroid m with its k-th neighbour ``idx[b, m, k]``.
        idx: ``(B, M, K)`` neighbour indices into N.
        num_inputs: N.
        valid: ``(B, M, K)`` bool, False for padded neighbours (weight 0), or None.

    Returns:
        ``(B, H, M, K)`` weights; for every input j the weights of all (m, k) with ``idx[b, m, k] = j`` sum to 1.
    """
    B, H, M, K = scores.shape
    if valid is not None:
        scores = scores.masked_fill(~valid[:, None], -math.inf)
    flat = scores.reshape(B, H, M * K)
    j = idx.reshape(B, 1, M * K).expand(B, H, M * K)
    # Per-input max for stability; a stabilizer only, so no gradient flows through it.
    peak = flat.new_full((B, H, num_inputs), -math.inf).scatter_reduce(2, j, flat.detach(), "amax")
    e = torch.exp(flat - peak.gather(2, j).nan_to_num(neginf=0.0))  # masked entries: exp(-inf) = 0
    denom = torch.zeros_like(peak).scatter_add(2, j, e)
    return (e / denom.gather(2, j).clamp_min(torch.finfo(e.dtype).tiny)).view(B, H, M, K)


def check_neighbor_idx(idx: Tensor, name: str, B: int, M: int, N: int, device: torch.device) -> None:
    """``idx`` must be an integer ``(B, M, K)`` tensor on ``device`` with values in [0, N)."""
    if not isinstance(idx, Tensor) or idx.dim() != 3 or idx.shape[:2] != (B, M):
        shape = tuple(idx.shape) if isinstance(idx, Tensor) else type(idx).__name__
        raise ValueError(f"{name} must be a (B, M, K) = ({B}, {M}, K) index tensor, got {shape}")
    if idx.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold int64 (or int32) indices, got {idx.dtype}")
    if idx.device != device:
        raise ValueError(f"{name} is on {idx.device} but the inputs are on {device}")
    if idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= N):
        raise ValueError(f"{name} must index the N={N} inputs, got values in [{int(idx.min())}, {int(idx.max())}]")


def centroid_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor | None = None,
    *,
    mask: Tensor | None = None,
    normalize: str = "inputs",
    dropout_p: float = 0.0,
    eps: float = 1e-6,
    chunk_bytes: int | None = None,
    reference: bool = False,
    backend: str = "auto",
) -> Tensor:
    """Multi-head attention from centroid queries to inputs, dense or restricted to each centroid's neighbours.

    The KNN path (``idx`` given) gathers the neighbours' keys and values one chunk of centroids at a time, in the
    forward and again in the backward pass, so its memory is O(B M K H) plus one chunk; ``reference=True`` runs the
    plain version that gathers all of them at once and lets autograd keep them (the ground truth of the tests).

    Args:
        q: ``(B, H, M, D)`` centroid queries.
        k: ``(B, H, N, D)`` input keys.
        v: ``(B, H, N, D)`` input values.
        idx: ``(B, M, K)`` indices of the inputs each centroid attends to, or None for all N (dense).
        mask: ``(B, N)`` bool, True for real inputs; padded inputs get zero weight.
        normalize: ``"inputs"`` (softmax over inputs) or ``"centroids"`` (soft k-means assignment, see module doc).
        dropout_p: dropout on the attention weights (pass 0 in eval).
        eps: keeps the row normalization of ``normalize="centroids"`` finite for a centroid with no mass.
        chunk_bytes: memory budget of one chunk of gathered keys or values (default:
            ``attention.chunking.chunk_budget("knn_attention", device)``, 16 MiB on CPU, 256 MiB on CUDA).
        reference: use the plain gather-everything KNN path.
        backend: the KNN path's form (``idx`` given): ``"gather"`` (chunked gathers, memory O(B M K H) plus a chunk),
            ``"masked"`` (:func:`masked_knn_attention`, dense matrix products under the neighbour mask) or ``"auto"``
            (``"gather"``: a caller's ``idx`` may repeat a neighbour, which the masked form counts once; the layer,
            whose own search never repeats one, takes ``"masked"`` on CUDA where N / K is small: op
            ``"knn_attention"`` of :func:`attention.backends.resolve`).

    Returns:
        ``(B, H, M, D)`` attended values (before the output projection and skip).
    """
    if normalize not in NORMALIZATIONS:
        raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
    if q.dim() != 4 or k.dim() != 4 or v.shape != k.shape or q.shape[::3] != k.shape[::3] or q.shape[1] != k.shape[1]:
        raise ValueError(
            f"q must be (B, H, M, D) and k, v (B, H, N, D) with the same B, H, D, got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}"
        )
    B, H, M, D = q.shape
    N = k.shape[2]
    if checks_active():
        if idx is not None:
            check_neighbor_idx(idx, "idx", B, M, N, q.device)
        if mask is not None and (mask.shape != (B, N) or mask.dtype != torch.bool):
            raise ValueError(f"mask must be a bool tensor of shape ({B}, {N}), got {mask.dtype} {tuple(mask.shape)}")
    if idx is None:
        return dense_centroid_attention(q, k, v, mask, normalize, dropout_p, eps)
    if reference:
        K = idx.shape[-1]
        # Gather keys and values of each centroid's neighbours, (B, M, K, H, D) each, and let autograd keep them.
        kn = gather(k.transpose(1, 2).reshape(B, N, H * D), idx).view(B, M, K, H, D)
        vn = gather(v.transpose(1, 2).reshape(B, N, H * D), idx).view(B, M, K, H, D)
        return edge_attention(q, kn, vn, idx, N, mask=mask, normalize=normalize, dropout_p=dropout_p, eps=eps)
    # "auto" is "gather" here: the caller's idx may repeat an index (attention.backends, "knn_attention")
    shape = {"N": N, "K": idx.shape[-1], "distinct": False, "normalize": normalize}
    if resolve("knn_attention", backend, q.device, shape) == "masked":
        return masked_knn_attention(q, k, v, idx, mask, normalize, dropout_p, eps)
    return knn_centroid_attention(q, k, v, idx, mask, normalize, dropout_p, eps, chunk_bytes)


def dense_centroid_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    mask: Tensor | None = None,
    normalize: str = "inputs",
    dropout_p: float = 0.0,
    eps: float = 1e-6,
) -> Tensor:
    """The dense path of :func:`centroid_attention` without validation: q ``(B, H, M, D)``, k and v
    ``(B, H, N, D)``, mask ``(B, N)`` bool or None; returns ``(B, H, M, D)``. Plain tensor code (traceable)."""
    return _attend(q, k, v, None if mask is None else mask[:, None, None, :], normalize, dropout_p, eps)


def masked_knn_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    mask: Tensor | None = None,
    normalize: str = "inputs",
    dropout_p: float = 0.0,
    eps: float = 1e-6,
) -> Tensor:
    """The KNN path as dense attention under a neighbour mask (``backend="masked"`` of :func:`centroid_attention`).

    ``idx`` ``(B, M, K)`` is scattered into a ``(B, M, N)`` bool mask of each centroid's neighbours (and of real
    inputs, with ``mask``), and the dense products run under it: ``scaled_dot_product_attention`` with that mask for
    ``normalize="inputs"``, the masked softmax over centroids for ``"centroids"``. The weights equal the gather path's
    when each row of ``idx`` holds distinct indices, as the KNN searches return (a repeated index counts once here,
    twice there). Work O(B H M N D) in matrix products instead of O(B H M K D) in gathers and scatters; memory the
    ``(B, M, N)`` mask plus what the attention keeps (``"centroids"``, and SDPA's math kernel on CPU, build the
    ``(B, H, M, N)`` scores). It pays where N / K is small: on one CPU thread, forward + backward at B=8, H=4, D=16,
    M=512, N=1024, K=24 took 55 ms against 122 ms for the gather path. Plain tensor code (traceable).
    """
    # (B, M, N) False, built from idx's own shape (sizes stay symbolic under FX), then True at the neighbours
    edges = torch.zeros_like(idx[:, :, :1], dtype=torch.bool).expand(-1, -1, k.shape[2]).clone().scatter_(2, idx, True)
    if mask is not None:
        edges = edges & mask[:, None, :]
    return _attend(q, k, v, edges[:, None], normalize, dropout_p, eps)


def _attend(
    q: Tensor, k: Tensor, v: Tensor, allowed: Tensor | None, normalize: str, dropout_p: float, eps: float
) -> Tensor:
    """Dense attention of q over k, v where ``allowed`` (bool, broadcast to ``(B, H, M, N)``; None = all) is True."""
    if normalize == "inputs":
        return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed, dropout_p=dropout_p)
    scores = (q @ k.transpose(-2, -1)) * q.shape[-1] ** -0.5  # (B, H, M, N)
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    attn = scores.softmax(dim=-2).nan_to_num(0.0)  # over centroids; an input no centroid may see has an all -inf column
    attn = attn / (attn.sum(-1, keepdim=True) + eps)
    attn = F.dropout(attn, dropout_p, training=dropout_p > 0)
    return attn @ v


def knn_centroid_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    mask: Tensor | None = None,
    normalize: str = "inputs",
    dropout_p: float = 0.0,
    eps: float = 1e-6,
    chunk_bytes: int | None = None,
) -> Tensor:
    """The chunked KNN path of :func:`centroid_attention` without validation: q ``(B, H, M, D)``, k and v
    ``(B, H, N, D)``, idx ``(B, M, K)``; returns ``(B, H, M, D)``. An FX leaf (custom autograd Functions)."""
    B, H, M, D = q.shape
    N, K = k.shape[2], idx.shape[-1]
    budget = chunk_budget("knn_attention", q.device) if chunk_bytes is None else chunk_bytes
    rows = chunk_rows(B * M, K * H * D * q.element_size(), budget)
    # The Functions work on rows of (batch, point) pairs: (B * M) query rows, (B * N) key / value rows, and indices
    # into the flat key rows. A chunk is then a contiguous slice of rows (no copy of a strided slice of q, idx or
    # the output per chunk), and the gathered (rows, K, H, D) block is reduced in place. These reshapes are views
    # for the layer's layout, where q, k, v are transposed views of (B, M or N, H, D) projections.
    flat = _flat_rows(idx, N).reshape(B * M, K)
    qf = q.transpose(1, 2).reshape(B * M, H, D)
    kf = k.transpose(1, 2).reshape(B * N, H, D)
    vf = v.transpose(1, 2).reshape(B * N, H, D)
    scores = _GatherDot.apply(qf, kf, flat, rows).view(B, M, K, H).permute(0, 3, 1, 2) * D**-0.5  # (B, H, M, K)
    attn = _knn_weights(scores, idx, N, mask, normalize, dropout_p, eps)  # (B, H, M, K)
    out = _GatherWeightedSum.apply(attn.permute(0, 2, 3, 1).reshape(B * M, K, H), vf, flat, rows)  # (B * M, H, D)
    return out.view(B, M, H, D).transpose(1, 2)


def _knn_weights(
    scores: Tensor, idx: Tensor, N: int, mask: Tensor | None, normalize: str, dropout_p: float, eps: float
) -> Tensor:
    """Attention weights ``(B, H, M, K)`` from the scaled scores of each centroid's K neighbours."""
    valid = None if mask is None else gather(mask, idx)  # (B, M, K)
    if normalize == "inputs":
        if valid is not None:
            scores = scores.masked_fill(~valid[:, None], -math.inf)
        attn = scores.softmax(dim=-1)
    else:
        attn = _sparse_softmax_over_centroids(scores, idx, N, valid)
        attn = attn / (attn.sum(-1, keepdim=True) + eps)
    return F.dropout(attn, dropout_p, training=dropout_p > 0)


def edge_attention(
    q: Tensor,
    kn: Tensor,
    vn: Tensor,
    idx: Tensor,
    N: int,
    *,
    mask: Tensor | None,
    normalize: str,
    dropout_p: float,
    eps: float,
) -> Tensor:
    """KNN attention over keys and values given per edge: q ``(B, H, M, D)``, kn and vn ``(B, M, K, H, D)``, idx
    ``(B, M, K)`` into the N inputs; returns ``(B, H, M, D)``. The plain reference of the chunked KNN path."""
    scores = torch.einsum("bhmd,bmkhd->bhmk", q, kn) * q.shape[-1] ** -0.5  # (B, H, M, K)
    attn = _knn_weights(scores, idx, N, mask, normalize, dropout_p, eps)
    return torch.einsum("bhmk,bmkhd->bhmd", attn, vn)


def _flat_rows(idx: Tensor, N: int) -> Tensor:
    """``(B, M, K)`` per-cloud indices -> indices into the flattened ``(B * N)`` rows."""
    return idx + (torch.arange(idx.shape[0], device=idx.device) * N).view(-1, 1, 1)


def _cat(chunks: list[Tensor]) -> Tensor:
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


# FlopCounterMode pushes its inner _FlopCounterMode (torch 2.11-2.15) onto the dispatch-mode stack
_FLOP_COUNTER_MODES = (
    flop_counter.FlopCounterMode,
    getattr(flop_counter, "_FlopCounterMode", flop_counter.FlopCounterMode),
)


def _counting_flops() -> bool:
    """Whether ``torch.utils.flop_counter.FlopCounterMode`` is counting this call.

    The chunked products run as multiply + sum, element-wise work that the FLOP counter does not count; under the
    counter they run as the equivalent einsums instead, so that GMAC figures (``engine.count_gmacs``,
    ``tools/model_stats.py``) include the attention products, as they do for the dense path.
    """
    return any(isinstance(m, _FLOP_COUNTER_MODES) for m in _get_current_dispatch_mode_stack())


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision inputs: index_add_ then uses native float atomics on CUDA (bf16 ones are CAS
    loops) and the K contributions to a key add up without rounding to 8 bits each time."""
    return torch.promote_types(dtype, torch.float32)


class _GatherDot(torch.autograd.Function):
    """``s[l, k, h] = q[l, h] . k[idx[l, k], h]`` over chunks of query rows.

    q ``(L, H, D)`` holds the B * M centroid rows, k ``(R, H, D)`` the B * N input rows, idx ``(L, K)`` indices into
    R. Only one chunk of gathered keys, ``(rows, K, H, D)``, exists at a time, in the forward and in the backward pass
    (which gathers again instead of keeping the gathered keys alive): the KNN path's memory stays at O(B M K H) for
    the scores plus the chunk, instead of O(B M K H D). The products are a broadcast multiply and a sum over D, not
    an einsum: einsum would copy the chunk into a (l, h)-batched layout and run L * H matrix products of 1 x D by
    D x K, which are slow on GPUs.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, idx: Tensor, rows: int) -> Tensor:
        L, H, D = q.shape
        K = idx.shape[1]
        counting = _counting_flops()
        chunks = []
        for s in range(0, L, rows):
            kn = k.index_select(0, idx[s : s + rows].reshape(-1)).view(-1, K, H, D)  # (r, K, H, D)
            if counting:
                chunks.append(torch.einsum("rhd,rkhd->rkh", q[s : s + rows], kn))
            else:
                chunks.append(kn.mul_(q[s : s + rows, None]).sum(-1))  # (r, K, H)
        ctx.save_for_backward(q, k, idx)
        ctx.rows = rows
        return _cat(chunks)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, idx = ctx.saved_tensors
        L, H, D = q.shape
        K = idx.shape[1]
        acc = _accumulation_dtype(k.dtype)
        dq = []
        dk = torch.zeros(k.shape, dtype=acc, device=k.device) if ctx.needs_input_grad[1] else None
        for s in range(0, L, ctx.rows):
            f = idx[s : s + ctx.rows].reshape(-1)
            g = grad[s : s + ctx.rows]  # (r, K, H)
            if ctx.needs_input_grad[0]:
                kn = k.index_select(0, f).view(-1, K, H, D)
                dq.append(kn.mul_(g.to(kn.dtype)[..., None]).sum(1, dtype=q.dtype))  # (r, H, D)
            if dk is not None:
                contrib = g.to(acc)[..., None] * q[s : s + ctx.rows, None].to(acc)  # (r, K, H, D)
                dk.index_add_(0, f, contrib.view(-1, H, D))
        dq = _cat(dq) if dq else None
        return dq, None if dk is None else dk.to(k.dtype), None, None


class _GatherWeightedSum(torch.autograd.Function):
    """``out[l, h] = sum_k a[l, k, h] v[idx[l, k], h]``, chunked like :class:`_GatherDot`.

    a ``(L, K, H)`` holds the weights of the B * M centroid rows, v ``(R, H, D)`` the B * N input rows.
    """

    @staticmethod
    def forward(ctx, a: Tensor, v: Tensor, idx: Tensor, rows: int) -> Tensor:
        L, K, H = a.shape
        D = v.shape[-1]
        counting = _counting_flops()
        chunks = []
        for s in range(0, L, rows):
            vn = v.index_select(0, idx[s : s + rows].reshape(-1)).view(-1, K, H, D)  # (r, K, H, D)
            if counting:
                chunks.append(torch.einsum("rkh,rkhd->rhd", a[s : s + rows].to(vn.dtype), vn))
            else:
                chunks.append(vn.mul_(a[s : s + rows, ..., None].to(vn.dtype)).sum(1))  # (r, H, D)
        ctx.save_for_backward(a, v, idx)
        ctx.rows = rows
        return _cat(chunks)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        a, v, idx = ctx.saved_tensors
        L, K, H = a.shape
        D = v.shape[-1]
        acc = _accumulation_dtype(v.dtype)
        da = []
        dv = torch.zeros(v.shape, dtype=acc, device=v.device) if ctx.needs_input_grad[1] else None
        for s in range(0, L, ctx.rows):
            f = idx[s : s + ctx.rows].reshape(-1)
            g = grad[s : s + ctx.rows]  # (r, H, D)
            if ctx.needs_input_grad[0]:
                vn = v.index_select(0, f).view(-1, K, H, D)
                da.append(vn.mul_(g.to(vn.dtype)[:, None]).sum(-1, dtype=a.dtype))  # (r, K, H)
            if dv is not None:
                contrib = a[s : s + ctx.rows, ..., None].to(acc) * g.to(acc)[:, None]  # (r, K, H, D)
                dv.index_add_(0, f, contrib.view(-1, H, D))
        da = _cat(da) if da else None
        return da, None if dv is None else dv.to(v.dtype), None, None


torch.fx.wrap("knn_centroid_attention")  # FX keeps it as one call: its autograd Functions loop over chunks
