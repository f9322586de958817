"""tools/train_partseg.py beyond the shared CLI contract (tests/tools/test_cli_contract.py): the main job, eval-only
with voting, resume, the PointNet++ peer, the ShapeNet Part configs and both real layouts."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

import engine
from engine.testing import REPO, read_log
from pointcloud.partseg.recipe import PartSegConfig, PartSegRecipe, build_model
from pointcloud.testing import TINY_PARTSEG_SETS

TINY = ["--no-progress", "--device", "cpu", "--set", *TINY_PARTSEG_SETS]
PEER = ["--no-progress", "--device", "cpu", "--config", str(REPO / "configs" / "partseg" / "synthetic_pointnet2.yaml"),
        "--set", *[s for s in TINY_PARTSEG_SETS if not s.startswith(("num_centroids", "fuse_dim", "model_kwargs"))],
        "model_kwargs={mlps: [[16], [32], [64]], fp_mlps: [[32], [32], [32]], head_dim: 16}"]  # fmt: skip


@pytest.fixture(autouse=True)
def keep_threads():
    """The recipe sets torch's thread count (``threads``); later tests get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def train_partseg(argv: list[str]) -> dict:
    """What ``tools/train_partseg.py`` runs, in process."""
    return engine.main(PartSegRecipe, argv)


def test_main_job_eval_only_with_votes_and_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = train_partseg(["--epochs", "1", "--output-dir", str(run), *TINY])
    for key in ("test_instance_miou", "test_class_miou", "test_acc", "best_test_instance_miou", "params", "gmacs"):
        assert key in first, key
    assert set(first["class_ious"]) == {"table", "mug"} and first["num_parts"] == 4 and first["num_categories"] == 2
    assert 0 <= first["test_instance_miou"] <= 100
    saved = json.loads((run / "final_metrics.json").read_text())
    assert saved["class_ious"] == pytest.approx(first["class_ious"])
    best = read_log(run)[0]["test_instance_miou"]
    # eval-only rebuilds the run from its checkpoint (no --set) and reproduces the epoch's evaluation
    ev = train_partseg(["--no-progress", "--device", "cpu", "--eval-only", "--output-dir", str(run)])
    assert ev["test_instance_miou"] == pytest.approx(best, rel=1e-5) and ev["votes"] == 1
    voted = train_partseg(["--no-progress", "--device", "cpu", "--eval-only", "--output-dir", str(run),
                           "--set", "votes=3"])  # fmt: skip
    assert voted["votes"] == 3 and 0 <= voted["test_instance_miou"] <= 100
    resumed = train_partseg(["--no-progress", "--device", "cpu", "--epochs", "2", "--resume", "auto",
                             "--output-dir", str(run), "--set", "votes=2"])  # fmt: skip
    assert resumed["epochs"] == 2 and [r["epoch"] for r in read_log(run)] == [0, 1]
    assert "test_instance_miou_vote2" in resumed and "class_ious_vote2" in resumed


def test_threads_sets_torchs_thread_count_and_null_leaves_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    train_partseg(["--epochs", "1", "--output-dir", str(tmp_path / "a"), *TINY, "threads=3"])
    assert calls == [3]
    calls.clear()
    train_partseg(["--epochs", "1", "--output-dir", str(tmp_path / "b"), *TINY, "threads=null"])
    assert calls == []
    assert PartSegConfig().threads == 1  # the main job


def test_the_peer_trains_on_the_same_data(tmp_path: Path) -> None:
    metrics = train_partseg(["--epochs", "1", "--output-dir", str(tmp_path), *PEER])
    assert metrics["model"] == "pointnet2_ssg_partseg" and metrics["epochs"] == 1 and metrics["params"] > 0
    spec = torch.load(tmp_path / "last.pt", weights_only=True)["model_spec"]
    assert spec["name"] == "pointnet2_ssg_partseg" and spec["kwargs"]["num_categories"] == 2


def test_bad_settings_are_refused_naming_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for sets, message in (
        (["dataset=shapenet_part", "use_normals=true"], "dataset shapenet_part_normal"),
        (["categories=[Airplane]"], "categories applies to the ShapeNet Part datasets"),
        (["synthetic_classes=[sphere]"], "synthetic_classes must be a non-empty subset"),
        (["train_split=trainval"], "the synthetic parts have a train and a test split only"),
        (["model=pointnet2_ssg_partseg"], "does not take one of the keywords"),
        (["threads=0"], "threads must be >= 1 or null"),
    ):
        with pytest.raises(SystemExit) as exc:
            train_partseg(["--output-dir", str(tmp_path / "bad"), *TINY, *sets])
        assert exc.value.code == 2 and message in capsys.readouterr().err, sets
    assert not (tmp_path / "bad" / "log.jsonl").exists()


