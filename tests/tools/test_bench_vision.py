"""tools/bench_vision.py: a tiny run prints the table with ratios against DeiT measured in the same run."""

from __future__ import annotations

import pytest

from engine.testing import load_tool

bench_vision = load_tool("bench_vision")


def test_tiny_run_has_deit_baselines_and_ratios(capsys: pytest.CaptureFixture[str]) -> None:
    results = bench_vision.main(
        ["--batch", "2", "--img-size", "32", "--repeats", "1", "--warmup", "0", "--models",
         "centroid_deit_tiny_c6_patch16_224", "settrans_deit_small_patch16_224"]
    )  # fmt: skip
    assert {"deit_tiny_patch16_224", "deit_small_patch16_224"} <= {r["model"] for r in results}
    by = {r["model"]: r for r in results}
    assert by["deit_tiny_patch16_224"]["infer_vs_deit"] == 1.0
    assert (
        by["centroid_deit_tiny_c6_patch16_224"]["infer_ips"] > 0
        and by["centroid_deit_tiny_c6_patch16_224"]["gmacs"] > 0
    )
    out = capsys.readouterr().out
    assert "infer vs DeiT" in out and "target: centroid_deit_tiny_c6_patch16_224 inference >= 1.4x" in out


def test_registered_lists_every_vision_model() -> None:
    names = bench_vision.registered()
    assert "centroid_deit_tiny_c6_patch16_224" in names and "linformer_deit_small_patch16_224" in names
    assert len(names) == 10
