"""Model statistics: parameter counts and multiply-accumulates counted by ``torch.utils.flop_counter``.

``FlopCounterMode`` counts the FLOPs of every matmul-like aten op that actually runs, attention matmuls included,
so models with different token counts are compared fairly. One MAC is two FLOPs; element-wise ops (norms,
activations, softmax) are not counted, as in the papers' GMAC figures.

``scaled_dot_product_attention`` runs as its math form (two batched matmuls) while counting: not every torch
version's counter knows every fused kernel (torch 2.11 counts nothing for the CPU flash kernel, which timm's
attention picks, and so missed DeiT-tiny's attention: 1.07 instead of 1.25 GMACs).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
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
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            model(*inputs)
    finally:
        if isinstance(model, nn.Module):
            model.train(was_training)
    return counter.get_total_flops() / 2e9
