"""tools/bench_centroid.py (logic in attention.bench): the rows a CPU run times and those it skips with a reason, and
the fused KNN step's targets against SDPA, ratios of the same run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from attention import bench
from engine.testing import run_tool


def _rows(ms: dict[str, tuple[float, float]], sizes=(1024, 4096, 16384)) -> list[dict]:
    return [{"N": n, "path": p, "ms": t, "peak_mb": mb} for n in sizes for p, (t, mb) in ms.items()]


def test_targets_are_the_worst_ratio_over_every_n() -> None:
    rows = _rows({"dense-sdpa": (2.0, 10.0), "knn-triton": (1.0, 5.0)})
    rows[-1]["ms"] = 2.5  # slower than SDPA at N = 16384 only
    speed, graphs, memory = bench.centroid_targets(rows, "cuda")
    assert speed["target"] == "fused KNN step (its fastest row) vs eager SDPA speedup at every N = 1K-16K"
    assert speed["wanted"] == "> 1x"
    assert speed["measured"] == pytest.approx(0.8) and speed["met"] is False
    assert speed["detail"] == "worst at N=16384 of 1024, 4096, 16384 (knn-triton)"
    assert memory["measured"] == pytest.approx(0.5) and memory["met"] is True
    assert graphs["met"] is None and graphs["detail"] == (
        "no dense-sdpa-graphs row (--paths) (N=1024, 4096, 16384); no knn-triton-graphs row (--paths) (N=1024, 4096, "
        "16384)"
    )
    on_cpu = bench.centroid_targets(rows, "cpu")
    assert all(t["met"] is None for t in on_cpu)  # CUDA targets: the ratios, no verdict
    assert "no verdict" in on_cpu[0]["detail"] and "no verdict" in on_cpu[2]["detail"]


def test_the_speed_target_reads_the_fastest_fused_row_and_the_graphs_target_both_in_graphs() -> None:
    """What a user can choose (eager, compiled or CUDA graphs) against eager SDPA, named in the detail; and the
    like-for-like check with both steps in CUDA graphs. Memory: both eager."""
    rows = _rows({"dense-sdpa": (2.0, 10.0), "knn-triton": (4.0, 5.0), "knn-triton-compiled": (3.0, 50.0),
                  "knn-triton-graphs": (1.0, 60.0), "dense-sdpa-graphs": (0.5, 70.0)})  # fmt: skip
    graphed = rows[3]
    rows[3] = {"N": 1024, "path": "knn-triton-graphs", "error": "RuntimeError: capture failed"}  # compiled is best
    speed, graphs, memory = bench.centroid_targets(rows, "cuda")
    assert speed["measured"] == pytest.approx(2 / 3) and speed["met"] is False
    assert speed["detail"] == "worst at N=1024 of 1024, 4096, 16384 (knn-triton-compiled)"
    assert graphs["met"] is None and graphs["detail"] == "RuntimeError: capture failed (N=1024)"
    rows[3] = graphed
    rows[8]["ms"] = 2.0  # knn-triton-graphs at N = 4096
    speed, graphs, _ = bench.centroid_targets(rows, "cuda")
    assert speed["measured"] == pytest.approx(1.0) and speed["met"] is False  # > 1 wanted
    assert speed["detail"] == "worst at N=4096 of 1024, 4096, 16384 (knn-triton-graphs)"
    assert graphs["measured"] == pytest.approx(0.25) and graphs["met"] is False
    assert graphs["target"].endswith("both in CUDA graphs")
    assert graphs["detail"] == "worst at N=4096 of 1024, 4096, 16384 (knn-triton-graphs vs dense-sdpa-graphs)"
    assert memory["measured"] == pytest.approx(0.5) and memory["met"] is True  # the eager rows, not the graphs' pool


def test_the_graphs_target_takes_each_steps_faster_graph_form() -> None:
    """Compiled with reduce-overhead or captured whole (no compiler): each side's faster graph row, named."""
    rows = _rows({"dense-sdpa": (2.0, 10.0), "knn-triton": (4.0, 5.0), "knn-triton-graphs": (1.5, None),
                  "dense-sdpa-graphs": (1.2, None), "knn-triton-captured": (0.6, None),
                  "dense-sdpa-captured": (1.0, None)})  # fmt: skip
    rows[-1]["ms"] = 0.5  # SDPA captured at N = 16384: faster than the fused step there
    speed, graphs, _ = bench.centroid_targets(rows, "cuda")
    assert speed["measured"] == pytest.approx(2.0 / 0.6) and "(knn-triton-captured)" in speed["detail"]
    assert graphs["measured"] == pytest.approx(0.5 / 0.6) and graphs["met"] is False
    assert graphs["detail"] == "worst at N=16384 of 1024, 4096, 16384 (knn-triton-captured vs dense-sdpa-captured)"
    rows = [r for r in rows if r["path"] != "dense-sdpa-captured"]  # SDPA in compiled graphs only
    _, graphs, _ = bench.centroid_targets(rows, "cuda")
    assert graphs["measured"] == pytest.approx(1.2 / 0.6) and graphs["met"] is True
    assert graphs["detail"].endswith("(knn-triton-captured vs dense-sdpa-graphs)")


