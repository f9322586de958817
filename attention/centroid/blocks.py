"""Blocks built on centroid attention: :class:`CentroidBlock` (init -> T steps -> MLP, shortens the sequence) and
:class:`SelfAttentionBlock` (the M = N special case, optionally over K nearest tokens).

Wu et al., "Centroid Transformers", arXiv:2102.08606, section 3.
"""

from __future__ import annotations

from torch import Tensor, nn

from ..layers import Mlp
from .inits import CentroidOutput, build_centroid_init
from .layer import CentroidAttention

__all__ = ["CentroidBlock", "SelfAttentionBlock"]


class CentroidBlock(nn.Module):
    """A transformer block that shortens the sequence: init -> T centroid-attention steps -> MLP (residuals).

    Args:
        dim: channels C.
        init: a name from :data:`CENTROID_INITS` or an init module.
        init_kwargs: constructor arguments of the named init (e.g. ``num_centroids``, ``space``, ``grid_size``).
        num_heads, num_neighbors, num_steps, normalize, qkv_bias, attn_drop, knn_backend, attn_backend: of
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
        attn_backend: str = "auto",
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
                attn_backend=attn_backend,
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
        attn_backend: str = "auto",
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
        )
        self.norm = norm_layer(dim)
        self.mlp = Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)

    def forward(self, x: Tensor, mask: Tensor | None = None, neighbor_idx: Tensor | None = None) -> Tensor:
        x = self.attn(x, x, mask=mask, neighbor_idx=neighbor_idx)
        return x + self.mlp(self.norm(x))
