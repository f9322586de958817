"""Tests for engine.trainer on a tiny synthetic classification problem: exact resume, kill, NaN, best.pt."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from torch.utils.data import DataLoader, Dataset

from engine import TIMING_KEYS, NonFiniteLossError, Trainer, load_checkpoint, load_resume
from engine.logger import read_records

DIM, CLASSES = 8, 3


class NoisyBlobs(Dataset):
    """Linearly separable classes; every item gets noise that is a function of (seed, epoch, index)."""

    def __init__(self, n: int = 64, seed: int = 0, split_seed: int = 0) -> None:
        g = torch.Generator().manual_seed(1234)
        weight = torch.randn(DIM, CLASSES, generator=g)
        g.manual_seed(split_seed)
        self.x = torch.randn(n, DIM, generator=g)
        self.y = (self.x @ weight).argmax(-1)
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch * 10_007 + i)
        return self.x[i] + 0.1 * torch.randn(DIM, generator=g), self.y[i]


class Killed(RuntimeError):
    pass


def make_trainer(run_dir: Path, epochs: int, *, kill_at: int | None = None, nan_at: int | None = None, **kwargs):
    """Builds the same trainer every time; ``kill_at`` / ``nan_at`` count loss_fn calls from 0 (4 per epoch)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, CLASSES))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    loader = DataLoader(NoisyBlobs(64), batch_size=16, shuffle=True)
    val = NoisyBlobs(48, split_seed=1)
    calls = {"n": 0}

    def loss_fn(model, batch):
        x, y = batch
        if calls["n"] == kill_at:
            raise Killed("simulated kill")
        logits = model(x)
        loss = F.cross_entropy(logits, y)
        if calls["n"] == nan_at:
            loss = loss * float("nan")
        calls["n"] += 1
        return loss, {"acc": (logits.argmax(-1) == y).float().mean()}

    def evaluate_fn(model, epoch):
        assert not model.training and not torch.is_grad_enabled()
        logits = model(val.x)
        return {"val_loss": F.cross_entropy(logits, val.y), "val_acc": (logits.argmax(-1) == val.y).float().mean()}

    options = {"scheduler": scheduler, "seed": 7, "progress": False, "config": {"lr": 1e-2, "epochs": epochs}}
    options.update(kwargs)
    return Trainer(
        model=model,
        optimizer=optimizer,
        train_loader=loader,
        loss_fn=loss_fn,
        evaluate_fn=evaluate_fn,
        run_dir=run_dir,
        epochs=epochs,
        **options,
    )


def records(run_dir: Path) -> list[dict]:
    return [untimed(record) for record in read_records(run_dir)]


def untimed(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if k not in TIMING_KEYS}


def assert_same_params(a: nn.Module, b: nn.Module) -> None:
    for (name, p), (_, q) in zip(a.state_dict().items(), b.state_dict().items()):
        assert torch.equal(p, q), name


def resume(trainer: Trainer) -> dict:
    """``fit`` from the run folder's ``last.pt`` the way engine.run does (engine.resume.load_resume: the config is
    checked against the saved one, best.pt against last.pt)."""
    return trainer.fit(state=load_resume("auto", trainer.run_dir, config=trainer.config))


def assert_resumes_like(full: Trainer, full_final: dict, resumed: Trainer) -> None:
    """``resumed`` continues its run to the same weights, final metrics and log as the uninterrupted ``full``."""
    final = resume(resumed)
    assert_same_params(full.module, resumed.module)
    assert untimed(final) == untimed(full_final)
    assert records(resumed.run_dir) == records(full.run_dir)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """An uninterrupted 4-epoch run."""
    run_dir = tmp_path_factory.mktemp("full")
    trainer = make_trainer(run_dir, 4)
    final = trainer.fit()
    return trainer, final, run_dir