def test_a_row_that_ran_without_a_peak_says_so_and_a_zero_counts() -> None:
    rows = _rows({"dense-sdpa": (2.0, 10.0), "knn-triton": (1.0, 0.0)}, sizes=(1024, 4096))
    _, _, memory = bench.centroid_targets(rows, "cuda")
    assert memory["measured"] == 0.0 and memory["met"] is True  # a peak of 0 MB is a measured peak
    rows[0]["peak_mb"] = None  # SDPA at N = 1024 ran, its peak not measured (a CPU's resident set did not grow)
    rows[3] |= {"path": "knn-triton-graphs", "ms": 1.6}  # N = 4096: the graphed row ran, the eager one failed
    rows += [{"N": 4096, "path": "knn-triton", "error": "OutOfMemoryError: CUDA out of memory"}]
    speed, _, memory = bench.centroid_targets(rows, "cuda")
    assert memory["met"] is None and memory["detail"] == (
        "dense-sdpa: no peak measured (N=1024); OutOfMemoryError: CUDA out of memory (N=4096)"
    )
    assert speed["measured"] == pytest.approx(1.25) and speed["detail"].endswith(
        "at N=4096 of 1024, 4096 (knn-triton-graphs)"
    )


def test_targets_without_the_fused_rows_say_why() -> None:
    rows = _rows({"dense-sdpa": (2.0, 10.0)}) + [
        {"N": n, "path": "knn-triton", "note": "needs CUDA (the fused Triton kernel)"} for n in (1024, 4096, 16384)
    ]
    speed, _, memory = bench.centroid_targets(rows, "cpu")
    assert speed["measured"] is None and speed["detail"] == "needs CUDA (the fused Triton kernel) (N=1024, 4096, 16384)"
    speed, _, _ = bench.centroid_targets(_rows({"dense-sdpa": (2.0, 10.0)}, sizes=(1024,)), "cuda")
    assert speed["met"] is None and "no knn-triton row (--paths)" in speed["detail"]
    assert bench.centroid_targets(_rows({"dense-sdpa": (1.0, 1.0)}, sizes=(512,)), "cuda")[0]["detail"] == (
        "no N in range measured"
    )


def test_paths_skipped_on_cpu_and_why() -> None:
    assert bench.centroid_path_skipped("knn-triton", "cpu", compiled=True) == "needs CUDA (the fused Triton kernel)"
    assert "not requested" in bench.centroid_path_skipped("knn-compiled", "cuda", compiled=False)
    assert bench.centroid_path_skipped("knn-compiled", "cpu", compiled=True) is None
    assert bench.centroid_path_skipped("knn-masked", "cpu", compiled=False) is None
    assert (
        bench.centroid_path_skipped("knn-triton-compiled", "cpu", compiled=True)
        == "needs CUDA (the fused Triton kernel)"
    )
    assert "not requested" in bench.centroid_path_skipped("knn-triton-compiled", "cuda", compiled=False)
    assert bench.centroid_path_skipped("dense-sdpa-graphs", "cpu", compiled=True) == "needs CUDA (CUDA graphs)"
    assert bench.centroid_path_skipped("dense-sdpa-captured", "cpu", compiled=True) == "needs CUDA (CUDA graphs)"
    assert bench.centroid_path_skipped("dense-sdpa-captured", "cuda", compiled=False) is None  # nothing to compile
    assert "not requested" in bench.centroid_path_skipped("dense-sdpa-graphs", "cuda", compiled=False)


def test_cli_on_cpu_times_the_torch_rows_each_in_a_fresh_process_and_names_the_skipped_ones(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    run = run_tool("bench_centroid", ["--points", "64", "--dim", "16", "--heads", "2", "--k", "8", "--repeats", "1",
                                      "--json", str(path), "--profile", str(tmp_path / "prof")])  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "# knn-triton: not measured: needs CUDA (the fused Triton kernel)" in run.stdout
    assert "# knn-compiled: not measured: torch.compile row not requested" in run.stdout
    assert "target: fused KNN step (its fastest row) vs eager SDPA speedup at every N = 1K-16K > 1x: no verdict" in (
        run.stdout
    )
    assert "  N=64 knn: {'ms':" in run.stderr  # each configuration's result as it comes
    payload = json.loads(path.read_text())
    assert payload["tool"] == "bench_centroid" and payload["args"]["isolate"] == "auto"  # a process per configuration
    rows = {r["path"]: r for r in payload["results"]}
    assert list(rows) == list(bench.CENTROID_PATHS)
    assert [p for p, r in rows.items() if "ms" in r] == ["dense-matmul", "dense-sdpa", "knn", "knn-masked"]
    for r in rows.values():
        assert (r["N"], r["M"]) == (64, 16) and ("note" in r or r["ms"] > 0), r
    assert [t["verdict"] for t in payload["targets"]] == ["no verdict"] * 3
    assert "| N " in run.stdout and "knn-masked" in run.stdout
    # --profile: each timed row's step under torch.profiler (in its own process here), a table and a trace each
    assert "## profile (" in run.stdout and "| N=64 knn " in run.stdout
    for path, r in rows.items():
        if "ms" in r:
            assert r["profile"]["table"] == f"N64-{path}.txt" and r["profile"]["device_ms"] is None  # CPU
            assert (tmp_path / "prof" / f"N64-{path}.txt").is_file()
            assert (tmp_path / "prof" / f"N64-{path}.trace.json").is_file()


def test_the_graphs_target_names_a_capture_error_over_a_row_not_requested() -> None:
    rows = _rows({"dense-sdpa": (2.0, 10.0), "knn-triton": (1.0, 5.0), "knn-triton-captured": (0.5, None)})
    for n in (1024, 4096, 16384):  # --compiled no: no -graphs rows; SDPA's capture failed
        rows += [{"N": n, "path": "dense-sdpa-graphs", "note": "torch.compile row not requested"},
                 {"N": n, "path": "dense-sdpa-captured", "error": "RuntimeError: operation not permitted"}]  # fmt: skip
    _, graphs, _ = bench.centroid_targets(rows, "cuda")
    assert graphs["met"] is None and graphs["detail"] == "RuntimeError: operation not permitted (N=1024, 4096, 16384)"
