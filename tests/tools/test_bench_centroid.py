"""tools/bench_centroid.py (logic in attention.bench) at a tiny size, run as a script and read through --json: every
path measured in its own process (the CPU default), the ratios, no target."""

from __future__ import annotations

import json
from pathlib import Path

from attention.bench import CENTROID_PATHS
from engine.testing import run_tool


def test_tiny_run_measures_every_path_in_a_fresh_process(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    run = run_tool("bench_centroid", ["--points", "64", "--dim", "16", "--heads", "2", "--k", "8", "--repeats", "1",
                                      "--json", str(path)])  # fmt: skip
    assert run.returncode == 0, run.stderr
    payload = json.loads(path.read_text())
    assert payload["tool"] == "bench_centroid" and payload["targets"] == [] and payload["args"]["isolate"] == "auto"
    rows = {r["path"]: r for r in payload["results"]}
    assert list(rows) == list(CENTROID_PATHS)
    for r in rows.values():
        assert (r["N"], r["M"]) == (64, 16) and isinstance(r["ms"], float) and r["ms"] > 0, r
    assert rows["dense-matmul"]["speedup vs matmul"] == 1.0 and rows["dense-sdpa"]["speedup vs sdpa"] == 1.0
    assert "| N " in run.stdout and "knn-masked" in run.stdout
    assert "  N=64 knn: {'ms':" in run.stderr  # each configuration's result as it comes
