"""Small layers shared by the blocks of :mod:`attention`: the transformer MLP and stochastic depth."""

from __future__ import annotations

from torch import Tensor, nn

__all__ = ["DropPath", "Mlp"]


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