def test_uninterrupted_run_leaves_complete_record(reference):
    trainer, final, run_dir = reference
    # final_metrics.json is engine.run's (tests/engine/test_run.py): the Trainer returns the final metrics
    assert sorted(p.name for p in run_dir.iterdir()) == ["best.pt", "config.yaml", "last.pt", "log.jsonl", "tb"]
    log = records(run_dir)
    assert [r["epoch"] for r in log] == [0, 1, 2, 3]
    assert set(log[0]) == {"epoch", "train_loss", "train_acc", "val_loss", "val_acc", "lr"}
    assert [r["lr"] for r in log] == [1e-2, 1e-2, 5e-3, 5e-3]  # StepLR stepped per epoch
    assert log[-1]["val_loss"] < log[0]["val_loss"]  # it learns
    assert final["epochs"] == 4 and final["val_loss"] == log[-1]["val_loss"]
    assert final == trainer.final_metrics()
    last = load_checkpoint(run_dir / "last.pt")
    assert last["epoch"] == 4 and last["config"] == {"lr": 1e-2, "epochs": 4}
    assert_same_params(trainer.module, _model_from(last))


def _model_from(state: dict) -> nn.Module:
    model = nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, CLASSES))
    model.load_state_dict(state["model"])
    return model


def test_best_checkpoint_tracks_monitor(reference, tmp_path):
    _, final, run_dir = reference
    log = records(run_dir)
    losses = [r["val_loss"] for r in log]
    best = load_checkpoint(run_dir / "best.pt")
    assert best["best_metric"] == min(losses) == final["best_val_loss"]
    assert best["epoch"] == losses.index(min(losses)) + 1
    # monitor_mode="max" on accuracy
    trainer = make_trainer(tmp_path, 2, monitor="val_acc", monitor_mode="max")
    final_acc = trainer.fit()
    accs = [r["val_acc"] for r in records(tmp_path)]
    assert final_acc["best_val_acc"] == max(accs) == load_checkpoint(tmp_path / "best.pt")["best_metric"]


def test_resume_after_finished_run_is_bit_exact(reference, tmp_path):
    full, full_final, _ = reference
    make_trainer(tmp_path, 2).fit()
    torch.manual_seed(999)  # the global RNG state between the two runs must not matter
    # the config differs in "epochs" only (a key that may change on resume); the log is identical
    assert_resumes_like(full, full_final, make_trainer(tmp_path, 4))


@pytest.mark.torch_compat
def test_resume_after_kill_mid_epoch_is_bit_exact(reference, tmp_path):
    full, full_final, _ = reference
    with pytest.raises(Killed):
        make_trainer(tmp_path, 4, kill_at=10).fit()  # epoch 2 (the third), step 2
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 2
    assert [r["epoch"] for r in records(tmp_path)] == [0, 1]
    assert_resumes_like(full, full_final, make_trainer(tmp_path, 4))


def test_resume_when_all_epochs_done_returns_final_metrics(reference, tmp_path):
    _, full_final, _ = reference
    make_trainer(tmp_path, 4).fit()
    before = records(tmp_path)
    again = resume(make_trainer(tmp_path, 4))
    assert untimed(again) == untimed(full_final)
    assert records(tmp_path) == before


def test_non_finite_loss_stops_without_overwriting_last(tmp_path):
    trainer = make_trainer(tmp_path, 4, nan_at=5)  # epoch 1, step 1
    with pytest.raises(NonFiniteLossError, match=r"epoch 1 step 1"):
        trainer.fit()
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["epoch"] == 1
    assert all(torch.isfinite(t).all() for t in last["model"].values())
    assert all(torch.isfinite(p).all() for p in trainer.module.parameters())  # the bad step was not applied


def test_unknown_monitor_lists_available_keys(tmp_path):
    with pytest.raises(ValueError, match=r"monitor 'val_los'.*val_loss"):
        make_trainer(tmp_path, 1, monitor="val_los").fit()


