"""tools/bench_knn_attention.py (logic in attention.bench): the fused KNN-attention kernel's heads per program against
the gather path at a model's shapes; the kernel's rows under Triton's interpreter on CPU."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import attention.centroid.layer as centroid_layer
from attention.bench import KNN_KERNEL_PRESETS, knn_kernel_fastest
from engine.testing import run_tool


def test_the_modelnet_preset_is_the_point_models_attention_shapes(monkeypatch) -> None:
    """The preset's (M, N, K, H, D) are those the ModelNet40 centroid transformer's KNN attentions run at 1024
    points, recorded from the model's own forward."""
    import pointcloud

    seen, knn = [], centroid_layer.knn_centroid_attention

    def record(q, k, v, idx, *args, **kwargs):
        seen.append((q.shape[2], k.shape[2], idx.shape[2], q.shape[1], q.shape[3]))
        return knn(q, k, v, idx, *args, **kwargs)

    monkeypatch.setattr(centroid_layer, "knn_centroid_attention", record)  # the gather form, the CPU's
    model = pointcloud.create_model("centroid_transformer_modelnet40").eval()
    with torch.no_grad():
        model(torch.rand(2, 1024, 3))
    assert seen == [shape[1:] for shape in KNN_KERNEL_PRESETS["modelnet"]]


def test_a_cpu_run_times_the_gather_path_and_says_why_the_kernel_is_not(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "bench.json"
    argv = ["--shape", "S", "8", "32", "4", "2", "8", "--repeats", "1", "--json", str(path)]
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    run = run_tool("bench_knn_attention", argv)
    assert run.returncode == 0, run.stderr
    payload = json.loads(path.read_text())
    gather, skipped = payload["results"]
    assert gather["form"] == "gather" and gather["step_ms"] > 0 and gather["max_diff"] == 0 and gather["B"] == 1
    assert "runs on CUDA (or on CPU under TRITON_INTERPRET=1)" in skipped["skipped"]
    assert payload["fastest"] is None and "fastest:" not in run.stdout
    assert "# shapes of --shape, torch.float32" in run.stdout


@pytest.mark.torch_compat
@pytest.mark.slow
def test_the_kernels_rows_under_the_interpreter_equal_the_gather_path(tmp_path: Path, monkeypatch) -> None:
    path = tmp_path / "bench.json"
    argv = ["--shape", "odd", "5", "24", "3", "3", "8", "--shape", "wide", "4", "16", "3", "4", "128", "--batch", "2",
            "--block-h", "1", "2", "8", "--repeats", "1", "--json", str(path)]  # fmt: skip
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # read by triton when the tool imports it
    run = run_tool("bench_knn_attention", argv)
    assert run.returncode == 0, run.stderr
    payload = json.loads(path.read_text())
    rows = {(r["shape"], r["form"]): r for r in payload["results"]}
    assert set(rows) == {
        ("odd", "gather"), ("odd", "block_h=1"), ("odd", "block_h=2"), ("odd", "block_h=8 (runs as 4)"),
        ("wide", "gather"), ("wide", "block_h=1"), ("wide", "block_h=2"), ("wide", "block_h=8"),
    }  # fmt: skip
    # block_h=8 at D = 128: past the kernel's tile budget (it checks the value asked for), refused with its reason
    assert "block_h * next_pow2(D) must be <= 512" in rows[("wide", "block_h=8")]["skipped"]
    for (shape, form), r in rows.items():
        if "skipped" not in r:
            assert r["max_diff"] < 1e-5 and r["step_ms"] > 0, (shape, form)
            assert r["vs_gather"] == pytest.approx(rows[(shape, "gather")]["step_ms"] / r["step_ms"])
    assert rows[("odd", "block_h=8 (runs as 4)")]["block_h"] == 8
    # block_h=8 ran at one shape only: the sums compare the values that ran at both
    fastest = payload["fastest"]
    assert [s["block_h"] for s in fastest["sums"]] == [1, 2] and fastest == knn_kernel_fastest(payload["results"])
    assert payload["tables"][1]["title"] == "fwd+bwd summed over the shapes"
    assert f"fastest: block_h={fastest['block_h']}" in run.stdout


def test_bad_flags_are_refused_by_name() -> None:
    run = run_tool("bench_knn_attention", ["--block-h", "3"])
    assert run.returncode == 2 and "--block-h takes powers of two, got [3]" in run.stderr
    run = run_tool("bench_knn_attention", ["--shape", "S", "8", "4", "9", "2", "8"])
    assert run.returncode == 2 and "need B, M, N, K, H, D >= 1 and K <= N" in run.stderr
    for flag in ("--repeats", "--inner", "--batch"):
        run = run_tool("bench_knn_attention", [flag, "0"])
        assert run.returncode == 2 and f"{flag} must be >= 1, got 0" in run.stderr
    run = run_tool("bench_knn_attention", ["--shape", "S", "8", "x", "4", "2", "8"])
    assert run.returncode == 2 and "--shape takes a name and five integers M N K H D" in run.stderr
