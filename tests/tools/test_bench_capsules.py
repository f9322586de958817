"""tools/bench_capsules.py at a tiny size: every column, the ratios against routing, the verdicts, --json."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import bench_capsules  # noqa: E402

SMALL = ["pointcaps_routing_small", "pointcaps_centroid_small"]


@pytest.mark.slow  # four fresh processes for the memory column: about 30 s on an idle 2-core machine
def test_tiny_bench(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    kwargs = '{"num_primary": 24, "num_latent": 4, "latent_dim": 16}'
    argv = ["--models", *SMALL, "--points", "48", "--batch", "2", "--repeats", "1", "--warmup", "0",
            "--mem-batches", "2", "3", "--train-steps", "2", "--chamfer-points", "24", "--train-per-class", "2",
            "--budget-gb", "1", "--model-kwargs", kwargs, "--json", str(path)]  # fmt: skip
    results = bench_capsules.main(argv)
    assert [r["model"] for r in results] == SMALL
    for r in results:
        assert r["params_m"] > 0 and r["step_ms"] > 0 and r["mem_mb_per_sample"] > 0 and r["max_batch"] >= 0
        assert r["chamfer"] > 0 and 0 < r["part_purity"] <= 1 and len(r["mem_step_mb"]) == 2
        assert r["paper_params_m"] == bench_capsules.PAPER[r["model"]][1]
    routing, centroid = results
    assert "vs_routing" not in routing
    assert centroid["vs_routing"]["params"] == pytest.approx(centroid["params_m"] / routing["params_m"])
    assert centroid["vs_routing"]["chamfer"] == pytest.approx(centroid["chamfer"] / routing["chamfer"])
    out = capsys.readouterr().out
    assert "small: max batch" in out and "Chamfer distance = mean over a" in out
    header = next(line for line in out.splitlines() if line.startswith("| model"))
    assert "max batch vs routing" in header and "Chamfer @2 steps" in header
    payload = json.loads(path.read_text())
    assert payload["tool"] == "bench_capsules" and len(payload["verdicts"]) == 1


def test_rejects_unknown_models_and_bad_batches() -> None:
    with pytest.raises(SystemExit):
        bench_capsules.main(["--models", "pointcaps_tiny"])
    with pytest.raises(SystemExit):
        bench_capsules.main(["--mem-batches", "4", "2"])