@pytest.mark.parametrize("path", sorted((REPO / "configs" / "partseg").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_config_loads_and_builds(path: Path) -> None:
    cfg = engine.load_config(PartSegConfig, path)
    PartSegRecipe.validate(cfg)
    shapenet = cfg.dataset == "shapenet_part_normal"
    if shapenet:
        assert cfg.num_points == 2048 and cfg.use_normals and cfg.train_split == "trainval" and cfg.votes == 10
    parts, categories = (50, 16) if shapenet else (13, 5)
    model = build_model(cfg, parts, categories).eval()
    assert model.num_parts == parts and model.in_channels == (6 if cfg.use_normals else 3)


def _write_release(root: Path, layout: str) -> Path:
    """A two-category ShapeNet Part release (Airplane, Mug) in ``layout``: 4 train, 1 val and 2 test shapes of 100
    points, parts 1..2 of either category; returns the release folder."""
    from pointcloud.parts import ShapeNetPart

    folder = root / ShapeNetPart.FOLDERS[layout]
    synsets = {"Airplane": "02691156", "Mug": "03797390"}
    (folder / "train_test_split").mkdir(parents=True)
    (folder / "synsetoffset2category.txt").write_text("".join(f"{n}\t{s}\n" for n, s in synsets.items()))
    rng = np.random.default_rng(0)
    for split, count in (("train", 4), ("val", 1), ("test", 2)):
        entries = []
        for i in range(count):
            name, synset = list(synsets.items())[i % 2]
            shape_id = f"{split}{i}"
            entries.append(f"shape_data/{synset}/{shape_id}")
            xyz, local = rng.normal(size=(100, 3)), rng.integers(1, 3, 100)  # parts 1..2 of either category
            if layout == "v0":
                for sub, suffix, data, fmt in (("points", "pts", xyz, "%.5f"), ("points_label", "seg", local, "%d")):
                    (folder / synset / sub).mkdir(parents=True, exist_ok=True)
                    np.savetxt(folder / synset / sub / f"{shape_id}.{suffix}", data, fmt=fmt)
            else:
                first = 0 if name == "Airplane" else 36
                (folder / synset).mkdir(parents=True, exist_ok=True)
                table = np.hstack([xyz, rng.normal(size=(100, 3)), (first + local - 1)[:, None]])
                np.savetxt(folder / synset / f"{shape_id}.txt", table, fmt="%.6f")
        (folder / "train_test_split" / f"shuffled_{split}_file_list.json").write_text(json.dumps(entries))
    return folder


def _shapenet_argv(root: Path, dataset: str, run: Path) -> list[str]:
    sets = [s for s in TINY_PARTSEG_SETS if not s.startswith("synthetic")]
    extra = [] if dataset == "shapenet_part_normal" else ["use_normals=false"]  # v0 stores no normals
    return ["--no-progress", "--device", "cpu", "--epochs", "1", "--data-root", str(root), "--output-dir", str(run),
            "--set", *sets, f"dataset={dataset}", "train_split=trainval", *extra]  # fmt: skip


@pytest.mark.parametrize("dataset", ["shapenet_part", "shapenet_part_normal"])
def test_cli_on_both_shapenet_part_layouts(tmp_path: Path, dataset: str) -> None:
    """A two-category release in each layout, as released: the run reads the protocol's global labels."""
    _write_release(tmp_path, "normal" if dataset == "shapenet_part_normal" else "v0")
    metrics = train_partseg(_shapenet_argv(tmp_path, dataset, tmp_path / "run"))
    assert metrics["num_parts"] == 38 and metrics["num_categories"] == 2  # Mug's parts are 36 and 37
    assert set(metrics["class_ious"]) == {"Airplane", "Mug"}


@pytest.mark.parametrize(
    "layout,file,line,text,message",
    [
        ("v0", "03797390/points/test1.pts", 40, "0.1 abc 0.2", "test1.pts, line 40: not a number in '0.1 abc 0.2'"),
        ("v0", "03797390/points/train1.pts", 60, "nan 0 0", "train1.pts, line 60: NaN or Inf"),
        ("v0", "02691156/points/val0.pts", 80, "1 2 3 4", "val0.pts, line 80: found 4 numbers; expected 3"),
        ("v0", "02691156/points/train2.pts", 90, "50000 0 0", "train2.pts, line 90: coordinate 5e+04 is far outside"),
        ("v0", "02691156/points_label/test0.seg", 70, "7", "test0.seg: part label 7 outside 1..4, the Airplane parts"),
        ("v0", "02691156/points_label/test0.seg", 100, "", "test0.seg: 99 labels for the 100 points of"),
        ("normal", "03797390/test1.txt", 50, "1 2 3 4 5 6", "test1.txt, line 50: found 6 numbers; expected 7"),
        ("normal", "02691156/train0.txt", 30, "0 0 0 0 0 1 1.5", "train0.txt, line 30: part label 1.5 is not an"),
    ],
)
def test_every_line_of_every_shapenet_part_file_is_checked_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture, layout: str, file: str, line: int, text: str, message: str
) -> None:
    """A bad line of a test file was found after a full epoch, one of a train file mid-epoch (the check read line 1
    only), and a 50000 coordinate trained silently: each is now one line naming the file, before the first step."""
    path = _write_release(tmp_path, layout) / file
    lines = path.read_text().splitlines()
    lines[line - 1 : line] = [text] if text else []
    path.write_text("\n".join(lines) + "\n")
    dataset = "shapenet_part_normal" if layout == "normal" else "shapenet_part"
    with pytest.raises(SystemExit) as exc:
        train_partseg(_shapenet_argv(tmp_path, dataset, tmp_path / "run"))
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err, err
    (error,) = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert str(path) in error and message in error and error == err.strip().splitlines()[-1], err
    assert not (tmp_path / "run" / "log.jsonl").exists()
