"""tools/bench_mixers.py (logic in attention.bench) at a tiny size, run as a script and read through --json: both
baselines, ratios, the quadratic-mixer skip, the BHLLD column, the FSAT targets, and the same peaks in and out of
process."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.testing import run_tool

BASELINES = ("attention-matmul", "attention-sdpa")
TINY = ["--lengths", "48", "--dim", "32", "--heads", "2", "--mixers", "fsat", "cauchy"]


def bench_mixers(*args: str) -> tuple[list[dict], dict, str]:
    """Runs the script; its rows, its whole --json report and its stdout."""
    path = Path(args[args.index("--json") + 1])
    run = run_tool("bench_mixers", list(args))
    assert run.returncode == 0, run.stderr
    payload = json.loads(path.read_text())
    return payload["results"], payload, run.stdout


def test_tiny_bench(tmp_path: Path) -> None:
    rows, payload, out = bench_mixers(*TINY, "--max-quadratic-len", "40", "--json", str(tmp_path / "bench.json"),
                                      "--profile", str(tmp_path / "prof"))  # fmt: skip
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
    fsat, *kernels = payload["targets"]  # then the fused kernels' targets: CUDA figures, no verdict on CPU
    assert fsat["met"] is None and fsat["detail"] == "L = 16384 not measured"
    assert len(kernels) == 5 and all(t["met"] is None for t in kernels)
    assert kernels[0]["detail"].startswith("fsat at L = 4096: not measured")
    assert "| L " in out and "fsat" in out and "skipped" in out and "target: FSAT time vs SDPA" in out
    # --profile: each timed row's step under torch.profiler, a table and a trace each, and a table of them
    assert by["fsat"]["profile"]["table"] == "B1-L48-fsat.txt" and "profile" not in by["cauchy"]  # skipped
    assert (tmp_path / "prof" / "B1-L48-fsat.trace.json").is_file() and "## profile, B = 1" in out


def test_in_process_rows_equal_the_isolated_ones(tmp_path: Path) -> None:
    """``--isolate no`` (the CUDA default: no process start-up per row) measures the same exact tensor peaks."""
    isolated = bench_mixers(*TINY, "--isolate", "yes", "--json", str(tmp_path / "a.json"))[0]
    inline = bench_mixers(*TINY, "--isolate", "no", "--json", str(tmp_path / "b.json"))[0]
    assert [r["mixer"] for r in inline] == [r["mixer"] for r in isolated]
    for a, b in zip(isolated, inline):
        assert b["peak_mb"] == a["peak_mb"] > 0 and b["ms"] > 0, (a, b)


def test_several_batch_sizes_give_a_table_and_verdicts_each(tmp_path: Path) -> None:
    """``--batch 1 2``: the issue's targets hold at B = 1 and at B = 8, so one run times both and names each."""
    rows, payload, out = bench_mixers(*TINY, "--batch", "1", "2", "--isolate", "no", "--json", str(tmp_path / "b.json"))
    assert [(r["B"], r["mixer"]) for r in rows] == [(b, m) for b in (1, 2) for m in (*BASELINES, "fsat", "cauchy")]
    assert [t["title"] for t in payload["tables"]] == ["B = 1", "B = 2"] and "## B = 2" in out
    names = [t["target"] for t in payload["targets"]]
    assert len(names) == 12 and names[0] == "FSAT time vs SDPA at L >= 16K (fraction, B = 1)"
    assert names[6] == "FSAT time vs SDPA at L >= 16K (fraction, B = 2)" and names[-1].endswith("(B = 2)")
    assert len(set(names)) == 12  # no two verdicts share a name in gpu_check's summary
