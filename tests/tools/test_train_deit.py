"""tools/train_deit.py on the embedded synthetic images: smoke run, run folder, resume, eval-only, ImageFolder, DDP."""

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

from engine import TIMING_KEYS, Trainer

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
sys.path.insert(0, str(REPO / "tests" / "vision"))
import train_deit  # noqa: E402
from test_data import write_imagefolder  # noqa: E402

# A 32 px centroid DeiT (4 x 4 patches -> 2 x 2 centroids), 4 classes x 8 images, with the parts of DeiT's recipe that
# the main job leaves off: RandAugment, random erasing, mixup + cutmix, EMA.
TINY = [
    "--no-progress",
    "--device",
    "cpu",
    "--set",
    "img_size=32",
    "synthetic_image_size=32",
    "embed_dim=32",
    "depth=2",
    "num_heads=2",
    "centroid_index=1",
    "synthetic_classes=4",
    "synthetic_train_per_class=8",
    "synthetic_val_per_class=4",
    "batch_size=8",
    "eval_batch_size=16",
    "auto_augment=rand-m9-mstd0.5-inc1",
    "reprob=0.25",
    "mixup=0.8",
    "cutmix=1.0",
    "model_ema=true",
    "model_ema_decay=0.9",
    "warmup_epochs=1",
]


def _strip_timing(d: dict) -> dict:
    return {k: v for k, v in d.items() if k not in TIMING_KEYS}


def _log(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "log.jsonl").read_text().splitlines()]


def test_smoke_run_writes_a_complete_run_folder(tmp_path: Path) -> None:
    metrics = train_deit.main([*TINY, "--epochs", "2", "--output-dir", str(tmp_path)])
    for name in ("config.yaml", "log.jsonl", "last.pt", "best.pt", "final_metrics.json", "train.log"):
        assert (tmp_path / name).is_file(), name
    assert list((tmp_path / "tb").iterdir()), "no TensorBoard events"
    lines = _log(tmp_path)
    assert [r["epoch"] for r in lines] == [0, 1]
    for key in ("train_loss", "train_top1", "train_top5", "top1", "top5", "val_loss", "ema_top1", "lr",
                "samples_per_s"):  # fmt: skip
        assert key in lines[-1], key
    assert lines[0]["lr"] == pytest.approx(1e-6)  # warmup starts at warmup_lr
    final = json.loads((tmp_path / "final_metrics.json").read_text())
    for key in ("top1", "top5", "params", "gmacs", "ema_top1", "epochs", "best_top1"):
        assert key in final, key
    assert final["epochs"] == 2 and final["params"] > 0 and final["gmacs"] > 0
    assert metrics["top1"] == final["top1"] and 0 <= final["top1"] <= 100
    assert final["lr_scaled"] == pytest.approx(8e-3 * 8 / 512)  # DeiT's linear scaling
    state = torch.load(tmp_path / "last.pt", weights_only=False)
    for key in ("model", "optimizer", "scheduler", "ema", "rng", "config"):
        assert state[key] is not None, key
    assert (
        state["config"]["embed_dim"] == 32 and state["scheduler"]["t_initial"] == 2 * 4
    )  # per update: 32 images / batch 8
    assert any(k.startswith("module.") for k in state["ema"])
    # --eval-only on best.pt reproduces that checkpoint's evaluation, EMA included
    ev = train_deit.main([*TINY, "--eval-only", "--output-dir", str(tmp_path)])
    best = max(lines, key=lambda r: r["top1"])
    assert (tmp_path / "eval_metrics.json").is_file()
    assert ev["top1"] == pytest.approx(best["top1"]) and ev["ema_top1"] == pytest.approx(best["ema_top1"])
    last = train_deit.main([*TINY, "--eval-only", "--checkpoint", str(tmp_path / "last.pt"), "--output-dir",
                            str(tmp_path / "ev")])  # fmt: skip
    assert last["top1"] == pytest.approx(final["top1"]) and last["epochs"] == 2
    # a run folder's config.yaml rebuilds its model; another architecture is named with that hint
    same = train_deit.main(["--config", str(tmp_path / "config.yaml"), "--eval-only", "--checkpoint",
                            str(tmp_path / "best.pt"), "--no-progress", "--device", "cpu", "--output-dir",
                            str(tmp_path / "ev2")])  # fmt: skip
    assert same["top1"] == pytest.approx(ev["top1"])
    with pytest.raises(ValueError, match=r"config\.yaml"):
        train_deit.main([*TINY, "embed_dim=48", "--eval-only", "--output-dir", str(tmp_path)])


