"""The generic epoch loop shared by the training CLIs: train, evaluate, log, checkpoint, restore a checkpoint.

A CLI supplies the model, optimizer, loader and two functions, and the :class:`Trainer` does the rest::

    def loss_fn(model, batch):            # batch is already on the device
        points, labels = batch
        logits = model(points)
        loss = F.cross_entropy(logits, labels)
        return loss, {"acc": (logits.argmax(-1) == labels).float().mean()}

    def evaluate_fn(model, epoch):        # model is unwrapped, in eval mode, under torch.no_grad()
        return {"val_loss": ..., "val_acc": ...}

    trainer = Trainer(model=model, optimizer=opt, train_loader=loader, loss_fn=loss_fn, evaluate_fn=evaluate_fn,
                      run_dir="runs/exp", epochs=250, ctx=init_distributed(), scheduler=sched, config=cfg)
    state = load_resume(args.resume, "runs/exp", config=cfg)   # engine.resume: None, "auto" or a path
    final = trainer.fit(state=state)                           # state None: a fresh start

Epochs are 0-based in logs and hooks; a checkpoint's ``epoch`` is the number of completed epochs, i.e. the epoch
the run continues with.

Resume determinism. At the start of every epoch the Python, NumPy and torch RNGs (and the loader's own
generators) are reseeded with a seed derived from ``(seed, epoch, rank)``, and ``set_epoch(epoch)`` is called on
the sampler (``DistributedSampler``) and on the dataset (whose augmentation should be a function of
``(seed, epoch, index)``). Data order, augmentation and dropout are therefore a function of the epoch alone, and
a run restored from the checkpoint written after epoch ``k`` (model, optimizer, scheduler, scaler, EMA, best
metric) replays epochs ``k, k+1, ...`` exactly as an uninterrupted run does: bit for bit on the CPU, and on CUDA
when deterministic algorithms are enabled (``torch.use_deterministic_algorithms(True)``). A run killed in the
middle of an epoch restarts that epoch. RNG states are saved in the checkpoint too, and restored, for code that
draws random numbers outside the epoch loop. Not covered: ``persistent_workers=True`` DataLoaders (their workers
keep the dataset copy and RNG state of the first epoch; a warning is logged) and iterable datasets whose stream
does not restart each epoch.

Schedulers. ``scheduler_step="epoch"`` (default) calls ``scheduler.step()`` after each epoch's evaluation,
``"step"`` after every optimizer step. ``ReduceLROnPlateau`` gets the monitored metric. timm schedulers (anything
with ``step_update``) are driven the way timm's ``train.py`` does: ``step_update(num_updates)`` after every
optimizer step and ``step(epoch + 1, metric)`` after every epoch, whatever ``scheduler_step`` says.

Files (rank 0 only; every rank waits at a barrier): ``log.jsonl`` + ``tb/`` (via :class:`~engine.logger.RunLogger`),
``config.yaml`` (if ``config`` is given), ``best.pt`` when the monitored metric improves and then ``last.pt``, every
epoch (both atomic; in this order, so ``last.pt``'s ``best_epoch`` / ``best_metric`` always describe a ``best.pt`` on
disk). :meth:`Trainer.fit` returns the final metrics; :func:`engine.run` adds the recipe's entries and writes them to
``final_metrics.json``. A non-finite loss raises :class:`NonFiniteLossError` before the bad step is applied, and so
does a parameter or floating buffer (BatchNorm statistics, EMA weights) that is non-finite after an epoch, before
anything is saved: ``last.pt`` and ``best.pt`` only ever hold finite states, those of the last good epoch.
"""

from __future__ import annotations

import logging
import math
import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Literal, get_args

import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from engine.checkpoint import CheckpointError, get_rng_state, save_checkpoint, set_rng_state
from engine.config import config_to_dict, save_config
from engine.distributed import DistributedContext, unwrap, wrap_ddp
from engine.logger import RunLogger, to_jsonable

