"""tools/bench_points.py: the FPS target against torch-cluster (attention.bench.fps_cluster_target) and a tiny run
read through --json."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attention.bench import fps_cluster_target
from engine.testing import REPO, tool_env


def _fps_row(backend: str, speedup: float, B: int = 32, N: int = 1024, M: int = 512) -> dict:
    return {"B": B, "N": N, "M": M, "backend": backend, "ms": 1.0, "speedup vs cluster": speedup}


def test_fps_target_against_torch_cluster() -> None:
    rows = [_fps_row("torch", 0.02), _fps_row("triton", 2.6), _fps_row("triton", 9.0, B=8)]
    t = fps_cluster_target(rows, "cuda")
    assert t["target"] == "Triton fps vs torch-cluster (B=32 N=1024 M=512)" and t["wanted"] == ">= 2x"
    assert t["measured"] == 2.6 and t["met"] is True
    rows[1]["speedup vs cluster"] = float("nan")  # no torch-cluster: no verdict, and the reason
    t = fps_cluster_target(rows, "cuda")
    assert t["met"] is None and t["measured"] is None and t["detail"] == "torch-cluster not installed"
    assert fps_cluster_target(rows[:1], "cuda")["detail"] == "row not measured"
    on_cpu = fps_cluster_target([_fps_row("triton", 2.6)], "cpu")
    assert on_cpu["measured"] == 2.6 and on_cpu["met"] is None and "no verdict" in on_cpu["detail"]


@pytest.mark.slow
def test_tiny_run_writes_rows_and_the_target(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    argv = ["--batch", "2", "--points", "64", "--channels", "3", "--repeats", "1", "--threads", "1", "--large",
            "--json", str(path)]  # fmt: skip
    run = subprocess.run([sys.executable, str(REPO / "tools" / "bench_points.py"), *argv], env=tool_env(),
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    payload = json.loads(path.read_text())
    fps, knn = payload["results"]["fps"], payload["results"]["knn"]
    assert {r["backend"] for r in fps} >= {"torch"} and all(r["same indices"] == "yes" for r in fps)
    assert {(r["M"], r["C"]) for r in knn} == {(32, 3), (16, 3)} and payload["results"]["large"] == []
    (t,) = payload["targets"]
    assert t["met"] is None and t["detail"] == "row not measured"
    assert "## Farthest point sampling" in run.stdout and "target: Triton fps vs torch-cluster" in run.stdout
