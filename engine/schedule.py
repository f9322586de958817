"""Learning-rate schedules by epoch, and the rule they follow when a resumed run changes ``epochs``.

**Resume rule.** ``epochs`` may change on ``--resume`` (:data:`engine.resume.RESUME_MUTABLE`). A run stopped after
``k`` of ``E`` epochs and resumed with ``E'`` keeps the learning rate it stopped at and stretches what is left of
its schedule over the epochs now left: epoch ``e >= k`` runs at the rate the original schedule gives at

    k + (e - k) * (E - k) / (E' - k)

so the rate goes on from where it was without a jump, still decays monotonically, and reaches the schedule's end value
(1% of ``lr`` for the cosine, ``min_lr`` for timm's) at the new end, ``E'``. Warm-up still ahead keeps its length. A run
that had finished its schedule (``k = E``) goes on at the end value. Step decay, which depends on the epoch and not on
``epochs``, goes on unchanged. With the same ``epochs`` nothing changes, and resume stays bit for bit.

Recomputing the schedule for ``E'`` at the current epoch instead (what a schedule rebuilt from the config does) makes
the rate jump up: a cosine stopped half-way and resumed with twice the epochs would jump from 50% to 85% of ``lr``.

:class:`EpochLR` implements the rule for per-epoch ``LambdaLR`` schedules (:func:`epoch_lr_schedule` and the ListOps
recipe's); :class:`StretchOnResume` wraps a timm scheduler that ends at a given epoch (cosine, tanh, poly), per update
or per epoch. Both keep what they need in their ``state_dict``; a checkpoint written before they existed resumes as it
did then.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

__all__ = ["EpochLR", "StretchOnResume", "epoch_lr_schedule"]

logger = logging.getLogger(__name__)


class EpochLR(torch.optim.lr_scheduler.LambdaLR):
    """A per-epoch ``LambdaLR``: linear warm-up over ``warmup_epochs``, then ``decay(step, progress)``, following the
    module's resume rule.

    Epoch ``e < warmup_epochs`` runs at ``(e + 1) / (warmup_epochs + 1)`` of the base rate; after it, at
    ``decay(e - warmup_epochs, progress)`` where ``progress`` runs from 0 at the end of the warm-up to 1 at
    ``epochs`` (:meth:`progress`). A decay that only uses ``progress`` ends where ``decay(., 1)`` says, whatever
    ``epochs`` is; one that only uses the step (step decay) does not depend on ``epochs``.

    Args:
        optimizer: The optimizer.
        decay: ``decay(step, progress) -> factor`` of the base rate.
        epochs: Epochs of the run.
        warmup_epochs: Epochs of linear warm-up.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        decay: Callable[[int, float], float],
        *,
        epochs: int,
        warmup_epochs: int = 0,
    ) -> None:
        # Plain numbers only: LambdaLR's state_dict saves them, so a resumed run knows the schedule it stopped in.
        self.epochs = epochs
        self.warmup_epochs = warmup_epochs
        self.anchor_epoch = warmup_epochs  # progress is anchor_progress at anchor_epoch and 1 at epochs
        self.anchor_progress = 0.0

        def factor(epoch: int) -> float:
            if epoch < self.warmup_epochs:
                return (epoch + 1) / (self.warmup_epochs + 1)
            return decay(epoch - self.warmup_epochs, self.progress(epoch))

        super().__init__(optimizer, factor)

    def progress(self, epoch: int) -> float:
        """How far epoch ``epoch`` is into the decay: 0 at its start, 1 at ``epochs``."""
        a, p = self.anchor_epoch, self.anchor_progress
        return min(p + (1.0 - p) * (epoch - a) / max(1, self.epochs - a), 1.0)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the schedule; if this run's ``epochs`` differs from the saved one, stretches what is left."""
        epochs = self.epochs
        super().load_state_dict(state_dict)  # brings back the saved epochs and anchor (if the checkpoint has them)
        if self.epochs == epochs:
            return
        done = self.last_epoch  # completed epochs
        if done > self.anchor_epoch:
            self.anchor_progress = self.progress(done)
            self.anchor_epoch = done
        logger.info(
            "lr schedule: epochs %d -> %d after %d epoch(s): what is left of the decay (from %.4g of the way) now "
            "ends at epoch %d",
            self.epochs,
            epochs,
            done,
            self.anchor_progress,
            epochs,
        )
        self.epochs = epochs


