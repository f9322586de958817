"""Centroid transformer for point-cloud classification (ModelNet40).

Wu et al., "Centroid Transformers: Learning to Abstract with Attention", arXiv:2102.08606, section 3.2.

The network (paper Fig. 3), with N input points::

    xyz (B, N, 3[+3 normals]) -> per-point embedding (C0 = 64; the paper's MLP of each point, or by default a maximum
                                 over its K nearest points of that MLP of their offsets, ``embed``)
      -> SA  (64,  N  points, attention over the K nearest points in xyz)
      -> CA  (128, N  -> N1 centroids, FPS init in xyz, K nearest inputs in feature space, T steps)
      -> SA  (128, N1 points)
      -> CA  (512, N1 -> N2 centroids)
    each block's output is upsampled back to the N input points by nearest neighbour in xyz, the four are
    concatenated (64 + 128 + 128 + 512 = 832 channels) and fused by a per-point linear layer, then max- and
    average-pooled; the two pooled vectors go through a 3-layer MLP head. LeakyReLU(0.2) everywhere.

The paper's text lost N1, N2 and K; they are constructor knobs (``num_centroids``, ``num_neighbors``). The defaults,
N1 = N / 2, N2 = N1 / 2 (512 and 256 centroids at N = 1024) and K = 24, are chosen to match the paper's 4.1 M params
and 5.4 GMACs: 3.57 M params, and 5.39 GMACs when the key/value projections of the KNN attention are evaluated per
(centroid, neighbour) edge, the only reading under which N1, N2 and K set the count (``tools/model_stats.py`` explains
it and prints both counts), in the paper's reading (``layer_scale=None, sa_pos_encoding=False, embed="point"``; the
default's SA position encoding adds 4 K params, 0.01 GMACs and 0.05 per edge, and its local embedding runs the
embedding's MLP once per (point, neighbour) edge instead of once per point). Our implementation projects each point
once and gathers keys and values, the same function at 1.49 GMACs. Width changes happen in a linear layer in front of
each block whose width differs from the previous one.

Ablation twins (paper Table 3): ``num_steps=0`` keeps the centroid blocks' init (FPS, random or k-means
downsampling) and their MLP but drops the attention step.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from functools import partial

import torch
from torch import Tensor, nn

from attention import (
    CentroidBlock,
    MixerBlock,
    SelfAttentionBlock,
    build_mixer,
    gather,
    input_checks,
    interpolate_neighbors,
    knn,
)
from attention.centroid import resolve_num_centroids
from attention.checks import check_points
from engine.registry import ModelRegistry

__all__ = [
    "CA_NEIGHBORS",
    "EMBEDS",
    "MODELS",
    "UPSAMPLE",
    "CentroidTransformer",
    "PointBatchNorm",
    "PointClassifier",
    "PointModel",
    "classifier_head",
    "create_model",
    "example_clouds",
    "linear_head",
    "list_models",
    "register_model",
]


CA_NEIGHBORS: dict[str, str] = {"feature": "feature", "xyz": "pos"}
"""Where the centroid blocks' centroids find their K neighbours -> :data:`attention.NEIGHBOR_SPACES` name."""

EMBEDS = ("point", "local", "edge")
"""How the centroid transformer embeds its input points: ``"point"``, an MLP of each point's own channels (absolute
xyz: the paper); ``"local"``, a maximum over the point's K nearest points in xyz of an MLP of their offsets (and
their channels past xyz), PointNet++'s first set abstraction without the downsampling; or ``"edge"``, the same maximum
of an MLP of ``[x_i, x_j - x_i]`` (the point's own channels and each neighbour's differences), DGCNN's first EdgeConv
with its neighbours in xyz."""

# Each embedding's MLP is named by what it reads: the local and point MLPs have the same weights' shapes, and a
# checkpoint of one must not load silently into another.
EMBED_MODULES = {"point": "embed", "local": "local_embed", "edge": "edge_embed"}

UPSAMPLE: dict[str, int] = {"nearest": 1, "inverse_distance": 3}
"""How a stage's features reach the N input points -> the neighbours (in xyz) each input point reads: its nearest
stage point, or the inverse-distance weighted mean of the 3 nearest (PointNet++'s feature propagation)."""


def _leaky() -> nn.Module:
    return nn.LeakyReLU(0.2)


