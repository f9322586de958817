"""The shared test helpers of :mod:`engine.testing` fail where they should."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.testing import assert_backends_agree, assert_interpreted


class _Scaled(nn.Module):
    """A linear layer whose ``backend`` scales the output: "exact" is the reference, "off" is wrong by 1%."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.backend = "exact"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * (1.01 if self.backend == "off" else 1.0)


def test_assert_backends_agree_compares_outputs_and_every_gradient() -> None:
    torch.manual_seed(0)
    m = _Scaled()
    x = torch.randn(5, 4, requires_grad=True)
    assert_backends_agree(m, x, m, "backend", ("exact", "exact"), 1e-6)
    with pytest.raises(AssertionError):
        assert_backends_agree(m, x, m, "backend", ("exact", "off"), 1e-4)
    assert m.backend == "off"  # the last backend stays set


@pytest.mark.torch_compat
def test_assert_interpreted_wants_a_clean_exit_that_prints_ok(tmp_path) -> None:
    assert_interpreted("import os; assert os.environ['TRITON_INTERPRET'] == '1'; print('ok')", tmp_path / "t.py")
    with pytest.raises(AssertionError):
        assert_interpreted("print('not ok')", tmp_path / "t.py")
    with pytest.raises(AssertionError, match="boom"):
        assert_interpreted("raise SystemExit('boom')", tmp_path / "t.py")
