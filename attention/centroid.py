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
backward pass), so the KNN path's memory is O(M K H) plus a fixed chunk.

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
the projection MACs; :func:`edge_projection` switches :class:`CentroidAttention` to that evaluation, which is how
MAC counts of KNN attention that project per edge come about (it is tested equal to the default path, and
``tools/model_stats.py`` uses it to set our point model next to the paper's GMACs).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from ._checks import check_points, input_checks_enabled
from .points import farthest_point_sample, gather, knn

__all__ = [
    "CENTROID_INITS",
    "CentroidAttention",
    "CentroidBlock",
    "CentroidOutput",
    "DWConv2dInit",
    "FPSInit",
    "KMeansInit",
    "LinearInit",
    "MeanPoolInit",
    "Mlp",
    "RandomInit",
    "SelfAttentionBlock",
    "build_centroid_init",
    "centroid_attention",
    "edge_projection",
    "resolve_num_centroids",
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


def _check_neighbor_idx(idx: Tensor, name: str, B: int, M: int, N: int, device: torch.device) -> None:
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
        chunk_bytes: memory budget of one chunk of gathered keys or values (default :data:`ATTN_CHUNK_BYTES`).
        reference: use the plain gather-everything KNN path.

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
    if input_checks_enabled():
        if idx is not None:
            _check_neighbor_idx(idx, "idx", B, M, N, q.device)
        if mask is not None and (mask.shape != (B, N) or mask.dtype != torch.bool):
            raise ValueError(f"mask must be a bool tensor of shape ({B}, {N}), got {mask.dtype} {tuple(mask.shape)}")
    scale = D**-0.5
    chunk_bytes = ATTN_CHUNK_BYTES if chunk_bytes is None else chunk_bytes
    if idx is None:
        if normalize == "inputs":
            attn_mask = None if mask is None else mask[:, None, None, :]  # (B, 1, 1, N)
            return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, dropout_p=dropout_p)
        scores = (q @ k.transpose(-2, -1)) * scale  # (B, H, M, N)
        if mask is not None:
            scores = scores.masked_fill(~mask[:, None, None, :], -math.inf)
        attn = scores.softmax(dim=-2).nan_to_num(0.0)  # over centroids; a padded input's column is all -inf
        attn = attn / (attn.sum(-1, keepdim=True) + eps)
        attn = F.dropout(attn, dropout_p, training=dropout_p > 0)
        return attn @ v

    K = idx.shape[-1]
    if reference:
        # Gather keys and values of each centroid's neighbours, (B, M, K, H, D) each, and let autograd keep them.
        kn = gather(k.transpose(1, 2).reshape(B, N, H * D), idx).view(B, M, K, H, D)
        vn = gather(v.transpose(1, 2).reshape(B, N, H * D), idx).view(B, M, K, H, D)
        return _edge_attention(q, kn, vn, idx, N, mask=mask, normalize=normalize, dropout_p=dropout_p, eps=eps)
    rows = _chunk_rows(B, M, K, H, D, q.element_size(), chunk_bytes)
    scores = _GatherDot.apply(q.transpose(1, 2), k.transpose(1, 2), idx, rows).permute(0, 3, 1, 2) * scale
    attn = _knn_weights(scores, idx, N, mask, normalize, dropout_p, eps)  # (B, H, M, K)
    out = _GatherWeightedSum.apply(attn.permute(0, 2, 3, 1), v.transpose(1, 2), idx, rows)  # (B, M, H, D)
    return out.transpose(1, 2)


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


def _edge_attention(
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


_EDGE_PROJECTION = False


@contextlib.contextmanager
def edge_projection(enabled: bool = True) -> Iterator[None]:
    """Evaluates the key and value projections of KNN centroid attention per (centroid, neighbour) edge.

    Inside the context, :class:`CentroidAttention` with neighbours gathers the normalized inputs ``(B, M, K, C)``
    and projects them, instead of projecting the N inputs once and gathering keys and values. The outputs are the
    same up to rounding; the cost is K times the key/value projection MACs and the memory of the gathered inputs.
    It exists for MAC accounting (KNN attention code that projects per edge reports those counts) and as a second
    reference in tests; never use it for training.
    """
    global _EDGE_PROJECTION
    previous, _EDGE_PROJECTION = _EDGE_PROJECTION, bool(enabled)
    try:
        yield
    finally:
        _EDGE_PROJECTION = previous


# Memory budget of the gathered keys (or values) of one chunk of centroids in the KNN path, in bytes.
ATTN_CHUNK_BYTES = 16 * 2**20


def _chunk_rows(B: int, M: int, K: int, H: int, D: int, itemsize: int, budget: int) -> int:
    return max(1, min(M, budget // max(1, B * K * H * D * itemsize)))


def _flat_rows(idx: Tensor, N: int) -> Tensor:
    """``(B, M, K)`` per-cloud indices -> indices into the flattened ``(B * N)`` rows."""
    return idx + (torch.arange(idx.shape[0], device=idx.device) * N).view(-1, 1, 1)


class _GatherDot(torch.autograd.Function):
    """``s[b, m, k, h] = q[b, m, h] . k[b, idx[b, m, k], h]`` over chunks of centroids.

    Only one chunk of gathered keys, ``(B, rows, K, H, D)``, exists at a time, in the forward and in the backward
    pass (which gathers again instead of keeping the gathered keys alive): the KNN path's memory stays at
    O(B M K H) for the scores plus the chunk, instead of O(B M K H D).
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, idx: Tensor, rows: int) -> Tensor:
        B, M, H, D = q.shape  # q: (B, M, H, D), k: (B, N, H, D), idx: (B, M, K)
        N, K = k.shape[1], idx.shape[-1]
        flat = _flat_rows(idx, N)
        kf = k.reshape(B * N, H, D)
        out = q.new_empty(B, M, K, H)
        for s in range(0, M, rows):
            f = flat[:, s : s + rows]
            kn = kf.index_select(0, f.reshape(-1)).view(*f.shape, H, D)  # (B, r, K, H, D)
            out[:, s : s + rows] = torch.einsum("bmhd,bmkhd->bmkh", q[:, s : s + rows], kn)
        ctx.save_for_backward(q, k, flat)
        ctx.rows = rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        q, k, flat = ctx.saved_tensors
        B, M, H, D = q.shape
        N = k.shape[1]
        kf = k.reshape(B * N, H, D)
        dq = torch.empty_like(q) if ctx.needs_input_grad[0] else None
        dk = torch.zeros(B * N, H, D, dtype=k.dtype, device=k.device) if ctx.needs_input_grad[1] else None
        for s in range(0, M, ctx.rows):
            f = flat[:, s : s + ctx.rows]
            g = grad[:, s : s + ctx.rows].to(q.dtype)  # (B, r, K, H)
            if dq is not None:
                kn = kf.index_select(0, f.reshape(-1)).view(*f.shape, H, D)
                dq[:, s : s + ctx.rows] = torch.einsum("bmkh,bmkhd->bmhd", g, kn)
            if dk is not None:
                contrib = torch.einsum("bmkh,bmhd->bmkhd", g, q[:, s : s + ctx.rows])
                dk.index_add_(0, f.reshape(-1), contrib.reshape(-1, H, D).to(dk.dtype))
        return dq, None if dk is None else dk.view(B, N, H, D), None, None


class _GatherWeightedSum(torch.autograd.Function):
    """``out[b, m, h] = sum_k a[b, m, k, h] v[b, idx[b, m, k], h]``, chunked like :class:`_GatherDot`."""

    @staticmethod
    def forward(ctx, a: Tensor, v: Tensor, idx: Tensor, rows: int) -> Tensor:
        B, M, K, H = a.shape  # a: (B, M, K, H), v: (B, N, H, D), idx: (B, M, K)
        N, D = v.shape[1], v.shape[-1]
        flat = _flat_rows(idx, N)
        vf = v.reshape(B * N, H, D)
        out = v.new_empty(B, M, H, D)
        for s in range(0, M, rows):
            f = flat[:, s : s + rows]
            vn = vf.index_select(0, f.reshape(-1)).view(*f.shape, H, D)  # (B, r, K, H, D)
            out[:, s : s + rows] = torch.einsum("bmkh,bmkhd->bmhd", a[:, s : s + rows].to(vn.dtype), vn)
        ctx.save_for_backward(a, v, flat)
        ctx.rows = rows
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor | None, ...]:
        a, v, flat = ctx.saved_tensors
        B, M, K, H = a.shape
        N, D = v.shape[1], v.shape[-1]
        vf = v.reshape(B * N, H, D)
        da = torch.empty_like(a) if ctx.needs_input_grad[0] else None
        dv = torch.zeros(B * N, H, D, dtype=v.dtype, device=v.device) if ctx.needs_input_grad[1] else None
        for s in range(0, M, ctx.rows):
            f = flat[:, s : s + ctx.rows]
            g = grad[:, s : s + ctx.rows].to(v.dtype)  # (B, r, H, D)
            if da is not None:
                vn = vf.index_select(0, f.reshape(-1)).view(*f.shape, H, D)
                da[:, s : s + ctx.rows] = torch.einsum("bmhd,bmkhd->bmkh", g, vn)
            if dv is not None:
                contrib = torch.einsum("bmkh,bmhd->bmkhd", a[:, s : s + ctx.rows].to(v.dtype), g)
                dv.index_add_(0, f.reshape(-1), contrib.reshape(-1, H, D))
        return da, None if dv is None else dv.view(B, N, H, D), None, None


# --------------------------------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------------------------------


class Mlp(nn.Module):
    """Two-layer MLP of a transformer block: Linear -> act -> dropout -> Linear -> dropout."""

    def __init__(self, dim: int, hidden_dim: int, act_layer: type[nn.Module] = nn.GELU, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class CentroidAttention(nn.Module):
    """T steps of ``u <- u + proj(MHA(q(norm(u)), k(norm(x)), v(norm(x))))``, dense or over K nearest inputs.

    Args:
        dim: channels C of inputs and centroids.
        num_heads: H; ``dim`` must be divisible by it.
        num_neighbors: K, the number of nearest inputs (in feature space) each centroid attends to; None = all.
        num_steps: T, the number of unrolled steps (shared weights).
        normalize: ``"inputs"`` or ``"centroids"`` (see the module docstring).
        qkv_bias: bias in the q, k, v projections.
        attn_drop: dropout on the attention weights.
        proj_drop: dropout after the output projection.
        norm_layer: pre-norm applied to centroids (each step) and inputs; None for no norm.
        share_norm: use one norm for centroids and inputs (a self-attention block).
        knn_backend: backend of :func:`attention.knn`.

    Shapes:
        x: ``(B, N, C)`` inputs; centroids: ``(B, M, C)``; mask: ``(B, N)`` bool (True = real input);
        neighbor_idx: ``(B, M, K)`` fixed neighbours (e.g. from coordinates) instead of feature-space KNN;
        output: ``(B, M, C)``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 4,
        num_neighbors: int | None = None,
        num_steps: int = 1,
        normalize: str = "inputs",
        qkv_bias: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
        norm_layer: type[nn.Module] | None = nn.LayerNorm,
        share_norm: bool = False,
        knn_backend: str = "auto",
    ) -> None:
        super().__init__()
        if dim % num_heads != 0:
            raise ValueError(f"dim={dim} must be divisible by num_heads={num_heads}")
        if normalize not in NORMALIZATIONS:
            raise ValueError(f"normalize must be one of {NORMALIZATIONS}, got {normalize!r}")
        if num_neighbors is not None and num_neighbors < 1:
            raise ValueError(f"num_neighbors must be None or a positive int, got {num_neighbors}")
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.num_neighbors = num_neighbors
        self.num_steps = num_steps
        self.normalize = normalize
        self.knn_backend = knn_backend
        self.norm_q = norm_layer(dim) if norm_layer is not None else nn.Identity()
        self.norm_kv = self.norm_q if share_norm else (norm_layer(dim) if norm_layer is not None else nn.Identity())
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def extra_repr(self) -> str:
        return (
            f"dim={self.dim}, num_heads={self.num_heads}, num_neighbors={self.num_neighbors}, "
            f"num_steps={self.num_steps}, normalize={self.normalize!r}"
        )

    def forward(
        self, x: Tensor, centroids: Tensor, mask: Tensor | None = None, neighbor_idx: Tensor | None = None
    ) -> Tensor:
        if input_checks_enabled():
            check_points(x, "x", channels=self.dim)
            check_points(centroids, "centroids", like=x, like_name="x")
        B, N, C = x.shape
        M = centroids.shape[1]
        if input_checks_enabled():
            if M > N:
                raise ValueError(f"centroid attention maps N inputs to M <= N centroids, got M={M} > N={N}")
            if self.num_neighbors is not None and self.num_neighbors > N:
                raise ValueError(f"num_neighbors K={self.num_neighbors} exceeds the N={N} inputs: need K <= N")
            if mask is not None and (mask.shape != (B, N) or mask.dtype != torch.bool):
                raise ValueError(
                    f"mask must be a bool tensor of shape ({B}, {N}), got {mask.dtype} {tuple(mask.shape)}"
                )
            if mask is not None and not bool(mask.any(1).all()):
                raise ValueError("every cloud needs at least one real input; mask has an all-False row")
            if neighbor_idx is not None:
                _check_neighbor_idx(neighbor_idx, "neighbor_idx", B, M, N, x.device)
        H, D = self.num_heads, self.head_dim
        xn = self.norm_kv(x)
        per_edge = _EDGE_PROJECTION and (neighbor_idx is not None or self.num_neighbors is not None)
        if not per_edge:
            k, v = self.kv(xn).view(B, N, 2, H, D).unbind(2)  # (B, N, H, D) each
            k, v = k.transpose(1, 2), v.transpose(1, 2)  # (B, H, N, D)
        dropout_p = self.attn_drop if self.training else 0.0
        u = centroids
        for _ in range(self.num_steps):
            idx = neighbor_idx
            if idx is None and self.num_neighbors is not None:
                with torch.no_grad():
                    _, idx = knn(u.detach(), x.detach(), self.num_neighbors, mask=mask, backend=self.knn_backend)
            un = xn if (u is x and self.norm_q is self.norm_kv) else self.norm_q(u)
            q = self.q(un).view(B, M, H, D).transpose(1, 2)  # (B, H, M, D)
            if per_edge:  # see edge_projection(): same function, K times the projection MACs
                kn, vn = self.kv(gather(xn, idx)).view(B, M, -1, 2, H, D).unbind(3)  # (B, M, K, H, D) each
                out = _edge_attention(
                    q, kn, vn, idx, N, mask=mask, normalize=self.normalize, dropout_p=dropout_p, eps=1e-6
                )
            else:
                out = centroid_attention(q, k, v, idx, mask=mask, normalize=self.normalize, dropout_p=dropout_p)
            u = u + self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, M, C)))
        return u


