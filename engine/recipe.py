"""What a training recipe declares: the domain-specific parts of a run; :func:`engine.run` does everything else.

In the spirit of detectron2's ``DefaultTrainer``: a recipe subclasses :class:`Recipe` and fills in how to build the
datasets, the model, the optimizer (and schedule), the loss and the evaluation, plus what to add to the final metrics.
Seeding, DDP set-up and teardown, the run folder and its lock, resume and its checks, eval-only, logging, signals and
the final metrics are the engine's (:mod:`engine.run`), written once for every CLI.

The engine calls, in order: :meth:`Recipe.validate` (class method, on the loaded config), ``Recipe(cfg, ctx,
data_root)``, :meth:`~Recipe.build_datasets`, :meth:`~Recipe.build_loaders`, :meth:`~Recipe.build_model` (by default
:meth:`~Recipe.model_spec` built by name), :meth:`~Recipe.summary`; then for training
:meth:`~Recipe.build_optimizer`, :meth:`~Recipe.build_scheduler`, :meth:`~Recipe.trainer_kwargs` and per step
:meth:`~Recipe.loss`, per epoch :meth:`~Recipe.evaluate`, and at the end :meth:`~Recipe.finalize`; for
``--eval-only`` :meth:`~Recipe.evaluate_checkpoint`.

Config conventions shared by every recipe config (checked by :func:`validate_common`): ``name``, ``seed``, ``epochs``,
``batch_size`` (global, split evenly over the ranks), ``eval_batch_size``, ``lr``, ``workers``, ``amp``, ``grad_clip``
and ``model_kwargs`` (any constructor keyword of the model, e.g. ``--set model_kwargs.mixer=hydra``), which
:func:`collect_model_kwargs` merges with the recipe's named model knobs. :func:`check_config` reports a recipe's
own config problems together, as :func:`validate_common` does.

Limits on the shared keys: ``batch_size`` and ``eval_batch_size`` at most :data:`MAX_BATCH_SIZE`; ``workers`` at most
:data:`MAX_WORKERS`, and :func:`clamp_workers` cuts a value above the CPUs this process may use to their number (with
a warning), so that a config written for a large machine still runs on a small one.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path, PurePath
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from engine.config import shorten
from engine.distributed import DistributedContext
from engine.errors import UsageError
from engine.logger import read_records
from engine.registry import create_by_name
from measure.stats import count_params

__all__ = [
    "MAX_BATCH_SIZE",
    "MAX_WORKERS",
    "NONFINITE_OK",
    "Recipe",
    "check_config",
    "clamp_workers",
    "collect_model_kwargs",
    "split_batch",
    "usable_cpus",
    "validate_common",
]

_logger = logging.getLogger(__name__)

#: Largest ``batch_size`` / ``eval_batch_size``: far above any batch that fits a device, low enough that a typo
#: (``eval_batch_size=1e20``) is refused with the config instead of failing when the first batch is allocated.
MAX_BATCH_SIZE = 2**20
#: Largest ``workers``: each is a process holding a copy of the dataset; no machine is helped by more.
MAX_WORKERS = 256


def check_config(cfg: Any, checks: Iterable[tuple[bool, str]]) -> None:
    """Raises one :class:`UsageError` that lists every failed check, prefixed with the config's class name.

    Args:
        cfg: The config (only its class name is used).
        checks: ``(ok, problem)`` pairs; ``problem`` says what was expected and what came, e.g.
            ``(cfg.votes >= 1, f"votes must be >= 1, got {cfg.votes}")``.

    Example (a recipe's :meth:`Recipe.validate`)::

        check_config(cfg, [
            (cfg.model in list_models(), f"model {cfg.model!r} is not registered; choose one of {list_models()}"),
            (cfg.num_points >= 1, f"num_points must be >= 1, got {cfg.num_points}"),
        ])
    """
    problems = [problem for ok, problem in checks if not ok]
    if problems:
        raise UsageError(f"{type(cfg).__name__}: " + "; ".join(problems))


# key, check, what it must be: the common keys (a config that lacks one, or sets it to None, skips it)
_COMMON_CHECKS: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    ("batch_size", lambda v: v >= 1, ">= 1"),
    ("batch_size", lambda v: v <= MAX_BATCH_SIZE, f"<= {MAX_BATCH_SIZE} (2**20)"),
    ("eval_batch_size", lambda v: v >= 1, ">= 1"),
    ("eval_batch_size", lambda v: v <= MAX_BATCH_SIZE, f"<= {MAX_BATCH_SIZE} (2**20)"),
    ("epochs", lambda v: v >= 1, ">= 1"),
    ("lr", lambda v: math.isfinite(v) and v > 0, "a finite number > 0"),
    ("weight_decay", lambda v: math.isfinite(v) and v >= 0, ">= 0"),
    ("workers", lambda v: v >= 0, ">= 0"),
    ("workers", lambda v: v <= MAX_WORKERS, f"<= {MAX_WORKERS} (DataLoader processes per rank)"),
    ("seed", lambda v: 0 <= v < 2**63, "in [0, 2**63)"),  # torch seeds are 64-bit; samplers add the epoch
    ("grad_clip", lambda v: math.isfinite(v) and v > 0, "> 0 or null"),
    ("warmup_epochs", lambda v: v >= 0, ">= 0"),
    ("num_heads", lambda v: v >= 1, ">= 1"),  # a model knob: also checked in model_kwargs
)
_MODEL_KNOBS = ("num_heads",)

#: ``dataclasses.field(metadata={NONFINITE_OK: True})`` lets a float field hold ``inf`` / ``nan``.
NONFINITE_OK = "nonfinite_ok"


def _passes(check: Callable[[Any], bool], value: Any) -> bool:
    try:
        return bool(check(value))
    except TypeError:  # e.g. a string in model_kwargs
        return False


def _nonfinite(value: Any) -> bool:
    """Whether ``value`` is or holds (in a list, tuple or dict) a float ``inf`` / ``nan``."""
    if isinstance(value, float):
        return not math.isfinite(value)
    if isinstance(value, (list, tuple)):
        return any(_nonfinite(v) for v in value)
    if isinstance(value, dict):
        return any(_nonfinite(v) for v in value.values())
    return False


def _name_problem(name: Any) -> str | None:
    """Why ``name`` cannot name a folder inside ``runs/<group>/``, or ``None``."""
    if not isinstance(name, str):
        return None
    path = PurePath(name)
    if not name.strip() or not path.parts:
        return f"name must name a folder, got {name!r}"
    if path.is_absolute() or path.anchor or ".." in path.parts:
        return (
            f"name must be a relative path inside runs/<group>/ (no '..', not absolute), got {name!r}; to write "
            "elsewhere use --output-dir"
        )
    return None


def validate_common(cfg: Any) -> None:
    """Checks the config keys every recipe shares (those the config has); raises one :class:`UsageError` for all.

    A ``batch_size`` of 0 or a non-positive ``lr`` or ``epochs`` would otherwise train nothing useful. Also checked:
    every float value of the config (in lists and dicts too) is finite unless its field's metadata sets
    :data:`NONFINITE_OK` (``label_smoothing=nan`` would silently act as 0); ``num_heads`` in ``model_kwargs`` too
    (it overrides the field); ``name`` is a relative path that stays inside ``runs/<group>/``.
    """
    values = {key: getattr(cfg, key, None) for key, _, _ in _COMMON_CHECKS}
    checks = [
        (_passes(ok, values[key]), f"{key} must be {expected}, got {values[key]!r}")
        for key, ok, expected in _COMMON_CHECKS
        if values[key] is not None
    ]
    model_kwargs = getattr(cfg, "model_kwargs", None)
    if isinstance(model_kwargs, dict):
        checks += [
            (_passes(ok, model_kwargs[key]), f"model_kwargs.{key} must be {expected}, got {model_kwargs[key]!r}")
            for key, ok, expected in _COMMON_CHECKS
            if key in _MODEL_KNOBS and model_kwargs.get(key) is not None
        ]
    if dataclasses.is_dataclass(cfg):
        checks += [
            (False, f"{f.name} must be finite, got {shorten(getattr(cfg, f.name))}")
            for f in dataclasses.fields(cfg)
            if not f.metadata.get(NONFINITE_OK) and _nonfinite(getattr(cfg, f.name, None))
        ]
    name_problem = _name_problem(getattr(cfg, "name", None))
    checks.append((name_problem is None, name_problem or ""))
    check_config(cfg, checks)


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask where the OS has one, else ``os.cpu_count()``)."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def clamp_workers(cfg: Any) -> Any:
    """``cfg`` with ``workers`` cut to :func:`usable_cpus` (and a warning) when it asks for more; else ``cfg`` itself.

    More DataLoader processes than CPUs only compete for them (and each holds a copy of the dataset); the cut value is
    the one the run records. Values above :data:`MAX_WORKERS` are refused earlier, by :func:`validate_common`.
    """
    workers, cpus = getattr(cfg, "workers", None), usable_cpus()
    if not isinstance(workers, int) or workers <= cpus:
        return cfg
    _logger.warning("workers=%d is more than the %d CPU(s) this process may use: using workers=%d", workers, cpus, cpus)
    return dataclasses.replace(cfg, workers=cpus)


def collect_model_kwargs(cfg: Any, knobs: Sequence[str]) -> dict[str, Any]:
    """The model-constructor keywords a config sets: every field in ``knobs`` that is not ``None``, then the
    ``cfg.model_kwargs`` dict (which wins).

    A knob left at ``None`` keeps the registered model's own default, so one config class serves model variants whose
    defaults differ. Pass the result to a factory that names a keyword it does not take
    (:func:`engine.registry.create_with_kwargs`; a :class:`~engine.registry.ModelRegistry`'s ``create_model`` does).
    """
    kwargs = {k: getattr(cfg, k) for k in knobs if getattr(cfg, k) is not None}
    kwargs.update(getattr(cfg, "model_kwargs", None) or {})
    return kwargs


def split_batch(batch_size: int, world_size: int, train_size: int | None = None) -> int:
    """The per-rank batch of a global ``batch_size``: it must divide evenly over the ranks and, with ``drop_last``,
    fit in the ``train_size`` samples of the train split (when given)."""
    if batch_size % world_size:
        raise UsageError(
            f"batch_size is the global batch and must divide evenly over {world_size} ranks, got {batch_size}"
        )
    if train_size is not None and batch_size > train_size:
        raise UsageError(
            f"batch_size={batch_size} exceeds the {train_size} samples of the train split (with drop_last no batch "
            "would be left): lower batch_size or use more data"
        )
    return batch_size // world_size


class Recipe:
    """The domain-specific half of a training run (see the module docstring for the call order).

    Class attributes:
        group: Runs go to ``runs/<group>/<cfg.name>/...``.
        config_cls: The flat config dataclass.
        monitor / monitor_mode: The record key that decides ``best.pt``, and ``"min"`` or ``"max"``.
        resume_mutable: Config keys (beyond :data:`engine.resume.RESUME_MUTABLE`) that may change on resume.
        eval_mutable: Config keys (beyond :data:`engine.resume.EVAL_MUTABLE`) that may change for ``--eval-only``:
            how to evaluate (e.g. test-time votes) and what only training reads (e.g. augmentation).

    Instance attributes set by the engine: ``cfg``, ``ctx`` (the :class:`DistributedContext`), ``data_root``,
    ``run_dir``; after :meth:`build_loaders`, ``train_set``, ``eval_set``, ``train_loader``, ``eval_loader``.
    """

    group: ClassVar[str] = ""
    config_cls: ClassVar[type] = object
    monitor: ClassVar[str] = "val_loss"
    monitor_mode: ClassVar[str] = "min"
    resume_mutable: ClassVar[tuple[str, ...]] = ()
    eval_mutable: ClassVar[tuple[str, ...]] = ()

    def __init__(self, cfg: Any, ctx: DistributedContext, data_root: str | None = None) -> None:
        self.cfg = cfg
        self.ctx = ctx
        self.data_root = data_root
        self.run_dir: Path | None = None

    @classmethod
    def validate(cls, cfg: Any) -> None:
        """Recipe-specific config checks (raise :class:`UsageError`); the common ones are already done."""

    def build_datasets(self) -> tuple[Dataset, Dataset]:
        """The train and evaluation datasets (the engine then checks their files and sizes)."""
        raise NotImplementedError

    def build_loaders(self, train_set: Dataset, eval_set: Dataset) -> tuple[Any, Any]:
        """Train loader (shuffled, ``DistributedSampler`` under DDP, ``drop_last``) and the full eval set per rank."""
        cfg = self.cfg
        per_rank = self.per_rank_batch(len(train_set))
        sampler = None
        if self.ctx.world_size > 1:
            sampler = DistributedSampler(
                train_set, self.ctx.world_size, self.ctx.rank, shuffle=True, seed=cfg.seed, drop_last=True
            )
        workers = getattr(cfg, "workers", 0)
        train_loader = DataLoader(
            train_set,
            batch_size=per_rank,
            shuffle=sampler is None,
            sampler=sampler,
            num_workers=workers,
            drop_last=True,  # BatchNorm needs more than one sample per batch
            generator=torch.Generator() if sampler is None else None,
        )
        eval_loader = DataLoader(eval_set, batch_size=cfg.eval_batch_size, shuffle=False, num_workers=workers)
        return train_loader, eval_loader

    def per_rank_batch(self, train_size: int) -> int:
        """``batch_size`` (global) split over the ranks (:func:`split_batch`)."""
        return split_batch(self.cfg.batch_size, self.ctx.world_size, train_size)

    def model_spec(self) -> tuple[str, dict[str, Any]] | None:
        """The model as ``(registered name, constructor keywords)``, or ``None`` if it has no registered name.

        The default :meth:`build_model` builds it with :func:`engine.registry.create_by_name`, and the engine saves it
        in every checkpoint (``model_spec``), so that ``tools/export_weights.py`` rebuilds exactly the trained model
        without the config's data. ``cfg.model_kwargs`` should reach the keywords (:func:`collect_model_kwargs`).
        """
        return None

    def build_model(self) -> nn.Module:
        """The model (the engine moves it to the device): :meth:`model_spec` built by name, unless overridden."""
        spec = self.model_spec()
        if spec is None:
            raise NotImplementedError(f"{type(self).__name__} defines neither model_spec() nor build_model()")
        return create_by_name(*spec)

    def summary(self, model: nn.Module) -> dict[str, Any]:
        """Facts about the run logged at the start and added to the final and eval metrics (params, GMACs, ...)."""
        return {"params": count_params(model)}

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        raise NotImplementedError

    def build_scheduler(self, optimizer: torch.optim.Optimizer, steps_per_epoch: int) -> tuple[Any, int]:
        """The LR scheduler (or ``None``) and the number of epochs to train."""
        return None, self.cfg.epochs

    def trainer_kwargs(self) -> dict[str, Any]:
        """Extra :class:`~engine.Trainer` arguments (``ema``, ``amp_dtype``, ``log_every``...)."""
        return {}

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict[str, Any]]:
        """``(scalar loss, logs)`` for one batch on the device (``model`` may be DDP-wrapped)."""
        raise NotImplementedError

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        """Metrics on the eval split (model unwrapped, in eval mode, under ``no_grad``); same on every rank."""
        raise NotImplementedError

    def finalize(self, final: dict[str, Any], model: nn.Module) -> dict[str, Any]:
        """Entries to add to the final metrics after training (e.g. test-time voting); ``model`` is trained."""
        return {}

    def records(self) -> list[dict[str, Any]]:
        """The run's ``log.jsonl`` records so far (one per epoch); empty before the first epoch or off rank 0."""
        return read_records(self.run_dir) if self.run_dir is not None else []

    def evaluate_checkpoint(self, model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
        """``--eval-only``: metrics of ``state`` (a checkpoint, already loaded into ``model``)."""
        return self.evaluate(model)
