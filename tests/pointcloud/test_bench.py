"""pointcloud.bench (behind tools/bench_modelnet.py) at a tiny size: rows for T = 1, 2, 3 and the twins, ratios,
targets, peers, chunk budgets, the table, the settings it refuses."""

from __future__ import annotations

import pytest
import torch

from measure.bench import RECOMPILE_LIMIT, markdown_table
from pointcloud import bench
from pointcloud import model as pc_model
from pointcloud.testing import TinyPeer

CT = "centroid_transformer_modelnet40"
TINY = "tiny_peer_modelnet40"


def test_tiny_bench(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(pc_model.MODELS, TINY, TinyPeer)
    rows = bench.plan([CT, f"{CT}_random", TINY], [1, 2, 3], [64, 32])
    results = bench.benchmark(rows, "cpu", batch=2, num_points=128, repeats=1, warmup=1)
    labels = [r["label"] for r in results]
    assert labels == [f"{CT} T=1", f"{CT} T=2", f"{CT} T=3", f"{CT}_random", TINY]
    for r in results:
        assert r["params_m"] > 0 and r["gmacs"] > 0 and r["train_sps"] > 0 and r["infer_sps"] > 0
        assert r["train_ms_rounds"] == [r["train_ms"]]  # repeats 1: one timed round
        assert r["ops_per_step"] > r["kernel_ops_per_step"] > 0
    by = {r["label"]: r for r in results}
    assert by[f"{CT}_random"]["train_vs_random"] == 1.0
    assert by[f"{CT} T=1"]["paper_train_vs_random"] == pytest.approx(60 / 312)
    assert by[f"{CT} T=2"]["gmacs"] > by[f"{CT} T=1"]["gmacs"]  # one more attention step
    assert by[TINY]["num_steps"] is None and by[TINY]["paper_train_sps"] is None
    assert by[f"{CT} T=2"]["ops_per_step"] > by[f"{CT} T=1"]["ops_per_step"] > by[TINY]["ops_per_step"]

    out = markdown_table(*bench.table(results))
    header, *table = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line[:2] == "| "]
    assert {"train vs random", "paper vs random", "infer samples/s"} <= set(header)
    printed = {r[0]: dict(zip(header, r)) for r in table}
    assert list(printed) == labels
    assert printed[f"{CT} T=1"]["paper vs random"] == "0.192" and printed[TINY]["paper vs random"] == "-"
    assert float(printed[f"{CT} T=1"]["train vs random"]) > 0
    vs_random, *vs_pointnet = bench.targets(results, "cpu", num_points=128)
    assert (
        vs_random["target"] == "centroid T=1 train samples/s vs the random twin's" and vs_random["wanted"] == ">= 0.5x"
    )
    assert vs_random["measured"] == by[f"{CT} T=1"]["train_vs_random"] and vs_random["met"] is not None
    assert [t["detail"] for t in vs_pointnet] == ["rows not measured"] * 2  # no PointNet++ row: no verdict
    assert all(t["met"] is None for t in vs_pointnet)


def test_targets_against_pointnet2_are_cuda_ratios_of_the_same_run() -> None:
    def row(label: str, sps: float, ops: int) -> dict:
        return {"label": label, "train_sps": sps, "ops_per_step": ops, "train_vs_random": None}

    results = [row(f"{CT} T=1", 300, 1434), row(f"{CT} T=1 gather", 500, 1138), row(bench.POINTNET2, 200, 511)]
    vs_random, auto, gather = bench.targets(results, "cuda", amp=True)
    assert vs_random["met"] is None and vs_random["detail"] == "needs both in --models"
    assert auto["target"] == "centroid T=1 train samples/s vs PointNet++ (AMP, 1024 points)"
    assert auto["measured"] == pytest.approx(1.5) and auto["met"] is True and auto["detail"] == "ops/step 1434 vs 511"
    assert auto["wanted"] == ">= 1.3x" and gather["wanted"] == ">= 1x"  # auto: the fused kernels
    assert gather["target"].startswith("centroid T=1, attn_backend=gather, train samples/s vs PointNet++")
    assert gather["measured"] == pytest.approx(2.5) and gather["met"] is True
    on_cpu = bench.targets(results, "cpu")[1]  # CUDA targets: the ratio, but no verdict on CPU
    assert on_cpu["measured"] == pytest.approx(1.5) and on_cpu["met"] is None and "no verdict" in on_cpu["detail"]

    # the fused kernels eager or compiled, whichever trained faster; the batch, when given, names the run
    compiled = {**row(f"{CT} T=1 compiled", 240, None), "ops_per_step": None}
    auto = bench.targets([*results, compiled], "cuda", amp=True, batch=128)[1]
    assert auto["target"] == "centroid T=1 train samples/s vs PointNet++ (batch 128, AMP, 1024 points)"
    assert auto["measured"] == pytest.approx(1.5) and auto["detail"] == "ops/step 1434 vs 511; compiled 240 samples/s"
    compiled["train_sps"] = 320
    auto = bench.targets([*results, compiled], "cuda", amp=True)[1]
    assert auto["measured"] == pytest.approx(1.6) and auto["met"] is True
    assert auto["detail"] == "compiled, 320 vs 200 samples/s (PointNet++ eager)"
    graphs = {**row(f"{CT} T=1 compiled reduce-overhead", 400, None), "ops_per_step": None}
    auto = bench.targets([*results, compiled, graphs], "cuda", amp=True)[1]
    assert auto["measured"] == pytest.approx(2.0)
    assert auto["detail"] == "compiled reduce-overhead, 400 vs 200 samples/s (PointNet++ eager)"
    errored = {"label": f"{CT} T=1 compiled", "model": CT, "num_steps": 1, "error": "OutOfMemoryError"}
    assert bench.targets([*results, errored], "cuda", amp=True)[1]["measured"] == pytest.approx(1.5)
    vs_random = bench.targets(results, "cuda", batch=32)[0]
    assert vs_random["target"] == "centroid T=1 train samples/s vs the random twin's at batch 32"


