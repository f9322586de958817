"""``engine.run(recipe, cfg)``: the one orchestration behind every training CLI, and :func:`main`, their command line.

A recipe (:class:`engine.recipe.Recipe`) says what is domain-specific; this module owns the rest, once:

* **Validation up front**: common config values (:func:`~engine.recipe.validate_common`) and the recipe's own checks
  when the config is loaded; every data file of both splits checked cheaply (``check_files()``) and the batch size
  against the train split, all before the first step.
* **The run folder** (:mod:`engine.rundir`): new per run by default, never reused without ``--resume`` or
  ``--overwrite``, locked while a run writes it (``--eval-only`` too), temp files of a killed run removed. A write
  that the file system refuses (full disk, read-only or not-writable folder) ends in one line that names the folder,
  the fix and the epochs ``last.pt`` holds; so does a run folder that cannot be created (a read-only ``runs/``),
  suggesting ``--output-dir``.
* **Resume** (:func:`engine.resume.load_resume`): the checkpoint is loaded safely (``weights_only``,
  :mod:`engine.checkpoint`); config keys that define the model, the data or the optimization must equal the
  checkpoint's (the refusal prints the diff); the keys in :data:`~engine.resume.RESUME_MUTABLE` (and the recipe's
  ``resume_mutable``) may change and are logged; ``best.pt`` must agree with ``last.pt``; ``config.yaml`` is only
  rewritten once the resume is accepted.
* **Seeding, DDP** set-up and teardown (barrier + destroy on success, plain destroy after an error), **eval-only**,
  **logging**, the **metrics files** (``final_metrics.json`` after training, ``eval_metrics.json`` after
  ``--eval-only``: each written once, in strict JSON, by :func:`write_metrics`), and **signals**: SIGINT / SIGTERM
  end with one line ("interrupted at epoch E, step S (SIGTERM): DIR/last.pt holds N epoch(s): resume with --resume
  auto ...") and exit status 130 / 143.

CLI exit statuses: 0 success, 2 user error (bad config, missing data, refused resume, locked folder, refused write:
one line on stderr, no traceback; ``--debug`` shows it), 130 / 143 interrupted (the line says which epoch ``last.pt``
holds), 1 anything else (with its traceback).
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

import torch

from engine import rundir
from engine.checkpoint import CheckpointError, load_checkpoint, resolve_resume
from engine.config import add_config_args, config_to_dict, describe_config, load_config
from engine.distributed import DistributedContext, init_distributed
from engine.errors import UsageError
from engine.interrupt import Interrupted, handle_signals
from engine.logger import setup_logging, write_json
from engine.recipe import Recipe, clamp_workers, validate_common
from engine.resume import load_evaluated, load_resume, saved_config
from engine.trainer import NonFiniteLossError, Trainer

__all__ = ["RunOptions", "add_checkpoint_flags", "load_run_config", "main", "run", "user_errors", "write_metrics"]

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
        data_root: Overrides ``cfg.data_root`` (and is recorded there, as an absolute path, for the config's record).
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
    if opts.data_root is not None and "data_root" in {f.name for f in fields(cfg)}:
        # recorded (absolute), so that the commands that open the run later find the data without the flag
        cfg = replace(cfg, data_root=str(Path(opts.data_root).resolve()))
    validate_common(cfg)
    recipe.validate(cfg)
    cfg = clamp_workers(cfg)
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
        # A refused resume or evaluation (changed config, best/last disagreeing) fails here, before the data is read.
        if opts.eval_only:
            evaluated = _eval_checkpoint(opts, out_dir)
            state = load_evaluated(evaluated, cfg, recipe.eval_mutable, allow_pickle=opts.trust_checkpoint)
        else:
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
            metrics = _eval_only(r, model, info, out_dir, evaluated, state)
        else:
            trainer = _trainer(r, model, out_dir, opts)
            metrics = trainer.fit(state=state)
            metrics.update(r.finalize(metrics, trainer.module))
            metrics.update(info)
            write_metrics(ctx, out_dir / "final_metrics.json", metrics)
        ok = True
        return metrics
    except KeyboardInterrupt as e:
        stop = _interrupted(e, out_dir, trainer)
        if stop is e:
            raise
        raise stop from e
    except Exception as e:
        storage = _storage_error(e, out_dir, opts.eval_only)
        if storage is not None:
            raise storage from e
        with contextlib.suppress(AttributeError):  # see main(): such an error is reported as a user error
            e._engine_before_training = trainer is None or trainer.global_step == 0
        raise
    finally:
        if lock is not None:
            lock.release()
        try:
            ctx.destroy(barrier=ok)  # no barrier after an error: a peer may be stuck elsewhere
        except KeyboardInterrupt as e:  # e.g. torchrun's SIGTERM after a peer died: still say where the run is
            stop = _interrupted(e, out_dir, trainer)
            if stop is e:
                raise
            raise stop from e


def _interrupted(e: KeyboardInterrupt, out_dir: Path | None, trainer: Trainer | None) -> Interrupted:
    """``e`` as an :class:`Interrupted` that knows the run folder and where training stopped."""
    stop = e if isinstance(e, Interrupted) else Interrupted(2)
    if getattr(stop, "run_dir", None) is None:
        stop.run_dir = out_dir
        stop.epoch = trainer.epoch if trainer is not None else None
        stop.step = trainer.step_in_epoch if trainer is not None else None
    return stop


#: A write the user can fix: full disk or quota, read-only file system (these only come from writes), and a folder
#: without write permission (only when the error names a file in the run folder: a data file can be unreadable too).
_STORAGE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EROFS})
_PERMISSION_ERRNOS = frozenset({errno.EACCES, errno.EPERM})


def _storage_error(
    e: BaseException, folder: Path | None, eval_only: bool = False, creating: bool = False
) -> UsageError | None:
    """A one-line :class:`UsageError` for a write into ``folder`` that the file system refused (``e`` or one of its
    causes is such an ``OSError``), naming the folder, the fix and what is on disk; ``None`` for anything else.

    With ``creating`` (``folder`` is being made), a refused folder above it is such a write too (a read-only
    ``runs/``): the error names the folder that exists and suggests ``--output-dir``."""
    refused = _STORAGE_ERRNOS | _PERMISSION_ERRNOS
    seen: set[int] = set()
    cause: BaseException | None = e
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError) and cause.errno in refused:
            break
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    if not isinstance(cause, OSError) or cause.errno not in refused or folder is None:
        return None
    path = Path(os.fsdecode(cause.filename)) if cause.filename else None
    full = cause.errno in (errno.ENOSPC, errno.EDQUOT)
    if creating and path is not None and path.resolve() in Path(folder).resolve().parents:
        existing = next((p for p in (path, *path.parents) if p.exists()), path)
        return UsageError(
            f"cannot create the run folder {folder} in {existing} ({os.strerror(cause.errno)}): "
            f"{'free space on its disk' if full else 'make it writable'}, or pass --output-dir DIR to write the run "
            "elsewhere"
        )
    inside = path is not None and Path(folder).resolve() in (path.resolve(), *path.resolve().parents)
    if not inside and (path is not None or cause.errno in _PERMISSION_ERRNOS):
        return None  # not a write into the run folder (e.g. an unreadable data file)
    fix = "free space on its disk" if full else "make it writable (or choose another --output-dir)"
    epochs = _saved_epochs(folder)
    saved = f"last.pt holds {epochs} epoch(s)" if epochs is not None else "no last.pt was saved"
    again = "run --eval-only again" if eval_only else f"continue with --resume auto --output-dir {folder}"
    return UsageError(
        f"cannot write to the run folder {folder} ({os.strerror(cause.errno)}{f': {path}' if path else ''}; {saved}): "
        f"{fix}, then {again}"
    )


def _saved_epochs(folder: Path | None) -> int | None:
    """The completed epochs that ``folder/last.pt`` holds, or ``None`` (no such file, unreadable)."""
    path = Path(folder) / "last.pt" if folder is not None else None
    if path is None or not path.is_file():
        return None
    try:  # mmap: only the small entries are read, not the weights
        return int(torch.load(path, map_location="cpu", weights_only=True, mmap=True)["epoch"])
    except Exception:  # only for a message: a damaged file is reported when it is loaded
        return None


def _setup_folder(
    recipe: type[Recipe], cfg: Any, opts: RunOptions, ctx: DistributedContext
) -> tuple[Path, rundir.RunLock | None]:
    """Rank 0 resolves, checks and locks the run folder; every rank gets its path (or rank 0's error)."""
    lock: rundir.RunLock | None = None
    result: tuple[str, str | None]
    if ctx.is_main:
        folder: Path | None = None
        try:
            folder, is_new_default = _resolve_folder(recipe, cfg, opts)
            # eval-only too: it writes eval_metrics.json and train.log, which a live run in the folder also writes
            lock = rundir.RunLock(folder).acquire()
            if not opts.eval_only:
                rundir.clean_temp_files(folder)
                rundir.prepare_run_dir(folder, resume=bool(opts.resume), overwrite=opts.overwrite)
                if is_new_default:
                    rundir.update_latest(folder)
            result = (str(folder), None)
        except Exception as e:
            if lock is not None:
                lock.release()
            storage = _storage_error(e, folder, opts.eval_only, creating=True)
            if ctx.is_distributed:
                ctx.all_gather_object(("", str(storage or e)))
            if storage is not None:
                raise storage from e
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
        compile_mode=getattr(cfg, "compile", None),
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
        model_spec=_model_spec(r),
        progress=opts.progress,
        max_steps_per_epoch=opts.max_steps_per_epoch,
        **kwargs,
    )


