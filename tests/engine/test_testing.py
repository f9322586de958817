"""The shared test helpers of :mod:`engine.testing` fail where they should."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from engine.testing import assert_backends_agree, assert_interpreted, run_tool, run_tools_batched


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


def test_batched_tools_behave_as_their_own_processes() -> None:
    """Each call of the batched runner gets its own argv, exit status, stdout and stderr, as ``python tools/x.py``
    would: a help text, an argparse error (2) and an error the script raises after parsing, in that order."""
    calls = [("run_ablation", ["--help"]), ("run_ablation", ["--table", "nope"]),
             ("run_ablation", ["--table", "modelnet", "--plan", "--seeds", "0"])]  # fmt: skip
    got = run_tools_batched(calls)
    assert [d.returncode for d in got] == [0, 2, 2]
    assert got[0].stdout.startswith("usage: run_ablation.py") and not got[0].stderr
    assert "invalid choice: 'nope'" in got[1].stderr and not got[1].stdout
    assert "--seeds N >= 1" in got[2].stderr
    alone = run_tool("run_ablation", ["--help"])
    assert (alone.returncode, alone.stdout) == (0, got[0].stdout)
