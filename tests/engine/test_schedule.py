"""Tests for engine.schedule: the per-epoch schedules, and the rule they follow when a resumed run changes epochs."""

from __future__ import annotations

import itertools
import math
import tempfile
from pathlib import Path

import pytest
import torch
from timm.scheduler import create_scheduler_v2

from engine.checkpoint import load_checkpoint, save_checkpoint
from engine.schedule import EpochLR, StretchOnResume, epoch_lr_schedule

LR = 0.1


def _optimizer() -> torch.optim.Optimizer:
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=LR)


def _step(opt: torch.optim.Optimizer, sched: EpochLR) -> None:
    """The end of an epoch: the optimizer (no gradients: a no-op, but torch warns when a scheduler goes first), then
    the schedule."""
    opt.step()
    sched.step()


def _through_checkpoint(state: dict) -> dict:
    """What a checkpoint gives back (saved, then loaded without pickle), as a resumed run gets it."""
    with tempfile.TemporaryDirectory() as folder:
        save_checkpoint(state, Path(folder) / "last.pt")
        return load_checkpoint(Path(folder) / "last.pt")


def _run(epochs: int, stop: int | None = None, resume_epochs: int | None = None, **kwargs) -> list[float]:
    """The lr of every epoch and the lr after the last step, stopping after ``stop`` epochs and resuming (in a new
    optimizer and schedule, as a new process would) with ``resume_epochs``."""
    opt = _optimizer()
    sched = epoch_lr_schedule(opt, epochs=epochs, **kwargs)
    lrs = []
    for _ in range(epochs if stop is None else stop):
        lrs.append(opt.param_groups[0]["lr"])
        _step(opt, sched)
    if stop is None:
        return [*lrs, opt.param_groups[0]["lr"]]
    state = _through_checkpoint({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()})
    epochs = resume_epochs if resume_epochs is not None else epochs
    opt = _optimizer()
    sched = epoch_lr_schedule(opt, epochs=epochs, **kwargs)
    opt.load_state_dict(state["optimizer"])
    sched.load_state_dict(state["scheduler"])
    for _ in range(stop, epochs):
        lrs.append(opt.param_groups[0]["lr"])
        _step(opt, sched)
    return [*lrs, opt.param_groups[0]["lr"]]


COSINE = dict(cosine=True, lr_step=20, lr_gamma=0.7)