class PointBatchNorm(nn.BatchNorm1d):
    """BatchNorm over the batch and point axes of ``(B, N, C)`` features (a BatchNorm1d on channels)."""

    def forward(self, x: Tensor) -> Tensor:
        # As (B * N, C) rows, not transposed to (B, C, N): the output keeps the layout of the Linear layers around
        # it, which would otherwise copy the transposed tensor in the forward and in the backward pass.
        B, N, C = x.shape
        return super().forward(x.reshape(B * N, C)).view(B, N, C)


def classifier_head(
    in_dim: int,
    hidden: Sequence[int],
    act: Callable[[], nn.Module],
    drop: float,
    norm: Callable[[int], nn.Module] = nn.BatchNorm1d,
) -> nn.Sequential:
    """Hidden layers of a classification head: Linear + ``norm`` (BatchNorm1d on ``(B, C)`` rows; PointBatchNorm for
    a per-point head on ``(B, N, C)``) + activation + dropout per layer."""
    layers: list[nn.Module] = []
    for h in hidden:
        layers += [nn.Linear(in_dim, h, bias=False), norm(h), act(), nn.Dropout(drop)]
        in_dim = h
    return nn.Sequential(*layers)


def linear_head(in_features: int, num_outputs: int) -> nn.Module:
    """A model's final layer: a Linear to ``num_outputs``, or an Identity for 0 (the features, as timm's
    ``num_classes=0``)."""
    return nn.Linear(in_features, num_outputs) if num_outputs > 0 else nn.Identity()


class PointModel(nn.Module):
    """What every point model answers under timm's names: its final layer ``head`` (set by the subclass) and the
    parameters kept from weight decay (none)."""

    head: nn.Module

    def no_weight_decay(self) -> set[str]:
        return set()

    def get_classifier(self) -> nn.Module:
        return self.head


