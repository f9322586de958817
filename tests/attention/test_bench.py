"""attention.bench: the targets of bench_points and bench_mixers, the large-cloud sizes bench_points runs, and the
centroid-attention rows with their ratios."""

from __future__ import annotations

import math

import pytest
import torch

from attention import backends, bench
from measure.bench import RECOMPILE_LIMIT


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


def test_knn_memory_row_runs_at_the_target_size_by_default_on_cpu_only() -> None:
    assert bench.knn_memory_sizes(None, bench.GRID_POINTS, "cpu") == [20000, 200000, 128]
    assert bench.knn_memory_sizes(None, bench.GRID_POINTS, "cuda") == []
    assert bench.knn_memory_sizes(None, [256], "cpu") == []
    assert bench.knn_memory_sizes([], bench.GRID_POINTS, "cpu") == []  # `--knn-memory` alone: skip
    assert bench.knn_memory_sizes([50, 300, 8], [256], "cpu") == [50, 300, 8]
    with pytest.raises(ValueError, match="--knn-memory takes M N C"):
        bench.knn_memory_sizes([50, 0, 8], [256], "cpu")


def test_knn_memory_targets_judge_the_peak_at_its_size_and_the_growth_at_any() -> None:
    row = dict(zip(bench.KNN_MEMORY_HEADERS, [20000, 200000, 128, 16, 1, 0.9, 1.2, 6, 3334, 0.0, ""]))
    peak, growth = bench.knn_memory_targets(row)
    assert (peak["verdict"], peak["measured"], growth["verdict"]) == ("MET", 1.2, "MET")
    peak, growth = bench.knn_memory_targets({**row, "peak RSS GB": 7.1, "growth MB": 99.0})
    assert (peak["verdict"], growth["verdict"]) == ("NOT MET", "NOT MET")
    peak, _ = bench.knn_memory_targets({**row, "M": 200, "peak RSS GB": 0.5})
    assert peak["met"] is None and peak["measured"] == 0.5 and "the target is for M=20000" in peak["detail"]
    nan = float("nan")
    peak, growth = bench.knn_memory_targets({**row, "peak RSS GB": nan, "growth MB": nan, "error": "MemoryError"})
    assert peak["met"] is None and growth["met"] is None and peak["detail"] == "MemoryError"
    assert bench.knn_memory_targets(None) == []


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
    assert all(r[7] == "yes" for r in fps if r[3] == "torch")
    assert {(r[2], r[3], r[4]) for r in knn} == {(M, C, 4) for M in (32, 16) for C in (3, 8)}
    # every ratio is against the reference timed in the same run
    assert all(r[5] == 1.0 for r in fps if r[3] == "torch") and all(r[7] == 1.0 for r in knn if r[5] == "torch")
    results = bench.points_results(fps, knn, [])
    assert results["fps"][0]["backend"] == fps[0][3] and results["large"] == []


def test_centroid_rows_carry_ratios_against_both_dense_paths() -> None:
    results = bench.centroid_results("cpu", [64], paths=bench.CENTROID_PATHS, compiled=False, k=8, dim=16, heads=2,
                                     batch=1, repeats=1, isolate=False)  # fmt: skip
    by = {r[2]: dict(zip(bench.CENTROID_HEADERS, r)) for r in bench.centroid_rows(results)}
    assert list(by) == list(bench.CENTROID_PATHS)
    untimed = ("knn-triton", "knn-compiled", "knn-triton-compiled", "knn-triton-graphs", "dense-sdpa-graphs",
               "knn-triton-captured", "dense-sdpa-captured")  # fmt: skip
    assert {by[path]["ms"] for path in untimed} == {"not measured (see above)"}
    timed = {path: r for path, r in by.items() if path not in untimed}
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


def _mixer_row(L: int, mixer: str, ms: float, vs_matmul: float, vs_sdpa: float, memory: float = 0.1) -> dict:
    ratios = {"speedup vs attention-matmul": vs_matmul, "speedup vs attention-sdpa": vs_sdpa}
    return {"L": L, "mixer": mixer, "ms": ms, "peak_mb": 1.0, "path": "triton", **ratios,
            "memory vs attention-matmul": memory}  # fmt: skip


