"""Train (or evaluate) a part-segmentation model: the centroid transformer's encoder or the PointNet++ peer.

    python tools/train_partseg.py                                     # the main job: synthetic parts, CPU, minutes
    python tools/train_partseg.py --config configs/partseg/synthetic_pointnet2.yaml         # the peer, same data
    python tools/train_partseg.py --config configs/partseg/shapenet_part_centroid.yaml --data-root /data --device cuda
    python tools/train_partseg.py --resume auto                                # continue a killed run (latest)
    python tools/train_partseg.py --eval-only --checkpoint runs/partseg/main/latest/best.pt --set votes=10
    torchrun --nproc-per-node 4 tools/train_partseg.py --config ...                     # DistributedDataParallel

ShapeNet Part's protocol (`pointcloud.partseg.metrics`): each point's prediction is the arg-max over its
category's parts; a shape's IoU is the mean over those parts (a part in neither prediction nor label counts as 1);
`test_instance_miou` averages it over shapes, `test_class_miou` over categories. The run folder (default: a new
`runs/partseg/<name>/<timestamp>`, `latest` points to it) gets the resolved `config.yaml`, `train.log`,
`log.jsonl` (one line per epoch), TensorBoard events in `tb/`, `last.pt` (every epoch, atomic), `best.pt`
and `final_metrics.json` (with each category's mIoU under `class_ious`).
"""

from __future__ import annotations

import engine
from pointcloud.partseg.recipe import PartSegRecipe


def main(argv: list[str] | None = None) -> dict:
    return engine.main(PartSegRecipe, argv, description=__doc__)


if __name__ == "__main__":
    main()
