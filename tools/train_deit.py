"""Train (or evaluate) a DeiT with a centroid block (or any timm model) on timm's pipeline.

    python tools/train_deit.py                                        # the main job: synthetic images, CPU, minutes
    python tools/train_deit.py --config configs/vision/deit_tiny_centroid_c6_300e.yaml --data-root /data/imagenet
    python tools/train_deit.py --set embed_dim=128 lr=1e-3 --epochs 5      # lr is per 512 images: trains at 1.25e-4
    python tools/train_deit.py --resume auto                                          # continue a killed run (latest)
    python tools/train_deit.py --eval-only --checkpoint runs/deit/synthetic_centroid_tiny/latest/best.pt
    torchrun --nproc-per-node 8 tools/train_deit.py --config configs/vision/deit_tiny_centroid_c6_300e.yaml ...

The run folder (default: a new `runs/deit/<name>/<timestamp>`, `latest` points to the newest; rules in
docs/harness.md) gets the resolved `config.yaml`, `train.log`, `log.jsonl` (one
line per epoch: train loss / top-1 / top-5, val loss / top-1 / top-5 (and `ema_*`), lr, images/s as
`samples_per_s`), TensorBoard events in `tb/`, `last.pt` (every epoch, atomic), `best.pt` (best val top-1)
and `final_metrics.json` (`top1`, `top5`, `params`, `gmacs`, `ema_top1` with EMA, ...).
The recipe (timm data / optimizer / scheduler / loss / EMA) is `vision.recipe`; config keys are the fields of
`vision.recipe.DeiTConfig`.
"""

from __future__ import annotations

import os

# torch's CPU thread pool (GNU OpenMP) spins while waiting between parallel regions: on a CPU shared with other
# processes that stalls every op. Must be set before torch loads; an explicit setting wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import engine
from vision.recipe import DeiTRecipe


def main(argv: list[str] | None = None) -> dict:
    return engine.main(DeiTRecipe, argv, description=__doc__)


if __name__ == "__main__":
    main()