def test_default_models_include_registered_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(pc_model.MODELS, TINY, TinyPeer)
    models = bench.default_models()
    assert models[:4] == [CT, f"{CT}_random", f"{CT}_fps", f"{CT}_kmeans"] and models[-1] == TINY
    rows = bench.plan(models, [1, 2, 3], [64, 32])
    assert [r[2] for r in rows[:6]] == [1, 2, 3, 0, 0, 0]
    assert rows[0][3] == {"num_classes": 40, "num_centroids": (64, 32), "num_steps": 1, "attn_backend": "auto"}
    assert rows[-1][3] == {"num_classes": 40}  # peers get no centroid knobs
    both = bench.plan([CT, TINY], [1], None, ["auto", "masked"])
    assert [r[0] for r in both] == [f"{CT} T=1", f"{CT} T=1 masked", TINY]
    assert both[1][3]["attn_backend"] == "masked"
    chunks = bench.plan([CT], [1], None, ["auto"], [16])
    assert [r[0] for r in chunks] == [f"{CT} T=1", f"{CT} T=1 chunks 16 MiB"]
    assert chunks[1][3]["_chunk_mb"] == 16 and chunks[1][3]["attn_backend"] == "gather"
    compiled = bench.plan([CT], [1], None, ["auto", "triton"], compile_forms=["masked", "auto"])
    assert [r[0] for r in compiled] == [f"{CT} T=1", f"{CT} T=1 triton", f"{CT} T=1 masked compiled",
                                        f"{CT} T=1 compiled"]  # fmt: skip
    assert compiled[2][3]["_compile"] == "default" and compiled[2][3]["attn_backend"] == "masked"
    modes = bench.plan([CT], [1], None, ["auto"], compile_forms=["auto"], compile_modes=["default", "reduce-overhead"])
    assert [r[0] for r in modes] == [f"{CT} T=1", f"{CT} T=1 compiled", f"{CT} T=1 compiled reduce-overhead"]
    assert modes[2][3]["_compile"] == "reduce-overhead"


@pytest.mark.torch_compat
def test_a_compiled_row_trains_and_infers_through_torch_compile(monkeypatch: pytest.MonkeyPatch) -> None:
    """The row's closures call the compiled model (static shapes); it counts no aten ops (generated kernels)."""
    calls = []

    def spy(model, **kwargs):
        calls.append(kwargs)
        return lambda x: calls.append("call") or model(x)

    monkeypatch.setattr(torch, "compile", spy)
    kwargs = {"num_classes": 40, "num_centroids": (32, 16), "num_steps": 1, "attn_backend": "masked"}
    # (config.patch restores the limit; monkeypatch's undo would delete the entry from dynamo's config module)
    with torch._dynamo.config.patch(recompile_limit=8):
        stats, train_step, infer = bench.prepare(CT, {**kwargs, "_compile": "default"}, "cpu", batch=2, num_points=64)
        # each (T, form, batch, mode) of a run is one more graph of the same forward: none may fall back to eager
        assert torch._dynamo.config.recompile_limit == RECOMPILE_LIMIT
    assert calls == [{"dynamic": False}] and stats["ops_per_step"] is None and stats["gmacs"] > 0
    train_step()
    infer()
    assert calls[1:] == ["call", "call"]
    bench.prepare(CT, {**kwargs, "_compile": "reduce-overhead"}, "cpu", batch=2, num_points=64)
    assert calls[3:] == [{"dynamic": False, "mode": "reduce-overhead"}]  # CUDA graphs too, on a GPU


