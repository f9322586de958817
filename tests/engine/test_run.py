"""Tests for engine.run in process on a tiny recipe: the metrics files (each written once), resume through the one
resume path (engine.resume.load_resume), and the recipe helpers (check_config, collect_model_kwargs, split_batch)."""

from __future__ import annotations

import errno
import json
import logging
import math
import os
import re
import signal
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
import torch
from torch import nn

import engine
import engine.checkpoint as checkpoint_module
import engine.logger as logger_module
from engine import (
    NONFINITE_OK,
    TIMING_KEYS,
    DistributedContext,
    Interrupted,
    UsageError,
    check_config,
    collect_model_kwargs,
    create_with_kwargs,
    load_checkpoint,
    main,
    run,
    split_batch,
    validate_common,
)
from engine.logger import read_records
from engine.rundir import RunLock
from engine.testing import BlobsTask, BlobsTaskConfig, blobs

DIM, CLASSES = 8, 3


@dataclass
class BlobsConfig(BlobsTaskConfig):
    hidden: int | None = None  # a model knob: None keeps the model's default
    model_kwargs: dict = field(default_factory=dict)


def _mlp(hidden: int = 32, dropout: float = 0.2) -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, hidden), nn.ReLU(), nn.Dropout(dropout), nn.Linear(hidden, CLASSES))


class BlobsRecipe(BlobsTask):
    group = "blobs"
    config_cls = BlobsConfig
    monitor = "val_acc"
    monitor_mode = "max"

    def build_datasets(self):
        return blobs(64, 0), blobs(48, 2)

    def build_model(self) -> nn.Module:
        return create_with_kwargs(_mlp, "mlp", collect_model_kwargs(self.cfg, ("hidden",)))

    def finalize(self, final, model):
        return {"finalized": True}


def _run(cfg: BlobsConfig, out: Path, **options) -> dict:
    return run(BlobsRecipe, cfg, output_dir=out, device="cpu", progress=False, **options)


def _untimed(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in TIMING_KEYS}


def test_each_metrics_file_is_written_once_with_what_run_returns(tmp_path, monkeypatch):
    written = []
    write = logger_module.atomic_write_text  # what every JSON file of engine.logger.write_json goes through

    def record(path, text):
        written.append(Path(path).name)
        return write(path, text)

    monkeypatch.setattr(logger_module, "atomic_write_text", record)
    final = _run(BlobsConfig(), tmp_path)
    assert [name for name in written if name.endswith(".json")] == ["final_metrics.json"]
    assert json.loads((tmp_path / "final_metrics.json").read_text()) == final
    assert final["epochs"] == 3 and final["finalized"] is True and final["params"] > 0  # trainer + recipe + summary
    assert final["best_val_acc"] == max(r["val_acc"] for r in read_records(tmp_path))
    evaluated = _run(BlobsConfig(), tmp_path, eval_only=True)
    assert [name for name in written if name.endswith(".json")] == ["final_metrics.json", "eval_metrics.json"]
    assert json.loads((tmp_path / "eval_metrics.json").read_text()) == evaluated
    assert evaluated["val_acc"] == final["best_val_acc"]  # best.pt


def test_resume_through_run_is_bit_exact(tmp_path):
    full = _run(BlobsConfig(), tmp_path / "full")
    _run(BlobsConfig(epochs=1), tmp_path / "part")
    resumed = _run(BlobsConfig(), tmp_path / "part", resume="auto")  # epochs may change on resume
    assert _untimed(resumed) == _untimed(full)
    for name in ("last.pt", "best.pt"):
        a, b = load_checkpoint(tmp_path / "full" / name), load_checkpoint(tmp_path / "part" / name)
        assert all(torch.equal(a["model"][k], b["model"][k]) for k in a["model"])
    assert [_untimed(r) for r in read_records(tmp_path / "part")] == [
        _untimed(r) for r in read_records(tmp_path / "full")
    ]


