"""Model statistics: parameter counts and multiply-accumulates counted by ``torch.utils.flop_counter``.

``FlopCounterMode`` counts the FLOPs of every matmul-like aten op that actually runs, attention matmuls and
``scaled_dot_product_attention`` included, so models with different token counts are compared fairly. One MAC is
two FLOPs; element-wise ops (norms, activations, softmax) are not counted, as in the papers' GMAC figures.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["count_gmacs", "count_params"]


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (shared parameters counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


@torch.no_grad()
def count_gmacs(model: nn.Module | Callable, *inputs: torch.Tensor) -> float:
    """GMACs of one forward pass on ``inputs`` (in eval mode; the model's mode is restored)."""
    was_training = getattr(model, "training", False)
    if isinstance(model, nn.Module):
        model.eval()
    try:
        with FlopCounterMode(display=False) as counter:
            model(*inputs)
    finally:
        if isinstance(model, nn.Module):
            model.train(was_training)
    return counter.get_total_flops() / 2e9
