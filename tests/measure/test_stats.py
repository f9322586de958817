"""measure.stats: GMACs include fused attention on every supported torch (2.11's counter skips the CPU flash kernel)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from measure.stats import count_gmacs, count_params

# torch's FLOP counter sees different kernels on different torch versions
pytestmark = pytest.mark.torch_compat


class _Attention(nn.Module):
    def __init__(self, fused: bool) -> None:
        super().__init__()
        self.fused = fused

    def forward(self, q: torch.Tensor) -> torch.Tensor:
        if self.fused:
            return F.scaled_dot_product_attention(q, q, q)
        return (q @ q.transpose(-2, -1) * q.shape[-1] ** -0.5).softmax(-1) @ q


def test_fused_attention_counts_as_its_two_matmuls() -> None:
    q = torch.randn(2, 3, 197, 64)
    expected = 2 * 2 * 3 * 197 * 197 * 64 / 1e9  # QK^T and AV, B=2 H=3 L=197 D=64, in MACs
    assert count_gmacs(_Attention(fused=False), q) == expected
    assert count_gmacs(_Attention(fused=True), q) == expected


def test_count_gmacs_restores_the_mode_and_count_params_counts_shared_once() -> None:
    lin = nn.Linear(4, 5)
    model = nn.Sequential(lin, nn.ReLU(), nn.Linear(5, 5)).train()
    assert count_gmacs(model, torch.randn(3, 4)) == 3 * (4 * 5 + 5 * 5) / 1e9
    assert model.training
    shared = nn.Sequential(lin, nn.ReLU(), nn.Linear(5, 4), lin)
    assert count_params(shared) == 4 * 5 + 5 + 5 * 4 + 4


def test_engine_still_exports_the_counts() -> None:
    """``engine.count_gmacs`` and ``engine.count_params`` are public names of the harness: the same functions."""
    import engine

    assert (engine.count_gmacs, engine.count_params) == (count_gmacs, count_params)