@pytest.mark.parametrize("warmup", [0, 3])
def test_fresh_schedule_is_the_closed_form(warmup):
    epochs = 12
    lrs = _run(epochs, warmup_epochs=warmup, **COSINE)
    for e, lr in enumerate(lrs):
        if e < warmup:
            factor = (e + 1) / (warmup + 1)
        else:
            factor = 0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * (e - warmup) / (epochs - warmup)))
        assert lr == pytest.approx(LR * factor, rel=1e-12), e
    assert lrs[-1] == pytest.approx(0.01 * LR)
    steps = _run(12, cosine=False, lr_step=5, lr_gamma=0.5, warmup_epochs=warmup)
    assert steps[warmup:] == pytest.approx([LR * 0.5 ** (s // 5) for s in range(13 - warmup)], rel=1e-12)


@pytest.mark.parametrize("kwargs", [COSINE, dict(COSINE, warmup_epochs=3), dict(cosine=False, lr_step=4, lr_gamma=0.5)])
def test_resume_with_the_same_epochs_is_bit_exact(kwargs):
    assert _run(12, stop=5, **kwargs) == _run(12, **kwargs)


def test_more_epochs_stretch_what_is_left_of_the_cosine():
    """Stopped after 4 of 10 epochs, resumed to 16: epoch e follows the original at 4 + (e - 4) * 6 / 12."""
    ref = _run(10, **COSINE)
    lrs = _run(10, stop=4, resume_epochs=16, **COSINE)
    assert len(lrs) == 17 and lrs[:5] == ref[:5]
    for e in range(4, 17, 2):
        assert lrs[e] == pytest.approx(ref[4 + (e - 4) // 2], rel=1e-12), e
    steps = [b - a for a, b in itertools.pairwise(lrs)]
    assert all(s < 0 for s in steps) and max(-s for s in steps) <= max(a - b for a, b in itertools.pairwise(ref))
    assert lrs[-1] == pytest.approx(0.01 * LR)
    # fewer epochs compress it the same way; still ends at 1%
    short = _run(10, stop=4, resume_epochs=7, **COSINE)
    assert short[4 + 1] == pytest.approx(ref[6], rel=1e-12) and short[-1] == pytest.approx(0.01 * LR)


def test_extended_twice_and_during_warmup():
    opt = _optimizer()
    sched = epoch_lr_schedule(opt, epochs=10, **COSINE)
    lrs = []
    for epochs, stop in ((10, 4), (16, 10), (22, 22)):  # each part a new process, resumed from a checkpoint
        if lrs:
            state = _through_checkpoint({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()})
            opt = _optimizer()
            sched = epoch_lr_schedule(opt, epochs=epochs, **COSINE)
            opt.load_state_dict(state["optimizer"])
            sched.load_state_dict(state["scheduler"])
        while len(lrs) < stop:
            lrs.append(opt.param_groups[0]["lr"])
            _step(opt, sched)
    lrs.append(opt.param_groups[0]["lr"])
    # progress: e / 10 up to 4, then 0.4 -> 1 over [4, 16] (0.7 at 10), then 0.7 -> 1 over [10, 22]
    progress = [e / 10 for e in range(4)]
    progress += [0.4 + 0.6 * (e - 4) / 12 for e in range(4, 10)] + [0.7 + 0.3 * (e - 10) / 12 for e in range(10, 23)]
    expected = [LR * (0.01 + 0.99 * 0.5 * (1 + math.cos(math.pi * p))) for p in progress]
    assert lrs == pytest.approx(expected, rel=1e-12)
    # during the warm-up: it keeps its length and the decay then spans the new epochs, like a fresh run of them
    warm = dict(COSINE, warmup_epochs=3)
    assert _run(10, stop=2, resume_epochs=16, **warm) == pytest.approx(_run(16, **warm), rel=1e-12)
    # a finished schedule goes on at its end value
    assert _run(10, stop=10, resume_epochs=13, **COSINE)[10:] == pytest.approx([0.01 * LR] * 4)


def test_step_decay_goes_on_unchanged_when_epochs_grow():
    kwargs = dict(cosine=False, lr_step=4, lr_gamma=0.5)
    assert _run(10, stop=5, resume_epochs=16, **kwargs) == _run(16, **kwargs)


@pytest.mark.torch_compat
def test_a_checkpoint_without_the_schedule_state_resumes_as_before():
    opt = _optimizer()
    sched = epoch_lr_schedule(opt, epochs=10, **COSINE)
    for _ in range(4):
        _step(opt, sched)
    old = {k: v for k, v in sched.state_dict().items() if k not in ("epochs", "anchor_epoch", "anchor_progress")}
    again = epoch_lr_schedule(_optimizer(), epochs=16, **COSINE)
    again.load_state_dict(old)
    assert (again.epochs, again.last_epoch) == (16, 4)


def test_epoch_lr_takes_any_decay():
    opt = _optimizer()
    sched = EpochLR(opt, lambda step, progress: 1.0 - 0.9 * progress, epochs=5, warmup_epochs=1)
    lrs = []
    for _ in range(5):
        lrs.append(opt.param_groups[0]["lr"])
        _step(opt, sched)
    assert [*lrs, opt.param_groups[0]["lr"]] == pytest.approx([0.05, 0.1, 0.0775, 0.055, 0.0325, 0.01])


# --------------------------------------------------------------------------------------------------------------------
# timm schedulers


def _timm(epochs: int, updates: int, on_updates: bool) -> tuple[torch.optim.Optimizer, StretchOnResume]:
    opt = _optimizer()
    sched, num_epochs = create_scheduler_v2(
        opt, sched="cosine", num_epochs=epochs, min_lr=1e-4, warmup_lr=1e-5, warmup_epochs=1,
        step_on_epochs=not on_updates, updates_per_epoch=updates,
    )  # fmt: skip
    return opt, StretchOnResume(sched, epochs=num_epochs, updates_per_epoch=updates, warmup_epochs=1)


def _timm_run(epochs: int, stop: int | None = None, resume_epochs: int | None = None, on_updates=True) -> list:
    """The lr at every update (as the Trainer drives a timm scheduler), stopping and resuming like :func:`_run`."""
    updates = 3
    opt, sched = _timm(epochs, updates, on_updates)
    lrs = []

    def train(first: int, last: int) -> None:
        for epoch in range(first, last):
            for step in range(updates):
                lrs.append(opt.param_groups[0]["lr"])
                sched.step_update(num_updates=epoch * updates + step + 1)
            sched.step(epoch + 1, None)

    train(0, epochs if stop is None else stop)
    if stop is not None:
        state = _through_checkpoint({"optimizer": opt.state_dict(), "scheduler": sched.state_dict()})
        epochs = resume_epochs if resume_epochs is not None else epochs
        opt, sched = _timm(epochs, updates, on_updates)
        opt.load_state_dict(state["optimizer"])
        sched.load_state_dict(state["scheduler"])
        train(stop, epochs)
    return [*lrs, opt.param_groups[0]["lr"]]


@pytest.mark.parametrize("on_updates", [True, False], ids=["per-update", "per-epoch"])
def test_timm_schedule_same_epochs_exact_more_epochs_stretched(on_updates):
    opt, sched = _timm(6, 3, on_updates)
    bare, _ = create_scheduler_v2(
        _optimizer(), sched="cosine", num_epochs=6, min_lr=1e-4, warmup_lr=1e-5, warmup_epochs=1,
        step_on_epochs=not on_updates, updates_per_epoch=3,
    )  # fmt: skip
    assert sched.t_initial == bare.t_initial  # other attributes are the wrapped scheduler's
    ref = _timm_run(6, on_updates=on_updates)
    assert _timm_run(6, stop=3, on_updates=on_updates) == ref
    lrs = _timm_run(6, stop=3, resume_epochs=9, on_updates=on_updates)
    per_epoch = 3 if on_updates else 1  # distinct lrs per epoch
    assert lrs[:10] == ref[:10]
    for e in (3, 5, 7, 9):  # epoch e follows the original at 3 + (e - 3) * 3 / 6
        assert lrs[e * 3] == pytest.approx(ref[(3 + (e - 3) // 2) * 3], rel=1e-9), e
    steps = [b - a for a, b in itertools.pairwise(lrs[3:])]
    assert all(s <= 0 for s in steps) and sum(s < 0 for s in steps) >= 6 * per_epoch - 1
    assert lrs[-1] == pytest.approx(1e-4) and lrs[-2] > 1e-4 * 1.01


@pytest.mark.torch_compat
def test_timm_bare_state_of_an_older_checkpoint_loads():
    opt, sched = _timm(6, 3, True)
    for n in range(1, 7):
        sched.step_update(num_updates=n)
    again_opt, again = _timm(9, 3, True)
    assert sched.state_dict()["t_initial"] == 6 * 3  # the timm state's keys stay where they were
    again.load_state_dict(sched.scheduler.state_dict())
    assert again.t_initial == sched.t_initial and again.anchor is None and again.epochs == 9
