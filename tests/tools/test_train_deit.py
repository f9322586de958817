"""tools/train_deit.py beyond the shared CLI contract (tests/tools/test_cli_contract.py): the timm recipe's state
in the checkpoint, an in-process interruption resumed exactly (EMA and mixup included), eval-only against another
architecture, ImageFolder trees, and errors that name the fix."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import engine
from engine import Trainer
from engine.testing import REPO, read_log, strip_timing
from vision.recipe import DeiTRecipe
from vision.testing import TINY_DEIT_SETS, write_imagefolder

TINY = ["--no-progress", "--device", "cpu", "--set", *TINY_DEIT_SETS]


def train_deit(argv: list[str]) -> dict:
    """What ``tools/train_deit.py`` runs, in process."""
    return engine.main(DeiTRecipe, argv)


def test_checkpoint_state_eval_only_and_another_architecture(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    final = train_deit([*TINY, "--epochs", "2", "--output-dir", str(tmp_path)])
    assert final["lr_scaled"] == pytest.approx(8e-3 * 8 / 512)  # DeiT's linear scaling
    assert read_log(tmp_path)[0]["lr"] == pytest.approx(1e-6)  # warmup starts at warmup_lr
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    for key in ("model", "optimizer", "scheduler", "ema", "rng", "config"):
        assert state[key] is not None, key
    assert state["config"]["embed_dim"] == 32 and state["scheduler"]["t_initial"] == 2 * 4  # per update
    assert any(k.startswith("module.") for k in state["ema"])
    last = train_deit([*TINY, "--eval-only", "--checkpoint", str(tmp_path / "last.pt"), "--output-dir",
                            str(tmp_path / "ev")])  # fmt: skip
    assert last["top1"] == pytest.approx(final["top1"]) and last["ema_top1"] == pytest.approx(final["ema_top1"])
    # a run folder's config.yaml rebuilds its model (as the checkpoint's config does); another architecture is refused
    same = train_deit(["--config", str(tmp_path / "config.yaml"), "--eval-only", "--checkpoint",
                            str(tmp_path / "last.pt"), "--no-progress", "--device", "cpu", "--output-dir",
                            str(tmp_path / "ev2")])  # fmt: skip
    assert same["top1"] == pytest.approx(last["top1"])
    capsys.readouterr()
    with pytest.raises(SystemExit):
        train_deit([*TINY, "embed_dim=48", "--eval-only", "--output-dir", str(tmp_path)])
    assert (
        "refusing to evaluate" in (err := capsys.readouterr().err) and "embed_dim: 32 in the checkpoint, 48 now" in err
    )


def test_interrupted_run_resumes_to_the_same_metrics(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    """Interrupt in epoch 1 (in-process), --resume auto: the same metrics, log and weights as an uninterrupted run."""
    args = [*TINY, "--epochs", "3"]
    ref = train_deit([*args, "--output-dir", str(tmp_path / "ref")])
    run_epoch = Trainer._run_epoch

    def stop_at_epoch_1(self: Trainer, epoch: int) -> None:
        if epoch == 1:
            raise KeyboardInterrupt
        run_epoch(self, epoch)

    monkeypatch.setattr(Trainer, "_run_epoch", stop_at_epoch_1)
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        train_deit([*args, "--output-dir", str(tmp_path / "run")])
    assert exc.value.code == 130 and "interrupted at epoch 1" in capsys.readouterr().err
    monkeypatch.undo()
    assert torch.load(tmp_path / "run" / "last.pt", weights_only=True)["epoch"] == 1
    resumed = train_deit([*args, "--output-dir", str(tmp_path / "run"), "--resume", "auto"])
    assert strip_timing(resumed) == strip_timing(ref)
    assert [strip_timing(r) for r in read_log(tmp_path / "run")] == [
        strip_timing(r) for r in read_log(tmp_path / "ref")
    ]
    a = torch.load(tmp_path / "ref" / "last.pt", weights_only=True)
    b = torch.load(tmp_path / "run" / "last.pt", weights_only=True)
    for part in ("model", "ema"):
        assert all(torch.equal(a[part][k], b[part][k]) for k in a[part]), part


def test_imagefolder_tree_of_jpeg_and_png(tmp_path: Path) -> None:
    root = write_imagefolder(tmp_path / "imagenet")
    out = tmp_path / "run"
    metrics = train_deit(["--data-root", str(tmp_path), "--output-dir", str(out), "--epochs", "1", *TINY,
                               "dataset=imagefolder", "batch_size=4"])  # fmt: skip
    assert metrics["epochs"] == 1 and metrics["dataset"] == "imagefolder"
    assert json.loads((out / "final_metrics.json").read_text())["top1"] == metrics["top1"]
    assert (root / "train").is_dir()
    assert 0 <= metrics["top1"] <= 100 and metrics["top5"] == 100.0  # 3 classes: the top 5 always hit


def test_small_images_config_on_a_train_test_imagefolder(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """train/ + test/, as most small real sets are split, with the small-image config: no ImageNet habits, no
    warning; the same data with ImageNet's flip and eval crop at 32 px gets a one-line warning."""
    root = write_imagefolder(tmp_path / "digits")
    (root / "val").rename(root / "test")
    config = str(REPO / "configs" / "vision" / "small_images.yaml")
    small = ["embed_dim=32", "depth=2", "num_heads=2", "centroid_index=1", "batch_size=4", "eval_batch_size=4"]
    flags = ["--no-progress", "--device", "cpu", "--epochs", "1", "--data-root", str(root)]
    metrics = train_deit([*flags, "--config", config, "--output-dir", str(tmp_path / "a"), "--set", *small])
    assert metrics["img_size"] == 32 and 0 <= metrics["top1"] <= 100
    assert "ImageNet's" not in caplog.text
    train_deit([*flags, "--output-dir", str(tmp_path / "b"), "--set", *small, "dataset=imagefolder", "img_size=32"])
    warnings = [r.getMessage() for r in caplog.records if "ImageNet's" in r.getMessage()]
    assert len(warnings) == 1 and "hflip=0.5" in warnings[0] and "crop_pct=0.875 (resizes to 36 px" in warnings[0]


def test_bad_config_key_and_missing_data_root_are_named(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="did you mean 'embed_dim'"):
        train_deit(["--debug", *TINY, "embed_dimm=64", "--output-dir", str(tmp_path / "a")])
    with pytest.raises(ValueError, match="expects float"):
        train_deit(["--debug", *TINY, "lr=fast", "--output-dir", str(tmp_path / "b")])
    empty = tmp_path / "nothing_here"
    empty.mkdir()
    with pytest.raises(FileNotFoundError, match=r"(?s)nothing_here.*train/<class>/<image>"):
        train_deit(["--debug", "--data-root", str(empty), "--output-dir", str(tmp_path / "c"), *TINY,
                         "dataset=imagefolder"])  # fmt: skip
    row = REPO / "configs" / "vision" / "deit_tiny_centroid_c6_300e.yaml"
    with pytest.raises(FileNotFoundError, match="ImageFolder dataset not found"):  # the DeiT rows need a data root
        train_deit(["--debug", "--config", str(row), "--data-root", str(empty), "--output-dir",
                         str(tmp_path / "d"), "--device", "cpu"])  # fmt: skip