# --------------------------------------------------------------------------------------------------------------------
# Centroid inits
# --------------------------------------------------------------------------------------------------------------------


class CentroidOutput(NamedTuple):
    """What a centroid init or block returns.

    Attributes:
        x: ``(B, M, C)`` centroid features.
        pos: ``(B, M, P)`` centroid positions (selected or averaged from the input positions), or None.
        index: ``(B, M)`` indices of the inputs the centroids were sampled from, or None for averaged inits.
    """

    x: Tensor
    pos: Tensor | None
    index: Tensor | None


def resolve_num_centroids(spec: int | float, num_inputs: int) -> int:
    """M from an absolute count (int) or a fraction of the N inputs (float in (0, 1]), at least 1."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float)) or spec <= 0:
        raise ValueError(f"num_centroids must be a positive int or a fraction in (0, 1], got {spec!r}")
    if isinstance(spec, float):
        if spec > 1:
            raise ValueError(f"a fractional num_centroids must lie in (0, 1], got {spec}")
        return max(1, round(spec * num_inputs))
    return spec


def _masked_or_plain(mask: Tensor | None, name: str) -> None:
    if mask is not None and input_checks_enabled() and not bool(mask.all()):
        raise ValueError(f"the {name!r} centroid init does not support padded inputs (mask has False entries)")


class FPSInit(nn.Module):
    """Centroids = the inputs picked by farthest point sampling, in position or feature space.

    Args:
        num_centroids: M, or a fraction of the N inputs (a float in (0, 1]; also for the random, mean-pool and
            k-means inits).
        space: ``"pos"`` (needs positions, e.g. xyz) or ``"features"``.
        backend: FPS backend (:func:`attention.farthest_point_sample`).
    """

    def __init__(self, num_centroids: int | float, space: str = "pos", backend: str = "auto") -> None:
        super().__init__()
        if space not in ("pos", "features"):
            raise ValueError(f"space must be 'pos' or 'features', got {space!r}")
        self.num_centroids = num_centroids
        self.space = space
        self.backend = backend

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        if self.space == "pos" and pos is None:
            raise ValueError("FPSInit(space='pos') needs input positions: pass pos=(B, N, P)")
        source = pos if self.space == "pos" else x
        start = 0 if mask is None else mask.int().argmax(1)  # the first real input of each cloud
        M = resolve_num_centroids(self.num_centroids, x.shape[1])
        idx = farthest_point_sample(source, M, start=start, mask=mask, backend=self.backend)
        return CentroidOutput(gather(x, idx), None if pos is None else gather(pos, idx), idx)


class RandomInit(nn.Module):
    """Centroids = a uniformly random subset of the (real) inputs.

    In training a fresh subset is drawn from torch's global generator each call; in eval the subset comes from a
    generator seeded with ``eval_seed``, so evaluation is deterministic.
    """

    def __init__(self, num_centroids: int | float, eval_seed: int = 0) -> None:
        super().__init__()
        self.num_centroids = num_centroids
        self.eval_seed = eval_seed

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        B, N, _ = x.shape
        M = resolve_num_centroids(self.num_centroids, N)
        if self.training:
            keys = torch.rand(B, N, device=x.device)
        else:
            g = torch.Generator(device="cpu").manual_seed(self.eval_seed)
            keys = torch.rand(B, N, generator=g).to(x.device)
        if mask is not None:
            if input_checks_enabled() and int(mask.sum(1).min()) < M:
                raise ValueError(f"random init needs M={M} real inputs per cloud, got fewer")
            keys = keys.masked_fill(~mask, 2.0)  # padded inputs sort last
        idx = keys.argsort(dim=1)[:, :M]
        return CentroidOutput(gather(x, idx), None if pos is None else gather(pos, idx), idx)


class MeanPoolInit(nn.Module):
    """Centroids = means of M runs of consecutive inputs (adaptive average pooling along N)."""

    def __init__(self, num_centroids: int | float) -> None:
        super().__init__()
        self.num_centroids = num_centroids

    def _pool(self, t: Tensor, w: Tensor | None) -> Tensor:
        M = resolve_num_centroids(self.num_centroids, t.shape[1])
        if w is None:
            return F.adaptive_avg_pool1d(t.transpose(1, 2), M).transpose(1, 2)
        num = F.adaptive_avg_pool1d((t * w).transpose(1, 2), M)
        den = F.adaptive_avg_pool1d(w.transpose(1, 2), M)
        if input_checks_enabled() and not bool((den > 0).all()):
            raise ValueError("mean_pool init: a window of consecutive inputs is all padding; put real inputs first")
        return (num / den.clamp_min(1e-12)).transpose(1, 2)

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        w = None if mask is None else mask.unsqueeze(-1).to(x.dtype)
        return CentroidOutput(self._pool(x, w), None if pos is None else self._pool(pos, w), None)


class KMeansInit(nn.Module):
    """Centroids = means of k-means clusters: FPS seeds, then ``num_iters`` Lloyd iterations.

    Assignments use squared L2 in ``space`` (no gradient through them); the returned features and positions are
    the means of each cluster's inputs, differentiable in the inputs. An empty cluster keeps its previous centre.
    """

    def __init__(
        self,
        num_centroids: int | float,
        num_iters: int = 3,
        space: str = "pos",
        fps_backend: str = "auto",
        knn_backend: str = "auto",
    ) -> None:
        super().__init__()
        self.seed = FPSInit(num_centroids, space=space, backend=fps_backend)
        self.num_centroids = num_centroids
        self.num_iters = num_iters
        self.space = space
        self.knn_backend = knn_backend

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        seed = self.seed(x, pos, mask)
        source = pos if self.space == "pos" else x
        centers = gather(source, seed.index).detach()
        assign = None
        with torch.no_grad():
            for _ in range(self.num_iters):
                _, nn_idx = knn(source.detach(), centers, 1, backend=self.knn_backend)
                assign = nn_idx[..., 0]  # (B, N)
                centers = self._means(source.detach(), assign, mask, fallback=centers)
        if assign is None:  # num_iters == 0: plain FPS
            return seed
        feats = self._means(x, assign, mask, fallback=seed.x)
        centre_pos = None if pos is None else self._means(pos, assign, mask, fallback=seed.pos)
        return CentroidOutput(feats, centre_pos, None)

    def _means(self, t: Tensor, assign: Tensor, mask: Tensor | None, fallback: Tensor) -> Tensor:
        B, N, C = t.shape
        M = fallback.shape[1]
        w = torch.ones(B, N, 1, dtype=t.dtype, device=t.device) if mask is None else mask[..., None].to(t.dtype)
        sums = t.new_zeros(B, M, C).scatter_add(1, assign[..., None].expand(-1, -1, C), t * w)
        counts = t.new_zeros(B, M, 1).scatter_add(1, assign[..., None], w)
        return torch.where(counts > 0, sums / counts.clamp_min(1.0), fallback)


class LinearInit(nn.Module):
    """Centroids = a learned linear map over the input axis, ``u_m = sum_n W[m, n] x_n + b_m`` (fixed N).

    Used by the capsule network, where the N primary capsules have a fixed order. W starts as an averaging map
    (each centroid the mean of a run of consecutive inputs) plus small noise.
    """

    def __init__(self, num_inputs: int, num_centroids: int) -> None:
        super().__init__()
        self.num_inputs = num_inputs
        self.num_centroids = num_centroids
        weight = F.adaptive_avg_pool1d(torch.eye(num_inputs)[None], num_centroids)[0].t()  # (M, N) averaging
        self.weight = nn.Parameter(weight + 0.01 * torch.randn(num_centroids, num_inputs) / math.sqrt(num_inputs))
        self.bias = nn.Parameter(torch.zeros(num_centroids, 1))

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        if x.shape[1] != self.num_inputs:
            raise ValueError(f"LinearInit was built for N={self.num_inputs} inputs, got x of shape {tuple(x.shape)}")
        _masked_or_plain(mask, "linear")
        u = torch.einsum("mn,bnc->bmc", self.weight, x) + self.bias
        p = None if pos is None else torch.einsum("mn,bnp->bmp", self.weight, pos)
        return CentroidOutput(u, p, None)


class DWConv2dInit(nn.Module):
    """Centroids from a token grid: a depth-wise conv (kernel 3, stride 2, padding 1) on the ``(H, W)`` grid.

    N = H * W tokens in row-major order become ``ceil(H / 2) * ceil(W / 2)`` centroids (N / 4 for even sides).
    The conv starts as an averaging filter (``avg_init=True``), so a pretrained model's tokens pass through it
    as local means.
    """

    def __init__(
        self, dim: int, grid_size: tuple[int, int], kernel_size: int = 3, stride: int = 2, avg_init: bool = True
    ) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(
                f"kernel_size must be odd (padding kernel_size // 2 keeps the grid aligned), got {kernel_size}"
            )
        self.grid_size = (int(grid_size[0]), int(grid_size[1]))
        self.kernel_size, self.stride = kernel_size, stride
        self.conv = nn.Conv2d(dim, dim, kernel_size, stride=stride, padding=kernel_size // 2, groups=dim)
        gh, gw = self.grid_size
        self.out_grid_size = ((gh - 1) // stride + 1, (gw - 1) // stride + 1)  # the conv's output size, odd kernel
        self.num_centroids = self.out_grid_size[0] * self.out_grid_size[1]
        if avg_init:
            nn.init.constant_(self.conv.weight, 1.0 / kernel_size**2)
            nn.init.zeros_(self.conv.bias)

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        B, N, C = x.shape
        gh, gw = self.grid_size
        if N != gh * gw:
            raise ValueError(f"DWConv2dInit expects N = {gh} x {gw} = {gh * gw} grid tokens, got {N}")
        _masked_or_plain(mask, "dwconv2d")
        grid = x.transpose(1, 2).reshape(B, C, gh, gw)  # (B, C, H, W)
        u = self.conv(grid).flatten(2).transpose(1, 2)  # (B, M, C)
        p = None
        if pos is not None:
            P = pos.shape[-1]
            k, st = self.kernel_size, self.stride
            p = F.avg_pool2d(pos.transpose(1, 2).reshape(B, P, gh, gw), k, st, k // 2, count_include_pad=False)
            p = p.flatten(2).transpose(1, 2)
        return CentroidOutput(u, p, None)


CENTROID_INITS: dict[str, type[nn.Module]] = {
    "fps": FPSInit,
    "random": RandomInit,
    "mean_pool": MeanPoolInit,
    "kmeans": KMeansInit,
    "linear": LinearInit,
    "dwconv2d": DWConv2dInit,
}


def build_centroid_init(name: str, **kwargs) -> nn.Module:
    """Builds a centroid init from :data:`CENTROID_INITS` by name, passing ``kwargs`` to its constructor."""
    if name not in CENTROID_INITS:
        raise ValueError(f"unknown centroid init {name!r}; choose one of {sorted(CENTROID_INITS)}")
    return CENTROID_INITS[name](**kwargs)


# --------------------------------------------------------------------------------------------------------------------
# Blocks
# --------------------------------------------------------------------------------------------------------------------


class CentroidBlock(nn.Module):
    """A transformer block that shortens the sequence: init -> T centroid-attention steps -> MLP (residuals).

    Args:
        dim: channels C.
        init: a name from :data:`CENTROID_INITS` or an init module.
        init_kwargs: constructor arguments of the named init (e.g. ``num_centroids``, ``space``, ``grid_size``).
        num_heads, num_neighbors, num_steps, normalize, qkv_bias, attn_drop, knn_backend: of
            :class:`CentroidAttention`. ``num_steps=0`` gives the ablation that only downsamples (init + MLP).
        mlp_ratio: hidden width of the MLP relative to C.
        drop: dropout after the attention projection and in the MLP.
        act_layer: MLP activation (the point-cloud model uses LeakyReLU(0.2)).
        norm_layer: pre-norm layer.

    Shapes:
        x: ``(B, N, C)``; pos: ``(B, N, P)`` or None; mask: ``(B, N)`` bool or None.
        output: :class:`CentroidOutput` with x ``(B, M, C)``, pos ``(B, M, P)`` or None, index ``(B, M)`` or None.
    """

    def __init__(
        self,
        dim: int,
        init: str | nn.Module = "fps",
        init_kwargs: dict | None = None,
        num_heads: int = 4,
        num_neighbors: int | None = None,
        num_steps: int = 1,
        normalize: str = "inputs",
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        knn_backend: str = "auto",
    ) -> None:
        super().__init__()
        self.init = init if isinstance(init, nn.Module) else build_centroid_init(init, **(init_kwargs or {}))
        self.attn = (
            CentroidAttention(
                dim,
                num_heads=num_heads,
                num_neighbors=num_neighbors,
                num_steps=num_steps,
                normalize=normalize,
                qkv_bias=qkv_bias,
                attn_drop=attn_drop,
                proj_drop=drop,
                norm_layer=norm_layer,
                knn_backend=knn_backend,
            )
            if num_steps > 0
            else None
        )
        self.norm = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        u, u_pos, index = self.init(x, pos, mask)
        if self.attn is not None:
            u = self.attn(x, u, mask=mask)
        u = u + self.mlp(self.norm(u))
        return CentroidOutput(u, u_pos, index)


class SelfAttentionBlock(nn.Module):
    """Pre-norm transformer block whose attention may be restricted to each token's K nearest tokens.

    It is centroid attention with the inputs as their own centroids (M = N, identity init, T = 1) and one shared
    norm, then an MLP. With ``num_neighbors`` set, neighbours are found in feature space unless the caller passes
    ``neighbor_idx`` (e.g. KNN in xyz).

    Shapes:
        x: ``(B, N, C)``; mask: ``(B, N)``; neighbor_idx: ``(B, N, K)``; output: ``(B, N, C)``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 4,
        num_neighbors: int | None = None,
        mlp_ratio: float = 4.0,
        qkv_bias: bool = False,
        drop: float = 0.0,
        attn_drop: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = nn.LayerNorm,
        knn_backend: str = "auto",
    ) -> None:
        super().__init__()
        self.attn = CentroidAttention(
            dim,
            num_heads=num_heads,
            num_neighbors=num_neighbors,
            num_steps=1,
            qkv_bias=qkv_bias,
            attn_drop=attn_drop,
            proj_drop=drop,
            norm_layer=norm_layer,
            share_norm=True,
            knn_backend=knn_backend,
        )
        self.norm = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)

    def forward(self, x: Tensor, mask: Tensor | None = None, neighbor_idx: Tensor | None = None) -> Tensor:
        x = self.attn(x, x, mask=mask, neighbor_idx=neighbor_idx)
        return x + self.mlp(self.norm(x))
