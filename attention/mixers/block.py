"""A pre-norm transformer block around any sequence mixer of :data:`attention.mixers.MIXERS`."""

from __future__ import annotations

from torch import Tensor, nn

from ..layers import Mlp

__all__ = ["MixerBlock"]


class MixerBlock(nn.Module):
    """``x + mixer(LN(x))`` then ``x + MLP(LN(x))``.

    Args:
        dim: width C.
        mixer: the token mixer (``forward(x, attn_mask=None)``), e.g. from :func:`attention.mixers.build_mixer`.
        mlp_ratio: hidden width of the MLP.
        drop: dropout in the MLP.
        act_layer, norm_layer: activation and norm classes.

    Shapes:
        x: ``(B, L, C)``; output: ``(B, L, C)``.
    """

    def __init__(
        self,
        dim: int,
        mixer: nn.Module,
        mlp_ratio: float = 4.0,
        drop: float = 0.0,
        act_layer: type[nn.Module] = nn.GELU,
        norm_layer: type[nn.Module] = nn.LayerNorm,
    ) -> None:
        super().__init__()
        self.norm1, self.mixer = norm_layer(dim), mixer
        self.norm2, self.mlp = norm_layer(dim), Mlp(dim, int(dim * mlp_ratio), act_layer=act_layer, drop=drop)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.mixer(self.norm1(x))
        return x + self.mlp(self.norm2(x))
