"""vision.bench: the rows bench_vision measures (DeiT baselines added where missing) and the Ours-1 target."""

from __future__ import annotations

import pytest

from vision.bench import BASELINES, OURS_1, benchmark, model_names, ours_target, registered, table


def test_ours_target_is_per_device_and_needs_the_row() -> None:
    rows = [{"model": OURS_1, "infer_vs_deit": 1.5}]
    assert ours_target(rows, "cpu")["met"] is True
    on_gpu = ours_target(rows, "cuda")
    assert on_gpu["wanted"] == ">= 1.6x" and on_gpu["met"] is False
    assert ours_target([], "cuda")["met"] is None


def test_registered_lists_every_vision_model() -> None:
    names = registered()
    assert "centroid_deit_tiny_c6_patch16_224" in names and "linformer_deit_small_patch16_224" in names
    assert len(names) == 10


def test_model_names_put_the_missing_deit_baseline_first() -> None:
    assert model_names([OURS_1]) == [BASELINES["tiny"], OURS_1]
    assert model_names([BASELINES["tiny"], OURS_1]) == [BASELINES["tiny"], OURS_1]
    assert model_names()[:2] == [BASELINES["tiny"], BASELINES["small"]] and OURS_1 in model_names()


def test_inference_only_rows_have_no_train_columns() -> None:
    settings = dict(batch=2, img_size=32, repeats=1, warmup=0, stat="median", amp=False, compile_models=False)
    results = benchmark(model_names([OURS_1]), "cpu", **settings, train=False)
    assert [r["model"] for r in results] == [BASELINES["tiny"], OURS_1]
    assert results[0]["infer_vs_deit"] == 1.0 and "train_ips" not in results[1]
    assert results[1]["infer_vs_deit"] == pytest.approx(results[1]["infer_ips"] / results[0]["infer_ips"])
    headers, rows = table(results, train=False)
    assert headers[-1] == "infer vs DeiT" and len(rows[1]) == len(headers)
