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
work in matrix products instead of O(M K D) in gathers and scatters, which is faster where N / K is small; and a
third, ``backend="triton"`` (:func:`triton_knn_attention`, CUDA, ``normalize="inputs"``): one fused Triton kernel
per direction that reads each neighbour's key and value by index, with an online softmax, no gathered tensor and no
mask (:mod:`attention.kernels.knn_attention_triton`).

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
the projection MACs; :func:`attention.centroid.accounting.edge_projection` swaps :class:`attention.CentroidAttention`
for such a per-edge module to set our point model next to the paper's GMACs (tested equal to the default path). The
layer's own forward has no such switch.

Tracing: :func:`centroid_attention` validates its inputs and dispatches; :func:`dense_centroid_attention` (the path
of every vision model) is plain tensor code that FX, TorchScript, dynamo, ``torch.export`` and ONNX follow.
:func:`knn_centroid_attention` runs two custom autograd Functions (chunked gather products) that TorchScript cannot
compile; it is registered as an FX leaf (``torch.fx.wrap`` and timm's ``register_notrace_function``).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..backends import BACKENDS, resolve
from ..checks import check_index, check_mask, checks_active, is_tracing
from ..chunking import chunk_budget, chunk_rows
from ..points import gather

__all__ = [
    "NORMALIZATIONS",
    "centroid_attention",
    "check_neighbor_idx",
    "dense_centroid_attention",
    "edge_attention",
    "grouped_vector_attention",
    "knn_centroid_attention",
    "knn_vector_attention",
    "masked_knn_attention",
    "triton_knn_attention",
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
    check_index(idx, name, batch=B, device=device, shape=(B, M, "K"), dims="(B, M, K)", bound=N, of=f"N={N} inputs")


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
            ``"masked"`` (:func:`masked_knn_attention`, dense matrix products under the neighbour mask), ``"triton"``
            (:func:`triton_knn_attention`, the fused kernel: CUDA, ``normalize="inputs"``, ``dropout_p=0``) or
            ``"auto"`` (op ``"knn_attention"`` of :func:`attention.backends.resolve`: on CUDA the fused kernel where
            it applies, else ``"masked"`` while N / K is small and every row of ``idx`` is checked to hold distinct
            indices, else ``"gather"``). The masked form counts a repeated neighbour once where the others count it
            each time it is listed, so ``backend="masked"`` with an ``idx`` that repeats one in a row raises a
            ``ValueError``; with input checks off (:func:`attention.input_checks`) nothing is checked, an explicit
            ``"masked"`` is taken as asked and ``"auto"`` does not take it.

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
        check_mask(mask, "mask", batch=B, length=N)
    if idx is None:
        return dense_centroid_attention(q, k, v, mask, normalize, dropout_p, eps)
    if reference:
        K = idx.shape[-1]
        # Gather keys and values of each centroid's neighbours, (B, M, K, H, D) each, and let autograd keep them.
        kn = gather(k.transpose(1, 2).reshape(B, N, H * D), idx).view(B, M, K, H, D)
        vn = gather(v.transpose(1, 2).reshape(B, N, H * D), idx).view(B, M, K, H, D)
        return edge_attention(q, kn, vn, idx, N, mask=mask, normalize=normalize, dropout_p=dropout_p, eps=eps)
    # the caller's idx may repeat an index, which the masked form would count once: checked (once, and only when the
    # masked form is asked for or would be taken) while input checks run; unknown otherwise, and then "auto" keeps off
    # the masked form (attention.backends, "knn_attention")
    distinct = _distinct_check(idx) if checks_active() else False
    shape = _knn_attention_shape(N, idx.shape[-1], D, normalize, dropout_p, distinct)
    form = resolve("knn_attention", backend, q.device, shape, q.dtype)
    if form == "masked":
        return masked_knn_attention(q, k, v, idx, mask, normalize, dropout_p, eps)
    if form == "triton":
        return triton_knn_attention(q, k, v, idx, mask)
    return knn_centroid_attention(q, k, v, idx, mask, normalize, dropout_p, eps, chunk_bytes)


def _knn_attention_shape(
    N: int, K: int, D: int, normalize: str, dropout_p: float, distinct: bool | Callable[[], bool]
) -> dict:
    """What :func:`attention.backends.resolve` reads to choose the KNN attention's form (op ``"knn_attention"``):
    N inputs, K neighbours, head dim D, the normalization, the dropout and whether each row's neighbours are
    distinct (the masked form counts a repeated one once): True (a KNN search's), False (not known), or a check that
    says so (:func:`_distinct_check`), run only when the masked form is asked for or would be taken."""
    return {"N": N, "K": K, "D": D, "normalize": normalize, "dropout": dropout_p, "distinct": distinct}


def _repeats_a_neighbor(idx: Tensor) -> bool:
    """Whether some row of ``idx`` ``(..., K)`` lists an index twice: sorted along K, two neighbours are equal (one
    sort and one comparison; a host sync on CUDA)."""
    s = idx.sort(dim=-1).values
    return bool((s[..., 1:] == s[..., :-1]).any())


def _distinct_check(idx: Tensor) -> Callable[[], bool]:
    """A check that each row of ``idx`` holds distinct indices, computed on its first call and remembered (the
    switchboard may ask twice: whether ``"auto"`` prefers the masked form, then whether it can run)."""
    return functools.cache(lambda: not _repeats_a_neighbor(idx))


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
    ``(B, H, M, N)`` scores). It pays where N / K is small (tools/bench_centroid.py times both forms). Plain tensor
    code (traceable).
    """
    # (B, M, N) False, built from idx's own shape (sizes stay symbolic under FX), then True at the neighbours
    edges = torch.zeros_like(idx[:, :, :1], dtype=torch.bool).expand(-1, -1, k.shape[2]).clone().scatter_(2, idx, True)
    if mask is not None:
        edges = edges & mask[:, None, :]
    return _attend(q, k, v, edges[:, None], normalize, dropout_p, eps)


def triton_knn_attention(q: Tensor, k: Tensor, v: Tensor, idx: Tensor, mask: Tensor | None = None) -> Tensor:
    """The KNN path as one fused Triton kernel (``backend="triton"`` of :func:`centroid_attention`), for
    ``normalize="inputs"`` without dropout: q ``(B, H, M, D)``, k and v ``(B, H, N, D)``, idx ``(B, M, K)``, mask
    ``(B, N)`` bool or None; returns ``(B, H, M, D)``.

    Per (centroid, head) the kernel reads the K neighbours' keys and values by index, runs an online softmax over
    them and keeps the log-sum-exp for the backward pass, which scatters the key and value gradients with float32
    atomics (so they may differ in their last bits between two runs):
    :mod:`attention.kernels.knn_attention_triton`. Its value and gradients are the gather path's (a repeated index
    counts twice); memory O(B H M) beyond the inputs and their gradients. No validation (the caller's, or
    :func:`centroid_attention`'s); CUDA tensors, or CPU tensors under ``TRITON_INTERPRET=1``. An FX leaf.
    """
    return BACKENDS["knn_attention"]["triton"].load()(q, k, v, idx, mask)


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
    pos_hidden: Tensor | None = None,
    pos_weight: Tensor | None = None,
    pos_bias: Tensor | None = None,
) -> Tensor:
    """The chunked KNN path of :func:`centroid_attention` without validation: q ``(B, H, M, D)``, k and v
    ``(B, H, N, D)``, idx ``(B, M, K)``; returns ``(B, H, M, D)``. An FX leaf (custom autograd Functions).

    With ``pos_hidden`` ``(B, M, K, R)``, ``pos_weight`` ``(C, R)`` and ``pos_bias`` ``(C,)`` (C = H D), every edge's
    key and value get a relative position encoding ``delta_mk = pos_weight @ pos_hidden[b, m, k] + pos_bias`` (the
    last, linear layer of :class:`attention.RelativePositionEncoding` applied to its hidden features), computed without
    forming any per-edge key, value or encoding: per head h,
    ``q . delta = (W_h^T q) . hidden + q . b_h`` and ``sum_k a_k delta_k = W_h (sum_k a_k hidden_k) + b_h sum_k a_k``,
    so the extra work is O(M K H R) and the memory O(M K R). Tested equal to the per-edge form
    (:func:`edge_attention` with ``k + delta`` and ``v + delta``)."""
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
    scores = _GatherProduct.apply("gather_dot", qf, kf, flat, rows).view(B, M, K, H)
    scores = scores.permute(0, 3, 1, 2)  # (B, H, M, K)
    if pos_hidden is not None and pos_weight is not None:
        w = pos_weight.view(H, D, -1)  # (H, D, R)
        scores = scores + torch.einsum("bhmr,bmkr->bhmk", torch.einsum("bhmd,hdr->bhmr", q, w), pos_hidden)
        if pos_bias is not None:
            scores = scores + torch.einsum("bhmd,hd->bhm", q, pos_bias.view(H, D)).unsqueeze(-1)
    attn = _knn_weights(scores * D**-0.5, idx, N, mask, normalize, dropout_p, eps)  # (B, H, M, K)
    return _weighted_values(attn, vf, flat, rows, pos_hidden, pos_weight, pos_bias)


def _weighted_values(
    attn: Tensor, vf: Tensor, flat: Tensor, rows: int, pos_hidden: Tensor | None, pos_weight: Tensor | None,
    pos_bias: Tensor | None,
) -> Tensor:  # fmt: skip
    """``sum_k attn[b, h, m, k] (v[idx[b, m, k], h] + delta_mk[h])`` ``(B, H, M, D)`` from weights ``(B, H, M, K)``, the
    value rows ``vf`` ``(B * N, H, D)`` and the flat neighbour rows ``(B * M, K)``, chunked by ``rows``; the encoding's
    share comes from its hidden features (see :func:`knn_centroid_attention`)."""
    B, H, M, K = attn.shape
    D = vf.shape[-1]
    a = attn.permute(0, 2, 3, 1).reshape(B * M, K, H)
    out = _GatherProduct.apply("gather_weighted_sum", a, vf, flat, rows).view(B, M, H, D)
    if pos_hidden is not None and pos_weight is not None:
        w = pos_weight.view(H, D, -1)  # (H, D, R)
        out = out + torch.einsum("bhmr,hdr->bmhd", torch.einsum("bhmk,bmkr->bhmr", attn, pos_hidden), w)
        if pos_bias is not None:
            out = out + attn.sum(-1).transpose(1, 2).unsqueeze(-1) * pos_bias.view(H, D)
    return out.transpose(1, 2)


def knn_vector_attention(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    idx: Tensor,
    weight_enc: tuple[Tensor, Tensor, Callable[[Tensor], Tensor]],
    mask: Tensor | None = None,
    normalize: str = "inputs",
    dropout_p: float = 0.0,
    eps: float = 1e-6,
    chunk_bytes: int | None = None,
    pos_hidden: Tensor | None = None,
    pos_weight: Tensor | None = None,
    pos_bias: Tensor | None = None,
) -> Tensor:
    """Grouped vector attention over K neighbours without per-edge C-wide tensors: q ``(B, M, C)``, k and v
    ``(B, N, C)``, idx ``(B, M, K)``, ``weight_enc`` = (``A`` ``(G, C)``, ``a`` ``(G,)``, ``rest``): the logits are
    ``rest(A (q_m - k_j + delta_mj) + a)``; returns ``(B, G, M, C / G)``. The same function as
    :func:`grouped_vector_attention` over per-edge relations and values (tested, outputs and gradients), with the first
    layer of the logits' MLP moved through the difference by linearity: ``A q_m`` and ``A k_j`` are projected once per
    point and gathered at width G, and ``A delta_mj = (A W) hidden_mj + A b`` for the encoding's last layer ``W``,
    ``b`` (``pos_weight``, ``pos_bias``, over ``pos_hidden`` ``(B, M, K, R)``); the values are the chunked gather
    product of :func:`knn_centroid_attention` with the groups as heads. Extra memory O(M K (G + R)) instead of
    O(M K C)."""
    B, M, C = q.shape
    N, K = k.shape[1], idx.shape[-1]
    A, a, rest = weight_enc
    G = A.shape[0]
    pre = F.linear(q, A).unsqueeze(2) - gather(F.linear(k, A), idx) + a  # (B, M, K, G)
    if pos_hidden is not None and pos_weight is not None:
        pre = pre + F.linear(pos_hidden, A @ pos_weight, None if pos_bias is None else A @ pos_bias)
    attn = _knn_weights(rest(pre).permute(0, 3, 1, 2), idx, N, mask, normalize, dropout_p, eps)  # (B, G, M, K)
    budget = chunk_budget("knn_attention", q.device) if chunk_bytes is None else chunk_bytes
    rows = chunk_rows(B * M, K * C * v.element_size(), budget)
    flat = _flat_rows(idx, N).reshape(B * M, K)
    return _weighted_values(attn, v.reshape(B * N, G, C // G), flat, rows, pos_hidden, pos_weight, pos_bias)


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


def grouped_vector_attention(
    logits: Tensor,
    vn: Tensor,
    idx: Tensor,
    N: int,
    *,
    mask: Tensor | None,
    normalize: str,
    dropout_p: float,
    eps: float,
) -> Tensor:
    """Grouped vector attention (Point Transformer v2, Wu et al., arXiv:2210.05666, eq. 6-7) over K neighbours: logits
    ``(B, M, K, G)``, one per neighbour and group of channels, are normalised over the neighbours (``normalize``, as
    the dot-product form) and weigh the values ``vn`` ``(B, M, K, C)`` group by group, C divisible by G; returns
    ``(B, G, M, C / G)``. With G = C every channel weighs its own neighbours, as Point Transformer's vector attention
    does; with one logit per head it is the dot-product form's weighting."""
    B, M, K, G = logits.shape
    attn = _knn_weights(logits.permute(0, 3, 1, 2), idx, N, mask, normalize, dropout_p, eps)  # (B, G, M, K)
    return torch.einsum("bgmk,bmkgd->bgmd", attn, vn.view(B, M, K, G, -1))


def _flat_rows(idx: Tensor, N: int) -> Tensor:
    """``(B, M, K)`` per-cloud indices -> indices into the flattened ``(B * N)`` rows."""
    return idx + (torch.arange(idx.shape[0], device=idx.device) * N).view(-1, 1, 1)


def _cat(chunks: list[Tensor]) -> Tensor:
    return chunks[0] if len(chunks) == 1 else torch.cat(chunks)


def _accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    """float32 for half-precision inputs: index_add_ then uses native float atomics on CUDA (bf16 ones are CAS
    loops) and the K contributions to a key add up without rounding to 8 bits each time."""
    return torch.promote_types(dtype, torch.float32)


# In eager mode the two forward products of the autograd Function below run as operators of their own,
# ``torch.ops.attention.gather_dot`` and ``torch.ops.attention.gather_weighted_sum``: a dispatch mode (a FLOP counter)
# sees each as one call, counted by the formula :mod:`attention.centroid.accounting` registers (2 L K H D FLOPs, what
# the reference's einsums count), not as the element-wise multiply + sum inside. While traced (dynamo, export) the
# chunk loops run inline instead, as the plain aten ops that every exporter (ONNX too) translates.
_LIB = torch.library.Library("attention", "DEF")
_LIB.define("gather_dot(Tensor q, Tensor k, Tensor idx, int rows) -> Tensor")
_LIB.define("gather_weighted_sum(Tensor a, Tensor v, Tensor idx, int rows) -> Tensor")


def _gather_dot(q: Tensor, k: Tensor, idx: Tensor, rows: int, dtype: torch.dtype | None = None) -> Tensor:
    """``s[l, k, h] = q[l, h] . k[idx[l, k], h]``: q ``(L, H, D)``, k ``(R, H, D)``, idx ``(L, K)`` -> ``(L, K, H)``
    (in ``dtype``, default k's), ``rows`` query rows at a time. The forward of ``"gather_dot"`` in
    :class:`_GatherProduct`, and the weights' gradient of ``"gather_weighted_sum"``."""
    L, H, D = q.shape
    K = idx.shape[1]
    chunks = []
    for s in range(0, L, rows):
        kn = k.index_select(0, idx[s : s + rows].reshape(-1)).view(-1, K, H, D)  # (r, K, H, D)
        chunks.append(kn.mul_(q[s : s + rows, None].to(kn.dtype)).sum(-1, dtype=dtype))  # (r, K, H)
    return _cat(chunks)


def _gather_weighted_sum(a: Tensor, v: Tensor, idx: Tensor, rows: int, dtype: torch.dtype | None = None) -> Tensor:
    """``out[l, h] = sum_k a[l, k, h] v[idx[l, k], h]``: a ``(L, K, H)``, v ``(R, H, D)``, idx ``(L, K)`` ->
    ``(L, H, D)`` (in ``dtype``, default v's), ``rows`` rows at a time. The forward of ``"gather_weighted_sum"`` in
    :class:`_GatherProduct`, and the queries' gradient of ``"gather_dot"``."""
    L, K, H = a.shape
    D = v.shape[-1]
    chunks = []
    for s in range(0, L, rows):
        vn = v.index_select(0, idx[s : s + rows].reshape(-1)).view(-1, K, H, D)  # (r, K, H, D)
        chunks.append(vn.mul_(a[s : s + rows, ..., None].to(vn.dtype)).sum(1, dtype=dtype))  # (r, H, D)
    return _cat(chunks)


def _scatter_outer(w: Tensor, x: Tensor, idx: Tensor, rows: int, like: Tensor) -> Tensor:
    """``out[idx[l, k], h] += w[l, k, h] x[l, h]``: w ``(L, K, H)``, x ``(L, H, D)`` -> ``(R, H, D)`` shaped and typed
    like ``like``, accumulated in :func:`_accumulation_dtype`, ``rows`` rows at a time. The inputs' gradient of both
    products of :class:`_GatherProduct` (keys of ``"gather_dot"``, values of ``"gather_weighted_sum"``)."""
    H, D = like.shape[1:]
    acc = _accumulation_dtype(like.dtype)
    out = torch.zeros(like.shape, dtype=acc, device=like.device)
    for s in range(0, w.shape[0], rows):
        contrib = w[s : s + rows].to(acc)[..., None] * x[s : s + rows, None].to(acc)  # (r, K, H, D)
        out.index_add_(0, idx[s : s + rows].reshape(-1), contrib.view(-1, H, D))
    return out.to(like.dtype)


_LIB.impl("gather_dot", _gather_dot, "CompositeExplicitAutograd")
_LIB.impl("gather_weighted_sum", _gather_weighted_sum, "CompositeExplicitAutograd")


@torch.library.register_fake("attention::gather_dot", lib=_LIB)
def _gather_dot_fake(q: Tensor, k: Tensor, idx: Tensor, rows: int) -> Tensor:
    return k.new_empty(q.shape[0], idx.shape[1], q.shape[1])


@torch.library.register_fake("attention::gather_weighted_sum", lib=_LIB)
def _gather_weighted_sum_fake(a: Tensor, v: Tensor, idx: Tensor, rows: int) -> Tensor:
    return v.new_empty(a.shape[0], a.shape[2], v.shape[2])


class _GatherProduct(torch.autograd.Function):
    """``apply(op, x, y, idx, rows)``: one of the two chunked products over gathered rows, by ``op``'s name.

    ``"gather_dot"``: ``s[l, k, h] = q[l, h] . k[idx[l, k], h]``, x = q ``(L, H, D)`` the B * M centroid rows, y = k
    ``(R, H, D)`` the B * N input rows, idx ``(L, K)`` indices into R. ``"gather_weighted_sum"``: ``out[l, h] =
    sum_k a[l, k, h] v[idx[l, k], h]``, x = a ``(L, K, H)`` the weights of the centroid rows, y = v ``(R, H, D)``.

    Each is the other's gradient with respect to x, and both send y's gradient through :func:`_scatter_outer`. Only
    one chunk of gathered rows, ``(rows, K, H, D)``, exists at a time, in the forward and in the backward pass (which
    gathers again instead of keeping the gathered rows alive): the KNN path's memory stays at O(B M K H) for the
    scores plus the chunk, instead of O(B M K H D). The products are a broadcast multiply and a sum over D, not an
    einsum: einsum would copy the chunk into a (l, h)-batched layout and run L * H matrix products of 1 x D by D x K,
    which are slow on GPUs.
    """

    @staticmethod
    def forward(ctx, op: str, x: Tensor, y: Tensor, idx: Tensor, rows: int) -> Tensor:
        ctx.save_for_backward(x, y, idx)
        ctx.op, ctx.rows = op, rows
        return (_GATHER_PRODUCTS[op] if is_tracing() else getattr(torch.ops.attention, op))(x, y, idx, rows)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        x, y, idx = ctx.saved_tensors
        dot = ctx.op == "gather_dot"
        dual = _gather_weighted_sum if dot else _gather_dot
        dx = dual(grad, y, idx, ctx.rows, x.dtype) if ctx.needs_input_grad[1] else None
        weights, rows_in = (grad, x) if dot else (x, grad)  # (L, K, H), (L, H, D)
        dy = _scatter_outer(weights, rows_in, idx, ctx.rows, y) if ctx.needs_input_grad[2] else None
        return None, dx, dy, None, None


_GATHER_PRODUCTS = {"gather_dot": _gather_dot, "gather_weighted_sum": _gather_weighted_sum}


torch.fx.wrap("knn_centroid_attention")  # FX keeps it as one call: its autograd Functions loop over chunks
torch.fx.wrap("triton_knn_attention")  # and this one: a Triton kernel
