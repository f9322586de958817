"""Peer models for ModelNet40 classification, built from PyTorch Geometric's message-passing layers.

* DGCNN: Wang et al., "Dynamic Graph CNN for Learning on Point Clouds", ACM TOG 2019, arXiv:1801.07829.
  Four :class:`~torch_geometric.nn.EdgeConv` layers (max aggregation), each on a k-NN graph recomputed in the
  feature space of its input, ``h(x_i, x_j) = LeakyReLU(BN(W [x_i, x_j - x_i]))``; the four outputs are
  concatenated, lifted to 1024 channels, max- and mean-pooled and classified by a 3-layer head. Paper: 1.8 M
  parameters, 92.9 OA.
* PointNet++ (SSG): Qi et al., "PointNet++: Deep Hierarchical Feature Learning on Point Sets in a Metric Space",
  NeurIPS 2017, arXiv:1706.02413. Two set-abstraction layers (farthest point sampling, grouping, a shared MLP on
  ``[x_j, p_j - p_i]`` and max pooling: :class:`~torch_geometric.nn.PointNetConv`), a global set abstraction and
  a 3-layer head. Paper: about 1.5 M parameters, 90.7 OA.

PyG 2.8's own ``knn``, ``knn_graph``, ``fps``, ``radius`` and ``DynamicEdgeConv`` need pyg-lib, which is not
installable here; its message-passing layers work on any ``edge_index``. Every graph is therefore built with this
toolkit's :func:`attention.knn` and :func:`attention.farthest_point_sample` and converted once, by
:func:`knn_edge_index`, from batched ``(B, M, K)`` neighbour indices to PyG's flat ``edge_index``.

Where we deviate from the papers, and why:

* PointNet++ ball query is k-NN plus a radius mask: the K nearest points of each centre, minus those farther than
  the radius. The original ball query takes the first K points inside the ball in storage order and pads with the
  first one; under max aggregation the padding changes nothing, so the only difference is which points of an
  overfull ball are kept (the nearest here, an arbitrary subset there). ``radii=None`` gives plain k-NN grouping.
* Centre and neighbour counts are clamped to the points available (``M <= N``, ``K <= N``, and the same for
  DGCNN's k), so small clouds (the tests' N = 128, the recipe's N = 256) run with the defaults instead of raising;
  the clamp depends on N only, so a model sees the same architecture for the same N in training and evaluation.
* FPS starts at point 0 (deterministic, as in the original CUDA op); the data pipeline shuffles the points.
* DGCNN's first graph is built on xyz only: with normals as input channels (``in_channels=6``) the first EdgeConv
  still sees all six channels, but neighbourhoods are spatial. The original code builds it on its 3-channel input.
* The head BatchNorms normalise over the batch, so in training mode a batch needs at least 2 clouds (as in the
  original implementations); in evaluation mode a batch of 1 works.

PyG is imported when a model is built, not when :mod:`pointcloud` is imported: it adds about 3 s and a ``torch.jit``
deprecation warning to every import of the package.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attention import farthest_point_sample, gather, input_checks, knn
from attention.centroid import resolve_num_centroids
from attention.checks import check_points, input_checks_enabled

from .model import PointClassifier, classifier_head, register_model

__all__ = ["DGCNN", "PointNet2SSG", "SetAbstraction", "knn_edge_index"]


# --------------------------------------------------------------------------------------------------------------------
# Graph construction
# --------------------------------------------------------------------------------------------------------------------


def knn_edge_index(idx: Tensor, num_ref: int, keep: Tensor | None = None) -> Tensor:
    """Batched neighbour indices ``(B, M, K)`` -> PyG's flat ``edge_index`` ``(2, E)``.

    Edge ``(source, target)`` runs from neighbour ``j = idx[b, i, k]`` of centre ``i`` in cloud ``b`` to that centre:
    ``source = b * N + j`` indexes the ``B * N`` flattened reference points, ``target = b * M + i`` the ``B * M``
    flattened centres (the same nodes as the sources when the graph is square, M = N). Edges come sorted by target.

    Args:
        idx: int64 ``(B, M, K)`` indices into the N reference points of each cloud, as returned by
            :func:`attention.knn`.
        num_ref: N, the number of reference points per cloud.
        keep: optional bool ``(B, M, K)``; edges where it is False are dropped (e.g. neighbours outside a radius).

    Returns:
        int64 ``(2, E)`` with ``E = B * M * K`` (or ``keep.sum()``); row 0 sources, row 1 targets.

    Shapes:
        idx, keep: ``(B, M, K)``; output ``(2, E)``.
    """
    if not isinstance(idx, Tensor) or idx.dim() != 3 or idx.is_floating_point():
        shape = tuple(idx.shape) if isinstance(idx, Tensor) else type(idx).__name__
        raise ValueError(f"idx must be an integer (B, M, K) tensor of neighbour indices, got {shape}")
    B, M, K = idx.shape
    if isinstance(num_ref, bool) or not isinstance(num_ref, int) or num_ref < 1:
        raise ValueError(f"num_ref must be a positive int (N reference points per cloud), got {num_ref!r}")
    if input_checks_enabled() and idx.numel() > 0 and bool(((idx < 0) | (idx >= num_ref)).any()):
        raise ValueError(f"idx values must lie in [0, num_ref={num_ref}), got [{int(idx.min())}, {int(idx.max())}]")
    if keep is not None and (keep.shape != idx.shape or keep.dtype != torch.bool):
        raise ValueError(
            f"keep must be a bool tensor of shape {tuple(idx.shape)}, got {keep.dtype} {tuple(keep.shape)}"
        )
    offsets = torch.arange(B, device=idx.device).view(B, 1, 1)
    src = idx.long() + offsets * num_ref  # (B, M, K) into B * N
    dst = (offsets * M + torch.arange(M, device=idx.device).view(1, M, 1)).expand(B, M, K)  # (B, M, K) into B * M
    if keep is not None:
        return torch.stack([src[keep], dst[keep]])
    return torch.stack([src.reshape(-1), dst.reshape(-1)])


# --------------------------------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------------------------------


def _mlp(dims: Sequence[int], act: type[nn.Module], **act_kwargs) -> nn.Sequential:
    """Shared per-row MLP: each layer Linear (no bias, the BatchNorm has one) + BatchNorm1d + activation."""
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b, bias=False), nn.BatchNorm1d(b), act(**act_kwargs)]
    return nn.Sequential(*layers)


class SetAbstraction(nn.Module):
    """PointNet++ set abstraction: FPS centres, grouping by (radius-masked) k-NN, PointNetConv with max pooling.

    ``x'_i = max_{j in N(i)} h([x_j, p_j - p_i])`` (paper Sec. 3.2) with ``h`` a shared MLP over the edges.

    Args:
        in_channels: C, features per input point (0 when the points carry positions only).
        dims: output widths of the shared MLP (its input width is ``C + 3``).
        num_centroids: M, centres chosen by farthest point sampling: a count (clamped to N) or a fraction of N (a
            float in (0, 1]).
        num_neighbors: K, the nearest points grouped around each centre (clamped to N).
        radius: ball-query radius; neighbours farther than it are dropped (the nearest, the centre itself, is
            always kept). None keeps all K.

    Shapes:
        x: ``(B, N, C)`` or None, pos: ``(B, N, 3)``; outputs ``(B, M, dims[-1])`` features and ``(B, M, 3)`` centres.
    """

    def __init__(
        self,
        in_channels: int,
        dims: Sequence[int],
        num_centroids: int | float,
        num_neighbors: int,
        radius: float | None = None,
    ) -> None:
        super().__init__()
        from torch_geometric.nn import PointNetConv

        resolve_num_centroids(num_centroids, 1)  # a positive count or a fraction in (0, 1], else a ValueError
        if num_neighbors < 1:
            raise ValueError(f"num_neighbors must be >= 1, got {num_neighbors}")
        if radius is not None and radius <= 0:
            raise ValueError(f"radius must be positive or None (plain k-NN grouping), got {radius}")
        self.num_centroids = num_centroids
        self.num_neighbors = num_neighbors
        self.radius = radius
        # Self-loops are not added: the centre is a point of the cloud, so it is its own nearest neighbour already.
        self.conv = PointNetConv(_mlp([in_channels + 3, *dims], nn.ReLU), add_self_loops=False)

    def forward(self, x: Tensor | None, pos: Tensor) -> tuple[Tensor, Tensor]:
        B, N, _ = pos.shape
        M, K = min(resolve_num_centroids(self.num_centroids, N), N), min(self.num_neighbors, N)
        centres = gather(pos, farthest_point_sample(pos, M))  # (B, M, 3)
        dist, idx = knn(centres, pos, K)  # (B, M, K), ascending
        keep = None
        if self.radius is not None:
            keep = dist <= self.radius**2
            keep[..., 0] = True  # never an empty group, whatever the rounding
        edge_index = knn_edge_index(idx, N, keep)
        x_src = None if x is None else x.reshape(B * N, -1)
        out = self.conv((x_src, None), (pos.reshape(B * N, 3), centres.reshape(B * M, 3)), edge_index)
        return out.view(B, M, -1), centres


# --------------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------------


class DGCNN(PointClassifier):
    """Dynamic graph CNN: EdgeConv layers on k-NN graphs recomputed in feature space, max + mean pooled head.

    Args:
        num_classes: output classes.
        in_channels: 3 (xyz) or 6 (xyz + normals); the first 3 channels are positions.
        k: neighbours per point in every graph, the point itself included (clamped to N).
        conv_dims: output widths of the EdgeConv layers.
        emb_dim: width of the per-point layer on the concatenated EdgeConv outputs.
        head_dims: hidden widths of the head.
        drop: dropout in the head.

    Shapes:
        points: ``(B, N, in_channels)``; features ``(B, N, emb_dim)``; output logits ``(B, num_classes)``.
    """

    def __init__(
        self,
        num_classes: int = 40,
        in_channels: int = 3,
        k: int = 20,
        conv_dims: Sequence[int] = (64, 64, 128, 256),
        emb_dim: int = 1024,
        head_dims: Sequence[int] = (512, 256),
        drop: float = 0.5,
    ) -> None:
        super().__init__(num_classes, in_channels)
        from torch_geometric.nn import EdgeConv

        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k must be a positive int, got {k!r}")
        self.k = k
        self.num_features = 2 * emb_dim
        leaky = {"negative_slope": 0.2}
        dims = [in_channels, *conv_dims]
        # EdgeConv's message is h([x_i, x_j - x_i]): a Linear on 2C channels, BatchNorm over the edges, max over j.
        self.convs = nn.ModuleList(
            [EdgeConv(_mlp([2 * a, b], nn.LeakyReLU, **leaky), aggr="max") for a, b in itertools.pairwise(dims)]
        )
        self.embed = _mlp([sum(conv_dims), emb_dim], nn.LeakyReLU, **leaky)
        self.head_hidden = classifier_head(self.num_features, head_dims, lambda: nn.LeakyReLU(**leaky), drop)
        self.head = nn.Linear(head_dims[-1] if head_dims else self.num_features, num_classes)

    def forward_features(self, points: Tensor) -> Tensor:
        """Per-point features ``(B, N, emb_dim)`` of a batch of clouds ``(B, N, in_channels)``."""
        check_points(points, "points", channels=self.in_channels)
        B, N, C = points.shape
        k = min(self.k, N)
        x = points.reshape(B * N, C)
        graph_space = points[..., :3]  # the first graph is spatial; later ones use the previous layer's output
        outs = []
        with input_checks(False):  # validated once above; knn need not re-check every layer
            for conv in self.convs:
                _, idx = knn(graph_space, graph_space, k)  # (B, N, k), the point itself first
                x = conv(x, knn_edge_index(idx, N))  # (B * N, C_out)
                outs.append(x)
                graph_space = x.view(B, N, -1)
        return self.embed(torch.cat(outs, dim=-1)).view(B, N, -1)  # (B, N, emb_dim)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Max + mean pooling of ``(B, N, emb_dim)`` features, then the MLP head."""
        x = torch.cat([x.amax(dim=1), x.mean(dim=1)], dim=-1)  # (B, 2 * emb_dim)
        x = self.head_hidden(x)
        return x if pre_logits else self.head(x)


