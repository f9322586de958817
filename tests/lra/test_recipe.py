"""lra.recipe: ListOps runs with other mixers; the run itself follows the shared CLI contract
(tests/tools/test_cli_contract.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import engine
from lra.recipe import ListOpsRecipe
from lra.testing import TINY_LISTOPS_SETS

TINY = ["--set", *TINY_LISTOPS_SETS, "--no-progress", "--device", "cpu"]


@pytest.mark.parametrize("mixer", ["fsat", "hydra"])
def test_other_mixers_run(tmp_path: Path, mixer: str) -> None:
    out = engine.main(ListOpsRecipe, [*TINY, "--set", f"mixer={mixer}", "--epochs", "1", "--output-dir", str(tmp_path)])
    assert out["mixer"] == mixer and np.isfinite(out["test_loss"])