class _Broken(torch.nn.Module):
    """A model whose forward fails, as a compile or an out-of-memory error would in one row of a GPU run."""

    def __init__(self, num_classes: int = 40) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(3, num_classes)

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("this row cannot run")


def test_a_row_that_fails_reports_its_error_and_the_others_are_timed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(pc_model.MODELS, TINY, TinyPeer)
    monkeypatch.setitem(pc_model.MODELS, "broken_modelnet40", _Broken)
    rows = bench.plan([CT, "broken_modelnet40", f"{CT}_random"], [1], [32, 16])
    results = bench.benchmark(rows, "cpu", batch=2, num_points=64, repeats=1, warmup=0)
    assert [r["label"] for r in results] == [f"{CT} T=1", "broken_modelnet40", f"{CT}_random"]
    broken = results[1]
    assert broken["error"] == "RuntimeError: this row cannot run" and "train_sps" not in broken
    assert results[0]["train_sps"] > 0 and results[0]["train_vs_random"] > 0
    printed = bench.table(results)[1]
    assert printed[1][:3] == ["broken_modelnet40", "-", "RuntimeError: this row cannot run"]
    assert len(printed[1]) == len(printed[0])
    assert bench.targets(results, "cpu")[0]["met"] is not None  # the verdicts read the rows that ran


def test_chunk_budget_sets_every_default_within_and_restores_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``--chunk-mb`` row really runs at its budget: the budgets its forward's chunking asked for (the backward
    reuses the forward's chunk rows)."""
    import attention.centroid.functional as functional
    from attention.chunking import chunk_budget

    def defaults() -> tuple[int, int, int, int]:
        return tuple(chunk_budget(op, d) for op in ("knn_attention", "knn") for d in ("cpu", "cuda"))

    before = defaults()
    budgets = []
    real = functional.chunk_rows
    spy = lambda n, row, budget: budgets.append(budget) or real(n, row, budget)  # noqa: E731
    monkeypatch.setattr(functional, "chunk_rows", spy)
    model = pc_model.create_model(CT, num_centroids=(32, 16), num_neighbors=8)
    x = torch.rand(2, 64, 3)
    with bench.chunk_budget(1):
        assert defaults() == (2**20,) * 4
        model(x).sum().backward()
    assert budgets and set(budgets) == {2**20}
    assert defaults() == before


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"amp": True}, "--amp is CUDA bf16 autocast"),
        ({"models": ["no_such_model"]}, "unknown models ['no_such_model']"),
        ({"batch": 1}, "--batch must be >= 2"),
        ({"chunk_mb": [0]}, "--chunk-mb budgets must be >= 1 MiB"),
        ({"compile_forms": ["csr"]}, "--compile takes the forms torch.compile traces"),
        ({"compile_forms": ["auto"], "compile_modes": ["fast"]}, "--compile-mode takes torch.compile's modes"),
        ({"compile_modes": ["reduce-overhead"]}, "--compile-mode applies to the compiled rows"),
    ],
)
def test_bad_settings(settings: dict, message: str) -> None:
    kwargs = {"models": [CT], "device": "cpu", "amp": False, "batch": 2, "repeats": 1, "chunk_mb": [], **settings}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        bench.check_settings(**kwargs)


def test_rows_that_need_another_device_are_skipped_with_the_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """A CPU run times the torch forms and names the fused kernel's row it cannot run; CUDA keeps every row."""
    from attention import backends

    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    rows = bench.plan([CT, TINY], [1], None, ["auto", "triton", "masked"])
    kept, skipped = bench.runnable(rows, "cpu")
    assert [r[0] for r in kept] == [f"{CT} T=1", f"{CT} T=1 masked", TINY]
    assert list(skipped) == [f"{CT} T=1 triton"] and "runs on cuda" in skipped[f"{CT} T=1 triton"]
    assert bench.runnable(rows, "cuda") == (rows, {})
    monkeypatch.setitem(backends.INSTALLED, "triton", False)
    assert "needs triton" in bench.runnable(rows, "cuda")[1][f"{CT} T=1 triton"]
