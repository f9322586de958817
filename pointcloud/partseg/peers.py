"""PointNet++ part segmentation (SSG) from PyTorch Geometric's layers, the peer of the centroid model.

Qi et al., "PointNet++: Deep Hierarchical Feature Learning on Point Sets in a Metric Space", NeurIPS 2017,
arXiv:1706.02413, the single-scale-grouping part-segmentation network (ShapeNet Part: 85.1 instance mIoU)::

    SA1: FPS to N / 4 centres, ball of r = 0.2 (32 nearest), MLP 64-64-128    (PointNetConv)
    SA2: FPS to N / 16 centres, ball of r = 0.4 (64 nearest), MLP 128-128-256 (PointNetConv)
    SA3: all centres in one group, MLP 256-512-1024, max pool                  (global feature)
    FP3: global feature to every SA2 centre, [., skip 256] -> 256-256
    FP2: SA2 -> SA1 centres by inverse-distance interpolation (3 nearest), [., skip 128] -> 256-128
    FP1: SA1 -> input points likewise, [., one-hot category, xyz (+ normals)] -> 128-128-128
    head: 128 -> 128 (BatchNorm, ReLU, dropout 0.5) -> num_parts

At 2048 points the centre counts are the paper's 512 and 128; they are fractions (a quarter of each set
abstraction's input) so that smaller clouds keep the same ratios. Set abstraction is
:class:`pointcloud.peers.SetAbstraction` (PyG's ``PointNetConv`` on a radius-masked k-NN graph, see
:mod:`pointcloud.peers` for how it deviates from the original ball query). Feature propagation is PyG's
``knn_interpolate`` formula, ``f(y) = sum_i w_i f(x_i) / sum_i w_i`` with ``w_i = 1 / d(y, x_i)^2`` over the 3
nearest, computed by :func:`attention.interpolate_neighbors` on this toolkit's :func:`attention.knn`: PyG 2.8's
``knn_interpolate`` calls its own ``knn``, which needs pyg-lib (not built for every torch release). The two agree
(tested).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attention import input_checks, interpolate_neighbors, knn
from attention.checks import check_points

from ..peers import SetAbstraction, _mlp
from .model import PartSegModel, category_one_hot, register_model

__all__ = ["PointNet2PartSeg", "propagate"]


def propagate(x: Tensor, pos: Tensor, pos_skip: Tensor, k: int = 3) -> Tensor:
    """PointNet++ feature propagation: features ``(B, M, C)`` at ``pos`` ``(B, M, 3)`` -> ``(B, N, C)`` at
    ``pos_skip`` ``(B, N, 3)`` by inverse-distance weighting of the k nearest (k clamped to M)."""
    return interpolate_neighbors(x, *knn(pos_skip, pos, min(k, pos.shape[1])))


class PointNet2PartSeg(PartSegModel):
    """PointNet++ SSG part segmentation: three set abstractions, three feature propagations, a per-point head.

    Args:
        num_parts: global part labels (50 in ShapeNet Part).
        num_categories: object categories, given as a one-hot input to FP1.
        in_channels: 3 (xyz) or 6 (xyz + normals); the channels after xyz are point features.
        num_centroids: (M1, M2) FPS centres of SA1 and SA2: counts (clamped to the points available) or fractions of
            each one's input (the default a quarter each: 512 and 128 at 2048 points).
        num_neighbors: (K1, K2) grouped neighbours per centre, or one int for both (clamped likewise).
        radii: ball-query radii of SA1 and SA2 (unit-sphere clouds), or None for plain k-NN.
        mlps: widths of the shared MLPs of SA1, SA2 and the global SA3.
        fp_mlps: widths of FP3, FP2 and FP1.
        head_dim: hidden width of the head.
        drop: dropout in the head.

    Shapes:
        points: ``(B, N, in_channels)``; category: ``(B,)`` int64; features ``(B, N, fp_mlps[-1][-1])``;
        output logits ``(B, N, num_parts)``.
    """

    def __init__(
        self,
        num_parts: int = 50,
        num_categories: int = 16,
        in_channels: int = 3,
        num_centroids: Sequence[int | float] = (0.25, 0.25),
        num_neighbors: int | Sequence[int] = (32, 64),
        radii: Sequence[float] | None = (0.2, 0.4),
        mlps: Sequence[Sequence[int]] = ((64, 64, 128), (128, 128, 256), (256, 512, 1024)),
        fp_mlps: Sequence[Sequence[int]] = ((256, 256), (256, 128), (128, 128, 128)),
        head_dim: int = 128,
        drop: float = 0.5,
    ) -> None:
        super().__init__()
        if in_channels < 3:
            raise ValueError(f"in_channels must be >= 3 (xyz first), got {in_channels}")
        if isinstance(num_neighbors, int):
            num_neighbors = (num_neighbors, num_neighbors)
        if len(num_centroids) != 2 or len(num_neighbors) != 2 or len(mlps) != 3 or len(fp_mlps) != 3:
            raise ValueError(
                f"num_centroids and num_neighbors need 2 entries, mlps and fp_mlps 3, got {num_centroids}, "
                f"{num_neighbors}, {len(mlps)} mlps, {len(fp_mlps)} fp_mlps"
            )
        if radii is not None and len(radii) != 2:
            raise ValueError(f"radii needs 2 entries (or None for k-NN grouping), got {radii}")
        self.num_parts = num_parts
        self.num_categories = num_categories
        self.in_channels = in_channels
        self.num_features = fp_mlps[2][-1]
        r = radii if radii is not None else (None, None)
        self.sa1 = SetAbstraction(in_channels - 3, mlps[0], num_centroids[0], num_neighbors[0], r[0])
        self.sa2 = SetAbstraction(mlps[0][-1], mlps[1], num_centroids[1], num_neighbors[1], r[1])
        self.sa3 = _mlp([mlps[1][-1] + 3, *mlps[2]], nn.ReLU)  # one group of all SA2 centres, [x, position]
        self.fp3 = _mlp([mlps[2][-1] + mlps[1][-1], *fp_mlps[0]], nn.ReLU)
        self.fp2 = _mlp([fp_mlps[0][-1] + mlps[0][-1], *fp_mlps[1]], nn.ReLU)
        self.fp1 = _mlp([fp_mlps[1][-1] + num_categories + in_channels, *fp_mlps[2]], nn.ReLU)
        self.head_hidden = nn.Sequential(*_mlp([fp_mlps[2][-1], head_dim], nn.ReLU), nn.Dropout(drop))
        self.head = nn.Linear(head_dim, num_parts)

    @staticmethod
    def _rows(layer: nn.Module, x: Tensor) -> Tensor:
        """A per-row MLP (Linear + BatchNorm1d) on ``(B, N, C)``."""
        B, N, C = x.shape
        return layer(x.reshape(B * N, C)).view(B, N, -1)

    def forward_features(self, points: Tensor, category: Tensor) -> Tensor:
        """Per-point features ``(B, N, fp_mlps[-1][-1])`` after FP1 (which reads the one-hot category)."""
        check_points(points, "points", channels=self.in_channels)
        B, N, C = points.shape
        self.check_category(category, B)
        pos0 = points[..., :3].contiguous()
        x0 = points[..., 3:] if C > 3 else None
        with input_checks(False):  # validated once above
            x1, pos1 = self.sa1(x0, pos0)  # (B, M1, 128), (B, M1, 3)
            x2, pos2 = self.sa2(x1, pos1)  # (B, M2, 256), (B, M2, 3)
            g = self._rows(self.sa3, torch.cat([x2, pos2.to(x2.dtype)], dim=-1)).amax(dim=1)  # (B, 1024)
            h = self._rows(self.fp3, torch.cat([g[:, None, :].expand(-1, x2.shape[1], -1), x2], dim=-1))  # (B, M2, .)
            h = self._rows(self.fp2, torch.cat([propagate(h, pos2, pos1), x1], dim=-1))  # (B, M1, 128)
            onehot = category_one_hot(category, self.num_categories, h.dtype)[:, None, :].expand(B, N, -1)
            skip = torch.cat([onehot, points.to(h.dtype)], dim=-1)  # (B, N, num_categories + in_channels)
            return self._rows(self.fp1, torch.cat([propagate(h, pos1, pos0), skip], dim=-1))  # (B, N, 128)

    def forward_head(self, x: Tensor, category: Tensor | None = None, pre_logits: bool = False) -> Tensor:
        """Per-point logits ``(B, N, num_parts)`` from FP1's features (the category entered FP1 already)."""
        x = self._rows(self.head_hidden, x)
        return x if pre_logits else self.head(x)

    def forward(self, points: Tensor, category: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(points, category))


@register_model
def pointnet2_ssg_partseg(**kwargs) -> PointNet2PartSeg:
    """PointNet++ SSG part segmentation: N / 4 and N / 16 centres, 32 and 64 neighbours within radii 0.2 and 0.4."""
    return PointNet2PartSeg(**kwargs)
