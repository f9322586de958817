"""Part segmentation with the centroid transformer (ShapeNet Part), and the registry of part-segmentation models.

Wu et al., "Centroid Transformers: Learning to Abstract with Attention", arXiv:2102.08606: the paper evaluates the
network on classification only; this is its encoder with the per-point head that DGCNN (Wang et al., arXiv:1801.07829)
and PCT put on theirs for ShapeNet Part::

    p = xyz (B, N, 3[+3 normals]) -> the classifier's encoder, CentroidTransformer.forward_features
      (pointcloud/model.py): SA -> CA -> SA -> CA; each block's features back at the N input points, fused
      -> f (B, N, fuse_dim)
    g = LeakyReLU(W_g [max_n f, mean_n f, onehot(category)])              per shape     (B, global_dim)
    logits = MLP([f_n, p_n, g])                                            per point     (B, N, num_parts)

The encoder carries every centroid stage back to the input points itself, with one KNN search in xyz per point set
(from the N inputs to the stage's points, FPS-chosen by the stored centroid indices of the CA block); the head reads
its fused per-point features and adds no search of its own. Segmentation uses ``upsample="inverse_distance"``: each
input point reads the inverse-distance weighted mean of its 3 nearest stage points (PointNet++'s feature
propagation, :func:`attention.interpolate_neighbors`) instead of the classifier's nearest neighbour, so part
boundaries between two centroids are not cut along their Voronoi cell.

The category enters as a one-hot vector, as ShapeNet Part's protocol gives it (PointNet++ concatenates it to the last
feature-propagation input, DGCNN and PCT to the global feature as here). Each point's own input channels (xyz, and
normals when given) join its features in the head, as in PointNet++'s last feature propagation: the head sees the
exact position and normal that interpolated stage features only approximate (measured in docs/benchmarks.md). The
logits cover all ``num_parts`` global part labels; evaluation takes the arg-max over the category's parts
(:mod:`pointcloud.partseg.metrics`).

The part-segmentation models have their own registry (``list_models()`` here: this module's model and the PointNet++
peer of :mod:`pointcloud.partseg.peers`), because their forward takes ``(points, category)`` and returns per-point
logits; :func:`engine.registry.create_by_name` and ``tools/export_weights.py`` find them like any other.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn

from attention.checks import check_index
from engine.registry import ModelRegistry

from ..model import (
    CentroidTransformer,
    PointBatchNorm,
    PointModel,
    _leaky,
    classifier_head,
    example_clouds,
    linear_head,
)

__all__ = [
    "MODELS",
    "CentroidPartSeg",
    "PartSegModel",
    "category_one_hot",
    "create_model",
    "list_models",
    "point_head",
    "register_model",
]


def category_one_hot(category: Tensor, num_categories: int, dtype: torch.dtype) -> Tensor:
    """``(B,)`` category indices -> ``(B, num_categories)`` one-hot rows (a comparison, traceable by torch.export)."""
    return (category[:, None] == torch.arange(num_categories, device=category.device)).to(dtype)


def point_head(in_dim: int, hidden: Sequence[int], act, drop: float) -> nn.Sequential:
    """Hidden layers of a per-point head on ``(B, N, C)``: Linear + BatchNorm over batch x points + act + dropout."""
    return classifier_head(in_dim, hidden, act, drop, norm=PointBatchNorm)


class PartSegModel(PointModel):
    """The surface shared by the part-segmentation models: ``forward(points, category)`` -> ``(B, N, num_parts)``.

    Subclasses set ``num_parts``, ``num_categories``, ``in_channels``, ``head`` (the final Linear) and implement
    ``forward_features(points)`` and ``forward_head(x, category, pre_logits=False)``.
    """

    num_parts: int
    num_categories: int
    in_channels: int

    def reset_classifier(self, num_parts: int) -> None:
        self.num_parts = num_parts
        self.head = linear_head(self.head.in_features, num_parts)

    def check_category(self, category: Tensor, batch: int) -> None:
        """``category`` must be ``(B,)`` integer indices in ``[0, num_categories)`` (eager mode only)."""
        check_index(category, "category", batch=batch, device=category.device, shape=(batch,), dims="(B,)",
                    bound=self.num_categories, of=f"{self.num_categories} categories")  # fmt: skip

    def forward(self, points: Tensor, category: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(points), category)


class CentroidPartSeg(PartSegModel):
    """The centroid transformer's encoder with a per-point part classifier (see the module docstring).

    Args:
        num_parts: global part labels (50 in ShapeNet Part).
        num_categories: object categories (16 in ShapeNet Part), given as a one-hot input.
        in_channels: 3 (xyz) or 6 (xyz + normals).
        upsample: how the centroid stages reach the input points: ``"inverse_distance"`` (3 nearest) or
            ``"nearest"`` (:data:`pointcloud.model.UPSAMPLE`).
        global_dim: width of the per-shape vector (pooled features and category) given to every point.
        head_dims: hidden widths of the per-point head.
        drop: dropout in the per-point head.
        **encoder_kwargs: the encoder's other arguments, with its defaults: those of
            :class:`pointcloud.CentroidTransformer` but the head's (``widths``, ``num_centroids``, ``num_neighbors``,
            ``num_heads``, ``num_steps``, ``init``, ``kmeans_iters``, ``mlp_ratio``, ``fuse_dim``, ``mixer``,
            ``mixer_kwargs``, ``attn_backend``), and ``embed="point"``: on the synthetic parts it measured level with
            ``"edge"`` and far above the classifier's default ``"local"``, which sees no absolute position and cannot
            tell a part by where it lies in the shape (docs/guides/part-segmentation.md).

    Shapes:
        points: ``(B, N, in_channels)``; category: ``(B,)`` int64; features ``(B, N, fuse_dim + in_channels)``;
        output logits ``(B, N, num_parts)``.
    """

    def __init__(
        self,
        num_parts: int = 50,
        num_categories: int = 16,
        in_channels: int = 3,
        upsample: str = "inverse_distance",
        global_dim: int = 256,
        head_dims: Sequence[int] = (256, 128),
        drop: float = 0.5,
        **encoder_kwargs,
    ) -> None:
        super().__init__()
        if num_parts < 1 or num_categories < 1:
            raise ValueError(f"num_parts and num_categories must be >= 1, got {num_parts} and {num_categories}")
        self.num_parts = num_parts
        self.num_categories = num_categories
        self.in_channels = in_channels
        # the classifier's network without its head, read at its fused per-point features
        encoder_kwargs = {"embed": "point", **encoder_kwargs}
        self.encoder = CentroidTransformer(
            num_classes=0, in_channels=in_channels, head_dims=(), upsample=upsample, **encoder_kwargs
        )
        self.fuse_dim = self.encoder.fuse_dim
        self.num_features = self.fuse_dim + in_channels
        # No BatchNorm on the per-shape vector: its statistics would come from the few shapes of a batch.
        self.global_proj = nn.Sequential(nn.Linear(2 * self.fuse_dim + num_categories, global_dim), _leaky())
        self.head_hidden = point_head(self.num_features + global_dim, head_dims, _leaky, drop)
        self.head = nn.Linear(head_dims[-1] if head_dims else self.num_features + global_dim, num_parts)

    def forward_features(self, points: Tensor) -> Tensor:
        """Per-point features ``(B, N, fuse_dim + in_channels)``: the fused encoder features (every centroid stage
        carried back to the points), then the point's own input channels."""
        return torch.cat([self.encoder.forward_features(points), points], dim=-1)

    def forward_head(self, x: Tensor, category: Tensor, pre_logits: bool = False) -> Tensor:
        """Per-point logits ``(B, N, num_parts)`` from features ``(B, N, fuse_dim + in_channels)`` and categories
        ``(B,)``; the per-shape vector pools the encoder's part of the features."""
        B, N, C = x.shape
        self.check_category(category, B)
        onehot = category_one_hot(category, self.num_categories, x.dtype)  # (B, num_categories)
        f = x[..., : self.fuse_dim]  # (B, N, fuse_dim)
        g = self.global_proj(torch.cat([f.amax(dim=1), f.mean(dim=1), onehot], dim=-1))  # (B, global_dim)
        x = self.head_hidden(torch.cat([x, g[:, None, :].expand(B, N, -1)], dim=-1))  # (B, N, head_dims[-1])
        return x if pre_logits else self.head(x)


# --------------------------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------------------------


# create_model: kwargs override a model's defaults (e.g. ``num_steps=2``); checkpoint= loads exported weights
def _example_inputs(model: nn.Module, config: dict) -> tuple[Tensor, Tensor]:
    """Two clouds of the run's ``num_points`` (2048 by default, ShapeNet Part's) and their categories."""
    return example_clouds(model, config, default_points=2048), torch.arange(2) % model.num_categories


MODELS, register_model, list_models, create_model = ModelRegistry(
    "point part segmentation", example_inputs=_example_inputs
).exports()


@register_model
def centroid_transformer_partseg(**kwargs) -> CentroidPartSeg:
    """The centroid transformer's encoder (FPS init, T = 1) with the per-point head; ShapeNet Part's 50 parts."""
    return CentroidPartSeg(**kwargs)