def test_resume_refuses_a_changed_config_with_the_diff(tmp_path):
    _run(BlobsConfig(epochs=1), tmp_path)
    with pytest.raises(UsageError, match=r"refusing to resume .*last\.pt .*lr: 0\.01 in the checkpoint, 0\.005 now"):
        _run(BlobsConfig(lr=5e-3), tmp_path, resume="auto")
    with pytest.raises(UsageError, match=r"hidden: None in the checkpoint, 16 now"):
        _run(BlobsConfig(hidden=16), tmp_path, resume="auto")


def test_collect_model_kwargs_forwards_set_knobs_and_model_kwargs():
    cfg = BlobsConfig()
    assert collect_model_kwargs(cfg, ("hidden",)) == {}  # None: the model's default
    cfg = replace(cfg, hidden=16, model_kwargs={"dropout": 0.0})
    assert collect_model_kwargs(cfg, ("hidden",)) == {"hidden": 16, "dropout": 0.0}
    assert collect_model_kwargs(replace(cfg, model_kwargs={"hidden": 4}), ("hidden",)) == {"hidden": 4}  # wins
    model = BlobsRecipe(cfg, None).build_model()
    assert model[0].out_features == 16 and model[2].p == 0.0
    with pytest.raises(ValueError, match=r"model 'mlp' does not take one of the keywords \['dropout', 'hidden', 'x'\]"):
        BlobsRecipe(replace(cfg, model_kwargs={"dropout": 0.0, "x": 1}), None).build_model()


def test_check_config_lists_every_problem():
    cfg = BlobsConfig()
    check_config(cfg, [(True, "never shown")])
    with pytest.raises(UsageError, match=r"^BlobsConfig: a must be >= 1, got 0; c is wrong$"):
        check_config(cfg, [(False, "a must be >= 1, got 0"), (True, "b"), (False, "c is wrong")])


def test_split_batch():
    assert split_batch(32, 4) == 8 and split_batch(32, 1, train_size=32) == 32
    with pytest.raises(UsageError, match="must divide evenly over 3 ranks, got 32"):
        split_batch(32, 3)
    with pytest.raises(UsageError, match="batch_size=32 exceeds the 31 samples"):
        split_batch(32, 1, train_size=31)


def test_eval_only_refuses_a_config_that_changes_the_model(tmp_path):
    _run(BlobsConfig(hidden=16), tmp_path)
    with pytest.raises(UsageError, match=r"refusing to evaluate .*best\.pt .*hidden: 16 in the checkpoint, None now"):
        _run(BlobsConfig(), tmp_path, eval_only=True)
    evaluated = _run(BlobsConfig(hidden=16, lr=0.5, eval_batch_size=5), tmp_path, eval_only=True)  # training-only
    assert evaluated["val_acc"] == load_checkpoint(tmp_path / "best.pt")["metrics"]["val_acc"]


def test_the_command_line_opens_a_run_with_its_saved_config(tmp_path, caplog):
    """eval-only and --resume auto need none of the --set the run was started with (engine.load_run_config)."""
    flags = ["--no-progress", "--device", "cpu", "--output-dir", str(tmp_path)]
    main(BlobsRecipe, [*flags, "--epochs", "2", "--set", "hidden=16", "lr=0.02", "seed=3"])
    best = load_checkpoint(tmp_path / "best.pt")
    evaluated = main(BlobsRecipe, [*flags, "--eval-only"])
    assert evaluated["val_acc"] == best["metrics"]["val_acc"]
    assert f"starting from the config saved in {tmp_path / 'best.pt'}" in caplog.text
    resumed = main(BlobsRecipe, [*flags, "--resume", "auto", "--epochs", "3"])
    assert resumed["epochs"] == 3
    assert load_checkpoint(tmp_path / "last.pt")["config"] | {"epochs": 2} == best["config"]
    # the reference: the same three epochs in one go give the same result
    full = _run(BlobsConfig(hidden=16, lr=0.02, seed=3), tmp_path / "full")
    assert _untimed(resumed) == _untimed(full)


