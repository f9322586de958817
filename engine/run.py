"""``engine.run(recipe, cfg)``: the one orchestration behind every training CLI, and :func:`main`, their command line.

A recipe (:class:`engine.recipe.Recipe`) says what is domain-specific; this module owns the rest, once:

* **Validation up front**: common config values (:func:`~engine.recipe.validate_common`) and the recipe's own checks
  when the config is loaded; every data file of both splits checked cheaply (``check_files()``) and the batch size
  against the train split, all before the first step.
* **The run folder** (:mod:`engine.rundir`): new per run by default, never reused without ``--resume`` or
  ``--overwrite``, locked while a run writes it, temp files of a killed run removed.
* **Resume** (:func:`engine.resume.load_resume`): the checkpoint is loaded safely (``weights_only``,
  :mod:`engine.checkpoint`); config keys that define the model, the data or the optimization must equal the
  checkpoint's (the refusal prints the diff); the keys in :data:`~engine.resume.RESUME_MUTABLE` (and the recipe's
  ``resume_mutable``) may change and are logged; ``best.pt`` must agree with ``last.pt``; ``config.yaml`` is only
  rewritten once the resume is accepted.
* **Seeding, DDP** set-up and teardown (barrier + destroy on success, plain destroy after an error), **eval-only**,
  **logging**, the **metrics files** (``final_metrics.json`` after training, ``eval_metrics.json`` after
  ``--eval-only``: each written once, in strict JSON, by :func:`write_metrics`), and **signals**: SIGINT / SIGTERM
  end with one line ("interrupted at epoch E, step S: resume with --resume auto ...") and exit status 130 / 143.

CLI exit statuses: 0 success, 2 user error (bad config, missing data, refused resume, locked folder: one line on
stderr, no traceback; ``--debug`` shows it), 130 / 143 interrupted, 1 anything else (with its traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from engine import rundir
from engine.checkpoint import CheckpointError, load_checkpoint
from engine.config import add_config_args, config_to_dict, describe_config, load_config
from engine.distributed import DistributedContext, init_distributed
from engine.errors import UsageError
from engine.interrupt import Interrupted, handle_signals
from engine.logger import setup_logging, write_json
from engine.recipe import Recipe, validate_common
from engine.resume import load_resume
from engine.trainer import NonFiniteLossError, Trainer

__all__ = ["RunOptions", "main", "run", "write_metrics"]

logger = logging.getLogger(__name__)


@dataclass
class RunOptions:
    """How to run (not what): the command line's flags besides ``--config`` / ``--set``.

    Attributes:
        output_dir: Run folder; default a new ``runs_root/<group>/<name>/<timestamp>`` (``latest`` points to it).
        resume: ``None``, ``"auto"`` (the folder's ``last.pt`` if present) or a checkpoint path.
        overwrite: Reuse a folder that holds a run, deleting its run files first.
        eval_only: Evaluate ``checkpoint`` (default: the folder's ``best.pt``), write ``eval_metrics.json``.
        checkpoint: Checkpoint for ``eval_only``.
        device: ``"auto"``, ``"cpu"``, ``"cuda"``, ``"cuda:N"``.
        data_root: Overrides ``cfg.data_root``.
        trust_checkpoint: Load checkpoints that need the full unpickler (may run code: trusted files only).
        progress: tqdm bars.
        max_steps_per_epoch: Cut epochs short (smoke tests).
        runs_root: Where default run folders go.
        setup_logging: Send log messages to the console and ``train.log`` (what a CLI wants).
        debug: Debug-level logging.
    """

    output_dir: str | Path | None = None
    resume: str | None = None
    overwrite: bool = False
    eval_only: bool = False
    checkpoint: str | None = None
    device: str = "auto"
    data_root: str | None = None
    trust_checkpoint: bool = False
    progress: bool = True
    max_steps_per_epoch: int | None = None
    runs_root: str | Path = "runs"
    setup_logging: bool = False
    debug: bool = False


def run(recipe: type[Recipe], cfg: Any, options: RunOptions | None = None, **kwargs: Any) -> dict[str, Any]:
    """Trains (or, with ``eval_only``, evaluates) ``recipe`` on ``cfg``; returns the final (or eval) metrics.

    Args:
        recipe: A :class:`~engine.recipe.Recipe` subclass.
        cfg: Its resolved config (an instance of ``recipe.config_cls``).
        options: :class:`RunOptions`; or give its fields as keyword arguments.

    Raises:
        UsageError: Bad config value, folder holding a run, locked folder, refused resume, batch larger than the data.
        Interrupted: SIGINT / SIGTERM (``KeyboardInterrupt``); ``last.pt`` is complete. Its ``run_dir``, ``epoch`` and
            ``step`` attributes say where the run stopped.
    """
    opts = options if options is not None else RunOptions(**kwargs)
    if not isinstance(cfg, recipe.config_cls):
        raise TypeError(f"{recipe.__name__} takes a {recipe.config_cls.__name__}, got {type(cfg).__name__}")
    validate_common(cfg)
    recipe.validate(cfg)
    ctx = init_distributed(opts.device)
    lock: rundir.RunLock | None = None
    trainer: Trainer | None = None
    out_dir: Path | None = None
    ok = False
    try:
        out_dir, lock = _setup_folder(recipe, cfg, opts, ctx)
        if opts.setup_logging:
            setup_logging(out_dir, rank=ctx.rank, level=logging.DEBUG if opts.debug else logging.INFO)
        logger.info("run folder: %s", out_dir)
        torch.manual_seed(cfg.seed)
        r = recipe(cfg, ctx, opts.data_root)
        r.run_dir = out_dir
        # A refused resume (changed config, best/last disagreeing) fails here, before the data is read.
        state = None
        if not opts.eval_only:
            state = load_resume(opts.resume, out_dir, cfg, r.resume_mutable, allow_pickle=opts.trust_checkpoint)
        train_set, eval_set = r.build_datasets()
        _check_dataset(train_set, "train")
        _check_dataset(eval_set, "evaluation")
        r.train_set, r.eval_set = train_set, eval_set
        r.train_loader, r.eval_loader = r.build_loaders(train_set, eval_set)
        model = r.build_model().to(ctx.device)
        info = r.summary(model)
        logger.info(
            "%s: %s; %d train / %d eval samples",
            getattr(cfg, "model", type(model).__name__),
            ", ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in info.items()),
            len(train_set),
            len(eval_set),
        )
        if opts.eval_only:
            metrics = _eval_only(r, model, info, out_dir, opts)
        else:
            trainer = _trainer(r, model, out_dir, opts)
            metrics = trainer.fit(state=state)
            metrics.update(r.finalize(metrics, trainer.module))
            metrics.update(info)
            write_metrics(ctx, out_dir / "final_metrics.json", metrics)
        ok = True
        return metrics
    except KeyboardInterrupt as e:
        stop = e if isinstance(e, Interrupted) else Interrupted(2)
        stop.run_dir = out_dir
        stop.epoch = trainer.epoch if trainer is not None else None
        stop.step = trainer.step_in_epoch if trainer is not None else None
        if stop is e:
            raise
        raise stop from e
    except Exception as e:
        with contextlib.suppress(AttributeError):  # see main(): such an error is reported as a user error
            e._engine_before_training = trainer is None or trainer.global_step == 0
        raise
    finally:
        if lock is not None:
            lock.release()
        ctx.destroy(barrier=ok)  # no barrier after an error: a peer may be stuck elsewhere


def _setup_folder(
    recipe: type[Recipe], cfg: Any, opts: RunOptions, ctx: DistributedContext
) -> tuple[Path, rundir.RunLock | None]:
    """Rank 0 resolves, checks and locks the run folder; every rank gets its path (or rank 0's error)."""
    lock: rundir.RunLock | None = None
    result: tuple[str, str | None]
    if ctx.is_main:
        try:
            folder, is_new_default = _resolve_folder(recipe, cfg, opts)
            if not opts.eval_only:
                lock = rundir.RunLock(folder).acquire()
                rundir.clean_temp_files(folder)
                rundir.prepare_run_dir(folder, resume=bool(opts.resume), overwrite=opts.overwrite)
                if is_new_default:
                    rundir.update_latest(folder)
            else:
                folder.mkdir(parents=True, exist_ok=True)
            result = (str(folder), None)
        except Exception as e:
            if lock is not None:
                lock.release()
            if ctx.is_distributed:
                ctx.all_gather_object(("", str(e)))
            raise
    else:
        result = ("", None)
    gathered = ctx.all_gather_object(result)
    path, error = gathered[0]
    if error is not None:
        raise UsageError(f"rank 0 stopped: {error}")
    return Path(path), lock


def _resolve_folder(recipe: type[Recipe], cfg: Any, opts: RunOptions) -> tuple[Path, bool]:
    """The run folder for these options, and whether it is a new default one."""
    if opts.output_dir is not None:
        return Path(opts.output_dir), False
    name = getattr(cfg, "name", "run")
    if opts.eval_only:
        if opts.checkpoint:
            return Path(opts.checkpoint).parent, False
        latest = rundir.latest_run_dir(recipe.group, name, opts.runs_root)
        if latest is None:
            raise UsageError(
                f"--eval-only: no run of {name!r} under {Path(opts.runs_root) / recipe.group / name} to evaluate; "
                "pass --checkpoint or --output-dir"
            )
        return latest, False
    if opts.resume and opts.resume != "auto":
        return Path(opts.resume).parent, False
    if opts.resume == "auto":
        latest = rundir.latest_run_dir(recipe.group, name, opts.runs_root)
        if latest is not None:
            return latest, False
    return rundir.default_run_dir(recipe.group, name, opts.runs_root), True


def _check_dataset(dataset: Any, split: str) -> None:
    """Every file of ``dataset`` checked cheaply (its ``check_files()``, if it has one); an empty split is an error."""
    check = getattr(dataset, "check_files", None)
    if callable(check):
        check()
    if len(dataset) == 0:
        raise UsageError(f"the {split} split is empty ({dataset!r})")


def _trainer(r: Recipe, model: torch.nn.Module, out_dir: Path, opts: RunOptions) -> Trainer:
    cfg, ctx = r.cfg, r.ctx
    optimizer = r.build_optimizer(model)
    steps = len(r.train_loader)
    if opts.max_steps_per_epoch is not None:
        steps = min(steps, opts.max_steps_per_epoch)
    scheduler, epochs = r.build_scheduler(optimizer, steps)
    kwargs: dict[str, Any] = dict(
        amp=bool(getattr(cfg, "amp", False)) and ctx.device.type == "cuda",
        grad_clip=getattr(cfg, "grad_clip", None),
    )
    kwargs.update(r.trainer_kwargs())
    return Trainer(
        model=model,
        optimizer=optimizer,
        train_loader=r.train_loader,
        loss_fn=r.loss,
        evaluate_fn=lambda m, epoch: r.evaluate(m),
        run_dir=out_dir,
        epochs=epochs,
        ctx=ctx,
        scheduler=scheduler,
        seed=cfg.seed,
        monitor=r.monitor,
        monitor_mode=r.monitor_mode,
        config=config_to_dict(cfg),
        progress=opts.progress,
        max_steps_per_epoch=opts.max_steps_per_epoch,
        **kwargs,
    )


def _eval_only(r: Recipe, model: torch.nn.Module, info: dict[str, Any], out_dir: Path, opts: RunOptions) -> dict:
    path = Path(opts.checkpoint) if opts.checkpoint else out_dir / "best.pt"
    state = load_checkpoint(path, allow_pickle=opts.trust_checkpoint)
    weights = state["model"] if "model" in state else state
    try:
        model.load_state_dict(weights)
    except RuntimeError as err:
        raise UsageError(
            f"{path} does not fit the model this config builds ({getattr(r.cfg, 'model', '?')}; {err}); evaluate "
            f"with the config it was trained with, e.g. --config {path.parent / 'config.yaml'}"
        ) from err
    model.eval()
    with torch.no_grad():
        metrics = r.evaluate_checkpoint(model, state)
    metrics.update(checkpoint=str(path), epochs=state.get("epoch"), **info)
    write_metrics(r.ctx, out_dir / "eval_metrics.json", metrics)
    return metrics


def write_metrics(ctx: DistributedContext, path: Path, metrics: dict[str, Any]) -> None:
    """The run's metrics file (``final_metrics.json``, ``eval_metrics.json``): strict JSON written atomically by rank
    0; every rank waits until it is on disk."""
    if ctx.is_main:
        write_json(path, metrics)
    ctx.barrier()


# --------------------------------------------------------------------------------------------------------------------
# Command line
# --------------------------------------------------------------------------------------------------------------------


def _user_error(e: BaseException) -> bool:
    """A user error: a :class:`UsageError`, a non-finite loss, or a bad value / missing file / unreadable checkpoint
    raised before the first training step (config, data, model knobs, resume)."""
    if isinstance(e, (UsageError, NonFiniteLossError)):
        return True
    early = getattr(e, "_engine_before_training", True)
    return early and isinstance(e, (ValueError, FileNotFoundError, CheckpointError))


def build_parser(recipe: type[Recipe], description: str | None) -> argparse.ArgumentParser:
    """The flags every training CLI shares; the help ends with every config key, its default and meaning."""
    group = recipe.group
    parser = argparse.ArgumentParser(
        description=description,
        epilog=describe_config(recipe.config_cls),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_config_args(parser)
    parser.add_argument("--data-root", default=None, help="dataset root (default: $CENTROID_DATA or ./datasets)")
    parser.add_argument(
        "--output-dir",
        default=None,
        help=f"run folder (default: a new runs/{group}/<name>/<timestamp>; runs/{group}/<name>/latest points to it)",
    )
    parser.add_argument(
        "--resume", default=None, help="'auto' (the run folder's last.pt; default folder: the latest run) or a .pt path"
    )
    parser.add_argument("--overwrite", action="store_true", help="reuse a folder holding a run: delete its run files")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument(
        "--epochs",
        type=int,
        default=None,
        help="override the config's epochs. With --resume, another value keeps the learning rate where the run "
        "stopped and stretches what is left of the schedule over the epochs now left, so it ends at its final value "
        "at the new last epoch without a jump (engine.schedule)",
    )
    parser.add_argument("--eval-only", action="store_true", help="evaluate --checkpoint (default: best.pt)")
    parser.add_argument("--checkpoint", default=None, help="checkpoint for --eval-only")
    parser.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="load checkpoints that need pickle (can run arbitrary code: only files you trust)",
    )
    parser.add_argument("--debug", action="store_true", help="debug logging; errors show their traceback")
    parser.add_argument("--max-steps-per-epoch", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    return parser


def main(
    recipe: type[Recipe],
    argv: list[str] | None = None,
    description: str | None = None,
    report: Callable[[dict[str, Any]], str] | None = None,
) -> dict[str, Any]:
    """A training CLI: parses ``argv``, loads the config, :func:`run` s it; exits 2 on a user error (see above).

    Args:
        recipe: The recipe class.
        argv: Arguments (``None``: ``sys.argv[1:]``).
        description: The CLI's help text.
        report: Formats the final metrics for the last log line (default: every scalar).

    Returns:
        The final (or eval) metrics. Errors end in ``SystemExit`` with the statuses in the module docstring.
    """
    args = build_parser(recipe, description).parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(None, rank=rank, level=logging.DEBUG if args.debug else logging.INFO)  # console until the folder
    try:
        with handle_signals():
            cfg = load_config(recipe.config_cls, args.config, args.overrides)
            if args.epochs is not None:
                cfg = replace(cfg, epochs=args.epochs)
            # the shared flags are named as RunOptions' fields
            flags = {f.name: getattr(args, f.name) for f in fields(RunOptions) if hasattr(args, f.name)}
            opts = RunOptions(**flags, progress=not args.no_progress, setup_logging=True)
            metrics = run(recipe, cfg, opts)
    except KeyboardInterrupt as stop:
        e = stop if isinstance(stop, Interrupted) else Interrupted(2)
        where = f"epoch {e.epoch}, step {e.step}" if getattr(e, "epoch", None) is not None else "start-up"
        folder = getattr(e, "run_dir", None)
        hint = f"resume with --resume auto --output-dir {folder}" if folder else "nothing was trained"
        sys.stderr.write(f"interrupted at {where} ({e}): {hint}\n")
        raise SystemExit(e.exit_code) from None
    except Exception as e:
        if args.debug or not _user_error(e):
            raise
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(2) from None
    if rank == 0:
        text = report(metrics) if report is not None else _summary(metrics)
        logger.info("final: %s", text)
    return metrics


def _summary(metrics: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