class PointClassifier(PointModel):
    """The model surface shared by the point-cloud classifiers: subclasses pass ``num_classes`` and ``in_channels``
    (checked here: positions come first), set ``head`` (the final Linear) and implement ``forward_features`` and
    ``forward_head``."""

    num_classes: int
    in_channels: int

    def __init__(self, num_classes: int, in_channels: int = 3) -> None:
        super().__init__()
        if in_channels < 3:
            raise ValueError(f"in_channels must be >= 3 (xyz first), got {in_channels}")
        self.num_classes = num_classes
        self.in_channels = in_channels

    def reset_classifier(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.head = linear_head(self.head.in_features, num_classes)

    def forward(self, points: Tensor) -> Tensor:
        return self.forward_head(self.forward_features(points))


class CentroidTransformer(PointClassifier):
    """SA -> CA -> SA -> CA point-cloud classifier with multi-scale fusion.

    Args:
        num_classes: output classes.
        in_channels: 3 (xyz) or 6 (xyz + normals); the first 3 channels are positions.
        widths: channels of the four blocks.
        num_centroids: (N1, N2), centroids after the first and second centroid block: ints, or fractions of each
            block's input (floats in (0, 1]; the default (0.5, 0.5) gives 512 and 256 centroids at N = 1024).
        num_neighbors: K of every block (xyz KNN in SA blocks, feature-space KNN in CA blocks).
        num_heads: attention heads.
        num_steps: T, centroid-attention steps; 0 gives the downsampling-only ablation twin.
        init: centroid init of the CA blocks: ``"fps"``, ``"random"`` or ``"kmeans"``.
        kmeans_iters: Lloyd iterations of the k-means init.
        mlp_ratio: hidden width of the blocks' MLPs.
        fuse_dim: width of the per-point fusion layer (its max and mean pools feed the head).
        head_dims: hidden widths of the 3-layer head.
        drop: dropout in the head.
        upsample: how each block's features reach the N input points (:data:`UPSAMPLE`): ``"nearest"`` (the paper)
            or ``"inverse_distance"`` (3 nearest, as PointNet++'s feature propagation). Either is one KNN search per
            point set in xyz, from the input points to the stage's.
        mixer: None (default): the SA blocks attend over each point's K nearest points in xyz. A name from
            :data:`attention.MIXERS` (``"softmax"``, ``"hydra"``, ``"fsat"``, ...) replaces that KNN attention in both
            SA blocks by a global sequence mixer over all points of the stage (a :class:`attention.MixerBlock`).
            Points have no order: Toeplitz, Vandermonde, Hydra and FSAT mix in the order the points arrive (input
            order, then FPS order); softmax, linear and Cauchy are permutation-equivariant.
        mixer_kwargs: extra arguments of :func:`attention.build_mixer` (``max_len`` for ``fsat`` and the twins).
        attn_backend: form of every block's KNN attention (:class:`attention.CentroidAttention`): ``"gather"``,
            ``"masked"`` (dense products under the neighbour mask), ``"triton"`` (the fused kernel, CUDA) or
            ``"auto"`` (on CUDA the fused kernel; without triton the masked form while a stage's N / K <= 128, as at
            1024 points, where it trains faster than the gather form: ``tools/bench_modelnet.py --attn-backends``;
            on CPU the gather form).
        sa_pos_encoding: add a learned encoding of each neighbour's offset ``p_j - p_i`` in xyz to its key and value
            in both SA blocks (:class:`attention.RelativePositionEncoding`, Point Transformer's form). None (default):
            on for the KNN SA blocks, which measured above the blocks without it for both the centroid model and its
            twins (docs/ablations.md, table ``modelnet_levers``), off with a global ``mixer`` (no neighbours to
            encode); False: the paper's blocks. It changes the twins too: they share the SA blocks.
        ca_pos_encoding: the same in the centroid-attention step of both CA blocks (offset of each input from the
            centroid's position).
        ca_neighbors: where each centroid finds its K neighbours: ``"feature"`` (the paper: feature space, recomputed
            every step) or ``"xyz"`` (the K input points nearest the centroid in xyz).
        ca_normalize: the CA blocks' normalization of the attention weights, ``"inputs"`` or ``"centroids"``
            (:class:`attention.CentroidAttention`).
        layer_scale: a float scales the centroid step's update per channel by a learned factor initialised to that
            value; the default 0.0 starts each centroid block as its downsampling-only twin, which measured above
            both the twin and the unscaled update (docs/ablations.md, table ``modelnet_levers``). None adds the
            update as it is: the paper's reading (``configs/pointcloud/modelnet40_centroid_t1_paper.yaml``).
        pos_hidden: hidden width of the position encodings' MLPs.
        ca_num_neighbors: K of the centroid blocks' attention when it differs from the SA blocks' ``num_neighbors``
            (None: the same K); at most N1, the second centroid block's inputs.
        ca_num_heads: heads of the centroid blocks' attention when they differ from ``num_heads`` (None: the same);
            each head chooses its own neighbours for its share of the channels.
        sa_aggregation: how the KNN SA blocks read their neighbours (:data:`attention.AGGREGATIONS`): ``"dot"`` (the
            paper) or ``"vector"`` (grouped vector attention with ``sa_num_heads`` groups; with ``sa_pos_encoding``,
            Point Transformer's layer). It changes the twins too.
        sa_num_heads: heads (or vector-attention groups) of the SA blocks when they differ from ``num_heads``.
        ca_aggregation: how the centroid step reads its neighbours (:data:`attention.AGGREGATIONS`): ``"dot"`` (the
            paper's multi-head attention), ``"vector"`` (grouped vector attention, ``ca_num_heads`` groups of channels
            each weighing its own neighbours, Point Transformer v2's form) or ``"max"`` (a per-channel maximum over
            the neighbours, PointNet++'s pool).
        embed: how the input points become the first block's features (:data:`EMBEDS`): ``"local"`` (default: a
            per-channel maximum over its ``num_neighbors`` nearest points of an MLP of their offsets ``p_j - p_i`` and
            normals, translation-invariant, as PointNet++'s first layer; it measured above the point embedding for
            the centroid model and its twins, docs/ablations.md, table ``modelnet_levers``), ``"point"`` (the paper:
            the same MLP of each point's xyz and normals) or ``"edge"`` (DGCNN's EdgeConv input ``[x_i, x_j - x_i]``
            over the same neighbours: local shape and absolute position). It changes the twins too.

    Shapes:
        points: ``(B, N, in_channels)``; output logits ``(B, num_classes)`` (``num_classes=0``: the pooled features
        ``(B, 2 * fuse_dim)`` after the hidden head layers).
    """

    def __init__(
        self,
        num_classes: int = 40,
        in_channels: int = 3,
        widths: Sequence[int] = (64, 128, 128, 512),
        num_centroids: Sequence[int | float] = (0.5, 0.5),
        num_neighbors: int = 24,
        num_heads: int = 4,
        num_steps: int = 1,
        init: str = "fps",
        kmeans_iters: int = 3,
        mlp_ratio: float = 2.0,
        fuse_dim: int = 512,
        head_dims: Sequence[int] = (512, 256),
        drop: float = 0.5,
        upsample: str = "nearest",
        mixer: str | None = None,
        mixer_kwargs: dict | None = None,
        attn_backend: str = "auto",
        sa_pos_encoding: bool | None = None,
        ca_pos_encoding: bool = False,
        ca_neighbors: str = "feature",
        ca_normalize: str = "inputs",
        layer_scale: float | None = 0.0,
        pos_hidden: int = 16,
        ca_num_neighbors: int | None = None,
        ca_num_heads: int | None = None,
        ca_aggregation: str = "dot",
        sa_aggregation: str = "dot",
        sa_num_heads: int | None = None,
        embed: str = "local",
    ) -> None:
        super().__init__(num_classes, in_channels)
        if len(widths) != 4 or len(num_centroids) != 2:
            raise ValueError(f"widths needs 4 entries and num_centroids 2, got {widths} and {num_centroids}")
        if init not in ("fps", "random", "kmeans"):
            raise ValueError(f"init must be 'fps', 'random' or 'kmeans', got {init!r}")
        if upsample not in UPSAMPLE:
            raise ValueError(f"upsample must be one of {sorted(UPSAMPLE)}, got {upsample!r}")
        if embed not in EMBEDS:
            raise ValueError(f"embed must be one of {list(EMBEDS)}, got {embed!r}")
        if ca_neighbors not in CA_NEIGHBORS:
            raise ValueError(f"ca_neighbors must be one of {sorted(CA_NEIGHBORS)}, got {ca_neighbors!r}")
        if sa_pos_encoding and mixer is not None:
            raise ValueError(f"sa_pos_encoding applies to the KNN SA blocks, not to a global mixer ({mixer!r})")
        if sa_aggregation != "dot" and mixer is not None:
            raise ValueError(f"sa_aggregation applies to the KNN SA blocks, not to a global mixer ({mixer!r})")
        if sa_pos_encoding is None:
            sa_pos_encoding = mixer is None
        self.num_centroids = tuple(num_centroids)
        self.embed_mode = embed
        self.num_neighbors = num_neighbors
        self.ca_num_neighbors = num_neighbors if ca_num_neighbors is None else ca_num_neighbors
        self.upsample_neighbors = UPSAMPLE[upsample]
        self.fuse_dim = fuse_dim
        self.num_features = 2 * fuse_dim
        act = _leaky
        block = partial(dict, num_heads=num_heads, mlp_ratio=mlp_ratio, act_layer=act, attn_backend=attn_backend)
        sa = {"pos_encoding": sa_pos_encoding, "pos_hidden": pos_hidden}
        if mixer is None:  # a global mixer block takes neither
            sa.update(aggregation=sa_aggregation, num_heads=num_heads if sa_num_heads is None else sa_num_heads)
        ca = {"neighbor_space": CA_NEIGHBORS[ca_neighbors], "pos_encoding": ca_pos_encoding, "pos_hidden": pos_hidden,
              "normalize": ca_normalize, "layer_scale": layer_scale, "aggregation": ca_aggregation}  # fmt: skip
        ca_block = partial(block, num_heads=num_heads if ca_num_heads is None else ca_num_heads)
        embed_in = 2 * in_channels if embed == "edge" else in_channels  # edge: [x_i, x_j - x_i]
        embed_mlp = nn.Sequential(
            nn.Linear(embed_in, widths[0], bias=False), PointBatchNorm(widths[0]), act(),
            nn.Linear(widths[0], widths[0], bias=False), PointBatchNorm(widths[0]), act(),
        )  # fmt: skip
        setattr(self, EMBED_MODULES[embed], embed_mlp)  # named by its mode: a checkpoint never crosses modes
        init_kwargs: Callable[[int], dict] = lambda m: (  # noqa: E731
            {"num_centroids": m, "num_iters": kmeans_iters} if init == "kmeans" else {"num_centroids": m}
        )
        self.blocks = nn.ModuleList(
            [
                self._sa_block(widths[0], num_neighbors, mixer, mixer_kwargs, block(**sa)),
                CentroidBlock(
                    widths[1], init, init_kwargs(num_centroids[0]), num_neighbors=self.ca_num_neighbors,
                    num_steps=num_steps, **ca_block(**ca),
                ),
                self._sa_block(widths[2], num_neighbors, mixer, mixer_kwargs, block(**sa)),
                CentroidBlock(
                    widths[3], init, init_kwargs(num_centroids[1]), num_neighbors=self.ca_num_neighbors,
                    num_steps=num_steps, **ca_block(**ca),
                ),
            ]
        )  # fmt: skip
        dims = [widths[0], *widths]
        self.transitions = nn.ModuleList(
            [nn.Identity() if a == b else nn.Linear(a, b) for a, b in itertools.pairwise(dims)]
        )
        # Per-point layers (embedding, fusion) use BatchNorm over batch x points, as DGCNN and PCT do: its statistics
        # come from thousands of points per batch. The head uses LayerNorm: a BatchNorm over the few pooled vectors
        # of a batch made eval accuracy swing between epochs, and without BatchNorm in the per-point layers the
        # network did not learn at all (chance accuracy).
        self.fuse = nn.Sequential(nn.Linear(sum(widths), fuse_dim, bias=False), PointBatchNorm(fuse_dim), act())
        self.head_hidden = classifier_head(self.num_features, head_dims, act, drop)
        self.head = linear_head(head_dims[-1] if head_dims else self.num_features, num_classes)

    @staticmethod
    def _sa_block(dim: int, num_neighbors: int, mixer: str | None, mixer_kwargs: dict | None, kw: dict) -> nn.Module:
        """An SA block: KNN self-attention, or a global :class:`MixerBlock` with the named sequence mixer."""
        if mixer is None:
            return SelfAttentionBlock(dim, num_neighbors=num_neighbors, **kw)
        mixer_module = build_mixer(mixer, dim, num_heads=kw["num_heads"], **(mixer_kwargs or {}))
        return MixerBlock(dim, mixer_module, mlp_ratio=kw["mlp_ratio"], act_layer=kw["act_layer"])  # no KNN attention

    def stage_sizes(self, num_points: int) -> tuple[int, int]:
        """(N1, N2): the centroid counts of the two centroid blocks for clouds of ``num_points`` points."""
        n1 = resolve_num_centroids(self.num_centroids[0], num_points)
        return n1, resolve_num_centroids(self.num_centroids[1], n1)

    def forward_features(self, points: Tensor) -> Tensor:
        """Per-point fused features ``(B, N, fuse_dim)`` of a batch of clouds ``(B, N, in_channels)``."""
        check_points(points, "points", channels=self.in_channels)
        B, N, _ = points.shape
        n1, n2 = self.stage_sizes(N)
        if not N >= n1 >= n2 >= 1:
            raise ValueError(
                f"num_centroids={self.num_centroids} gives N1={n1}, N2={n2} for N={N} points: need N >= N1 >= N2; "
                "lower num_centroids or feed more points"
            )
        if self.num_neighbors > n1:
            raise ValueError(
                f"num_neighbors K={self.num_neighbors} exceeds the N1={n1} points of the second stage (N={N}): "
                "need K <= N1"
            )
        if self.ca_num_neighbors > n1:
            raise ValueError(
                f"ca_num_neighbors K={self.ca_num_neighbors} exceeds the N1={n1} inputs of the second centroid block "
                f"(N={N}): need K <= N1"
            )
        pos = points[..., :3].contiguous()
        outs = []
        with input_checks(False):  # validated once above; the blocks need not re-check each call
            # the input points' K nearest in xyz: read by the local / edge embedding and by the first SA block alike
            nbr = knn(pos, pos, self.num_neighbors)[1] if self.embed_mode != "point" else None  # (B, N, K)
            x = self._embed(points, pos, nbr)
            cur_pos = pos
            up_pos, up = pos, None  # the points whose neighbours (dist, idx) of the input points up holds
            for transition, block in zip(self.transitions, self.blocks):
                x = transition(x)
                if isinstance(block, SelfAttentionBlock):
                    if nbr is None or cur_pos is not pos:
                        _, nbr = knn(cur_pos, cur_pos, self.num_neighbors)  # (B, n, K) in xyz
                    x = block(x, neighbor_idx=nbr, pos=cur_pos)
                elif isinstance(block, MixerBlock):
                    x = block(x)  # global sequence mixer over the stage's points
                else:
                    x, cur_pos, _ = block(x, pos=cur_pos)
                if x.shape[1] == N:
                    outs.append(x)
                    continue
                # Back to the N input points in xyz (nearest neighbour or inverse-distance weights); a block that
                # keeps its input points (SA after CA) reuses the search of the block before it.
                if up is None or up_pos is not cur_pos:
                    up_pos, up = cur_pos, knn(pos, cur_pos, min(self.upsample_neighbors, x.shape[1]))  # (B, N, k)
                outs.append(interpolate_neighbors(x, *up))
        return self.fuse(torch.cat(outs, dim=-1))  # (B, N, fuse_dim)

    @property
    def embedding(self) -> nn.Module:
        """The embedding's MLP (``embed``, ``local_embed`` or ``edge_embed``, by :data:`EMBEDS` mode)."""
        return getattr(self, EMBED_MODULES[self.embed_mode])

    def _embed(self, points: Tensor, pos: Tensor, nbr: Tensor | None = None) -> Tensor:
        """``(B, N, widths[0])`` features of the input points (``embed``); ``nbr``: the ``(B, N, K)`` indices of each
        point's K nearest in xyz (each point among its own), searched here if not given."""
        if self.embed_mode == "point":
            return self.embed(points)
        B, N, _ = points.shape
        if nbr is None:
            nbr = knn(pos, pos, self.num_neighbors)[1]
        edges = gather(points, nbr)  # (B, N, K, in_channels)
        if self.embed_mode == "local":
            edges = torch.cat([edges[..., :3] - pos.unsqueeze(2), edges[..., 3:]], dim=-1)
        else:  # edge
            centre = points.unsqueeze(2).expand_as(edges)
            edges = torch.cat([centre, edges - centre], dim=-1)
        x = self.embedding(edges.view(B, N * nbr.shape[-1], -1))  # per-edge MLP; BatchNorm over every edge
        return x.view(B, N, nbr.shape[-1], -1).amax(dim=2)

    def forward_head(self, x: Tensor, pre_logits: bool = False) -> Tensor:
        """Max + mean pooling of ``(B, N, fuse_dim)`` features, then the MLP head."""
        x = torch.cat([x.amax(dim=1), x.mean(dim=1)], dim=-1)  # (B, 2 * fuse_dim)
        x = self.head_hidden(x)
        return x if pre_logits else self.head(x)


# --------------------------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------------------------


def example_clouds(model: nn.Module, config: dict, default_points: int = 1024, batch: int = 2) -> Tensor:
    """``(batch, N, C)`` deterministic clouds for ``model``: xyz centred in the unit ball (max norm 1), as the data
    pipeline's, then unit vectors for channels past xyz (normals, ``in_channels`` 6); N is the run's ``num_points``
    (``config``, the run's config), else ``default_points``. The registries' example inputs
    (:func:`engine.registry.example_inputs`)."""
    n = int(config.get("num_points") or default_points)
    channels = int(getattr(model, "in_channels", 3))
    g = torch.Generator().manual_seed(0)
    xyz = torch.randn(batch, n, 3, generator=g)
    xyz = xyz - xyz.mean(1, keepdim=True)
    xyz = xyz / xyz.norm(dim=-1).amax(1).view(-1, 1, 1)
    if channels == 3:
        return xyz
    extra = torch.randn(batch, n, channels - 3, generator=g)
    return torch.cat([xyz, extra / extra.norm(dim=-1, keepdim=True)], -1)


# create_model: kwargs override a model's defaults (e.g. ``num_steps=2``); checkpoint= loads exported weights
MODELS, register_model, list_models, create_model = ModelRegistry(
    "point cloud", example_inputs=lambda model, config: (example_clouds(model, config),)
).exports()


@register_model
def centroid_transformer_modelnet40(**kwargs) -> CentroidTransformer:
    """The paper's model: FPS init, one centroid-attention step (T as ``num_steps``), with three measured changes: its
    update scaled by a learned per-channel factor that starts at 0, relative positions in the SA blocks, and each
    point embedded from its neighbours' offsets (``layer_scale=None, sa_pos_encoding=False, embed="point"``: the
    paper's reading)."""
    return CentroidTransformer(**{"num_classes": 40, **kwargs})


@register_model
def centroid_transformer_modelnet40_random(**kwargs) -> CentroidTransformer:
    """Ablation twin: centroid blocks only downsample by random sampling (no attention step)."""
    return CentroidTransformer(**{"num_classes": 40, "init": "random", "num_steps": 0, **kwargs})


@register_model
def centroid_transformer_modelnet40_fps(**kwargs) -> CentroidTransformer:
    """Ablation twin: centroid blocks only downsample by farthest point sampling (no attention step)."""
    return CentroidTransformer(**{"num_classes": 40, "init": "fps", "num_steps": 0, **kwargs})


@register_model
def centroid_transformer_modelnet40_kmeans(**kwargs) -> CentroidTransformer:
    """Ablation twin: centroid blocks only downsample by k-means (3 iterations, no attention step)."""
    return CentroidTransformer(**{"num_classes": 40, "init": "kmeans", "num_steps": 0, **kwargs})
