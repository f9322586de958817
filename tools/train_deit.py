"""Train (or evaluate) a DeiT with a centroid block (or any timm model) on timm's pipeline.

    python tools/train_deit.py                                        # the main job: synthetic images, CPU, minutes
    python tools/train_deit.py --config configs/vision/deit_tiny_centroid_c6_300e.yaml --data-root /data/imagenet
    python tools/train_deit.py --set embed_dim=128 lr=1e-3 --epochs 5
    python tools/train_deit.py --resume auto --output-dir runs/deit/synthetic_centroid_tiny    # continue a killed run
    python tools/train_deit.py --eval-only --checkpoint runs/deit/synthetic_centroid_tiny/best.pt
    torchrun --nproc-per-node 8 tools/train_deit.py --config configs/vision/deit_tiny_centroid_c6_300e.yaml ...

The run folder (default ``runs/deit/<name>``) gets the resolved ``config.yaml``, ``train.log``, ``log.jsonl`` (one
line per epoch: train loss / top-1 / top-5, val loss / top-1 / top-5 (and ``ema_*``), lr, images/s as
``samples_per_s``), TensorBoard events in ``tb/``, ``last.pt`` (every epoch, atomic), ``best.pt`` (best val top-1)
and ``final_metrics.json`` (``top1``, ``top5``, ``params``, ``gmacs``, ``ema_top1`` with EMA, ...).
The recipe (timm data / optimizer / scheduler / loss / EMA) is :mod:`vision.recipe`; config keys are the fields of
``vision.recipe.DeiTConfig``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing
# torch's CPU thread pool (GNU OpenMP) spins while waiting between parallel regions. On a CPU shared with other
# processes that stalls every op: the main job trained at 17 images/s with spinning and 171 with passive waiting
# (2 threads, load average 10 on 2 cores). Must be set before torch loads; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from engine import add_config_args, config_from_args, setup_logging
from vision.recipe import DeiTConfig, train


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--data-root", default=None, help="dataset root (default: $CENTROID_DATA or ./datasets)")
    parser.add_argument("--output-dir", default=None, help="run folder (default: runs/deit/<name>)")
    parser.add_argument("--resume", default=None, help="'auto' (the run folder's last.pt) or a checkpoint path")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--epochs", type=int, default=None, help="override the config's epochs")
    parser.add_argument("--eval-only", action="store_true", help="evaluate --checkpoint (default: best.pt)")
    parser.add_argument("--checkpoint", default=None, help="checkpoint for --eval-only")
    parser.add_argument("--max-steps-per-epoch", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    args = parser.parse_args(argv)
    cfg = config_from_args(DeiTConfig, args)
    if args.epochs is not None:
        cfg = replace(cfg, epochs=args.epochs)
    output_dir = Path(args.output_dir or Path("runs") / "deit" / cfg.name)
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(output_dir, rank=rank)
    logging.getLogger(__name__).info("run folder: %s", output_dir)
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
        logging.getLogger(__name__).info("final: %s", summary)
    return metrics


if __name__ == "__main__":
    main()
