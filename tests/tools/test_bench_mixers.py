"""tools/bench_mixers.py at a tiny size: both baselines, ratios, the quadratic-mixer skip and the BHLLD column."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.testing import load_tool

REPO = Path(__file__).resolve().parents[2]
bench_mixers = load_tool("bench_mixers")


def test_tiny_bench(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    argv = ["--lengths", "48", "--dim", "32", "--heads", "2", "--max-quadratic-len", "40"]
    rows = bench_mixers.main([*argv, "--mixers", "fsat", "cauchy", "--json", str(path)])
    assert [r["mixer"] for r in rows] == ["attention-matmul", "attention-sdpa", "fsat", "cauchy"]
    by = {r["mixer"]: r for r in rows}
    for base in bench_mixers.BASELINES:
        assert "error" not in by[base], by[base]
        assert by[base][f"speedup vs {base}"] == pytest.approx(1.0)
        assert by[base]["peak_mb"] is None or by[base]["peak_mb"] >= 0
    assert by["fsat"]["ms"] > 0 and by["fsat"]["speedup vs attention-matmul"] > 0
    assert "skipped" in by["cauchy"]["error"]
    assert by["cauchy"]["dense_bhlld_mb"] == pytest.approx(2 * 48 * 48 * 16 * 4 / 2**20)  # B H L L D float32
    assert json.loads(path.read_text())[0]["mixer"] == "attention-matmul"
    out = capsys.readouterr().out
    assert "| L " in out and "fsat" in out and "skipped" in out


def test_in_process_rows_equal_the_isolated_ones() -> None:
    """``--isolate no`` (the CUDA default: no process start-up per row) measures the same exact tensor peaks."""
    argv = ["--lengths", "48", "--dim", "32", "--heads", "2", "--mixers", "fsat", "cauchy"]
    isolated = bench_mixers.main([*argv, "--isolate", "yes"])
    inline = bench_mixers.main([*argv, "--isolate", "no"])
    assert [r["mixer"] for r in inline] == [r["mixer"] for r in isolated]
    for a, b in zip(isolated, inline):
        assert b["peak_mb"] == a["peak_mb"] > 0 and b["ms"] > 0, (a, b)
