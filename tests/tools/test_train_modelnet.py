"""tools/train_modelnet.py beyond the shared CLI contract (tests/tools/test_cli_contract.py): peer models, model
knobs and ``model_kwargs``, the paper-row configs, the real data layouts and their up-front file checks."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

import engine
from engine.testing import REPO
from pointcloud.recipe import ModelNetRecipe
from pointcloud.testing import TINY_MODELNET_SETS

TINY = ["--no-progress", "--device", "cpu", "--set", *TINY_MODELNET_SETS]


def train_modelnet(argv: list[str]) -> dict:
    """What ``tools/train_modelnet.py`` runs, in process."""
    return engine.main(ModelNetRecipe, argv)


def test_peer_model_trains_and_foreign_knobs_are_named(tmp_path: Path) -> None:
    tiny = [a for a in TINY if a not in ("num_centroids=[16,8]", "fuse_dim=32")]
    metrics = train_modelnet(
        ["--epochs", "1", "--output-dir", str(tmp_path / "dgcnn"), *tiny, "model=dgcnn_modelnet40"]
    )
    assert metrics["epochs"] == 1 and metrics["params"] > 0
    with pytest.raises(ValueError, match="num_steps"):
        train_modelnet(["--debug", "--output-dir", str(tmp_path / "bad"), *tiny, "model=dgcnn_modelnet40",
                             "num_steps=2"])  # fmt: skip


def test_pointnet_trains_with_its_regularizer_in_the_loss(tmp_path: Path) -> None:
    """The PointNet peer on the same command line (the recipe's K knob is ignored by it); its feature-transform loss
    is part of the training loss and logged."""
    tiny = [a for a in TINY if a not in ("num_centroids=[16,8]", "fuse_dim=32")]
    metrics = train_modelnet(["--epochs", "1", "--output-dir", str(tmp_path), *tiny, "model=pointnet_modelnet40"])
    assert metrics["epochs"] == 1 and metrics["model"] == "pointnet_modelnet40" and math.isfinite(metrics["test_oa"])
    records = [json.loads(line) for line in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert any(r.get("train_aux_loss", 0) > 0 for r in records), records[-1].keys()


def test_model_kwargs_reach_the_point_model(tmp_path: Path) -> None:
    """``--set model_kwargs.mixer=...`` reaches CentroidTransformer (no fixed knob whitelist in between)."""
    metrics = train_modelnet(["--epochs", "1", "--output-dir", str(tmp_path), *TINY, "model_kwargs.mixer=hydra",
                                   "model_kwargs.widths=[16,32,32,32]"])  # fmt: skip
    assert metrics["epochs"] == 1
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert state["config"]["model_kwargs"] == {"mixer": "hydra", "widths": [16, 32, 32, 32]}
    assert any("mixer" in k for k in state["model"]), "the SA blocks are not mixer blocks"


def test_k_larger_than_the_cloud_is_refused_up_front(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        train_modelnet(["--output-dir", str(tmp_path), *TINY, "num_neighbors=64"])
    assert exc.value.code == 2 and "num_neighbors (K) must be in [1, num_points=32]" in capsys.readouterr().err
    assert not (tmp_path / "log.jsonl").exists()


@pytest.mark.parametrize(
    "path", sorted((REPO / "configs" / "pointcloud").glob("modelnet40_*.yaml")), ids=lambda p: p.stem
)
def test_every_paper_row_config_loads_and_builds(path: Path) -> None:
    from engine import load_config
    from pointcloud.recipe import ModelNetConfig, build_model

    cfg = load_config(ModelNetConfig, path)
    points = 256 if path.stem.endswith("_256") else 1024  # a peer scaled to the converged table's clouds
    assert cfg.epochs == 250 and cfg.dataset == "modelnet40_h5" and cfg.num_points == points
    model = build_model(cfg, num_classes=40).eval()
    with torch.no_grad():
        assert model(torch.rand(2, cfg.num_points, 3)).shape == (2, 40)


def test_rotation_about_the_datasets_own_up_axis_and_a_different_one_is_refused() -> None:
    """Both ModelNet releases stand on y, the synthetic shapes and the sampled .off meshes on z: the main job's config
    with another dataset rotates about that dataset's axis, an explicit axis that disagrees is refused by name, and the
    paper-row configs and the ablation regimes (which pin up_axis=z on synthetic data) still validate."""
    from engine import UsageError, load_config
    from engine.ablation import TABLES
    from pointcloud.ablation import MODELNET_TABLE
    from pointcloud.data import DATASETS, UP_AXES
    from pointcloud.recipe import ModelNetConfig, _train_transform
    from pointcloud.transforms import RandomRotateUp

    assert set(UP_AXES) == set(DATASETS) and UP_AXES["synthetic"] == "z"
    assert UP_AXES["modelnet40_h5"] == UP_AXES["modelnet40_normal"] == "y"
    for name, axis in UP_AXES.items():
        cfg = load_config(ModelNetConfig, overrides=[f"dataset={name}"])  # the main job's config, rotate_up: true
        ModelNetRecipe.validate(cfg)
        (rotation,) = [t for t in _train_transform(cfg).transforms if isinstance(t, RandomRotateUp)]
        assert rotation.axis == "xyz".index(axis), name
    wrong = load_config(ModelNetConfig, overrides=["dataset=modelnet40_normal", "up_axis=z"])
    with pytest.raises(UsageError, match="up_axis 'z' disagrees with dataset 'modelnet40_normal', whose shapes stand"):
        ModelNetRecipe.validate(wrong)
    for path in sorted((REPO / "configs" / "pointcloud").glob("modelnet40_*.yaml")):
        for sets in ([], ["dataset=synthetic"], ["dataset=modelnet40_normal"]):
            ModelNetRecipe.validate(load_config(ModelNetConfig, path, sets))
    tables = [t for t in TABLES.values() if t.recipe is ModelNetRecipe]
    assert MODELNET_TABLE in tables
    for table in tables:
        for row in table.rows:
            cfg = load_config(ModelNetConfig, REPO / row.config, [*table.regime, *row.overrides])
            ModelNetRecipe.validate(cfg)
            assert (cfg.up_axis, cfg.dataset) == ("z", "synthetic")


# Options first, then `--set` with its items last, so a test can append more items.
REAL = ["--no-progress", "--device", "cpu", "--epochs", "1", "--set", "num_points=32", "num_centroids=[16,8]",
        "num_neighbors=4", "fuse_dim=32", "batch_size=4", "eval_batch_size=8"]  # fmt: skip


def test_cli_on_the_real_hdf5_layout(tmp_path: Path) -> None:
    """modelnet40_ply_hdf5_2048 written exactly as released (data/label datasets, list files with data/ prefixes)."""
    import h5py
    import numpy as np

    folder = tmp_path / "data" / "modelnet40_ply_hdf5_2048"
    folder.mkdir(parents=True)
    (folder / "shape_names.txt").write_text("\n".join(f"class{i}" for i in range(40)) + "\n")
    rng = np.random.default_rng(0)
    for split, n in (("train", 8), ("test", 4)):
        with h5py.File(folder / f"ply_data_{split}0.h5", "w") as f:
            f.create_dataset("data", data=rng.uniform(-1, 1, (n, 2048, 3)).astype(np.float32))
            f.create_dataset("label", data=rng.integers(0, 40, (n, 1)).astype(np.uint8))
        (folder / f"{split}_files.txt").write_text(f"data/modelnet40_ply_hdf5_2048/ply_data_{split}0.h5\n")
    out = tmp_path / "run"
    root = ["--data-root", str(tmp_path / "data")]
    metrics = train_modelnet([*root, "--output-dir", str(out), *REAL, "dataset=modelnet40_h5", "up_axis=y"])
    assert metrics["epochs"] == 1 and (out / "final_metrics.json").is_file()
    with pytest.raises(ValueError, match="xyz only"):
        train_modelnet(["--debug", *root, "--output-dir", str(tmp_path / "bad"), *REAL, "dataset=modelnet40_h5",
                             "use_normals=true"])  # fmt: skip


def test_cli_on_the_real_normal_resampled_sample(tmp_path: Path) -> None:
    sample = REPO.parent / "shared" / "data" / "modelnet40_normal_resampled_sample"
    if not sample.is_dir():
        pytest.skip(f"real-layout sample not found at {sample} (it sits beside the repo in CI, not in a user's clone)")
    metrics = train_modelnet(
        ["--data-root", str(sample), "--output-dir", str(tmp_path), *REAL, "dataset=modelnet40_normal",
         "use_normals=true", "up_axis=y"]
    )  # fmt: skip
    assert metrics["epochs"] == 1 and 0 <= metrics["test_oa"] <= 100


def test_missing_dataset_names_the_folder_and_tree(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="modelnet40_ply_hdf5_2048"):
        train_modelnet(["--debug", "--data-root", str(tmp_path), "--output-dir", str(tmp_path / "run"), *REAL,
                             "dataset=modelnet40_h5"])  # fmt: skip


def _write_normal_release(data: Path) -> Path:
    """A 40-class modelnet40_normal_resampled tree (8 train, 2 test shapes of 64 rows) under ``data``."""
    root = data / "modelnet40_normal_resampled"
    rng = torch.Generator().manual_seed(0)
    classes = [f"class{i}" for i in range(40)]
    root.mkdir(parents=True)
    (root / "modelnet40_shape_names.txt").write_text("\n".join(classes) + "\n")
    for split, n in (("train", 8), ("test", 2)):
        ids = [f"{classes[i % 2]}_{split}{i:03d}" for i in range(n)]
        (root / f"modelnet40_{split}.txt").write_text("\n".join(ids) + "\n")
        for shape_id in ids:
            folder = root / shape_id.rsplit("_", 1)[0]
            folder.mkdir(exist_ok=True)
            rows = torch.rand(64, 6, generator=rng).tolist()
            (folder / f"{shape_id}.txt").write_text("".join(",".join(f"{v:.6f}" for v in r) + "\n" for r in rows))
    return root


def test_a_corrupt_test_file_is_found_before_the_first_step_defect_8(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A bad file in the test split stops the run before training (it used to surface after a full epoch)."""
    root = _write_normal_release(tmp_path / "data")
    bad = root / "class1" / "class1_test001.txt"
    bad.write_text("0.1,0.2,oops\n" * 64)
    with pytest.raises(SystemExit) as exc:
        train_modelnet(["--data-root", str(tmp_path / "data"), "--output-dir", str(tmp_path / "run"), *REAL,
                             "dataset=modelnet40_normal", "use_normals=true"])  # fmt: skip
    err = capsys.readouterr().err
    assert exc.value.code == 2 and str(bad) in err and "line 1" in err
    assert not (tmp_path / "run" / "log.jsonl").exists(), "training started before the data was checked"


@pytest.mark.parametrize(
    ("row", "message"),
    [
        ("0.1,0.2,0.3,0.4,oops,0.6", "line 20: non-numeric value"),
        ("0.1,0.2,0.3,0.4", "line 20: expected 6 comma-separated numbers, got 4"),
        ("0.1,nan,0.3,0,0,1", "line 20: contains NaN or Inf"),
        ("4.2e4,0.2,0.3,0,0,1", "line 20: coordinate 4.2e+04 is far outside the unit scale"),
    ],
)
def test_a_bad_row_past_line_1_of_a_test_file_stops_the_run_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture, row: str, message: str
) -> None:
    """It used to end the first epoch in a traceback (evaluation parsed the row); now one line before step 1."""
    root = _write_normal_release(tmp_path / "data")
    bad = root / "class1" / "class1_test001.txt"
    lines = bad.read_text().splitlines()
    lines[19] = row
    bad.write_text("\n".join(lines) + "\n")
    args = ["--data-root", str(tmp_path / "data"), "--output-dir", str(tmp_path / "run"), *REAL,
            "dataset=modelnet40_normal"]  # fmt: skip
    with pytest.raises(SystemExit) as exc:
        train_modelnet(args)
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    assert f"{bad}, {message}" in err
    assert not (tmp_path / "run" / "log.jsonl").exists(), "training started before the data was checked"


def test_far_out_of_scale_clouds_train_with_normalize(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    root = _write_normal_release(tmp_path / "data")
    for path in root.glob("class*/*.txt"):  # the whole release in other units: 5e4 around (1e3, 0, 0)
        rows = np.loadtxt(path, delimiter=",")
        rows[:, :3] = rows[:, :3] * 5e4 + [1e3, 0, 0]
        np.savetxt(path, rows, fmt="%.6f", delimiter=",")
    args = ["--data-root", str(tmp_path / "data"), *REAL, "dataset=modelnet40_normal"]
    with pytest.raises(SystemExit) as exc:
        train_modelnet(["--output-dir", str(tmp_path / "refused"), *args])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "far outside the unit scale" in err and "normalize: true" in err
    metrics = train_modelnet(["--output-dir", str(tmp_path / "run"), *args, "normalize=true"])
    assert metrics["epochs"] == 1 and math.isfinite(metrics["test_loss"])
