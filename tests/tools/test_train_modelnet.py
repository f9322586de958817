"""tools/train_modelnet.py on the embedded synthetic data: smoke run, run folder, kill + resume, eval-only."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from engine import TIMING_KEYS

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import train_modelnet  # noqa: E402

TINY = [
    "--set",
    "num_points=64",
    "num_centroids=[32,16]",
    "num_neighbors=8",
    "fuse_dim=64",
    "synthetic_classes=4",
    "synthetic_train_per_class=8",
    "synthetic_test_per_class=4",
    "batch_size=8",
    "eval_batch_size=16",
    "--no-progress",
    "--device",
    "cpu",
]


def _strip_timing(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in TIMING_KEYS}


def test_smoke_run_writes_a_complete_run_folder(tmp_path: Path) -> None:
    metrics = train_modelnet.main([*TINY, "--epochs", "2", "--output-dir", str(tmp_path)])
    for name in ("config.yaml", "log.jsonl", "last.pt", "best.pt", "final_metrics.json", "train.log"):
        assert (tmp_path / name).is_file(), name
    assert list((tmp_path / "tb").iterdir()), "no TensorBoard events"
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in lines] == [0, 1]
    for key in ("train_loss", "test_oa", "test_macc", "lr", "samples_per_s"):
        assert key in lines[-1], key
    final = json.loads((tmp_path / "final_metrics.json").read_text())
    for key in ("test_oa", "test_macc", "epochs", "params", "gmacs"):
        assert key in final, key
    assert final["epochs"] == 2 and final["params"] > 0 and final["gmacs"] > 0
    assert metrics["test_oa"] == final["test_oa"]
    # --eval-only on best.pt reproduces an evaluation of that checkpoint
    ev = train_modelnet.main([*TINY, "--eval-only", "--output-dir", str(tmp_path)])
    assert (tmp_path / "eval_metrics.json").is_file() and 0 <= ev["test_oa"] <= 100


def test_peer_model_trains_and_foreign_knobs_are_named(tmp_path: Path) -> None:
    tiny = [a for a in TINY if a not in ("num_centroids=[32,16]", "fuse_dim=64")]
    metrics = train_modelnet.main(
        [*tiny, "--set", "model=dgcnn_modelnet40", "--epochs", "1", "--output-dir", str(tmp_path / "dgcnn")]
    )
    assert metrics["epochs"] == 1 and metrics["params"] > 0
    with pytest.raises(ValueError, match="num_steps"):
        train_modelnet.main(
            [*tiny, "--set", "model=dgcnn_modelnet40", "num_steps=2", "--output-dir", str(tmp_path / "bad")]
        )


def test_unknown_config_key_is_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="num_centriods"):
        train_modelnet.main([*TINY, "--set", "num_centriods=[4,2]", "--output-dir", str(tmp_path)])


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_metrics(tmp_path: Path) -> None:
    """SIGKILL after the first epoch's checkpoint, resume with --resume auto: same metrics as an uninterrupted run."""
    args = [*TINY, "--epochs", "5"]
    ref = train_modelnet.main([*args, "--output-dir", str(tmp_path / "ref")])

    run = tmp_path / "killed"
    cmd = [sys.executable, str(REPO / "tools" / "train_modelnet.py"), *args, "--output-dir", str(run)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        log = run / "log.jsonl"
        if log.is_file() and len(log.read_text().splitlines()) >= 1 and (run / "last.pt").is_file():
            break  # epoch 2 (of 5) has started
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = torch.load(run / "last.pt", weights_only=False)
    assert 1 <= state["epoch"] < 5
    resumed = train_modelnet.main([*args, "--output-dir", str(run), "--resume", "auto"])
    assert _strip_timing(resumed) == _strip_timing(ref)
    ref_log = [_strip_timing(json.loads(x)) for x in (tmp_path / "ref" / "log.jsonl").read_text().splitlines()]
    log = [_strip_timing(json.loads(x)) for x in (run / "log.jsonl").read_text().splitlines()]
    assert log == ref_log


@pytest.mark.slow
def test_torchrun_two_gloo_processes(tmp_path: Path) -> None:
    """The CLI under torchrun on CPU: 2 gloo ranks train one epoch with DDP and rank 0 writes the run folder."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(port), str(REPO / "tools" / "train_modelnet.py"), *TINY, "--epochs", "1",
        "--output-dir", str(tmp_path),
    ]  # fmt: skip
    out = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rank 0/2, backend gloo" in out.stderr
    final = json.loads((tmp_path / "final_metrics.json").read_text())
    assert final["epochs"] == 1
    # (parameter equality across ranks after DDP steps is tested in tests/engine/test_distributed.py)
    assert torch.load(tmp_path / "last.pt", weights_only=False)["epoch"] == 1


@pytest.mark.parametrize(
    "path", sorted((REPO / "configs" / "pointcloud").glob("modelnet40_*.yaml")), ids=lambda p: p.stem
)
def test_every_paper_row_config_loads_and_builds(path: Path) -> None:
    from engine import load_config
    from pointcloud.recipe import ModelNetConfig, build_model

    cfg = load_config(ModelNetConfig, path)
    assert cfg.epochs == 250 and cfg.dataset == "modelnet40_h5" and cfg.num_points == 1024
    model = build_model(cfg, num_classes=40).eval()
    with torch.no_grad():
        assert model(torch.rand(2, cfg.num_points, 3)).shape == (2, 40)


# Options first, then `--set` with its items last, so a test can append more items.
REAL = ["--no-progress", "--device", "cpu", "--epochs", "1", "--set", "num_points=64", "num_centroids=[32,16]",
        "num_neighbors=8", "fuse_dim=64", "batch_size=4", "eval_batch_size=8"]  # fmt: skip


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
    metrics = train_modelnet.main([*root, "--output-dir", str(out), *REAL, "dataset=modelnet40_h5", "up_axis=y"])
    assert metrics["epochs"] == 1 and (out / "final_metrics.json").is_file()
    with pytest.raises(ValueError, match="xyz only"):
        train_modelnet.main([*root, "--output-dir", str(tmp_path / "bad"), *REAL, "dataset=modelnet40_h5",
                             "use_normals=true"])  # fmt: skip


def test_cli_on_the_real_normal_resampled_sample(tmp_path: Path) -> None:
    sample = REPO.parent / "shared" / "data" / "modelnet40_normal_resampled_sample"
    if not sample.is_dir():
        pytest.skip(f"real-layout sample not found at {sample} (it sits beside the repo in CI, not in a user's clone)")
    metrics = train_modelnet.main(
        ["--data-root", str(sample), "--output-dir", str(tmp_path), *REAL, "dataset=modelnet40_normal",
         "use_normals=true", "up_axis=y"]
    )  # fmt: skip
    assert metrics["epochs"] == 1 and 0 <= metrics["test_oa"] <= 100


def test_missing_dataset_names_the_folder_and_tree(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="modelnet40_ply_hdf5_2048"):
        train_modelnet.main(["--data-root", str(tmp_path), "--output-dir", str(tmp_path / "run"), *REAL,
                             "dataset=modelnet40_h5"])  # fmt: skip
