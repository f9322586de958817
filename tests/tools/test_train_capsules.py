"""tools/train_capsules.py beyond the shared CLI contract (tests/tools/test_cli_contract.py): the routing model,
foreign knobs, the real ShapeNet Part layout and every config row."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import engine
from capsules.recipe import CapsulesRecipe
from capsules.testing import TINY_CAPSULES_SETS
from engine.testing import REPO

TINY = ["--no-progress", "--device", "cpu", "--set", *TINY_CAPSULES_SETS]


def train_capsules(argv: list[str]) -> dict:
    """What ``tools/train_capsules.py`` runs, in process."""
    return engine.main(CapsulesRecipe, argv)


def test_routing_model_and_foreign_knobs(tmp_path: Path) -> None:
    metrics = train_capsules(
        ["--epochs", "1", "--output-dir", str(tmp_path / "r"), *TINY, "model=pointcaps_routing_small"]
    )
    assert metrics["epochs"] == 1 and math.isfinite(metrics["chamfer"])
    with pytest.raises(ValueError, match="num_heads"):
        train_capsules(["--debug", "--output-dir", str(tmp_path / "bad"), *TINY, "model=pointcaps_routing_small",
                             "num_heads=2"])  # fmt: skip
    with pytest.raises(ValueError, match="num_pionts"):
        train_capsules(["--debug", "--output-dir", str(tmp_path / "bad2"), *TINY, "num_pionts=3"])
    # as the point models refuse it: one cloud of 10**11 points would ask for hundreds of GiB before training
    with pytest.raises(ValueError, match=r"num_points must be <= 65536, got 100000000000$"):
        train_capsules(["--debug", "--output-dir", str(tmp_path / "bad3"), *TINY, "num_points=100000000000"])
    assert not (tmp_path / "bad3").exists()


def test_cli_on_the_real_shapenet_part_layout(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "shapenetcore_partanno_segmentation_benchmark_v0"
    (folder / "train_test_split").mkdir(parents=True)
    (folder / "synsetoffset2category.txt").write_text("Airplane\t02691156\nTable\t04379243\n")
    rng = np.random.default_rng(0)
    for split, n in (("train", 4), ("val", 1), ("test", 2)):
        entries = []
        for i in range(n):
            synset = ("02691156", "04379243")[i % 2]
            shape_id = f"{split}{i:02d}ab"
            entries.append(f"shape_data/{synset}/{shape_id}")
            for sub in ("points", "points_label"):
                (folder / synset / sub).mkdir(parents=True, exist_ok=True)
            np.savetxt(folder / synset / "points" / f"{shape_id}.pts", rng.normal(size=(50, 3)), fmt="%.5f")
            np.savetxt(folder / synset / "points_label" / f"{shape_id}.seg", rng.integers(1, 4, 50), fmt="%d")
        (folder / "train_test_split" / f"shuffled_{split}_file_list.json").write_text(json.dumps(entries))
    metrics = train_capsules(["--data-root", str(tmp_path / "data"), "--epochs", "1",
                                   "--output-dir", str(tmp_path / "run"), *TINY, "dataset=shapenet_part"])  # fmt: skip
    assert metrics["epochs"] == 1 and 0 < metrics["part_purity"] <= 1
    with pytest.raises(FileNotFoundError, match="shapenet_core13_points"):
        train_capsules(["--debug", "--data-root", str(tmp_path / "data"), "--output-dir", str(tmp_path / "bad"),
                             *TINY, "dataset=shapenet_core13"])  # fmt: skip


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "capsules").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_config_loads_and_builds(path: Path) -> None:
    from capsules.recipe import CapsulesConfig, build_model
    from engine import load_config

    cfg = load_config(CapsulesConfig, path)
    if path.stem.endswith("_base") and path.stem != "synthetic_centroid_small":
        assert cfg.lr == 1e-4 and cfg.batch_size == 8 and cfg.num_points == 2048
        return
    with torch.device("meta"):
        model = build_model(cfg)
    assert model.num_points == cfg.num_points
    expected = {"shapenet_part": (200, 12), "core13": (300, 64), "synthetic": (20, 12)}
    assert (cfg.epochs, model.num_latent) == next(v for k, v in expected.items() if path.stem.startswith(k))
    assert cfg.model.split("_")[1] in path.stem  # routing / centroid
    assert model.decoder_type == ("heads" if path.stem.endswith("_heads") else "patch")


SAMPLE = REPO.parent / "shared" / "data" / "modelnet40_normal_resampled_sample"


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="the real ModelNet40 sample (../shared/data) is absent")
def test_trains_on_the_real_modelnet40_sample_with_a_label_free_number(tmp_path: Path) -> None:
    """No part labels: purity says so (in the metrics and the epoch line of the log), the patch spread says whether
    capsules decode regions (below random patches)."""
    run = tmp_path / "run"
    metrics = train_capsules(["--no-progress", "--device", "cpu", "--epochs", "1", "--output-dir", str(run),
                              "--data-root", str(SAMPLE), "--set", "dataset=modelnet40_normal", "num_points=128",
                              "batch_size=8"])  # fmt: skip
    written = json.loads((run / "final_metrics.json").read_text())
    assert written["part_purity"] == metrics["part_purity"] == written["part_purity_chance"] == "no part labels"
    assert "test_part_purity (no part labels)" in (run / "train.log").read_text()
    assert 0 < written["patch_spread"] < written["patch_spread_random"] <= 1.5
    assert written["dataset"] == "modelnet40_normal"
    # the run records where its data lies: eval-only needs no --data-root
    assert engine.main(CapsulesRecipe, ["--no-progress", "--device", "cpu", "--eval-only", "--output-dir", str(run)])[
        "patch_spread"
    ] == pytest.approx(written["patch_spread"])


def test_trains_on_a_plain_folder_of_clouds(tmp_path: Path) -> None:
    import trimesh

    rng = np.random.default_rng(0)
    for split, count in (("train", 8), ("test", 3)):
        (tmp_path / "clouds" / split).mkdir(parents=True)
        for i in range(count):
            size = rng.uniform(0.5, 2.0, size=3)
            mesh = trimesh.creation.box(extents=size) if i % 2 else trimesh.creation.cylinder(0.4, size[0])
            if i % 3:  # .npy clouds and .ply meshes (sampled on their surface) side by side
                np.save(tmp_path / "clouds" / split / f"shape{i}.npy", mesh.sample(200, seed=i).astype(np.float32))
            else:
                mesh.export(tmp_path / "clouds" / split / f"shape{i}.ply")
    metrics = train_capsules(["--no-progress", "--device", "cpu", "--epochs", "1", "--output-dir",
                              str(tmp_path / "run"), "--data-root", str(tmp_path / "clouds"), "--set",
                              "dataset=cloud_folder", "num_points=64", "batch_size=4"])  # fmt: skip
    assert math.isfinite(metrics["chamfer"]) and math.isfinite(metrics["patch_spread"])
