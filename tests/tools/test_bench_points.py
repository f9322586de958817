"""tools/bench_points.py (logic in attention.bench, the Chamfer rows in capsules.bench): a tiny run read through --json,
which leaves out the large clouds and the KNN memory row its small --points did not ask for; a tiny KNN memory row; the
usage errors of an odd --large and of --knn-memory without three sizes."""

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
    chamfer = payload["results"]["chamfer"]
    assert {r["backend"] for r in chamfer} >= {"dense", "chunked"} and all(r["same indices"] == "yes" for r in chamfer)
    (t,) = payload["targets"]
    assert t["met"] is None and t["detail"] == "row not measured"
    assert "## Farthest point sampling" in run.stdout and "target: Triton fps vs torch-cluster" in run.stdout
    assert "## Chamfer loss and its backward pass" in run.stdout
    assert "one large cloud" not in run.stdout


def test_odd_large_is_a_usage_error() -> None:
    run = run_tool("bench_points", ["--points", "64", "--large", "8192", "512", "4096"])
    assert run.returncode == 2 and "--large takes N M pairs, got 3 numbers" in run.stderr


@pytest.mark.slow
def test_tiny_knn_memory_row_reports_the_peak_and_its_growth(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    tiny = ["--batch", "1", "--points", "64", "--channels", "3", "--repeats", "1", "--threads", "1", "--large"]
    run = run_tool(
        "bench_points", [*tiny, "--knn-memory", "50", "300", "8", "--knn-memory-calls", "2", "--json", str(path)]
    )
    assert run.returncode == 0, run.stderr
    payload = json.loads(path.read_text())
    (row,) = payload["results"]["knn_memory"]
    assert (row["M"], row["N"], row["C"], row["threads"], row["growth calls"], row["growth M"]) == (
        50,
        300,
        8,
        1,
        2,
        25,
    )
    assert row["error"] == "" and 0 < row["RSS before GB"] <= row["peak RSS GB"] and row["growth MB"] >= 0
    _, peak, growth = payload["targets"]
    assert peak["measured"] == row["peak RSS GB"] and peak["met"] is None  # the 1.5 GB is for 20000 x 200000 x 128
    assert "the target is for M=20000 N=200000 C=128" in peak["detail"]
    assert growth["measured"] == row["growth MB"] and growth["met"] is not None
    assert (
        "## KNN search memory" in run.stdout
        and "target: KNN search peak RSS growth over the last 1 of 2 calls" in run.stdout
    )


@pytest.mark.parametrize(
    "flags,message",
    [
        (["--knn-memory", "20000", "200000"], "--knn-memory takes M N C (positive), got 20000 200000"),
        (["--knn-memory-calls", "1"], "--knn-memory-calls must be at least 2"),
    ],
)
def test_bad_knn_memory_is_a_usage_error(flags: list[str], message: str) -> None:
    run = run_tool("bench_points", ["--points", "64", *flags])
    assert run.returncode == 2 and message in run.stderr
