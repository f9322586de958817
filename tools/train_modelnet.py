"""Train (or evaluate) a ModelNet40 centroid transformer.

    python tools/train_modelnet.py                                    # the main job: synthetic data, CPU, minutes
    python tools/train_modelnet.py --config configs/pointcloud/modelnet40_centroid_t2.yaml --data-root /data
    python tools/train_modelnet.py --set num_steps=2 lr=1e-3 --epochs 5
    python tools/train_modelnet.py --resume auto                               # continue a killed run (latest)
    python tools/train_modelnet.py --eval-only --checkpoint runs/modelnet40/main/latest/best.pt --set votes=10
    torchrun --nproc-per-node 4 tools/train_modelnet.py --config ...                    # DistributedDataParallel

The run folder (default: a new `runs/modelnet40/<name>/<timestamp>`, `latest` points to the newest; rules in
docs/harness.md) gets the resolved `config.yaml`, `train.log`, `log.jsonl`
(one line per epoch), TensorBoard events in `tb/`, `last.pt` (every epoch, atomic), `best.pt` and
`final_metrics.json`.
"""

from __future__ import annotations

import engine
from pointcloud.recipe import ModelNetRecipe


def main(argv: list[str] | None = None) -> dict:
    return engine.main(ModelNetRecipe, argv, description=__doc__)


if __name__ == "__main__":
    main()