def test_mixer_kernel_targets_are_fractions_of_the_baselines_of_the_same_run() -> None:
    rows = [
        _mixer_row(4096, "fsat", 1.0, vs_matmul=3.0, vs_sdpa=0.8, memory=0.12),
        _mixer_row(8192, "fsat", 2.0, vs_matmul=9.0, vs_sdpa=1.5),
        _mixer_row(16384, "fsat", 4.0, vs_matmul=9.0, vs_sdpa=0.9),  # slower than SDPA at 16K only
        _mixer_row(4096, "hydra", 1.0, vs_matmul=3.0, vs_sdpa=2.0),
        _mixer_row(8192, "hydra", 2.0, vs_matmul=9.0, vs_sdpa=3.0),
        _mixer_row(16384, "hydra", 4.2, vs_matmul=9.0, vs_sdpa=4.0),
    ]
    time4k, memory4k, fsat_sdpa, hydra_sdpa, growth = bench.mixer_kernel_targets(rows, "cuda")
    assert time4k["measured"] == pytest.approx(1 / 3) and time4k["met"] is True and time4k["wanted"] == "<= 0.4"
    assert memory4k["measured"] == 0.12 and memory4k["met"] is True
    assert fsat_sdpa["measured"] == pytest.approx(1 / 0.9) and fsat_sdpa["met"] is False
    assert fsat_sdpa["detail"] == "fsat at L = 16384 ran triton"  # the largest fraction, and the path it measured
    assert hydra_sdpa["measured"] == pytest.approx(0.5) and hydra_sdpa["met"] is True  # the 4K row, of 4K-16K
    assert growth["measured"] == pytest.approx(2.1) and growth["met"] is True
    on_cpu = bench.mixer_kernel_targets(rows, "cpu")  # CUDA targets: the ratios, no verdict
    assert [t["measured"] for t in on_cpu] == [t["measured"] for t in (time4k, memory4k, fsat_sdpa, hydra_sdpa, growth)]
    assert all(t["met"] is None for t in on_cpu)
    rows[2] = {"L": 16384, "mixer": "fsat", "error": "OutOfMemoryError"}
    del rows[-1]
    _, _, fsat_sdpa, _, growth = bench.mixer_kernel_targets(rows, "cuda")
    assert fsat_sdpa["met"] is None and fsat_sdpa["detail"] == "fsat at L = 16384: OutOfMemoryError"
    assert growth["met"] is None and growth["detail"] == "hydra at L = 16384: not measured"


def test_kernel_targets_read_the_compiled_kernels_where_they_ran_faster() -> None:
    """A compiled model runs the kernels under torch.compile: the target takes that row where it is faster and names
    it; the eager row where it is faster."""
    compiled = _mixer_row(4096, "fsat-fused-compiled", 0.5, vs_matmul=6.0, vs_sdpa=1.6, memory=0.11)
    rows = [
        _mixer_row(4096, "fsat", 1.0, vs_matmul=3.0, vs_sdpa=0.8, memory=0.12),
        {**compiled, "path": "triton compiled"},
    ]
    time4k, memory4k, *_ = bench.mixer_kernel_targets(rows, "cuda")
    assert time4k["measured"] == pytest.approx(1 / 6) and memory4k["measured"] == 0.11
    assert time4k["detail"] == "fsat-fused-compiled at L = 4096 ran triton compiled"
    rows[1] = {**rows[1], "ms": 2.0, "speedup vs attention-matmul": 1.5}
    assert bench.mixer_kernel_targets(rows, "cuda")[0]["detail"] == "fsat at L = 4096 ran triton"
    # CUDA graphs: the fastest of the three rows for time; the memory of the fastest row that measured a peak (a
    # graph row has none: its graphs' pool)
    graphs = _mixer_row(4096, "fsat-fused-graphs", 0.4, vs_matmul=7.5, vs_sdpa=2.0, memory=float("nan"))
    time4k, memory4k, *_ = bench.mixer_kernel_targets([*rows, {**graphs, "path": "triton CUDA graphs"}], "cuda")
    assert time4k["measured"] == pytest.approx(1 / 7.5) and memory4k["measured"] == 0.12
    assert time4k["detail"] == "fsat-fused-graphs at L = 4096 ran triton CUDA graphs"
    assert memory4k["detail"] == "fsat at L = 4096 ran triton"
    # Hydra's growth 8K -> 16K within one row: a compiled row at 16K only does not mix with the eager one at 8K
    hydra = [_mixer_row(8192, "hydra", 2.0, 9.0, 3.0), _mixer_row(16384, "hydra", 4.2, 9.0, 4.0),
             _mixer_row(16384, "hydra-fused-compiled", 1.0, 9.0, 8.0)]  # fmt: skip
    growth = bench.mixer_kernel_targets(hydra, "cuda")[-1]
    assert growth["measured"] == pytest.approx(2.1) and growth["detail"] == "hydra at L = 8192 and 16384 ran triton"