@pytest.mark.torch_compat
def test_resume_exact_with_amp_clip_step_scheduler_ema_and_extra_state(tmp_path):
    def build(run_dir, epochs):
        trainer = make_trainer(run_dir, epochs, amp=True, grad_clip=0.5, log_every=3, max_steps_per_epoch=3)
        trainer.scheduler = torch.optim.lr_scheduler.LambdaLR(trainer.optimizer, lambda step: 1.0 / (1 + step))
        trainer.scheduler_step = "step"
        trainer.ema = AveragedModel(trainer.module, multi_avg_fn=get_ema_multi_avg_fn(0.9))
        trainer.extra_state["counter"] = {"seen": epochs}
        return trainer

    full = build(tmp_path / "full", 3)
    full_final = full.fit()
    build(tmp_path / "part", 1).fit()
    resumed = build(tmp_path / "part", 3)
    assert_resumes_like(full, full_final, resumed)
    assert_same_params(full.ema, resumed.ema)
    assert resumed.extra_state["counter"] == {"seen": 1}  # replaced by the value the first run saved
    assert all(math.isfinite(r["train_loss"]) for r in records(tmp_path / "full"))
    assert full.global_step == 9


def test_progress_bar_and_no_evaluate_fn(tmp_path):
    trainer = make_trainer(tmp_path, 1, progress=True, monitor="train_loss", max_steps_per_epoch=2)
    trainer.evaluate_fn = None
    final = trainer.fit()
    assert final["best_train_loss"] == records(tmp_path)[0]["train_loss"]


def test_fresh_start_in_used_run_dir_warns_and_restarts_the_log(tmp_path, caplog):
    make_trainer(tmp_path, 2).fit()
    with caplog.at_level("WARNING", logger="engine.trainer"):
        make_trainer(tmp_path, 1).fit()  # no resume
    assert "overwritten" in caplog.text
    assert [r["epoch"] for r in records(tmp_path)] == [0]
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 1


def test_float16_on_cpu_warns_and_invalid_arguments_raise(tmp_path, caplog):
    with caplog.at_level("WARNING", logger="engine.trainer"):
        trainer = make_trainer(tmp_path, 1, amp=True, amp_dtype=torch.float16)
    assert trainer.scaler is None and "GradScaler" in caplog.text
    for bad, pattern in [
        ({"monitor_mode": "lowest"}, "monitor_mode"),
        ({"scheduler_step": "batch"}, "scheduler_step"),
        ({"amp_dtype": torch.float32}, "amp_dtype"),
        ({"grad_clip": 0.0}, "grad_clip"),
    ]:
        with pytest.raises(ValueError, match=pattern):
            make_trainer(tmp_path, 1, **bad)


def test_best_pt_is_written_before_the_last_pt_that_names_it_defect_2(tmp_path, monkeypatch):
    """A stop between the two writes of an improving epoch must not leave last.pt naming a best that best.pt lacks."""
    import engine.trainer as trainer_module
    from engine import check_best_agrees

    writes = []
    save = trainer_module.save_checkpoint

    def save_then_stop(state, path):
        save(state, path)
        writes.append(Path(path).name)
        if state["epoch"] == 2:  # the second epoch (an improving one): stop after its first write
            raise Killed("stopped between the two writes")

    trainer = make_trainer(tmp_path, 3, monitor="val_acc", monitor_mode="max")
    monkeypatch.setattr(trainer_module, "save_checkpoint", save_then_stop)
    monkeypatch.setattr(trainer, "_is_better", lambda value: True)  # every epoch improves
    with pytest.raises(Killed):
        trainer.fit()
    assert writes[-1] == "best.pt"
    last = load_checkpoint(tmp_path / "last.pt")
    best = load_checkpoint(tmp_path / "best.pt")
    assert last["epoch"] == 1 and best["epoch"] == 2
    assert last["best_metric"] is not None
    check_best_agrees(last, tmp_path / "best.pt")  # best.pt one epoch ahead: consistent, resume replays epoch 2


