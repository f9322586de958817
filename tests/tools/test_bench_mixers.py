"""tools/bench_mixers.py at a tiny size (run as a script, read through --json): both baselines, ratios, the
quadratic-mixer skip, the BHLLD column, and the FSAT target (attention.bench.fsat_target)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from attention.bench import fsat_target
from engine.testing import REPO, tool_env

BASELINES = ("attention-matmul", "attention-sdpa")
TINY = ["--lengths", "48", "--dim", "32", "--heads", "2", "--mixers", "fsat", "cauchy"]


def bench_mixers(*args: str) -> tuple[list[dict], dict, str]:
    """Runs the script; its rows, its whole --json report and its stdout."""
    path = Path(args[args.index("--json") + 1])
    run = subprocess.run([sys.executable, str(REPO / "tools" / "bench_mixers.py"), *args], env=tool_env(),
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    payload = json.loads(path.read_text())
    return payload["results"], payload, run.stdout


def test_tiny_bench(tmp_path: Path) -> None:
    rows, payload, out = bench_mixers(*TINY, "--max-quadratic-len", "40", "--json", str(tmp_path / "bench.json"))
    assert [r["mixer"] for r in rows] == ["attention-matmul", "attention-sdpa", "fsat", "cauchy"]
    by = {r["mixer"]: r for r in rows}
    for base in BASELINES:
        assert "error" not in by[base], by[base]
        assert by[base][f"speedup vs {base}"] == pytest.approx(1.0)
        assert by[base]["peak_mb"] is None or by[base]["peak_mb"] >= 0
    assert by["fsat"]["ms"] > 0 and by["fsat"]["speedup vs attention-matmul"] > 0
    assert "skipped" in by["cauchy"]["error"]
    assert by["cauchy"]["dense_bhlld_mb"] == pytest.approx(2 * 48 * 48 * 16 * 4 / 2**20)  # B H L L D float32
    assert payload["tool"] == "bench_mixers"
    (fsat,) = payload["targets"]
    assert fsat["met"] is None and fsat["detail"] == "L = 16384 not measured"
    assert "| L " in out and "fsat" in out and "skipped" in out and "target: FSAT time vs SDPA" in out


def test_in_process_rows_equal_the_isolated_ones(tmp_path: Path) -> None:
    """``--isolate no`` (the CUDA default: no process start-up per row) measures the same exact tensor peaks."""
    isolated = bench_mixers(*TINY, "--isolate", "yes", "--json", str(tmp_path / "a.json"))[0]
    inline = bench_mixers(*TINY, "--isolate", "no", "--json", str(tmp_path / "b.json"))[0]
    assert [r["mixer"] for r in inline] == [r["mixer"] for r in isolated]
    for a, b in zip(isolated, inline):
        assert b["peak_mb"] == a["peak_mb"] > 0 and b["ms"] > 0, (a, b)


def test_fsat_target_is_its_time_as_a_fraction_of_sdpa_at_16k() -> None:
    rows = [
        {"L": 4096, "mixer": "fsat", "ms": 1.0, "speedup vs attention-sdpa": 0.5},
        {"L": 16384, "mixer": "attention-sdpa", "ms": 10.0, "speedup vs attention-sdpa": 1.0},
        {"L": 16384, "mixer": "fsat", "ms": 8.0, "speedup vs attention-sdpa": 1.25},
    ]
    t = fsat_target(rows, "cuda")
    assert t["measured"] == pytest.approx(0.8) and t["met"] is True and t["wanted"] == "< 1"
    on_cpu = fsat_target(rows, "cpu")  # a CUDA target: the ratio, no verdict
    assert on_cpu["measured"] == pytest.approx(0.8) and on_cpu["met"] is None
    failed = fsat_target([{"L": 16384, "mixer": "fsat", "error": "OutOfMemoryError"}], "cuda")
    assert failed["met"] is None and "OutOfMemoryError" in failed["detail"]
