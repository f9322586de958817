"""tools/lra_listops.py as a script: ``engine.main`` on the ListOps recipe, closing with the ListOps report. The
generator, model and recipe are tested in tests/lra/; the run follows the shared CLI contract
(tests/tools/test_cli_contract.py)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.testing import run_tool
from lra.testing import TINY_LISTOPS_SETS


def test_script_runs_the_recipe_and_reports_against_the_majority_class(tmp_path: Path) -> None:
    run = run_tool("lra_listops", ["--no-progress", "--device", "cpu", "--epochs", "1", "--output-dir", str(tmp_path),
                                   "--set", *TINY_LISTOPS_SETS, "mixer=linear"])  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    metrics = json.loads((tmp_path / "final_metrics.json").read_text())
    assert metrics["mixer"] == "linear" and metrics["epochs"] == 1
    last = run.stderr.strip().splitlines()[-1]
    assert f"test_acc={metrics['test_acc']:.2f}% (majority class: {metrics['majority_acc']:.2f}%), linear mixer" in last