@dataclass
class KnobsConfig(BlobsConfig):
    label_smoothing: float = 0.0
    scales: tuple[float, ...] = (1.0, 2.0)
    num_heads: int | None = None
    bound: float = field(default=math.inf, metadata={NONFINITE_OK: True})  # a field that may be infinite


@pytest.mark.parametrize(
    "override,message",
    [
        ("label_smoothing=nan", "label_smoothing must be finite, got nan"),
        ("label_smoothing=.inf", "label_smoothing must be finite, got inf"),
        ("scales=[1.0, .nan]", r"scales must be finite, got \(1\.0, nan\)"),
        ("model_kwargs.dropout=.nan", r"model_kwargs must be finite, got \{'dropout': nan\}"),
        ("seed=18446744073709551616", r"seed must be in \[0, 2\*\*63\), got 18446744073709551616"),
        ("num_heads=0", "num_heads must be >= 1, got 0"),
        ("model_kwargs.num_heads=0", "model_kwargs.num_heads must be >= 1, got 0"),
        ("name=../../elsewhere", r"name must be a relative path inside runs/<group>/ \(no '\.\.', not absolute\)"),
        ("name={tmp}/elsewhere", "name must be a relative path inside runs/<group>/"),
        ("name=.", "name must name a folder"),
        ("workers=100000", r"workers must be <= 256 \(DataLoader processes per rank\), got 100000$"),
        ("batch_size=1099511627776", r"batch_size must be <= 1048576 \(2\*\*20\), got 1099511627776$"),
        ("eval_batch_size=100000000000000000000", r"eval_batch_size must be <= 1048576 \(2\*\*20\), got 10{20}$"),
    ],
)
def test_bad_config_values_are_one_line_user_errors(tmp_path, monkeypatch, capsys, override, message):
    class KnobsRecipe(BlobsRecipe):
        config_cls = KnobsConfig

    monkeypatch.chdir(tmp_path)  # default run folders go to ./runs
    with pytest.raises(SystemExit) as exc:
        engine.main(KnobsRecipe, ["--no-progress", "--device", "cpu", "--set", override.format(tmp=tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and "Traceback" not in err
    assert re.search(message, err.strip().splitlines()[-1]), err
    assert not list(tmp_path.iterdir())  # refused before anything was written
    validate_common(KnobsConfig(bound=-math.inf, scales=(0.5,)))  # what is finite or allowed passes


def test_workers_above_the_usable_cpus_are_cut_to_their_number_and_recorded(tmp_path, monkeypatch, caplog):
    """A config written for a large machine (configs/vision/deit_imagenet_base.yaml asks for 10) runs on a small one
    with as many workers as it has CPUs; the run records what it used. MAX_WORKERS and above are refused (above)."""
    monkeypatch.setattr(engine.recipe, "usable_cpus", lambda: 1)
    assert engine.recipe.clamp_workers(BlobsConfig(workers=1)) == BlobsConfig(workers=1)
    assert engine.recipe.clamp_workers(BlobsConfig(workers=engine.recipe.MAX_WORKERS)).workers == 1
    assert "workers=256 is more than the 1 CPU(s) this process may use: using workers=1" in caplog.text

    class Built(Exception):
        pass

    def build_datasets(self):  # the recipe gets the cut config (and so do its loaders and the saved config)
        raise Built(self.cfg.workers)

    monkeypatch.setattr(BlobsRecipe, "build_datasets", build_datasets)
    with pytest.raises(Built, match=r"^1$"):
        _run(BlobsConfig(workers=10), tmp_path)


@pytest.fixture
def cli_logging():
    """engine.main sets up logging to the run folder's train.log: take its handlers down after the test."""
    yield
    logger_module.setup_logging(None)
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, "_engine_setup_logging", False)]:
        root.removeHandler(handler)
        handler.close()


def _main(run_dir: Path, *args: str) -> None:
    engine.main(BlobsRecipe, ["--no-progress", "--device", "cpu", "--output-dir", str(run_dir), *args])


def test_eval_only_stops_at_the_lock_of_a_live_run(tmp_path, cli_logging, capsys):
    _run(BlobsConfig(epochs=1), tmp_path)
    (tmp_path / "train.log").write_text("the training run's log\n")
    with RunLock(tmp_path):  # the training run still writes the folder
        with pytest.raises(SystemExit) as exc:
            _main(tmp_path, "--eval-only")
    assert exc.value.code == 2
    assert f"in use by process {os.getpid()}" in capsys.readouterr().err
    assert (tmp_path / "train.log").read_text() == "the training run's log\n"
    assert not (tmp_path / "eval_metrics.json").exists()
    _main(tmp_path, "--eval-only")  # and runs once the folder is free
    assert (tmp_path / "eval_metrics.json").exists() and not (tmp_path / "run.lock").exists()


def test_run_writes_train_log_only_when_it_sets_up_logging(tmp_path, cli_logging):
    """As docs/harness.md says: engine.run() from Python writes the run folder without train.log, and with
    setup_logging=True (what engine.main passes) it logs there too."""
    _run(BlobsConfig(epochs=1), tmp_path / "python")
    files = {p.name for p in (tmp_path / "python").iterdir()}
    assert {"config.yaml", "log.jsonl", "last.pt", "best.pt", "final_metrics.json"} <= files
    assert "train.log" not in files
    _run(BlobsConfig(epochs=1), tmp_path / "logged", setup_logging=True)
    assert (tmp_path / "logged" / "train.log").read_text(encoding="utf-8").strip()


def test_an_interrupt_says_which_epoch_last_pt_holds(tmp_path, monkeypatch, cli_logging, capsys):
    """torchrun stops rank 0 (SIGTERM) after a peer died: the collective fails, then the signal comes in teardown."""
    calls = {"barrier": 0}

    def barrier(ctx):
        calls["barrier"] += 1
        if calls["barrier"] == 2:  # after the second epoch's checkpoint
            raise RuntimeError("Connection closed by peer")

    def destroy(ctx, barrier=True):
        raise Interrupted(signal.SIGTERM)

    monkeypatch.setattr(DistributedContext, "barrier", barrier)
    monkeypatch.setattr(DistributedContext, "destroy", destroy)
    with pytest.raises(SystemExit) as exc:
        _main(tmp_path)
    assert exc.value.code == 143
    hint = f"{tmp_path / 'last.pt'} holds 2 epoch(s): resume with --resume auto --output-dir {tmp_path}"
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"interrupted at epoch 2, step 3 (SIGTERM): {hint}"
    monkeypatch.undo()

    def interrupted(recipe):
        raise Interrupted(signal.SIGINT)

    monkeypatch.setattr(BlobsRecipe, "build_datasets", interrupted)  # before training: no epoch was run
    with pytest.raises(SystemExit) as exc:
        _main(tmp_path, "--resume", "auto")
    assert exc.value.code == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == f"interrupted at start-up (SIGINT): {hint}"


@pytest.mark.parametrize(
    "target,error,fix",
    [
        ("checkpoint", errno.ENOSPC, "free space on its disk"),
        ("log", errno.EACCES, "make it writable"),
        ("lock", errno.EROFS, "make it writable"),
    ],
)
def test_a_refused_write_is_a_one_line_error_naming_the_folder(
    tmp_path, monkeypatch, cli_logging, capsys, target, error, fix
):
    run_dir = tmp_path / "run"
    writes = {"n": 0}

    def refuse(path):
        raise OSError(error, os.strerror(error), str(path))

    if target == "checkpoint":
        atomic_open = checkpoint_module.atomic_open

        def full_disk(path, mode="wb", encoding=None):
            writes["n"] += 1
            if writes["n"] == 4:  # epoch 2's last.pt (every epoch improves here: best.pt, then last.pt)
                refuse(path)
            return atomic_open(path, mode, encoding)

        monkeypatch.setattr(checkpoint_module, "atomic_open", full_disk)
        monkeypatch.setattr(BlobsRecipe, "monitor", "epoch")  # an always improving monitor: 2 writes per epoch
    elif target == "log":
        log = logger_module.RunLogger.log

        def no_permission(self, record, step=None):
            if record["epoch"] == 1:
                refuse(self.log_path)
            return log(self, record, step)

        monkeypatch.setattr(logger_module.RunLogger, "log", no_permission)
    else:
        monkeypatch.setattr(RunLock, "acquire", lambda self: refuse(self.path))
    with pytest.raises(SystemExit) as exc:
        _main(run_dir)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "Traceback" not in err, err
    line = err.splitlines()[-1]
    assert line.startswith(f"error: cannot write to the run folder {run_dir} ({os.strerror(error)}")
    assert f"{fix}" in line and f"--resume auto --output-dir {run_dir}" in line
    assert ("no last.pt was saved" if target == "lock" else "last.pt holds 1 epoch(s)") in line


def test_a_read_only_runs_root_is_a_one_line_error_suggesting_output_dir(tmp_path, monkeypatch, cli_logging, capsys):
    """Without --output-dir the run folder is made under ./runs; a read-only runs/ gave a PermissionError traceback."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    mkdir = os.mkdir

    def read_only_runs(path, *args, **kwargs):  # what os.mkdir does in a read-only runs/ (root ignores the mode bits)
        if Path(path).absolute().parent == tmp_path / "runs":
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), os.fspath(path))
        return mkdir(path, *args, **kwargs)

    monkeypatch.setattr(os, "mkdir", read_only_runs)
    with pytest.raises(SystemExit) as exc:
        engine.main(BlobsRecipe, ["--no-progress", "--device", "cpu"])
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2 and "Traceback" not in err, err
    line = err.splitlines()[-1]
    expected = r"error: cannot create the run folder runs/blobs/blobs/[\d-]+ in runs \(Permission denied\): make it "
    assert re.fullmatch(expected + "writable, or pass --output-dir DIR to write the run elsewhere", line), line
    assert os.listdir(tmp_path / "runs") == []


def test_eval_only_into_a_read_only_folder_says_to_run_it_again(tmp_path, monkeypatch, cli_logging, capsys):
    _run(BlobsConfig(epochs=1), tmp_path)

    def read_only(lock):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(lock.path))

    monkeypatch.setattr(RunLock, "acquire", read_only)
    with pytest.raises(SystemExit) as exc:
        _main(tmp_path, "--eval-only")
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2
    assert line.startswith(f"error: cannot write to the run folder {tmp_path} (Read-only file system")
    fix = "make it writable (or choose another --output-dir), then run --eval-only again"
    assert line.endswith(f"last.pt holds 1 epoch(s)): {fix}")


def test_a_checkpoint_from_before_a_config_key_existed_resumes(tmp_path):
    """A key the saved config lacks ran at its default: not a change (a different value still is)."""
    _run(BlobsConfig(epochs=1), tmp_path)
    for name in ("last.pt", "best.pt"):  # as written before the key `hidden` existed
        state = load_checkpoint(tmp_path / name)
        del state["config"]["hidden"]
        torch.save(state, tmp_path / name)
    assert _run(BlobsConfig(epochs=2), tmp_path, resume="auto")["epochs"] == 2
    with pytest.raises(UsageError, match=r"hidden: None in the checkpoint, 16 now"):
        _run(BlobsConfig(epochs=3, hidden=16), tmp_path, resume="auto")
