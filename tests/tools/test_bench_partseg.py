"""tools/bench_partseg.py: every row measured in one run, ratios to PointNet++ in the same run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.testing import run_tool
from pointcloud.partseg.bench import CENTROID, PEER, benchmark, check_settings, main_job_kwargs, plan, table
from pointcloud.partseg.recipe import PartSegConfig


def test_plan_has_every_model_and_the_main_job() -> None:
    rows = plan()
    assert [label for label, _, _ in rows] == [CENTROID, PEER, f"{CENTROID} (main job)"]
    cfg = PartSegConfig()
    assert rows[-1][2] == {**main_job_kwargs()} and rows[-1][2]["widths"] == cfg.model_kwargs["widths"]
    assert rows[-1][2]["num_neighbors"] == cfg.num_neighbors
    assert [label for label, _, _ in plan([PEER], main_job=False)] == [PEER]
    with pytest.raises(ValueError, match="unknown models"):
        check_settings(["pointnet_but_better"], "cpu", False, 8, 1)
    with pytest.raises(ValueError, match="--batch must be >= 2"):
        check_settings([PEER], "cpu", False, 1, 1)


def test_benchmark_measures_every_row_against_the_peer() -> None:
    tiny = {"num_centroids": (16, 8), "num_neighbors": 4, "widths": (8, 16, 16, 16), "fuse_dim": 16,
            "global_dim": 8, "head_dims": (8,)}  # fmt: skip
    peer = {"mlps": ((8,), (16,), (16,)), "fp_mlps": ((16,), (8,), (8,)), "head_dim": 8}
    rows = [(CENTROID, CENTROID, tiny), (PEER, PEER, peer)]
    results = benchmark(rows, "cpu", batch=2, num_points=32, repeats=1, warmup=0)
    by = {r["label"]: r for r in results}
    assert by[PEER]["train_vs_peer"] == pytest.approx(1.0) and by[PEER]["infer_vs_peer"] == pytest.approx(1.0)
    for r in results:
        assert r["params_m"] > 0 and r["gmacs"] > 0 and r["train_sps"] > 0 and r["infer_sps"] > 0
        assert r["train_ms_rounds"] == [r["train_ms"]]  # repeats 1: one timed round
    assert by[CENTROID]["train_vs_peer"] == pytest.approx(by[CENTROID]["train_sps"] / by[PEER]["train_sps"])
    headers, table_rows = table(results)
    assert "train vs PointNet++" in headers and len(table_rows) == 2
    without = benchmark(rows[:1], "cpu", batch=2, num_points=32, repeats=1, warmup=0, use_normals=False)
    assert without[0]["train_vs_peer"] is None and without[0]["params_m"] < by[CENTROID]["params_m"]  # 3 channels


@pytest.mark.slow
def test_the_cli_prints_the_table_and_writes_json(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    done = run_tool("bench_partseg", ["--points", "64", "--batch", "2", "--repeats", "1", "--warmup", "0",
                                      "--json", str(out)])  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "train vs PointNet++" in done.stdout
    labels = [r["label"] for r in json.loads(out.read_text())["results"]]
    assert labels == [CENTROID, PEER, f"{CENTROID} (main job)"]