__all__ = ["COMPILE_MODES", "TIMING_KEYS", "CompileMode", "NonFiniteLossError", "Trainer", "derive_seed", "to_device"]

_logger = logging.getLogger(__name__)  # not `logger`: that name is a Trainer argument

LossFn = Callable[[nn.Module, Any], "tuple[torch.Tensor, Mapping[str, Any]]"]
EvalFn = Callable[[nn.Module, int], Mapping[str, Any]]

#: Record and final-metric keys that measure wall time and so differ between otherwise identical runs.
TIMING_KEYS = ("samples_per_s", "epoch_time_s", "train_time_s")
CHECKPOINT_VERSION = 1
#: ``torch.compile`` modes of the training model (``Trainer(compile_mode=...)``, the recipes' ``compile`` key):
#: ``"reduce-overhead"`` adds CUDA graphs (for static shapes: one graph per batch shape).
CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)


class NonFiniteLossError(FloatingPointError):
    """The loss, or after an epoch a parameter or floating buffer, became NaN or infinite; the run stops without
    saving it. The message's advice is a new run with a lower ``lr`` (``--set lr=...``): ``lr`` is not among the keys
    a resume may change, because the saved optimizer and scheduler states carry it."""


def derive_seed(seed: int, epoch: int, rank: int = 0) -> int:
    """A well-mixed 63-bit seed that is a pure function of ``(seed, epoch, rank)`` (no collisions between them)."""
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return int(np.random.SeedSequence([seed, epoch, rank]).generate_state(1, dtype=np.uint64)[0]) & (2**63 - 1)


