"""Train (or evaluate) a 3D point capsule autoencoder (dynamic routing or centroid attention).

    python tools/train_capsules.py                                   # main job: centroid small, synthetic parts, CPU
    python tools/train_capsules.py --config configs/capsules/shapenet_part_routing_small.yaml --data-root /data
    python tools/train_capsules.py --set model=pointcaps_routing_small lr=3e-4 --epochs 5
    python tools/train_capsules.py --resume auto                               # continue a killed run (latest)
    python tools/train_capsules.py --eval-only --checkpoint runs/capsules/main/latest/best.pt
    torchrun --nproc-per-node 4 tools/train_capsules.py --config ...                   # DistributedDataParallel

The run folder (default: a new `runs/capsules/<name>/<timestamp>`, `latest` points to the newest; rules in
docs/harness.md) gets the resolved `config.yaml`, `train.log`, `log.jsonl` (one line per epoch: train and test
Chamfer, test part purity, or "no part labels" on data without them), TensorBoard events in `tb/`, `last.pt` (every
epoch, atomic), `best.pt` (lowest test Chamfer) and `final_metrics.json` (`chamfer`, `part_purity`, `params`,
`chamfer_definition`, `first_epoch_test_chamfer`, ...).
"""

from __future__ import annotations

import engine
from capsules.recipe import CapsulesRecipe


def main(argv: list[str] | None = None) -> dict:
    return engine.main(CapsulesRecipe, argv, description=__doc__)


if __name__ == "__main__":
    main()
