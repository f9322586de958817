"""tools/bench_points.py (logic in attention.bench): a tiny run read through --json, which leaves out the large clouds
its small --points did not ask for, and the usage error of an odd --large."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.testing import run_tool


@pytest.mark.slow
def test_tiny_run_writes_rows_and_the_target(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    tiny = ["--batch", "2", "--points", "64", "--channels", "3", "--repeats", "1", "--threads", "1"]
    run = run_tool("bench_points", [*tiny, "--json", str(path)])
    assert run.returncode == 0, run.stderr
    payload = json.loads(path.read_text())
    fps, knn = payload["results"]["fps"], payload["results"]["knn"]
    assert {r["backend"] for r in fps} >= {"torch"} and all(r["same indices"] == "yes" for r in fps)
    assert {(r["M"], r["C"]) for r in knn} == {(32, 3), (16, 3)}
    assert payload["results"]["large"] == [] and payload["args"]["large"] == []  # no 50K / 100K clouds at N = 64
    (t,) = payload["targets"]
    assert t["met"] is None and t["detail"] == "row not measured"
    assert "## Farthest point sampling" in run.stdout and "target: Triton fps vs torch-cluster" in run.stdout
    assert "one large cloud" not in run.stdout


def test_odd_large_is_a_usage_error() -> None:
    run = run_tool("bench_points", ["--points", "64", "--large", "8192", "512", "4096"])
    assert run.returncode == 2 and "--large takes N M pairs, got 3 numbers" in run.stderr
