"""pointcloud.diagnostics and tools/diagnose_modelnet.py: per-block gradient norms against a hand-made sum, the
attention statistics' fixed points (uniform attention, a zero update, xyz neighbours), and the CLI on a tiny run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import engine
import pointcloud
from engine.testing import run_tool
from pointcloud.diagnostics import attention_statistics, gradient_norms
from pointcloud.recipe import ModelNetRecipe
from pointcloud.testing import TINY_MODELNET_SETS

SMALL = {"num_classes": 5, "num_neighbors": 4, "widths": (16, 16, 16, 32), "fuse_dim": 16, "head_dims": (16,),
         "drop": 0.0}  # fmt: skip


def _model(**kwargs) -> pointcloud.CentroidTransformer:
    torch.manual_seed(0)
    return pointcloud.create_model("centroid_transformer_modelnet40", **{**SMALL, **kwargs})


def test_gradient_norms_match_the_parameters_gradients() -> None:
    model = _model()
    batch = (torch.rand(4, 32, 3), torch.tensor([0, 1, 2, 3]))
    norms = gradient_norms(model, [batch], F.cross_entropy)
    assert list(norms) == ["embed", "SA1", "CA1", "SA2", "CA2", "fuse", "head"]
    assert model.blocks[1].attn.q.weight.grad is None  # the model's .grad fields are left as they were
    model.train()
    F.cross_entropy(model(batch[0]), batch[1]).backward()
    ca2 = [p.grad.flatten() for p in [*model.transitions[3].parameters(), *model.blocks[3].parameters()]]
    assert norms["CA2"] == pytest.approx(float(torch.cat(ca2).norm()), rel=1e-4)
    assert all(v > 0 for v in norms.values())


def test_attention_statistics_fixed_points() -> None:
    points = torch.rand(3, 32, 3)
    model = _model(layer_scale=0.0, ca_neighbors="xyz")
    for block in (model.blocks[1], model.blocks[3]):  # zero queries: every neighbour gets the same weight
        torch.nn.init.zeros_(block.attn.q.weight)
    stats = attention_statistics(model, points)
    for ca in ("CA1", "CA2"):
        assert stats[ca]["entropy"] == pytest.approx(1.0, abs=1e-5)
        assert stats[ca]["update_ratio"] == 0.0  # LayerScale 0: the step adds nothing yet
        assert stats[ca]["nbr_dist_ratio"] == pytest.approx(1.0)  # xyz neighbours are the K nearest in xyz
        assert stats[ca]["weighted_dist_ratio"] == pytest.approx(1.0)
    assert 0.0 < stats["SA1"]["entropy"] <= 1.0
    feature = attention_statistics(_model(layer_scale=None), points)  # the paper's unscaled update
    assert feature["CA2"]["nbr_dist_ratio"] >= 1.0 - 1e-6  # no K inputs lie nearer in xyz than the K nearest
    assert feature["CA2"]["update_ratio"] > 0.0
    twin = attention_statistics(_model(num_steps=0), points)
    assert twin["CA1"] == {"attention": 0} and twin["SA2"]["attention"] == 1


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    threads = torch.get_num_threads()
    run = tmp_path_factory.mktemp("diagnose") / "run"
    try:
        engine.main(ModelNetRecipe, ["--no-progress", "--device", "cpu", "--epochs", "1", "--output-dir", str(run),
                                     "--set", *TINY_MODELNET_SETS])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return run / "last.pt"


def test_cli_writes_the_table_for_trained_and_initial_weights(checkpoint: Path, tmp_path: Path) -> None:
    out = tmp_path / "diag"
    proc = run_tool("diagnose_modelnet", ["--checkpoint", f"t1={checkpoint}", "--initial", "--batches", "1",
                                          "--batch-size", "4", "--max-shapes", "2", "--out", str(out)])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((out / "diagnosis.json").read_text())
    assert list(results) == ["t1", "t1 (init)"]
    assert results["t1"]["weights"] == "trained" and results["t1 (init)"]["weights"] == "initial"
    assert results["t1"]["part_agreement"]["shapes"] == 2
    assert results["t1"]["gradient_norms"] != results["t1 (init)"]["gradient_norms"]
    table = (out / "diagnosis.md").read_text()
    assert re.search(r"\| measure +\| t1 +\| t1 \(init\) +\|", table) and "update / skip CA2" in table
    assert 0.0 < results["t1"]["attention"]["CA1"]["entropy"] <= 1.0


def test_cli_refuses_bad_counts(checkpoint: Path) -> None:
    proc = run_tool("diagnose_modelnet", ["--checkpoint", str(checkpoint), "--batches", "0"])
    assert proc.returncode != 0 and "--batches" in proc.stderr


def test_self_weight_is_the_weight_on_the_centroids_own_point() -> None:
    model = _model(ca_neighbors="xyz")  # the nearest input in xyz of an FPS centroid is its own point
    for block in (model.blocks[1], model.blocks[3]):
        torch.nn.init.zeros_(block.attn.q.weight)  # uniform: the own point gets 1 / K
    stats = attention_statistics(model, torch.rand(2, 32, 3))
    assert stats["CA1"]["self_weight"] == pytest.approx(1 / 4, abs=1e-5)
    assert stats["CA1"]["max_weight"] == pytest.approx(1 / 4, abs=1e-5)


def test_top_rank_reads_which_neighbour_takes_the_weight() -> None:
    model = _model(ca_neighbors="xyz", num_heads=1)
    stats = attention_statistics(model, torch.rand(2, 32, 3))
    assert 0.0 <= stats["CA2"]["top_rank"] <= 1.0
    # one head whose query and key are the normalized features (x 50): by Cauchy-Schwarz the centroid's own point,
    # its nearest input in xyz (rank 0), takes the weight
    attn = model.blocks[1].attn
    with torch.no_grad():
        attn.q.weight.copy_(torch.eye(16) * 50.0)
        attn.kv.weight[:16].copy_(torch.eye(16))
    assert attention_statistics(model, torch.rand(2, 32, 3))["CA1"]["top_rank"] == pytest.approx(0.0, abs=0.05)
