"""attention.bench: the targets of bench_points and bench_mixers, the large-cloud sizes bench_points runs, and the
centroid-attention rows with their ratios."""

from __future__ import annotations

import math

import pytest

from attention import bench


def _fps_row(backend: str, speedup: float, B: int = 32, N: int = 1024, M: int = 512) -> dict:
    return {"B": B, "N": N, "M": M, "backend": backend, "ms": 1.0, "speedup vs cluster": speedup}


def test_fps_target_against_torch_cluster() -> None:
    rows = [_fps_row("torch", 0.02), _fps_row("triton", 2.6), _fps_row("triton", 9.0, B=8)]
    t = bench.fps_cluster_target(rows, "cuda")
    assert t["target"] == "Triton fps vs torch-cluster (B=32 N=1024 M=512)" and t["wanted"] == ">= 2x"
    assert t["measured"] == 2.6 and t["met"] is True
    rows[1]["speedup vs cluster"] = float("nan")  # no torch-cluster: no verdict, and the reason
    t = bench.fps_cluster_target(rows, "cuda")
    assert t["met"] is None and t["measured"] is None and t["detail"] == "torch-cluster not installed"
    assert bench.fps_cluster_target(rows[:1], "cuda")["detail"] == "row not measured"
    on_cpu = bench.fps_cluster_target([_fps_row("triton", 2.6)], "cpu")
    assert on_cpu["measured"] == 2.6 and on_cpu["met"] is None and "no verdict" in on_cpu["detail"]


def test_fsat_target_is_its_time_as_a_fraction_of_sdpa_at_16k() -> None:
    rows = [
        {"L": 4096, "mixer": "fsat", "ms": 1.0, "speedup vs attention-sdpa": 0.5},
        {"L": 16384, "mixer": "attention-sdpa", "ms": 10.0, "speedup vs attention-sdpa": 1.0},
        {"L": 16384, "mixer": "fsat", "ms": 8.0, "speedup vs attention-sdpa": 1.25},
    ]
    t = bench.fsat_target(rows, "cuda")
    assert t["measured"] == pytest.approx(0.8) and t["met"] is True and t["wanted"] == "< 1"
    on_cpu = bench.fsat_target(rows, "cpu")  # a CUDA target: the ratio, no verdict
    assert on_cpu["measured"] == pytest.approx(0.8) and on_cpu["met"] is None
    failed = bench.fsat_target([{"L": 16384, "mixer": "fsat", "error": "OutOfMemoryError"}], "cuda")
    assert failed["met"] is None and "OutOfMemoryError" in failed["detail"]


def test_large_clouds_follow_the_requested_sizes() -> None:
    """The 50K and 100K clouds run with the default grid only: other --points skip them unless --large names some."""
    assert bench.large_clouds(None, bench.GRID_POINTS) == [50000, 4096, 100000, 8192]
    assert bench.large_clouds(None, [256]) == []
    assert bench.large_clouds(None, [1024]) == []
    assert bench.large_clouds([8192, 512], [256]) == [8192, 512]
    assert bench.large_clouds([], bench.GRID_POINTS) == []  # `--large` alone: skip
    with pytest.raises(ValueError, match="--large takes N M pairs, got 3 numbers: 8192 512 4096"):
        bench.large_clouds([8192, 512, 4096], [256])


def test_large_cloud_rows_time_every_backend_against_the_reference() -> None:
    rows = bench.large_cloud_rows([300, 32], "cpu", repeats=1, clouds=["uniform", "clustered"])
    by = {(r[0], r[3].removesuffix(" (auto)")): dict(zip(bench.LARGE_HEADERS, r)) for r in rows}
    for cloud in ("uniform", "clustered"):
        ref = by[(cloud, "torch")]
        assert (ref["N"], ref["M"], ref["kind"]) == (300, 32, "exact")
        assert ref["speedup vs reference"] == 1.0 and ref["coverage / exact"] == 1.0
        assert ref["same indices as exact"] == "yes"


def test_point_op_rows_check_every_fps_backend_against_the_reference() -> None:
    fps, knn = bench.point_op_rows("cpu", [2], [64], [3, 8], k=4, repeats=1)
    assert {(r[0], r[1], r[2]) for r in fps} == {(2, 64, 32), (2, 64, 16)}
    assert {r[3] for r in fps} == set(bench.fps_backends("cpu")) and "fpsample_bucket" not in {r[3] for r in fps}
    assert all(r[6] == "yes" for r in fps if r[3] == "torch")
    assert {(r[2], r[3], r[4]) for r in knn} == {(M, C, 4) for M in (32, 16) for C in (3, 8)}
    results = bench.points_results(fps, knn, [])
    assert results["fps"][0]["backend"] == fps[0][3] and results["large"] == []


def test_centroid_rows_carry_ratios_against_both_dense_paths() -> None:
    results = bench.centroid_results("cpu", [64], paths=bench.CENTROID_PATHS, compiled=False, k=8, dim=16, heads=2,
                                     batch=1, repeats=1, isolate=False)  # fmt: skip
    by = {r[2]: dict(zip(bench.CENTROID_HEADERS, r)) for r in bench.centroid_rows(results)}
    assert list(by) == list(bench.CENTROID_PATHS)
    assert by["knn-triton"]["ms"] == by["knn-compiled"]["ms"] == "not measured (see above)"  # CUDA / not asked
    timed = {path: r for path, r in by.items() if path not in ("knn-triton", "knn-compiled")}
    assert timed["dense-matmul"]["speedup vs matmul"] == 1.0 and timed["dense-sdpa"]["speedup vs sdpa"] == 1.0
    for r in timed.values():
        assert (r["N"], r["M"]) == (64, 16) and r["ms"] > 0
        assert r["speedup vs sdpa"] == pytest.approx(timed["dense-sdpa"]["ms"] / r["ms"])
        peak_ok = not math.isnan(r["peak MB"]) and not math.isnan(timed["dense-matmul"]["peak MB"])
        assert math.isnan(r["memory vs matmul"]) or peak_ok  # a ratio only where both peaks were measured


def test_mixer_table_shows_time_as_a_fraction_of_each_baseline() -> None:
    results = bench.mixer_rows("cpu", [32], ["fsat", "cauchy"], dim=16, heads=2, batch=1, repeats=1,
                               max_quadratic_len=16, isolate=False)  # fmt: skip
    assert [r["mixer"] for r in results] == ["attention-matmul", "attention-sdpa", "fsat", "cauchy"]
    headers, rows = bench.mixer_table(results)
    fsat = dict(zip(headers, rows[2]))
    assert fsat["time vs sdpa"] == pytest.approx(1 / results[2]["speedup vs attention-sdpa"])
    assert rows[3][2].startswith("skipped (L > --max-quadratic-len 16)")
