"""tools/train_capsules.py on the embedded synthetic parts: smoke run, run folder, eval-only, kill + resume, DDP."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from capsules import CHAMFER_DEFINITION
from engine import TIMING_KEYS

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import train_capsules  # noqa: E402

TINY = [
    "--no-progress",
    "--device",
    "cpu",
    "--set",
    "num_points=32",
    "synthetic_classes=[table,airplane]",
    "synthetic_train_per_class=4",
    "synthetic_test_per_class=2",
    "batch_size=4",
    "eval_batch_size=8",
]


def _strip_timing(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in TIMING_KEYS}


def test_smoke_run_writes_a_complete_run_folder(tmp_path: Path) -> None:
    metrics = train_capsules.main(["--epochs", "2", "--output-dir", str(tmp_path), *TINY])
    for name in ("config.yaml", "log.jsonl", "last.pt", "best.pt", "final_metrics.json", "train.log"):
        assert (tmp_path / name).is_file(), name
    assert list((tmp_path / "tb").iterdir()), "no TensorBoard events"
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [0, 1]
    for key in ("train_loss", "train_chamfer", "test_chamfer", "test_part_purity", "lr"):
        assert key in lines[-1], key
    final = json.loads((tmp_path / "final_metrics.json").read_text())
    assert final["chamfer_definition"] == CHAMFER_DEFINITION
    assert final["params"] > 0 and final["epochs"] == 2 and final["chamfer"] == final["test_chamfer"] > 0
    assert 0 < final["part_purity"] <= 1 and final["first_epoch_test_chamfer"] == lines[0]["test_chamfer"]
    assert 0 < final["part_purity_chance"] <= 1
    assert metrics["chamfer"] == final["chamfer"]
    # --eval-only on best.pt reproduces the evaluation of the best epoch (eval mode is deterministic)
    ev = train_capsules.main(["--eval-only", "--output-dir", str(tmp_path), *TINY])
    assert (tmp_path / "eval_metrics.json").is_file()
    assert ev["chamfer"] == pytest.approx(final["best_test_chamfer"], rel=1e-6)
    assert ev["chamfer_definition"] == CHAMFER_DEFINITION


def test_routing_model_and_foreign_knobs(tmp_path: Path) -> None:
    metrics = train_capsules.main(
        ["--epochs", "1", "--output-dir", str(tmp_path / "r"), *TINY, "model=pointcaps_routing_small"]
    )
    assert metrics["epochs"] == 1 and math.isfinite(metrics["chamfer"])
    with pytest.raises(ValueError, match="num_heads"):
        train_capsules.main(["--output-dir", str(tmp_path / "bad"), *TINY, "model=pointcaps_routing_small",
                             "num_heads=2"])  # fmt: skip
    with pytest.raises(ValueError, match="num_pionts"):
        train_capsules.main(["--output-dir", str(tmp_path / "bad2"), *TINY, "num_pionts=3"])


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
    metrics = train_capsules.main(["--data-root", str(tmp_path / "data"), "--epochs", "1",
                                   "--output-dir", str(tmp_path / "run"), *TINY, "dataset=shapenet_part"])  # fmt: skip
    assert metrics["epochs"] == 1 and 0 < metrics["part_purity"] <= 1
    with pytest.raises(FileNotFoundError, match="shapenet_core13_points"):
        train_capsules.main(["--data-root", str(tmp_path / "data"), "--output-dir", str(tmp_path / "bad"), *TINY,
                             "dataset=shapenet_core13"])  # fmt: skip


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


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_metrics(tmp_path: Path) -> None:
    """SIGKILL after the first epoch's checkpoint, resume with --resume auto: same metrics as an uninterrupted run."""
    args = ["--epochs", "4", *TINY]
    ref = train_capsules.main(["--output-dir", str(tmp_path / "ref"), *args])
    run = tmp_path / "killed"
    cmd = [sys.executable, str(REPO / "tools" / "train_capsules.py"), "--output-dir", str(run), *args]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        log = run / "log.jsonl"
        if log.is_file() and len(log.read_text().splitlines()) >= 1 and (run / "last.pt").is_file():
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = torch.load(run / "last.pt", weights_only=False)
    assert 1 <= state["epoch"] < 4
    resumed = train_capsules.main(["--output-dir", str(run), "--resume", "auto", *args])
    assert _strip_timing(resumed) == _strip_timing(ref)
    ref_log = [_strip_timing(json.loads(x)) for x in (tmp_path / "ref" / "log.jsonl").read_text().splitlines()]
    log = [_strip_timing(json.loads(x)) for x in (run / "log.jsonl").read_text().splitlines()]
    assert log == ref_log


@pytest.mark.slow
def test_torchrun_two_gloo_processes(tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(port), str(REPO / "tools" / "train_capsules.py"), "--epochs", "1",
        "--output-dir", str(tmp_path), *TINY,
    ]  # fmt: skip
    out = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rank 0/2, backend gloo" in out.stderr
    final = json.loads((tmp_path / "final_metrics.json").read_text())
    assert final["epochs"] == 1 and final["chamfer_definition"] == CHAMFER_DEFINITION
    assert torch.load(tmp_path / "last.pt", weights_only=False)["epoch"] == 1