def _model_spec(r: Recipe) -> dict[str, Any] | None:
    """The recipe's ``(name, kwargs)`` as the checkpoint stores it (``engine.export`` rebuilds the model from it)."""
    spec = r.model_spec()
    return None if spec is None else {"name": spec[0], "kwargs": dict(spec[1])}


def _eval_checkpoint(opts: RunOptions, folder: Path) -> Path:
    """The checkpoint ``--eval-only`` evaluates: ``--checkpoint``, else the run folder's ``best.pt``."""
    return Path(opts.checkpoint) if opts.checkpoint else folder / "best.pt"


def _eval_only(
    r: Recipe, model: torch.nn.Module, info: dict[str, Any], out_dir: Path, path: Path, state: dict[str, Any]
) -> dict:
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


@contextlib.contextmanager
def user_errors(debug: bool = False) -> Iterator[None]:
    """For a command line: a user error (see :func:`_user_error`) ends with ``error: <message>`` on stderr and exit
    status 2, without a traceback; with ``debug`` (``--debug``) it propagates, traceback and all."""
    try:
        yield
    except Exception as e:
        if debug or not _user_error(e):
            raise
        sys.stderr.write(f"error: {e}\n")
        raise SystemExit(2) from None


def add_checkpoint_flags(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """``--trust-checkpoint`` and ``--debug``: the flags of every command that reads a checkpoint (the training CLIs,
    ``tools/export_weights.py``, the viewers); pair ``--debug`` with :func:`user_errors`."""
    parser.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="load checkpoints that need pickle (can run arbitrary code: only files you trust)",
    )
    parser.add_argument("--debug", action="store_true", help="debug logging; errors show their traceback")
    return parser


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
    add_checkpoint_flags(parser)
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
        with user_errors(args.debug), handle_signals():
            # the shared flags are named as RunOptions' fields
            flags = {f.name: getattr(args, f.name) for f in fields(RunOptions) if hasattr(args, f.name)}
            opts = RunOptions(**flags, progress=not args.no_progress, setup_logging=True)
            cfg = load_run_config(recipe, opts, args.config, args.overrides, args.epochs)
            metrics = run(recipe, cfg, opts)
    except KeyboardInterrupt as stop:
        e = stop if isinstance(stop, Interrupted) else Interrupted(2)
        where = f"epoch {e.epoch}, step {e.step}" if getattr(e, "epoch", None) is not None else "start-up"
        folder = getattr(e, "run_dir", None)
        epochs = _saved_epochs(folder)
        if epochs is not None:
            hint = f"{folder / 'last.pt'} holds {epochs} epoch(s): resume with --resume auto --output-dir {folder}"
        elif folder:
            hint = f"no epoch was saved in {folder} yet: rerun with --resume auto --output-dir {folder}"
        else:
            hint = "nothing was trained"
        sys.stderr.write(f"interrupted at {where} ({e}): {hint}\n")
        raise SystemExit(e.exit_code) from None
    if rank == 0:
        text = report(metrics) if report is not None else _summary(metrics)
        logger.info("final: %s", text)
    return metrics