def test_kernel_mixer_rows_name_their_path_and_skip_a_torch_row_that_repeats_auto(monkeypatch) -> None:
    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    # CUDA: auto runs the kernels; the torch rows the plain path auto would take without them; compiled: traceable
    assert bench.mixer_path("fsat", "cuda", 64) == bench.mixer_path("hydra", "cuda", 64) == "triton"
    assert bench.mixer_path("fsat-torch", "cuda", 64) == bench.mixer_path("fsat-compiled", "cuda", 64) == "gather"
    assert bench.mixer_path("hydra-torch", "cuda", 64) == bench.mixer_path("hydra-compiled", "cuda", 64) == "torch"
    assert bench.mixer_path("fsat", "cuda", 256) == "gather"  # beyond the kernel's head size
    assert bench.mixer_path("fsat-compiled", "cpu", 64) == "gather" and bench.mixer_path("fsat", "cpu", 64) == "csr"
    assert bench.mixer_path("cauchy", "cuda", 64) is None
    # the kernels compiled: what auto runs (the kernels on CUDA, where the rows are timed)
    assert bench.mixer_path("fsat-fused-compiled", "cuda", 64) == bench.mixer_path("hydra-fused-compiled", "cuda", 64)
    assert bench.mixer_path("hydra-fused-compiled", "cuda", 64) == "triton"
    assert bench.mixer_path("fsat-fused-graphs", "cuda", 64) == bench.mixer_path("hydra-fused-graphs", "cuda", 64)
    assert bench.mixer_path("hydra-fused-graphs", "cuda", 64) == "triton"
    assert bench.mixer_path("fsat-fused-captured", "cuda", 64) == "triton"
    assert bench.mixer_path("hydra-fused-compiled-captured", "cuda", 64) == "triton"
    mixers = ["fsat", "fsat-torch", "fsat-fused-compiled", "hydra", "hydra-fused-graphs", "hydra-fused-captured",
              "fsat-fused-compiled-captured"]  # fmt: skip
    results = bench.mixer_rows("cpu", [32], mixers, dim=16, heads=2, batch=1, repeats=1, max_quadratic_len=None,
                               isolate=False)  # fmt: skip
    by = {r["mixer"]: r for r in results}
    assert by["fsat"]["path"] == "csr" and by["hydra"]["path"] == "torch" and "path" not in by["attention-sdpa"]
    assert by["fsat-torch"]["error"] == "skipped: the fsat row runs this path (csr) on cpu"
    assert by["fsat-fused-compiled"]["error"] == "skipped: no fused kernel runs on cpu (fsat takes csr)"
    assert by["hydra-fused-graphs"]["error"] == "skipped: no fused kernel runs on cpu (hydra takes torch)"
    assert by["hydra-fused-captured"]["error"] == "skipped: no fused kernel runs on cpu (hydra takes torch)"
    assert by["fsat-fused-compiled-captured"]["error"] == "skipped: no fused kernel runs on cpu (fsat takes csr)"
    assert by["fsat-fused-compiled-captured"]["path"] == "csr compiled, captured CUDA graphs"
    assert by["hydra-fused-captured"]["path"] == "torch captured CUDA graphs"
    headers, rows = bench.mixer_table(results)
    assert [r[1] for r in rows] == ["attention-matmul", "attention-sdpa", "fsat (csr)", "fsat-torch",
                                    "fsat-fused-compiled", "hydra (torch)", "hydra-fused-graphs",
                                    "hydra-fused-captured", "fsat-fused-compiled-captured"]  # fmt: skip


