"""tools/bench_capsules.py (logic in capsules.bench) at a tiny size, run as a script and read through --json: every
column, the ratios against routing, the targets; the usage errors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.testing import run_tool

SMALL = ["pointcaps_routing_small", "pointcaps_centroid_small"]
PAPER_PARAMS_M = {"pointcaps_routing_small": 18.4, "pointcaps_centroid_small": 0.6}  # the paper's section 3.3


def test_tiny_bench(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    kwargs = '{"num_primary": 24, "num_latent": 8, "latent_dim": 64}'  # W expanded: 0.8 MB per sample
    argv = ["--models", *SMALL, "--points", "48", "--batch", "2", "--repeats", "1", "--warmup", "0",
            "--mem-batches", "2", "3", "--train-steps", "2", "--chamfer-points", "24", "--train-per-class", "2",
            "--budget-gb", "1", "--model-kwargs", kwargs, "--json", str(path)]  # fmt: skip
    run = run_tool("bench_capsules", argv)
    assert run.returncode == 0, run.stderr
    payload = json.loads(path.read_text())
    results = payload["results"]
    assert [(r["model"], r["impl"]) for r in results] == [
        ("pointcaps_routing_small", "einsum"),
        ("pointcaps_routing_small", "reference"),
        ("pointcaps_centroid_small", "-"),
    ]
    for r in results:
        assert r["params_m"] > 0 and r["step_ms"] > 0 and r["mem_mb_per_sample"] > 0 and r["max_batch"] >= 0
        assert len(r["mem_peak_mb"]) == 2 and r["mem_peak_mb"][1] > r["mem_peak_mb"][0]
        assert r["paper_params_m"] == PAPER_PARAMS_M[r["model"]]
    einsum, reference, centroid = results
    assert einsum["chamfer"] > 0 and 0 < einsum["part_purity"] <= 1 and "chamfer" not in reference
    assert 0 < einsum["part_purity_chance"] <= 1
    assert einsum["params_m"] == reference["params_m"]
    # The reference impl keeps W expanded over the batch, (B, M, P, D, K) floats per sample: far more per sample.
    assert reference["mem_mb_per_sample"] > einsum["mem_mb_per_sample"]
    assert "vs_routing" not in einsum and set(centroid["vs_routing"]) == {"einsum", "reference"}
    ratios = centroid["vs_routing"]["einsum"]
    assert ratios["params"] == pytest.approx(centroid["params_m"] / einsum["params_m"])
    assert ratios["chamfer"] == pytest.approx(centroid["chamfer"] / einsum["chamfer"])
    assert centroid["vs_routing"]["reference"]["max_batch"] == pytest.approx(
        centroid["max_batch"] / reference["max_batch"]
    )
    # the targets: max batch and params against both impls, Chamfer against the one that was trained
    targets = {t["target"]: t for t in payload["targets"]}
    assert list(targets) == [
        "small vs einsum routing: max batch",
        "small vs einsum routing: params",
        "small vs einsum routing: Chamfer after 2 steps",
        "small vs reference routing: max batch",
        "small vs reference routing: params",
    ]
    assert targets["small vs einsum routing: params"]["measured"] == pytest.approx(ratios["params"])
    assert targets["small vs einsum routing: Chamfer after 2 steps"]["wanted"] == "< 1x"
    assert all(t["met"] is not None for t in targets.values())
    out = run.stdout
    assert "target: small vs einsum routing: max batch >= 3x" in out and "small vs reference routing" in out
    assert "Chamfer distance = mean over a" in out
    header = next(line for line in out.splitlines() if line.startswith("| model"))
    assert "max batch vs reference routing" in header and "Chamfer @2 steps (patch)" in header
    assert payload["tool"] == "bench_capsules" and payload["chamfer_definition"].startswith("Chamfer distance")
    # the decoder table: both variants with both decoders; the main table's columns are the first decoder's
    decoded = {(d["model"], d["decoder"]): d for d in payload["decoders"]}
    assert set(decoded) == {(m, d) for m in SMALL for d in ("patch", "heads")}
    for d in decoded.values():
        assert d["chamfer"] > 0 and 0 < d["part_purity"] <= 1 and 0 < d["part_purity_chance"] <= 1
        assert 0 < d["patch_spread"] < 2
    assert centroid["chamfer"] == decoded[("pointcaps_centroid_small", "patch")]["chamfer"]
    assert decoded[("pointcaps_centroid_small", "heads")]["chamfer"] != centroid["chamfer"]
    assert "| pointcaps_centroid_small | heads" in out.replace("  ", "")


@pytest.mark.parametrize("argv", [["--models", "pointcaps_tiny"], ["--mem-batches", "4", "2"]])
def test_rejects_unknown_models_and_bad_batches(argv: list[str]) -> None:
    run = run_tool("bench_capsules", argv)
    assert run.returncode == 2 and "error:" in run.stderr