def load_run_config(
    recipe: type[Recipe],
    opts: RunOptions,
    config: str | Path | None = None,
    overrides: Sequence[str] = (),
    epochs: int | None = None,
) -> Any:
    """The config of a command line: defaults < ``config`` < ``overrides`` (< ``epochs``); for a command that opens a
    run (``opts.resume``, ``opts.eval_only``), that run's checkpoint config takes the defaults' place.

    So ``--resume auto`` and ``--eval-only`` rebuild the model and data the run was trained with, however it was
    started (``--set``, ``--config``); what the command line sets on top is then checked by :func:`run` against the
    checkpoint (a key that defines the model or the data is refused with the diff).
    """
    cls = recipe.config_cls
    cfg = _with_epochs(load_config(cls, config, overrides), epochs)
    source = _opened_checkpoint(recipe, cfg, opts)
    if source is None:
        return cfg
    saved = saved_config(load_checkpoint(source, allow_pickle=opts.trust_checkpoint), source)
    if saved is None:
        return cfg
    logger.info("starting from the config saved in %s", source)
    cfg = load_config(cls, config, overrides, defaults=saved, defaults_source=f"checkpoint {source}")
    return _with_epochs(cfg, epochs)


def _with_epochs(cfg: Any, epochs: int | None) -> Any:
    return cfg if epochs is None else replace(cfg, epochs=epochs)


def _opened_checkpoint(recipe: type[Recipe], cfg: Any, opts: RunOptions) -> Path | None:
    """The checkpoint a resume or an evaluation opens, if it exists (a missing one is reported by :func:`run`)."""
    if not (opts.resume or opts.eval_only):
        return None
    folder, _ = _resolve_folder(recipe, cfg, opts)
    if opts.eval_only:
        path = _eval_checkpoint(opts, folder)
        return path if path.is_file() else None
    return resolve_resume(opts.resume, folder)


def _summary(metrics: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
