"""Train (or evaluate) a 3D point capsule autoencoder (dynamic routing or centroid attention).

    python tools/train_capsules.py                                   # main job: centroid small, synthetic parts, CPU
    python tools/train_capsules.py --config configs/capsules/shapenet_part_routing_small.yaml --data-root /data
    python tools/train_capsules.py --set model=pointcaps_routing_small lr=3e-4 --epochs 5
    python tools/train_capsules.py --resume auto --output-dir runs/capsules/main        # continue a killed run
    python tools/train_capsules.py --eval-only --checkpoint runs/capsules/main/best.pt
    torchrun --nproc-per-node 4 tools/train_capsules.py --config ...                   # DistributedDataParallel

The run folder (default ``runs/capsules/<name>``) gets the resolved ``config.yaml``, ``train.log``, ``log.jsonl``
(one line per epoch: train and test Chamfer, test part purity), TensorBoard events in ``tb/``, ``last.pt`` (every
epoch, atomic), ``best.pt`` (lowest test Chamfer) and ``final_metrics.json`` (``chamfer``, ``part_purity``,
``params``, ``chamfer_definition``, ``first_epoch_test_chamfer``, ...).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing

from capsules.recipe import CapsulesConfig, train
from engine import add_config_args, config_from_args, setup_logging


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_args(parser)
    parser.add_argument("--data-root", default=None, help="dataset root (default: $CENTROID_DATA or ./datasets)")
    parser.add_argument("--output-dir", default=None, help="run folder (default: runs/capsules/<name>)")
    parser.add_argument("--resume", default=None, help="'auto' (the run folder's last.pt) or a checkpoint path")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    parser.add_argument("--epochs", type=int, default=None, help="override the config's epochs")
    parser.add_argument("--eval-only", action="store_true", help="evaluate --checkpoint (default: best.pt)")
    parser.add_argument("--checkpoint", default=None, help="checkpoint for --eval-only")
    parser.add_argument("--max-steps-per-epoch", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--no-progress", action="store_true", help="no tqdm bars")
    args = parser.parse_args(argv)
    cfg = config_from_args(CapsulesConfig, args)
    if args.epochs is not None:
        cfg = replace(cfg, epochs=args.epochs)
    output_dir = Path(args.output_dir or Path("runs") / "capsules" / cfg.name)
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