def to_device(batch: Any, device: torch.device) -> Any:
    """Moves the tensors in a (nested) batch to ``device``; objects with a ``.to`` method (PyG batches) too."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, Mapping):
        return type(batch)({k: to_device(v, device) for k, v in batch.items()})  # type: ignore[call-arg]
    if isinstance(batch, tuple) and hasattr(batch, "_fields"):  # namedtuple
        return type(batch)(*(to_device(v, device) for v in batch))
    if isinstance(batch, (list, tuple)):
        return type(batch)(to_device(v, device) for v in batch)
    if hasattr(batch, "to") and callable(batch.to):
        return batch.to(device)
    return batch


def _batch_size(batch: Any) -> int | None:
    """Size of the first axis of the first tensor in the batch."""
    if isinstance(batch, torch.Tensor):
        return batch.shape[0] if batch.dim() > 0 else None
    if isinstance(batch, Mapping):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = _batch_size(item)
            if size is not None:
                return size
    num_graphs = getattr(batch, "num_graphs", None)  # PyG Batch
    return int(num_graphs) if isinstance(num_graphs, int) else None


def _to_number(value: Any) -> Any:
    value = to_jsonable(value)
    return float(value) if isinstance(value, int) and not isinstance(value, bool) else value


class Trainer:
    """Runs epochs of training and evaluation with logging, checkpoints and exact resume (see the module docs).

    Args:
        model: The model; moved to ``ctx.device`` (build the optimizer after moving it yourself to be safe) and
            wrapped in DDP when ``ctx.world_size > 1`` (an already wrapped model is kept).
        optimizer: Optimizer over the model's parameters.
        train_loader: Iterable of batches, usually a ``DataLoader`` (with a ``DistributedSampler`` under DDP).
        loss_fn: ``loss_fn(model, batch) -> (loss, logs)``; gets the (DDP-wrapped) training model and the batch on
            the device; ``logs`` maps names to floats or scalar tensors, averaged over the epoch and logged as
            ``train_<name>``.
        evaluate_fn: ``evaluate_fn(model, epoch) -> metrics`` on the unwrapped model in eval mode under
            ``torch.no_grad()`` (and autocast with ``amp``); runs on every rank, so under DDP it either evaluates
            everything on each rank or shards and reduces with ``ctx.all_reduce_sum``. ``None``: no evaluation.
        run_dir: Run folder for logs and checkpoints.
        epochs: Total number of epochs (a resumed run continues up to this number).
        ctx: Distributed context; ``None`` means a single CPU process.
        scheduler: Optional LR scheduler (torch or timm).
        scheduler_step: ``"epoch"`` or ``"step"``: when a torch scheduler's ``step()`` is called.
        amp: Run ``loss_fn`` and ``evaluate_fn`` under ``torch.autocast``.
        amp_dtype: ``torch.bfloat16`` or ``torch.float16``; float16 on CUDA uses a ``GradScaler``.
        grad_clip: Max global gradient norm, or ``None``.
        seed: Base seed of the per-epoch reseeding.
        monitor: Record key that decides ``best.pt`` (an eval metric or e.g. ``"train_loss"``).
        monitor_mode: ``"min"`` or ``"max"``.
        config: The resolved config (dict or dataclass), saved in every checkpoint and as ``config.yaml``.
        model_spec: ``{"name": ..., "kwargs": {...}}`` that rebuilds the model by name
            (:func:`engine.registry.create_by_name`), saved in every checkpoint for :mod:`engine.export`.
        logger: A :class:`RunLogger`; by default one for ``run_dir``, enabled on rank 0 and closed by ``fit``.
        extra_state: Anything else to checkpoint. Values with ``state_dict``/``load_state_dict`` are saved and
            restored through them; other values are saved as they are and replaced in this dict on resume.
        progress: Show a tqdm bar (rank 0 only).
        log_every: Also log loss, lr and throughput every this many steps (0: only per epoch).
        max_steps_per_epoch: Cut each epoch after this many steps (smoke tests).
        ema: Optional weight EMA (timm ``ModelEmaV2/V3`` with ``update(model)`` or torch ``AveragedModel``),
            updated after every optimizer step and checkpointed; evaluate it inside ``evaluate_fn`` if wanted.
        compile_mode: Train through ``torch.compile(model, mode=compile_mode)`` (one of :data:`COMPILE_MODES`), or
            ``None``: eager. Only ``loss_fn`` sees the compiled model; checkpoints, ``evaluate_fn`` and the EMA use the
            uncompiled module (:attr:`module`), so a checkpoint's keys and a resume do not depend on it.
    """

    def __init__(
        self,
        *,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        train_loader: Any,
        loss_fn: LossFn,
        evaluate_fn: EvalFn | None,
        run_dir: str | Path,
        epochs: int,
        ctx: DistributedContext | None = None,
        scheduler: Any = None,
        scheduler_step: Literal["epoch", "step"] = "epoch",
        amp: bool = False,
        amp_dtype: torch.dtype = torch.bfloat16,
        grad_clip: float | None = None,
        seed: int = 0,
        monitor: str = "val_loss",
        monitor_mode: Literal["min", "max"] = "min",
        config: Any = None,
        model_spec: dict[str, Any] | None = None,
        logger: RunLogger | None = None,
        extra_state: dict[str, Any] | None = None,
        progress: bool = True,
        log_every: int = 0,
        max_steps_per_epoch: int | None = None,
        ema: Any = None,
        compile_mode: CompileMode | None = None,
    ) -> None:
        if not isinstance(epochs, int) or epochs < 0:
            raise ValueError(f"epochs must be an int >= 0, got {epochs!r}")
        if monitor_mode not in ("min", "max"):
            raise ValueError(f"monitor_mode must be 'min' or 'max', got {monitor_mode!r}")
        if scheduler_step not in ("epoch", "step"):
            raise ValueError(f"scheduler_step must be 'epoch' or 'step', got {scheduler_step!r}")
        if amp_dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"amp_dtype must be torch.bfloat16 or torch.float16, got {amp_dtype}")
        if grad_clip is not None and not grad_clip > 0:
            raise ValueError(f"grad_clip must be > 0 or None, got {grad_clip!r}")
        if max_steps_per_epoch is not None and max_steps_per_epoch < 1:
            raise ValueError(f"max_steps_per_epoch must be >= 1 or None, got {max_steps_per_epoch!r}")
        if log_every < 0:
            raise ValueError(f"log_every must be >= 0, got {log_every!r}")
        if seed < 0:
            raise ValueError(f"seed must be >= 0, got {seed}")
        if compile_mode is not None and compile_mode not in COMPILE_MODES:
            raise ValueError(f"compile_mode must be None or one of {COMPILE_MODES}, got {compile_mode!r}")
        if ema is not None and not (hasattr(ema, "update") or hasattr(ema, "update_parameters")):
            raise TypeError("ema must have update(model) (timm ModelEma) or update_parameters(model) (AveragedModel)")
        self.ctx = ctx if ctx is not None else DistributedContext()
        self.device = self.ctx.device
        model.to(self.device)
        self.model = wrap_ddp(model, self.ctx)
        self.module = unwrap(self.model)
        if compile_mode is not None:  # compiled on the first step (DDP's buckets too: torch.compile(DDP(model)))
            self.model = torch.compile(self.model, mode=compile_mode)
        self.optimizer = optimizer
        self.train_loader = train_loader
        self.loss_fn = loss_fn
        self.evaluate_fn = evaluate_fn
        self.run_dir = Path(run_dir)
        self.epochs = epochs
        self.scheduler = scheduler
        self.scheduler_step = scheduler_step
        if isinstance(scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau) and scheduler_step == "step":
            raise ValueError("ReduceLROnPlateau needs a metric: use scheduler_step='epoch'")
        self.amp = amp
        self.amp_dtype = amp_dtype
        use_scaler = amp and amp_dtype == torch.float16 and self.device.type == "cuda"
        self.scaler = torch.amp.GradScaler("cuda") if use_scaler else None
        if amp and amp_dtype == torch.float16 and not use_scaler:
            _logger.warning("float16 autocast on %s runs without a GradScaler; prefer bfloat16", self.device.type)
        self.grad_clip = grad_clip
        self.seed = seed
        self.monitor = monitor
        self.monitor_mode = monitor_mode
        self.config = config_to_dict(config) if config is not None else None
        self.model_spec = model_spec
        self._owns_logger = logger is None
        self.logger = logger if logger is not None else RunLogger(self.run_dir, enabled=self.ctx.is_main)
        self.extra_state = extra_state if extra_state is not None else {}
        self.progress = progress
        self.log_every = log_every
        self.max_steps_per_epoch = max_steps_per_epoch
        self.ema = ema
        # Progress state, all in the checkpoint.
        self.epoch = 0  # completed epochs = the next epoch to run
        self.global_step = 0
        self.best: float | None = None
        self.best_epoch: int | None = None  # completed epochs when best.pt was written (its ``epoch``)
        self.step_in_epoch = 0  # steps done in the epoch in progress (for the interruption message)
        self.last_metrics: dict[str, Any] = {}
        self.train_time_s = 0.0

    # ------------------------------------------------------------------ public

    def fit(self, state: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Trains up to ``epochs``, first restoring ``state`` if given.

        Args:
            state: The checkpoint to continue from, as :func:`engine.resume.load_resume` returns it (found, loaded
                and checked against the run's config); ``None`` starts fresh.

        Returns:
            The final metrics (:meth:`final_metrics`): the last epoch's eval metrics, ``best_<monitor>``, ``epochs``
            (completed) and ``train_time_s`` (summed over the run and every resume of it).
        """
        try:
            if state is not None:
                self.load_state_dict(state)
                _logger.info("resumed: %d epoch(s) done, continuing to %d", self.epoch, self.epochs)
            elif self.ctx.is_main and (self.run_dir / "last.pt").is_file():  # engine.run refuses this case
                _logger.warning(
                    "starting fresh in %s, which has a last.pt: it will be overwritten (resume with 'auto')",
                    self.run_dir,
                )
            self.logger.truncate_from(self.epoch)
            if self.config is not None and self.ctx.is_main:
                save_config(self.config, self.run_dir / "config.yaml")
            self._warn_persistent_workers()
            if self.epoch >= self.epochs:
                _logger.info("all %d epoch(s) already done in %s", self.epochs, self.run_dir)
            for epoch in range(self.epoch, self.epochs):
                self._run_epoch(epoch)
            return self.final_metrics()
        finally:
            if self._owns_logger:
                self.logger.close()

    def final_metrics(self) -> dict[str, Any]:
        """The dict :meth:`fit` returns, from the current state."""
        return {
            **self.last_metrics,
            f"best_{self.monitor}": self.best,
            "epochs": self.epoch,
            "train_time_s": round(self.train_time_s, 3),
        }

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint: model (unwrapped), optimizer, scheduler, scaler, EMA, progress, config, RNG, extras."""
        return {
            "version": CHECKPOINT_VERSION,
            "epoch": self.epoch,
            "global_step": self.global_step,
            "model": self.module.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict() if self.scheduler is not None else None,
            "scaler": self.scaler.state_dict() if self.scaler is not None else None,
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "monitor": self.monitor,
            "monitor_mode": self.monitor_mode,
            "best_metric": self.best,
            "best_epoch": self.best_epoch,
            "metrics": self.last_metrics,
            "train_time_s": self.train_time_s,
            "config": self.config,
            "model_spec": self.model_spec,
            "rng": get_rng_state(),
            "extra_state": {
                k: v.state_dict() if hasattr(v, "state_dict") and hasattr(v, "load_state_dict") else v
                for k, v in self.extra_state.items()
            },
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restores a checkpoint written by :meth:`state_dict` (called by ``fit(state=...)``)."""
        missing = [k for k in ("model", "optimizer", "epoch") if k not in state]
        if missing:
            raise CheckpointError(
                f"not a Trainer checkpoint: missing {', '.join(missing)} (a weights-only file cannot be resumed; "
                "load it into the model instead)"
            )
        self.module.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self._load_part("scheduler", self.scheduler, state.get("scheduler"))
        self._load_part("scaler", self.scaler, state.get("scaler"))
        self._load_part("ema", self.ema, state.get("ema"))
        self.epoch = int(state["epoch"])
        self.global_step = int(state.get("global_step", 0))
        self.last_metrics = dict(state.get("metrics") or {})
        self.train_time_s = float(state.get("train_time_s", 0.0))
        if state.get("monitor", self.monitor) == self.monitor and state.get("monitor_mode", self.monitor_mode) == (
            self.monitor_mode
        ):
            self.best = state.get("best_metric")
            self.best_epoch = state.get("best_epoch")
        else:
            _logger.warning(
                "checkpoint monitored %s (%s), this run monitors %s (%s): best metric reset",
                state.get("monitor"),
                state.get("monitor_mode"),
                self.monitor,
                self.monitor_mode,
            )
            self.best = None
            self.best_epoch = None
        if state.get("rng") is not None:
            set_rng_state(state["rng"])
        for key, value in (state.get("extra_state") or {}).items():
            current = self.extra_state.get(key)
            if current is not None and hasattr(current, "load_state_dict"):
                current.load_state_dict(value)
            else:
                self.extra_state[key] = value

    @staticmethod
    def _load_part(name: str, target: Any, state: Any) -> None:
        if target is None:
            if state is not None:
                _logger.warning("checkpoint holds %s state but this run has no %s: ignored", name, name)
            return
        if state is None:
            _logger.warning("checkpoint holds no %s state: the %s starts fresh", name, name)
            return
        target.load_state_dict(state)

    # ------------------------------------------------------------------ epoch

    def _run_epoch(self, epoch: int) -> None:
        start = time.perf_counter()
        self._seed_epoch(epoch)
        self._set_epoch(epoch)
        lr = self.optimizer.param_groups[0]["lr"]
        train_logs, samples, train_s = self._train_one_epoch(epoch)
        self._check_state(epoch)
        metrics = self._evaluate(epoch)
        epoch_s = time.perf_counter() - start
        record = {
            "epoch": epoch,
            **train_logs,
            **metrics,
            "lr": lr,
            "samples_per_s": round(samples / train_s, 2) if train_s > 0 else 0.0,
            "epoch_time_s": round(epoch_s, 3),
        }
        if self.monitor not in record:
            raise ValueError(
                f"monitor {self.monitor!r} is not in the epoch record; available: {', '.join(sorted(record))}"
            )
        value = record[self.monitor]
        improved = _is_num(value) and math.isfinite(value) and self._is_better(float(value))
        if improved:
            self.best = float(value)
            self.best_epoch = epoch + 1
        self.logger.log(record, step=epoch)
        _logger.info(
            "epoch %d/%d: %s (%.1f s)%s",
            epoch + 1,
            self.epochs,
            " ".join(_shown(k, v) for k, v in record.items() if k not in ("epoch", *TIMING_KEYS) and _shown(k, v)),
            epoch_s,
            f", new best {self.monitor}" if improved else "",
        )
        self._step_scheduler_epoch(epoch, value)
        self.epoch = epoch + 1
        self.last_metrics = metrics
        self.train_time_s += epoch_s
        if self.ctx.is_main:
            state = self.state_dict()
            # best.pt first: a last.pt on disk never names a best epoch whose weights are not in best.pt (a stop
            # between the two writes leaves best.pt one epoch ahead, which resume takes as the best; check_best_agrees).
            if improved:
                save_checkpoint(state, self.run_dir / "best.pt")
            save_checkpoint(state, self.run_dir / "last.pt")
        self.ctx.barrier()

    def _train_one_epoch(self, epoch: int) -> tuple[dict[str, float], int, float]:
        self.model.train()
        loader = self.train_loader
        total = self._steps_in_epoch()
        loss_sum = 0.0
        steps = 0
        samples = 0
        log_sums: dict[str, Any] = {}
        log_counts: dict[str, int] = {}
        self.step_in_epoch = 0
        start = time.perf_counter()
        bar = tqdm(
            total=total,
            desc=f"epoch {epoch + 1}/{self.epochs}",
            disable=not (self.progress and self.ctx.is_main),
            leave=False,
            dynamic_ncols=True,
        )
        with bar:
            for step, batch in enumerate(loader):
                if self.max_steps_per_epoch is not None and step >= self.max_steps_per_epoch:
                    break
                self.step_in_epoch = step
                batch = to_device(batch, self.device)
                loss, logs = self._forward(batch)
                loss_value = float(loss.detach().float().item())
                if not math.isfinite(loss_value):
                    raise NonFiniteLossError(
                        f"non-finite loss {loss_value} at epoch {epoch} step {step} (global step {self.global_step}); "
                        f"the step was not applied and {self.run_dir / 'last.pt'} still holds the state after "
                        f"{self.epoch} epoch(s). {self._divergence_advice()}"
                    )
                self._backward_step(loss)
                self.global_step += 1
                steps += 1
                samples += _batch_size(batch) or getattr(loader, "batch_size", None) or 0
                loss_sum += loss_value
                for key, value in logs.items():
                    value = value.detach().float() if isinstance(value, torch.Tensor) else float(value)
                    log_sums[key] = log_sums.get(key, 0.0) + value
                    log_counts[key] = log_counts.get(key, 0) + 1
                elapsed = time.perf_counter() - start
                rate = samples * self.ctx.world_size / elapsed if elapsed > 0 else 0.0
                bar.set_postfix(loss=f"{loss_value:.4f}", samples_s=f"{rate:.0f}", refresh=False)
                bar.update(1)
                if self.log_every and self.global_step % self.log_every == 0:
                    _logger.info(
                        "epoch %d step %d/%s: loss %.4f lr %.3g samples/s %.1f",
                        epoch,
                        step + 1,
                        total if total is not None else "?",
                        loss_value,
                        self.optimizer.param_groups[0]["lr"],
                        rate,
                    )
        train_s = time.perf_counter() - start
        if steps == 0:
            raise RuntimeError(f"epoch {epoch}: the train loader yielded no batches")
        means, samples = self._reduce_train_logs(loss_sum, steps, samples, log_sums, log_counts)
        return means, samples, train_s

    def _forward(self, batch: Any) -> tuple[torch.Tensor, Mapping[str, Any]]:
        with self._autocast():
            out = self.loss_fn(self.model, batch)
        loss, logs = (out, {}) if isinstance(out, torch.Tensor) else out
        if not isinstance(loss, torch.Tensor) or loss.numel() != 1:
            raise TypeError(f"loss_fn must return (scalar loss tensor, logs dict), got loss {type(loss).__name__}")
        if not isinstance(logs, Mapping):
            raise TypeError(f"loss_fn must return (loss, logs dict), got logs {type(logs).__name__}")
        return loss, logs

    def _backward_step(self, loss: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler is not None:
            self.scaler.scale(loss).backward()
            if self.grad_clip is not None:
                self.scaler.unscale_(self.optimizer)
                nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            loss.backward()
            if self.grad_clip is not None:
                nn.utils.clip_grad_norm_(self.module.parameters(), self.grad_clip)
            self.optimizer.step()
        if self.ema is not None:
            if hasattr(self.ema, "update"):
                self.ema.update(self.module)
            else:
                self.ema.update_parameters(self.module)
        if self._timm_scheduler:
            self.scheduler.step_update(num_updates=self.global_step + 1)
        elif self.scheduler is not None and self.scheduler_step == "step":
            self.scheduler.step()

    def _reduce_train_logs(
        self, loss_sum: float, steps: int, samples: int, log_sums: dict[str, Any], log_counts: dict[str, int]
    ) -> tuple[dict[str, float], int]:
        """Means over the epoch's steps, summed over ranks so that every rank logs the same numbers."""
        keys = sorted(log_sums)
        values = [loss_sum, float(steps), float(samples)]
        for key in keys:
            values += [float(log_sums[key]), float(log_counts[key])]
        totals = self.ctx.all_reduce_sum(torch.tensor(values, dtype=torch.float64, device=self.device)).tolist()
        means = {"train_loss": totals[0] / totals[1]}
        for i, key in enumerate(keys):
            name = key if key.startswith("train_") else f"train_{key}"
            if name != "train_loss":
                means[name] = totals[3 + 2 * i] / max(totals[4 + 2 * i], 1.0)
        return means, int(totals[2])

    def _evaluate(self, epoch: int) -> dict[str, Any]:
        if self.evaluate_fn is None:
            return {}
        was_training = self.module.training
        self.module.eval()
        try:
            with torch.no_grad(), self._autocast():
                metrics = self.evaluate_fn(self.module, epoch)
        finally:
            self.module.train(was_training)
        if not isinstance(metrics, Mapping):
            raise TypeError(f"evaluate_fn must return a dict of metrics, got {type(metrics).__name__}")
        return {str(k): _to_number(v) for k, v in metrics.items()}

    # ------------------------------------------------------------------ helpers

    @property
    def _timm_scheduler(self) -> bool:
        return self.scheduler is not None and hasattr(self.scheduler, "step_update")

    @property
    def _plateau(self) -> bool:
        return isinstance(self.scheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)

    def _autocast(self) -> Any:
        if not self.amp:
            return nullcontext()
        return torch.autocast(device_type=self.device.type, dtype=self.amp_dtype)

    def _is_better(self, value: float) -> bool:
        if self.best is None:
            return True
        return value < self.best if self.monitor_mode == "min" else value > self.best

    def _step_scheduler_epoch(self, epoch: int, metric: Any) -> None:
        if self.scheduler is None:
            return
        if self._timm_scheduler:
            self.scheduler.step(epoch + 1, metric)
        elif self._plateau:
            self.scheduler.step(metric)
        elif self.scheduler_step == "epoch":
            self.scheduler.step()

    def _seed_epoch(self, epoch: int) -> None:
        """Makes every random draw of the epoch (order, augmentation, dropout) a function of (seed, epoch, rank)."""
        seed = derive_seed(self.seed, epoch, self.ctx.rank)
        random.seed(seed)
        np.random.seed(seed % 2**32)  # noqa: NPY002 - reseed the legacy global RNG that augmentations use
        torch.manual_seed(seed)
        for generator in self._loader_generators():
            generator.manual_seed(seed)

    def _loader_attrs(self, name: str) -> Iterator[Any]:
        loader = self.train_loader
        batch_sampler = getattr(loader, "batch_sampler", None)
        seen: set[int] = set()
        for obj in (loader, getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)):
            value = getattr(obj, name, None) if obj is not None else None
            if value is not None and id(value) not in seen:
                seen.add(id(value))
                yield value

    def _loader_generators(self) -> Iterator[torch.Generator]:
        for generator in self._loader_attrs("generator"):
            if isinstance(generator, torch.Generator):
                yield generator

    def _set_epoch(self, epoch: int) -> None:
        loader = self.train_loader
        batch_sampler = getattr(loader, "batch_sampler", None)
        targets = [getattr(loader, "sampler", None), batch_sampler, getattr(batch_sampler, "sampler", None)]
        targets.append(getattr(loader, "dataset", None))
        seen: set[int] = set()
        for target in targets:
            if target is not None and id(target) not in seen and callable(getattr(target, "set_epoch", None)):
                seen.add(id(target))
                target.set_epoch(epoch)

    def _steps_in_epoch(self) -> int | None:
        try:
            total = len(self.train_loader)
        except TypeError:
            total = None
        if self.max_steps_per_epoch is not None:
            total = self.max_steps_per_epoch if total is None else min(total, self.max_steps_per_epoch)
        return total

    def _check_state(self, epoch: int) -> None:
        """Refuses to go on (and so to save) once a parameter or a floating buffer (BatchNorm's running statistics, an
        EMA's weights) holds ``inf`` / ``nan``: the checkpoints on disk keep the last finite state."""
        modules = {"": self.module}
        if isinstance(self.ema, nn.Module):
            modules["ema."] = self.ema
        bad = [
            prefix + name
            for prefix, module in modules.items()
            for name, t in (*module.named_parameters(), *module.named_buffers())
            if t.is_floating_point() and not bool(torch.isfinite(t).all())
        ]
        if bad:
            raise NonFiniteLossError(
                f"after epoch {epoch} {', '.join(bad[:5])}{' ...' if len(bad) > 5 else ''} hold inf or nan; not saved, "
                f"{self.run_dir / 'last.pt'} keeps the state after {self.epoch} epoch(s). {self._divergence_advice()}"
            )

    def _divergence_advice(self) -> str:
        """What to do about a diverged run, as a command that works: a resume keeps the config's lr and grad_clip (they
        define the optimization, see :func:`engine.resume.check_config_change`), so the fix is a new run."""
        lr = (self.config or {}).get("lr")
        new_lr = f"--set lr={lr / 10:g}" if isinstance(lr, (int, float)) and not isinstance(lr, bool) else "a lower lr"
        return (
            f"Start a new run (not --resume: the lr of a run is fixed) with {new_lr} or --set grad_clip=1.0, "
            "or check the data"
        )

    def _warn_persistent_workers(self) -> None:
        loader = self.train_loader
        dataset = getattr(loader, "dataset", None)
        if getattr(loader, "persistent_workers", False) and callable(getattr(dataset, "set_epoch", None)):
            _logger.warning(
                "persistent_workers=True: dataset.set_epoch() does not reach the worker copies of the dataset, so "
                "augmentation will not follow the epoch and resume is not exact; use persistent_workers=False"
            )


def _shown(key: str, value: Any) -> str:
    """``key value`` of one entry of the epoch line: a number to 4 digits, a text (why a metric has no value, such as
    ``"no part labels"``) in brackets, anything else left out."""
    if _is_num(value):
        return f"{key} {value:.4g}"
    return f"{key} ({value})" if isinstance(value, str) else ""


def _is_num(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