class PointNet2SSG(PointClassifier):
    """PointNet++ single-scale-grouping classifier: two set abstractions, a global one, a 3-layer head.

    Args:
        num_classes: output classes.
        in_channels: 3 (xyz) or 6 (xyz + normals); the first 3 channels are positions, the rest point features.
        num_centroids: (M1, M2), FPS centres of the two set abstractions (clamped to the points available).
        num_neighbors: (K1, K2) grouped neighbours per centre, or one int for both (clamped likewise).
        radii: ball-query radii of the two set abstractions (unit-sphere clouds), or None for plain k-NN.
        mlps: widths of the shared MLPs of SA1, SA2 and the global SA.
        head_dims: hidden widths of the head.
        drop: dropout in the head.

    Shapes:
        points: ``(B, N, in_channels)``; features ``(B, M2, mlps[-1][-1])``; output logits ``(B, num_classes)``.
    """

    def __init__(
        self,
        num_classes: int = 40,
        in_channels: int = 3,
        num_centroids: Sequence[int] = (512, 128),
        num_neighbors: int | Sequence[int] = (32, 64),
        radii: Sequence[float] | None = (0.2, 0.4),
        mlps: Sequence[Sequence[int]] = ((64, 64, 128), (128, 128, 256), (256, 512, 1024)),
        head_dims: Sequence[int] = (512, 256),
        drop: float = 0.5,
    ) -> None:
        super().__init__(num_classes, in_channels)
        if isinstance(num_neighbors, int):
            num_neighbors = (num_neighbors, num_neighbors)
        if len(num_centroids) != 2 or len(num_neighbors) != 2 or len(mlps) != 3:
            raise ValueError(
                f"num_centroids and num_neighbors need 2 entries and mlps 3, got {num_centroids}, {num_neighbors}, "
                f"{len(mlps)} mlps"
            )
        if radii is not None and len(radii) != 2:
            raise ValueError(f"radii needs 2 entries (or None for k-NN grouping), got {radii}")
        self.num_features = mlps[2][-1]
        r = radii if radii is not None else (None, None)
        self.sa1 = SetAbstraction(in_channels - 3, mlps[0], num_centroids[0], num_neighbors[0], r[0])
        self.sa2 = SetAbstraction(mlps[0][-1], mlps[1], num_centroids[1], num_neighbors[1], r[1])
        # Global set abstraction: one group of all remaining centres, MLP on [x, absolute position] (as group_all).
        self.sa3 = _mlp([mlps[1][-1] + 3, *mlps[2]], nn.ReLU)
        self.head_hidden = classifier_head(self.num_features, head_dims, nn.ReLU, drop)
        self.head = nn.Linear(head_dims[-1] if head_dims else self.num_features, num_classes)

    def forward_features(self, points: Tensor) -> Tensor:
        """Features ``(B, M2, C)`` of the second-level centres, before the global max pool."""
        check_points(points, "points", channels=self.in_channels)
        B, N, C = points.shape
        pos = points[..., :3].contiguous()
        x = points[..., 3:] if C > 3 else None  # normals are point features, as in the paper's xyz + normal runs
        with input_checks(False):  # validated once above
            x, pos = self.sa1(x, pos)  # (B, M1, 128), (B, M1, 3)
            x, pos = self.sa2(x, pos)  # (B, M2, 256), (B, M2, 3)
        M = x.shape[1]
        x = self.sa3(torch.cat([x, pos.to(x.dtype)], dim=-1).reshape(B * M, -1))  # (B * M2, 1024)
        return x.view(B, M, -1)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Global max pool of ``(B, M2, C)`` features, then the MLP head."""
        x = self.head_hidden(x.amax(dim=1))  # (B, head_dims[-1])
        return x if pre_logits else self.head(x)


# --------------------------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------------------------


@register_model
def dgcnn_modelnet40(**kwargs) -> DGCNN:
    """DGCNN, k = 20; the recipe's ``num_neighbors`` knob is its ``k``."""
    if "num_neighbors" in kwargs:
        if "k" in kwargs:
            raise ValueError("pass k or num_neighbors (the same knob), not both")
        kwargs["k"] = kwargs.pop("num_neighbors")
    return DGCNN(**{"num_classes": 40, **kwargs})


@register_model
def pointnet2_ssg_modelnet40(**kwargs) -> PointNet2SSG:
    """PointNet++ SSG: 512 and 128 centres, 32 and 64 neighbours within radii 0.2 and 0.4."""
    return PointNet2SSG(**{"num_classes": 40, **kwargs})