def test_interrupted_run_resumes_to_the_same_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Stop after epoch 1 (in-process), --resume auto: the same metrics and log as an uninterrupted run."""
    args = [*TINY, "--epochs", "3"]
    ref = train_deit.main([*args, "--output-dir", str(tmp_path / "ref")])

    run_epoch = Trainer._run_epoch

    def stop_at_epoch_1(self: Trainer, epoch: int) -> None:
        if epoch == 1:
            raise KeyboardInterrupt
        run_epoch(self, epoch)

    monkeypatch.setattr(Trainer, "_run_epoch", stop_at_epoch_1)
    with pytest.raises(KeyboardInterrupt):
        train_deit.main([*args, "--output-dir", str(tmp_path / "run")])
    monkeypatch.undo()
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=False)["epoch"] == 1
    resumed = train_deit.main([*args, "--output-dir", str(tmp_path / "run"), "--resume", "auto"])
    assert _strip_timing(resumed) == _strip_timing(ref)
    assert [_strip_timing(r) for r in _log(tmp_path / "run")] == [_strip_timing(r) for r in _log(tmp_path / "ref")]
    a = torch.load(tmp_path / "ref" / "last.pt", weights_only=False)
    b = torch.load(tmp_path / "run" / "last.pt", weights_only=False)
    for part in ("model", "ema"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part


@pytest.mark.slow
def test_killed_run_resumes_to_the_same_metrics(tmp_path: Path) -> None:
    """SIGKILL mid-run (after the first epoch's checkpoint), resume with --resume auto: same as uninterrupted."""
    args = [*TINY, "synthetic_train_per_class=64", "--epochs", "4"]  # epochs long enough to be killed mid-run
    ref = train_deit.main([*args, "--output-dir", str(tmp_path / "ref")])

    run = tmp_path / "killed"
    cmd = [sys.executable, str(REPO / "tools" / "train_deit.py"), *args, "--output-dir", str(run)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        log = run / "log.jsonl"
        if log.is_file() and len(log.read_text().splitlines()) >= 1 and (run / "last.pt").is_file():
            break  # epoch 2 (of 4) has started
        time.sleep(0.02)
    assert proc.poll() is None, "the run ended before it could be killed: make it longer"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    state = torch.load(run / "last.pt", weights_only=False)
    assert 1 <= state["epoch"] < 4
    resumed = train_deit.main([*args, "--output-dir", str(run), "--resume", "auto"])
    assert _strip_timing(resumed) == _strip_timing(ref)
    assert [_strip_timing(r) for r in _log(run)] == [_strip_timing(r) for r in _log(tmp_path / "ref")]


def test_imagefolder_tree_of_jpeg_and_png(tmp_path: Path) -> None:
    root = write_imagefolder(tmp_path / "imagenet")
    out = tmp_path / "run"
    metrics = train_deit.main(["--data-root", str(tmp_path), "--output-dir", str(out), "--epochs", "1", *TINY,
                               "dataset=imagefolder", "batch_size=4"])  # fmt: skip
    assert metrics["epochs"] == 1 and metrics["dataset"] == "imagefolder"
    assert json.loads((out / "final_metrics.json").read_text())["top1"] == metrics["top1"]
    assert (root / "train").is_dir()
    assert 0 <= metrics["top1"] <= 100 and metrics["top5"] == 100.0  # 3 classes: the top 5 always hit


def test_bad_config_key_and_missing_data_root_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="did you mean 'embed_dim'"):
        train_deit.main([*TINY, "embed_dimm=64", "--output-dir", str(tmp_path / "a")])
    with pytest.raises(ValueError, match="expects float"):
        train_deit.main([*TINY, "lr=fast", "--output-dir", str(tmp_path / "b")])
    empty = tmp_path / "nothing_here"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"(?s)nothing_here.*train/<class>/<image>"):
        train_deit.main(["--data-root", str(empty), "--output-dir", str(tmp_path / "c"), *TINY, "dataset=imagefolder"])
    row = REPO / "configs" / "vision" / "deit_tiny_centroid_c6_300e.yaml"
    with pytest.raises(FileNotFoundError, match="ImageFolder dataset not found"):  # the DeiT rows need a data root
        train_deit.main(["--config", str(row), "--data-root", str(empty), "--output-dir", str(tmp_path / "d"),
                         "--device", "cpu"])  # fmt: skip


@pytest.mark.slow
def test_torchrun_two_gloo_processes(tmp_path: Path) -> None:
    """2 gloo ranks on CPU: DDP training steps with mixup and EMA leave bit-identical weights on both ranks."""
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(port), str(REPO / "tools" / "train_deit.py"), *TINY, "--epochs", "2",
        "--output-dir", str(tmp_path),
    ]  # fmt: skip
    out = subprocess.run(cmd, env={**os.environ, "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rank 0/2, backend gloo" in out.stderr
    assert "DDP: weights identical on all 2 ranks" in out.stderr
    final = json.loads((tmp_path / "final_metrics.json").read_text())
    assert final["epochs"] == 2 and final["lr_scaled"] == pytest.approx(8e-3 * 8 / 512)
    # 32 train images, global batch 8 = 2 ranks x 4: 4 steps per epoch on each rank
    assert torch.load(tmp_path / "last.pt", weights_only=False)["global_step"] == 8
