"""Peer models for ModelNet40 classification: PointNet, and DGCNN and PointNet++ from PyTorch Geometric's
message-passing layers.

* PointNet: Qi et al., "PointNet: Deep Learning on Point Sets for 3D Classification and Segmentation", CVPR 2017,
  arXiv:1612.00593. A shared per-point MLP 64-64 | 64-128-1024 (each layer Linear + BatchNorm + ReLU), a global max
  pool and a head FC 512-256-k (BatchNorm, ReLU, dropout 0.3 after each hidden layer, as the authors' code). With the
  transforms (``pointnet_modelnet40``): an input T-Net predicts a 3 x 3 matrix applied to the xyz of every point, a
  feature T-Net a 64 x 64 one applied between the two MLPs, each a small PointNet (shared MLP 64-128-1024, max pool,
  FC 512-256, a last layer initialized near the identity), and the feature matrix A is pulled towards orthogonality by
  ``0.001 ||I - A A^T||_F^2`` added to the loss (:attr:`PointNet.aux_loss`). Without them
  (``pointnet_vanilla_modelnet40``): the same MLPs and head. PointNet paper (Table 6): 3.5 M params, 440 M
  FLOPs per sample with the transforms, 89.2 OA; vanilla 0.8 M, 148 M FLOPs, 87.1 OA (its FLOPs count one
  multiply-add as one, i.e. they are MACs). The centroid paper's Table 2 row "PointNet 89.2 OA, 0.8 M, 0.3 GMACs"
  pairs the full model's accuracy with the vanilla model's parameter count.
* DGCNN: Wang et al., "Dynamic Graph CNN for Learning on Point Clouds", ACM TOG 2019, arXiv:1801.07829.
  Four :class:`~torch_geometric.nn.EdgeConv` layers (max aggregation), each on a k-NN graph recomputed in the
  feature space of its input, ``h(x_i, x_j) = LeakyReLU(BN(W [x_i, x_j - x_i]))``; the four outputs are
  concatenated, lifted to 1024 channels, max- and mean-pooled and classified by a 3-layer head. Paper: 1.8 M
  parameters, 92.9 OA (the centroid paper's Table 2 lists 92.8).
* PointNet++ (SSG): Qi et al., "PointNet++: Deep Hierarchical Feature Learning on Point Sets in a Metric Space",
  NeurIPS 2017, arXiv:1706.02413. Two set-abstraction layers (farthest point sampling, grouping, a shared MLP on
  ``[x_j, p_j - p_i]`` and max pooling: :class:`~torch_geometric.nn.PointNetConv`), a global set abstraction and
  a 3-layer head. Paper: about 1.5 M parameters, 90.7 OA from xyz (91.9 with normals, the figure the centroid
  paper's Table 2 lists).

PyG 2.8's own ``knn``, ``knn_graph``, ``fps``, ``radius`` and ``DynamicEdgeConv`` need pyg-lib, which has no wheels
for every torch release; its message-passing layers work on any ``edge_index``. Every graph is therefore built with this
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

PyG is imported when a model is built, not when :mod:`pointcloud` is imported: it adds seconds and a ``torch.jit``
deprecation warning to every import of the package.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attention import farthest_point_sample, gather, input_checks, knn
from attention.centroid import resolve_num_centroids
from attention.checks import check_points, input_checks_enabled

from .model import PointClassifier, classifier_head, register_model

_logger = logging.getLogger(__name__)

__all__ = ["DGCNN", "PointNet", "PointNet2SSG", "SetAbstraction", "TNet", "knn_edge_index"]


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


class TNet(nn.Module):
    """PointNet's transform net: a shared MLP (C -> 64 -> 128 -> 1024) on every point, a max pool, FC 512 -> 256, and a
    last Linear to ``k x k`` whose bias is the identity, so training starts from ``A ~ I``. Its weight starts small
    (std 1e-3) rather than at the original's exact zero, which would leave every layer before it without a gradient
    on the first step.

    Args:
        k: size of the predicted matrix.
        in_channels: C, input channels per point (default k).

    Shapes:
        x: ``(B, N, C)``; output: ``(B, k, k)``.
    """

    def __init__(self, k: int, in_channels: int | None = None) -> None:
        super().__init__()
        self.k = k
        self.mlp = _mlp([in_channels or k, 64, 128, 1024], nn.ReLU)
        self.fc = _mlp([1024, 512, 256], nn.ReLU)
        self.out = nn.Linear(256, k * k)
        nn.init.normal_(self.out.weight, std=1e-3)
        with torch.no_grad():
            self.out.bias.copy_(torch.eye(k).flatten())

    def forward(self, x: Tensor) -> Tensor:
        B, N, C = x.shape
        h = self.mlp(x.reshape(B * N, C)).view(B, N, -1).amax(dim=1)  # (B, 1024)
        return self.out(self.fc(h)).view(B, self.k, self.k)


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


class PointNet(PointClassifier):
    """PointNet classifier: optional input / feature transforms, shared MLP 64-64 | 64-128-1024, max pool, FC head.

    Args:
        num_classes: output classes.
        in_channels: 3 (xyz) or 6 (xyz + normals); the input transform acts on xyz (the normals pass unchanged, as in
            the common PyTorch ports).
        input_transform: predict and apply the 3 x 3 input transform.
        feature_transform: predict and apply the 64 x 64 feature transform.
        reg_weight: weight of the feature transform's orthogonality loss ``||I - A A^T||_F^2`` (mean over the batch),
            left in :attr:`aux_loss` by each training forward for the recipe to add to the loss.
        head_dims: hidden widths of the head.
        drop: dropout after each hidden layer of the head.

    Shapes:
        points: ``(B, N, in_channels)``; features ``(B, N, 1024)``; output logits ``(B, num_classes)``.
    """

    def __init__(
        self,
        num_classes: int = 40,
        in_channels: int = 3,
        input_transform: bool = True,
        feature_transform: bool = True,
        reg_weight: float = 0.001,
        head_dims: Sequence[int] = (512, 256),
        drop: float = 0.3,
    ) -> None:
        super().__init__(num_classes, in_channels)
        if reg_weight < 0:
            raise ValueError(f"reg_weight must be >= 0, got {reg_weight}")
        self.reg_weight = reg_weight
        self.num_features = 1024
        self.input_tnet = TNet(3, in_channels) if input_transform else None
        self.mlp1 = _mlp([in_channels, 64, 64], nn.ReLU)
        self.feature_tnet = TNet(64) if feature_transform else None
        self.mlp2 = _mlp([64, 64, 128, 1024], nn.ReLU)
        self.head_hidden = classifier_head(self.num_features, head_dims, nn.ReLU, drop)
        self.head = nn.Linear(head_dims[-1] if head_dims else self.num_features, num_classes)
        self.aux_loss: Tensor | None = None  # the last training forward's orthogonality loss (None in eval)

    def forward_features(self, points: Tensor) -> Tensor:
        """Per-point features ``(B, N, 1024)`` of a batch of clouds ``(B, N, in_channels)``."""
        check_points(points, "points", channels=self.in_channels)
        B, N, C = points.shape
        x = points
        if self.input_tnet is not None:
            xyz = torch.bmm(points[..., :3], self.input_tnet(points))  # (B, N, 3): row vectors times A
            x = torch.cat([xyz, points[..., 3:]], dim=-1)
        x = self.mlp1(x.reshape(B * N, C)).view(B, N, 64)
        self.aux_loss = None
        if self.feature_tnet is not None:
            a = self.feature_tnet(x)  # (B, 64, 64)
            x = torch.bmm(x, a)
            if self.training and self.reg_weight > 0:
                eye = torch.eye(64, device=a.device, dtype=a.dtype)
                self.aux_loss = self.reg_weight * (eye - a @ a.transpose(1, 2)).square().sum((1, 2)).mean()
        return self.mlp2(x.reshape(B * N, 64)).view(B, N, -1)  # (B, N, 1024)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Global max pool of ``(B, N, 1024)`` features, then the MLP head."""
        x = self.head_hidden(x.amax(dim=1))  # (B, head_dims[-1])
        return x if pre_logits else self.head(x)


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


def _pointnet(input_transform: bool, kwargs: dict) -> PointNet:
    # the recipe's K knob means nothing to PointNet (it has no neighbourhoods): accepted so that the same command
    # line trains every peer
    if kwargs.pop("num_neighbors", None) is not None:
        _logger.info("PointNet has no neighbourhoods: num_neighbors ignored")
    kwargs.setdefault("feature_transform", input_transform)
    return PointNet(**{"num_classes": 40, "input_transform": input_transform, **kwargs})


@register_model
def pointnet_modelnet40(**kwargs) -> PointNet:
    """PointNet with the input (3 x 3) and feature (64 x 64) transforms and the 0.001 orthogonality loss."""
    return _pointnet(True, kwargs)


@register_model
def pointnet_vanilla_modelnet40(**kwargs) -> PointNet:
    """PointNet without transforms (the PointNet paper's "vanilla" row)."""
    return _pointnet(False, kwargs)


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
