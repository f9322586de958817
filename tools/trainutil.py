"""The command line shared by the training CLIs (``train_modelnet.py``, ``train_capsules.py``, ``train_deit.py``).

Each CLI is its docstring, its recipe's config dataclass and ``train`` function, and the folder its runs go under;
:func:`run_training_cli` builds the common flags, resolves the config (dataclass < ``--config`` YAML < ``--set``),
sets up logging in the run folder and calls ``train``.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from engine import add_config_args, config_from_args, setup_logging

log = logging.getLogger(__name__)


def run_training_cli(
    argv: list[str] | None,
    *,
    description: str | None,
    config_cls: type,
    train: Callable[..., dict],
    run_group: str,
) -> dict:
    """Parses ``argv`` with the common training flags and runs ``train``; returns its final metrics.

    Args:
        argv: command-line arguments (None: ``sys.argv[1:]``).
        description: the CLI's help text (its module docstring).
        config_cls: the recipe's config dataclass.
        train: the recipe's ``train(cfg, output_dir, resume=, device=, data_root=, eval_only=, checkpoint=,
            progress=, max_steps_per_epoch=)``.
        run_group: runs go to ``runs/<run_group>/<name>`` unless ``--output-dir`` says otherwise.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--data-root", default=None, help="dataset root (default: $CENTROID_DATA or ./datasets)")
    parser.add_argument("--output-dir", default=None, help=f"run folder (default: runs/{run_group}/<name>)")
    parser.add_argument("--resume", default=None, help="'auto' (the run folder's last.pt) or a checkpoint path")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--epochs", type=int, default=None, help="override the config's epochs")
    parser.add_argument("--eval-only", action="store_true", help="evaluate --checkpoint (default: best.pt)")
    parser.add_argument("--checkpoint", default=None, help="checkpoint for --eval-only")
    parser.add_argument("--max-steps-per-epoch", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    args = parser.parse_args(argv)
    cfg = config_from_args(config_cls, args)
    if args.epochs is not None:
        cfg = replace(cfg, epochs=args.epochs)
    output_dir = Path(args.output_dir or Path("runs") / run_group / cfg.name)
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(output_dir, rank=rank)
    log.info("run folder: %s", output_dir)
    metrics = train(
        cfg,
        output_dir,
        resume=args.resume,
        device=args.device,
        data_root=args.data_root,
        eval_only=args.eval_only,
        checkpoint=args.checkpoint,
        progress=not args.no_progress,
        max_steps_per_epoch=args.max_steps_per_epoch,
    )
    if rank == 0:
        summary = ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in metrics.items())
        log.info("final: %s", summary)
    return metrics