@pytest.mark.torch_compat
def test_compiled_mixer_rows_compile_in_their_mode_and_stay_compiled(monkeypatch) -> None:
    """-fused-graphs compiles with mode="reduce-overhead" (CUDA graphs), -fused-compiled and -compiled with the
    default; each raises dynamo's recompile limit, since every row is one more graph of the mixer's forward.
    -fused-captured captures the eager kernels (on CUDA, in measure_mixer) and compiles nothing; -fused-compiled-
    captured returns the layer wrapped by torch.compile (default mode, static shapes), which measure_mixer captures:
    the wrapper's forward is the one a capture replaces."""
    modes, wrapped = [], []
    monkeypatch.setattr(torch.nn.Module, "compile", lambda self, **kw: modes.append(kw))
    monkeypatch.setattr(torch, "compile", lambda layer, **kw: wrapped.append(kw) or ("compiled", layer))
    with torch._dynamo.config.patch(recompile_limit=8):  # (patch restores it; monkeypatch's undo would delete it)
        for name in ("hydra-fused-graphs", "hydra-fused-compiled", "fsat-compiled", "fsat", "fsat-fused-captured"):
            bench._bench_mixer(name, 16, 2, 32, torch.device("cpu"))
        assert torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT
    assert modes == [{"mode": "reduce-overhead"}, {}, {}] and not wrapped  # the captured row compiles nothing
    with torch._dynamo.config.patch(recompile_limit=8):
        tag, layer = bench._bench_mixer("fsat-fused-compiled-captured", 16, 2, 32, torch.device("cpu"))
        assert torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT
    assert tag == "compiled" and type(layer).__name__ == "FourierSparseAttention" and wrapped == [{"dynamic": False}]
    assert len(modes) == 3  # not compiled in place as well


@pytest.mark.gpu
def test_cuda_graph_rows_time_a_replayed_step_without_a_peak() -> None:
    for mixer in ("fsat-fused-graphs", "hydra-fused-graphs", "fsat-fused-captured", "hydra-fused-captured",
                  "fsat-fused-compiled-captured", "hydra-fused-compiled-captured"):  # fmt: skip
        r = bench.measure_mixer(dict(mixer=mixer, device="cuda", B=1, L=256, C=64, H=2, repeats=2))
        assert r["ms"] > 0 and r["peak_mb"] is None, (mixer, r)  # the graphs' pool: no peak


@pytest.mark.gpu
def test_centroid_graph_rows_time_a_replayed_step() -> None:
    for path in ("knn-triton-graphs", "dense-sdpa-graphs", "knn-triton-captured", "dense-sdpa-captured"):
        cfg = dict(mode=path, device="cuda", B=1, N=512, M=128, C=64, H=2, K=16, repeats=2)
        r = bench.measure_centroid(cfg)
        assert r["ms"] > 0 and r["peak_mb"] is None, (path, r)  # the graphs' pool: no peak
        assert r.get("form") == ("triton" if path.startswith("knn") else None)


@pytest.mark.torch_compat
@pytest.mark.slow
def test_torch_path_row_runs_under_dynamo() -> None:
    cfg = dict(mixer="hydra-compiled", device="cpu", B=1, L=40, C=16, H=2, repeats=1)
    r = bench.measure_mixer(cfg)
    assert r["ms"] > 0 and r["peak_mb"] > 0