def epoch_lr_schedule(
    optimizer: torch.optim.Optimizer,
    *,
    epochs: int,
    cosine: bool,
    lr_step: int,
    lr_gamma: float,
    warmup_epochs: int = 0,
) -> EpochLR:
    """Per-epoch schedule of the point-cloud and capsule recipes: linear warm-up over ``warmup_epochs``, then cosine
    decay to 1% of the base lr over the remaining epochs (``cosine``) or step decay by ``lr_gamma`` every ``lr_step``
    epochs (the papers' schedules). A resumed run with another ``epochs`` follows the module's resume rule: the cosine
    goes on from the current rate and still ends at 1% at the new last epoch; step decay goes on unchanged."""

    def decay(step: int, progress: float) -> float:
        if cosine:
            return 0.01 + 0.99 * 0.5 * (1 + np.cos(np.pi * progress))
        return lr_gamma ** (step // lr_step)

    return EpochLR(optimizer, decay, epochs=epochs, warmup_epochs=warmup_epochs)


class StretchOnResume:
    """A timm scheduler (one that ends at a given epoch: cosine, tanh, poly) that follows the module's resume rule.

    The wrapped scheduler keeps the schedule of the run's first ``epochs``; when a resumed run has another ``epochs``,
    the time it is stepped with is mapped onto what was left of it. Until then every call passes through unchanged.
    The :class:`~engine.Trainer` drives it as a timm scheduler (``step_update`` per update, ``step`` per epoch).

    Args:
        scheduler: The timm scheduler, built for ``epochs``.
        epochs: Epochs of the run (timm's ``num_epochs``, cool-down included).
        updates_per_epoch: Optimizer steps per epoch (for ``step_update``).
        warmup_epochs: Epochs of warm-up (kept as they are).
    """

    def __init__(self, scheduler: Any, *, epochs: int, updates_per_epoch: int, warmup_epochs: int = 0) -> None:
        self.scheduler = scheduler
        self.epochs = epochs
        self.horizon = epochs  # the epochs the wrapped schedule was built for
        self.updates_per_epoch = max(1, updates_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.anchor: tuple[float, float] | None = None  # (epoch, schedule epoch) where epochs last changed
        self.done = 0  # completed epochs

    def schedule_epoch(self, epoch: float) -> float:
        """The epoch of the wrapped schedule that epoch ``epoch`` of this run follows."""
        if self.anchor is None or epoch < self.anchor[0]:
            return epoch
        k, m = self.anchor
        return m + (self.horizon - m) * (epoch - k) / max(1, self.epochs - k)

    def step(self, epoch: int, metric: float | None = None) -> None:
        self.done = epoch
        self.scheduler.step(self.schedule_epoch(epoch), metric)

    def step_update(self, num_updates: int, metric: float | None = None) -> None:
        if self.anchor is not None:
            u = self.updates_per_epoch
            num_updates = u * self.schedule_epoch(num_updates / u)
        self.scheduler.step_update(num_updates, metric)

    def state_dict(self) -> dict[str, Any]:
        """The timm scheduler's state (its keys, as before), plus ``stretch``: what the resume rule needs."""
        stretch = {"epochs": self.epochs, "horizon": self.horizon, "done": self.done}
        stretch["anchor"] = list(self.anchor) if self.anchor is not None else None
        return {**self.scheduler.state_dict(), "stretch": stretch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restores the schedule; if this run's ``epochs`` differs from the saved one, stretches what is left."""
        state = dict(state)
        stretch = state.pop("stretch", None)
        self.scheduler.load_state_dict(state)
        if stretch is None:  # an older checkpoint: resumes as it did then
            return
        epochs = self.epochs
        self.epochs, self.horizon, self.done = stretch["epochs"], stretch["horizon"], stretch["done"]
        self.anchor = tuple(stretch["anchor"]) if stretch["anchor"] is not None else None
        if self.epochs == epochs:
            return
        start = max(self.done, self.warmup_epochs)
        self.anchor = (start, self.schedule_epoch(start))
        logger.info(
            "lr schedule: epochs %d -> %d after %d epoch(s): what is left of it (from its epoch %.4g of %d) now ends "
            "at epoch %d",
            self.epochs,
            epochs,
            self.done,
            self.anchor[1],
            self.horizon,
            epochs,
        )
        self.epochs = epochs

    def __getattr__(self, name: str) -> Any:  # anything else (t_initial, base_values, ...) is the wrapped scheduler's
        if name == "scheduler":
            raise AttributeError(name)
        return getattr(self.scheduler, name)