def test_resume_refuses_a_best_pt_of_another_run(tmp_path):
    from engine import CheckpointError, check_best_agrees

    make_trainer(tmp_path / "a", 2, monitor="val_acc", monitor_mode="max").fit()
    make_trainer(tmp_path / "b", 1, monitor="val_loss").fit()
    last = load_checkpoint(tmp_path / "a" / "last.pt")
    check_best_agrees(last, tmp_path / "a" / "best.pt")
    with pytest.raises(CheckpointError, match="different runs"):
        check_best_agrees({**last, "epoch": 5}, tmp_path / "b" / "best.pt")
    (tmp_path / "a" / "best.pt").unlink()
    with pytest.raises(CheckpointError, match="missing"):
        check_best_agrees(last, tmp_path / "a" / "best.pt")


@pytest.mark.torch_compat
def test_checkpoints_load_without_pickle(tmp_path):
    """Everything the Trainer saves (RNG states included) loads with torch.load(weights_only=True)."""
    trainer = make_trainer(tmp_path, 1)
    trainer.fit()
    state = torch.load(tmp_path / "last.pt", weights_only=True)
    assert isinstance(state["rng"]["numpy"], dict) and state["rng"]["python"][0] == 3
    resume(make_trainer(tmp_path, 2))  # and resumes from it


def test_resume_after_a_stop_between_the_best_and_last_writes_reports_the_best_that_best_pt_holds(
    reference, tmp_path, monkeypatch
):
    """best.pt one epoch ahead of last.pt: a resume with fewer, equal or more epochs reports best.pt's metric."""
    import engine.trainer as trainer_module

    full, full_final, _ = reference
    save = trainer_module.save_checkpoint

    def save_then_stop(state, path):
        save(state, path)
        if state["epoch"] == 2:  # the second epoch improves val_loss: best.pt is written, then the run stops
            raise Killed("stopped between the two writes")

    monkeypatch.setattr(trainer_module, "save_checkpoint", save_then_stop)
    with pytest.raises(Killed):
        make_trainer(tmp_path, 4).fit()
    monkeypatch.undo()
    best = load_checkpoint(tmp_path / "best.pt")
    assert (best["epoch"], load_checkpoint(tmp_path / "last.pt")["epoch"]) == (2, 1)
    val = NoisyBlobs(48, split_seed=1)
    best_loss = F.cross_entropy(_model_from(best).eval()(val.x), val.y).item()
    assert best["best_metric"] == pytest.approx(best_loss, rel=1e-6)
    for epochs in (1, 2):  # fewer epochs than best.pt holds (nothing to train), then exactly as many
        final = resume(make_trainer(tmp_path, epochs))
        assert final["best_val_loss"] == best["best_metric"]
    assert load_checkpoint(tmp_path / "last.pt")["best_metric"] == best["best_metric"]  # epoch 2 replayed
    assert_resumes_like(full, full_final, make_trainer(tmp_path, 4))
    assert load_checkpoint(tmp_path / "best.pt")["best_metric"] == full_final["best_val_loss"]


def test_a_non_finite_buffer_stops_the_run_before_it_is_saved(tmp_path):
    """BatchNorm's running_var = inf with finite parameters: neither last.pt nor best.pt may hold it."""
    trainer = make_trainer(tmp_path, 4)
    trainer.module.append(nn.BatchNorm1d(CLASSES))
    loss_fn, calls = trainer.loss_fn, {"n": 0}

    def diverging(model, batch):
        calls["n"] += 1
        if calls["n"] == 6:  # epoch 1, step 1
            with torch.no_grad():
                trainer.module[4].running_var.fill_(float("inf"))
        return loss_fn(model, batch)

    trainer.loss_fn = diverging
    with pytest.raises(NonFiniteLossError, match=r"after epoch 1 4\.running_var hold inf or nan; not saved") as info:
        trainer.fit()
    assert "Start a new run (not --resume" in str(info.value) and "--set lr=0.001" in str(info.value)
    for name in ("last.pt", "best.pt"):
        state = load_checkpoint(tmp_path / name)
        assert state["epoch"] == 1
        assert all(torch.isfinite(t).all() for t in state["model"].values() if t.is_floating_point())
