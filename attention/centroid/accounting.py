"""How centroid attention is counted and checked: FLOP formulas of the chunked KNN products, the per-edge twin of the
layer that sets our MAC count next to the paper's, and the plain multi-head attention step the layer is tested on.

* FLOPs. ``torch.utils.flop_counter.FlopCounterMode`` (and :func:`measure.stats.count_gmacs` on it) counts
  matmul-like aten ops by formula. The KNN path's two products run as the operators
  ``torch.ops.attention.gather_dot`` and ``torch.ops.attention.gather_weighted_sum``
  (:mod:`attention.centroid.functional`); the formulas registered here count each as the matrix product it is,
  2 L K H D FLOPs (L = B M centroid rows, K neighbours, H heads, D head dim), what the einsums of the reference
  :func:`attention.centroid.edge_attention` count. The production forward has no branch for the counter.
* MACs per edge. With K neighbours the keys and values are projected once per input and gathered per (centroid,
  neighbour) edge. Gathering the inputs first and projecting per edge computes the same function with K times the
  projection MACs (:class:`EdgeProjectionAttention`, swapped in by :func:`edge_projection`): the count the paper's
  5.4 GMACs of the point model follow (``tools/model_stats.py`` prints both).
* The plain reference. :func:`attention_step_reference` is one dense step of :class:`attention.CentroidAttention`
  written with the ``(B, H, M, N)`` score matrix materialized: the ground truth of the layer's tests and the
  ``dense-matmul`` row of ``tools/bench_centroid.py``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor, nn
from torch.utils.flop_counter import register_flop_formula

from ..points import gather
from .functional import edge_attention
from .layer import CentroidAttention

__all__ = ["EdgeProjectionAttention", "attention_step_reference", "edge_projection"]


@register_flop_formula(torch.ops.attention.gather_dot)
def _gather_dot_flops(q_shape, k_shape, idx_shape, rows: int, *args, out_shape=None, **kwargs) -> int:
    """``s[l, k, h] = q[l, h] . k[idx[l, k], h]``: L K H dot products of length D."""
    L, H, D = q_shape
    return 2 * L * idx_shape[1] * H * D


@register_flop_formula(torch.ops.attention.gather_weighted_sum)
def _gather_weighted_sum_flops(a_shape, v_shape, idx_shape, rows: int, *args, out_shape=None, **kwargs) -> int:
    """``out[l, h] = sum_k a[l, k, h] v[idx[l, k], h]``: L H D sums of K products."""
    L, K, H = a_shape
    return 2 * L * K * H * v_shape[-1]


@register_flop_formula(torch.ops.attention.knn_attention_triton_fwd)
def _knn_attention_triton_flops(q_shape, k_shape, v_shape, idx_shape, *args, out_shape=None, **kwargs) -> int:
    """The fused kernel's forward: ``s = q . k`` and ``o = sum_k p v``, the gather path's two formulas above."""
    B, H, M, D = q_shape
    return 4 * B * M * idx_shape[-1] * H * D


def attention_step_reference(layer: CentroidAttention, x: Tensor, centroids: Tensor) -> Tensor:
    """One dense step of ``layer``, the plain reference: ``u + proj(softmax(q(norm(u)) k(norm(x))^T / sqrt(D))
    v(norm(x)))`` with the layer's weights, the ``(B, H, M, N)`` scores materialized, no mask, dropout or neighbours.

    Shapes:
        x: ``(B, N, C)`` inputs; centroids: ``(B, M, C)``; output: ``(B, M, C)``.
    """
    B, N, C = x.shape
    M = centroids.shape[1]
    H, D = layer.num_heads, layer.head_dim
    k, v = layer.kv(layer.norm_kv(x)).view(B, N, 2, H, D).unbind(2)  # (B, N, H, D) each
    q = layer.q(layer.norm_q(centroids)).view(B, M, H, D).transpose(1, 2)  # (B, H, M, D)
    attn = (q @ k.permute(0, 2, 3, 1)) * D**-0.5  # (B, H, M, N), materialized
    out = attn.softmax(-1) @ v.transpose(1, 2)  # (B, H, M, D)
    return centroids + layer.proj(out.transpose(1, 2).reshape(B, M, C))


class EdgeProjectionAttention(CentroidAttention):
    """:class:`attention.CentroidAttention` with its key and value projections evaluated per (centroid, neighbour)
    edge: the normalized inputs are gathered ``(B, M, K, C)`` and then projected, instead of projecting the N inputs
    once and gathering keys and values. Same function up to rounding (tested, outputs and gradients); K times the
    key/value projection MACs. It exists so that the MAC count can be set next to KNN attention code that projects
    per edge (the paper's); never train with it. The dense path (no neighbours) and the ``"vector"`` and ``"max"``
    aggregations are the parent's.

    Shapes:
        as :class:`attention.CentroidAttention`.
    """

    def forward(
        self,
        x: Tensor,
        centroids: Tensor,
        mask: Tensor | None = None,
        neighbor_idx: Tensor | None = None,
        pos: Tensor | None = None,
        centroid_pos: Tensor | None = None,
    ) -> Tensor:
        if self.aggregation != "dot" or (neighbor_idx is None and self.num_neighbors is None):
            return super().forward(x, centroids, mask, neighbor_idx, pos, centroid_pos)
        self.check_inputs(x, centroids, mask, neighbor_idx, pos, centroid_pos)
        B, N, C = x.shape
        M = centroids.shape[1]
        H, D = self.num_heads, self.head_dim
        xn = self.norm_kv(x)
        dropout_p = self.attn_drop if self.training else 0.0
        u = centroids
        for _ in range(self.num_steps):
            q = self.q(self.norm_q(u)).view(B, M, H, D).transpose(1, 2)  # (B, H, M, D)
            idx = neighbor_idx if neighbor_idx is not None else self._feature_neighbors(u, x, mask)  # (B, M, K)
            K = idx.shape[-1]
            kvn = self.kv(gather(xn, idx)).view(B, M, K, 2, H, D)
            if self.pos_enc is not None and pos is not None and centroid_pos is not None:
                kvn = kvn + self.pos_enc(gather(pos, idx) - centroid_pos.unsqueeze(2)).view(B, M, K, 1, H, D)
            kn, vn = kvn.unbind(3)  # (B, M, K, H, D) each
            out = edge_attention(q, kn, vn, idx, N, mask=mask, normalize=self.normalize, dropout_p=dropout_p, eps=1e-6)
            update = self.proj_drop(self.proj(out.transpose(1, 2).reshape(B, M, C)))
            u = u + self.drop_path(self.layer_scale(update))
        return u


@contextlib.contextmanager
def edge_projection(model: nn.Module) -> Iterator[nn.Module]:
    """Swaps every :class:`attention.CentroidAttention` of ``model`` for :class:`EdgeProjectionAttention` (same
    parameters, same module objects) inside the context, and back on exit."""
    swapped = [m for m in model.modules() if type(m) is CentroidAttention]
    for m in swapped:
        m.__class__ = EdgeProjectionAttention
    try:
        yield model
    finally:
        for m in swapped:
            m.__class__ = CentroidAttention
