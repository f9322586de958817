"""Blocks built on centroid attention: :class:`CentroidBlock` (init -> T steps -> MLP, shortens the sequence) and
:class:`SelfAttentionBlock` (the M = N special case, optionally over K nearest tokens).

Wu et al., "Centroid Transformers", arXiv:2102.08606, section 3.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..layers import Mlp
from ..points import knn
from .inits import CentroidOutput, build_centroid_init
from .layer import CentroidAttention

__all__ = ["NEIGHBOR_SPACES", "CentroidBlock", "SelfAttentionBlock"]

NEIGHBOR_SPACES = ("feature", "pos")
"""Where a :class:`CentroidBlock`'s centroids find their K neighbours: in feature space or by position."""


class CentroidBlock(nn.Module):
    """A transformer block that shortens the sequence: init -> T centroid-attention steps -> MLP (residuals).

    Args:
        dim: channels C.
        init: a name from :data:`CENTROID_INITS` or an init module.
        init_kwargs: constructor arguments of the named init (e.g. ``num_centroids``, ``space``, ``grid_size``).
        num_heads, num_neighbors, num_steps, normalize, qkv_bias, attn_drop, knn_backend, attn_backend: of
            :class:`CentroidAttention`. ``num_steps=0`` gives the ablation that only downsamples (init + MLP).
        pos_encoding, pos_hidden, layer_scale, aggregation: of :class:`CentroidAttention` (relative position
            encoding, LayerScale, how the neighbours are read: :data:`AGGREGATIONS`).
        neighbor_space: where each centroid's K neighbours are searched: ``"feature"`` (the paper: feature space,
            recomputed at every step) or ``"pos"`` (the K inputs nearest the centroid's position, e.g. in xyz; needs
            ``pos`` and an init that returns the centroids' positions).
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
        attn_backend: str = "auto",
        neighbor_space: str = "feature",
        pos_encoding: bool = False,
        pos_hidden: int = 16,
        layer_scale: float | None = None,
        aggregation: str = "dot",
    ) -> None:
        super().__init__()
        if neighbor_space not in NEIGHBOR_SPACES:
            raise ValueError(f"neighbor_space must be one of {NEIGHBOR_SPACES}, got {neighbor_space!r}")
        if neighbor_space == "pos" and num_neighbors is None and num_steps > 0:
            raise ValueError("neighbor_space='pos' needs num_neighbors (K)")
        self.neighbor_space = neighbor_space
        self.knn_backend = knn_backend
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
                attn_backend=attn_backend,
                pos_encoding=pos_encoding,
                pos_hidden=pos_hidden,
                layer_scale=layer_scale,
                aggregation=aggregation,
            )
            if num_steps > 0
            else None
        )
        self.norm = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        u, u_pos, index = self.init(x, pos, mask)
        if self.attn is not None:
            idx = None
            if self.neighbor_space == "pos":
                if pos is None or u_pos is None:
                    raise ValueError("neighbor_space='pos' needs pos and an init that returns centroid positions")
                idx = knn(u_pos, pos, self.attn.num_neighbors, mask=mask, backend=self.knn_backend)[1]  # (B, M, K)
            u = self.attn(x, u, mask=mask, neighbor_idx=idx, pos=pos, centroid_pos=u_pos)
        u = u + self.mlp(self.norm(u))
        return CentroidOutput(u, u_pos, index)


class SelfAttentionBlock(nn.Module):
    """Pre-norm transformer block whose attention may be restricted to each token's K nearest tokens.

    It is centroid attention with the inputs as their own centroids (M = N, identity init, T = 1) and one shared
    norm, then an MLP. With ``num_neighbors`` set, neighbours are found in feature space unless the caller passes
    ``neighbor_idx`` (e.g. KNN in xyz). ``pos_encoding`` adds the relative position encoding of
    :class:`CentroidAttention` (the forward then needs ``pos``); ``aggregation="vector"`` with it is Point
    Transformer's layer (grouped vector attention, ``num_heads`` groups).

    Shapes:
        x: ``(B, N, C)``; mask: ``(B, N)``; neighbor_idx: ``(B, N, K)``; pos: ``(B, N, P)``; output: ``(B, N, C)``.
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
        attn_backend: str = "auto",
        pos_encoding: bool = False,
        pos_hidden: int = 16,
        aggregation: str = "dot",
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
            attn_backend=attn_backend,
            pos_encoding=pos_encoding,
            pos_hidden=pos_hidden,
            aggregation=aggregation,
        )
        self.norm = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)

    def forward(
        self, x: Tensor, mask: Tensor | None = None, neighbor_idx: Tensor | None = None, pos: Tensor | None = None
    ) -> Tensor:
        x = self.attn(x, x, mask=mask, neighbor_idx=neighbor_idx, pos=pos, centroid_pos=pos)
        return x + self.mlp(self.norm(x))
