"""Small layers shared by the blocks of :mod:`attention`: the transformer MLP, stochastic depth, LayerScale and the
relative position encoding of KNN attention."""

from __future__ import annotations

import torch
from torch import Tensor, nn

__all__ = ["DropPath", "LayerScale", "Mlp", "RelativePositionEncoding"]


class Mlp(nn.Module):
    """Two-layer MLP of a transformer block: Linear -> act -> dropout -> Linear -> dropout.

    Shapes:
        x: ``(..., dim)``; output: ``(..., dim)``.
    """

    def __init__(self, dim: int, hidden_dim: int, act_layer: type[nn.Module] = nn.GELU, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden_dim, dim)
        self.drop = nn.Dropout(drop)

    def forward(self, x: Tensor) -> Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth (Huang et al., arXiv:1603.09382): in training, zeroes the whole residual update of a sample
    with probability ``drop_prob`` and scales the kept ones by ``1 / (1 - drop_prob)``; identity in eval.

    Same function as timm's ``DropPath`` (``scale_by_keep=True``), kept here so the core does not import timm.

    Shapes:
        x: ``(B, ...)``; output: same.
    """

    def __init__(self, drop_prob: float = 0.0) -> None:
        super().__init__()
        if not 0.0 <= drop_prob < 1.0:
            raise ValueError(f"drop_prob must lie in [0, 1), got {drop_prob}")
        self.drop_prob = drop_prob

    def extra_repr(self) -> str:
        return f"drop_prob={self.drop_prob}"

    def forward(self, x: Tensor) -> Tensor:
        if self.drop_prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.drop_prob
        shape = [x.shape[0]] + [1] * (x.dim() - 1)
        return x * x.new_empty(shape).bernoulli_(keep).div_(keep)


class LayerScale(nn.Module):
    """Per-channel scale of a residual update (CaiT, Touvron et al., arXiv:2103.17239): ``x * gamma``, ``gamma``
    initialised to ``init_value`` for every channel. With ``init_value=0`` the branch starts as the identity of the
    residual stream (ReZero, Bachlechner et al., arXiv:2003.04887) and its weights still learn: ``gamma``'s gradient
    is the update itself.

    Same function as timm's ``LayerScale``, kept here so the core does not import timm.

    Shapes:
        x: ``(..., dim)``; output: same.
    """

    def __init__(self, dim: int, init_value: float = 1e-5) -> None:
        super().__init__()
        self.init_value = float(init_value)
        self.gamma = nn.Parameter(torch.full((dim,), self.init_value))

    def reset_parameters(self) -> None:
        nn.init.constant_(self.gamma, self.init_value)

    def extra_repr(self) -> str:
        return f"dim={self.gamma.numel()}, init_value={self.init_value}"

    def forward(self, x: Tensor) -> Tensor:
        return x * self.gamma


class RelativePositionEncoding(nn.Module):
    """A learned encoding ``delta(p_j - p_i)`` of each edge's relative position, as Point Transformer's ``linear_p``
    (Zhao et al., arXiv:2012.09164, eq. 4): a two-layer MLP from the offset of neighbour j from query i to ``dim``
    channels, added to the neighbour's key (so it enters the attention logits) and to its value. It reads offsets
    only, so an attention layer that uses it and no absolute positions is invariant to translating the cloud.

    Args:
        dim: output channels (the attention's width C = H D).
        pos_dim: coordinates per position (3 for xyz).
        hidden: width of the hidden layer; the per-edge cost is ``pos_dim * hidden + hidden * dim`` MACs.
        act_layer: activation between the two layers.

    Shapes:
        rel: ``(..., pos_dim)`` offsets; output: ``(..., dim)``.
    """

    def __init__(self, dim: int, pos_dim: int = 3, hidden: int = 16, act_layer: type[nn.Module] = nn.ReLU) -> None:
        super().__init__()
        self.fc1 = nn.Linear(pos_dim, hidden)
        self.act = act_layer()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, rel: Tensor) -> Tensor:
        return self.fc2(self.act(self.fc1(rel)))
