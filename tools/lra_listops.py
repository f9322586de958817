"""ListOps (Long Range Arena) with any sequence mixer: a seeded generator, a small classifier, a training run.

    python tools/lra_listops.py                                     # the CPU main job: short sequences, minutes
    python tools/lra_listops.py --set mixer=fsat                    # any name of attention.MIXERS
    python tools/lra_listops.py --config configs/lra/listops_fsat.yaml --device cuda    # LRA lengths, on a GPU
    python tools/lra_listops.py --resume auto                                 # continue a killed run (latest)

Task (Nangia and Bowman 2018; the LRA version of Tay et al., arXiv:2011.04006): a nested expression such as
`[MAX 2 9 [MIN 4 7 ] 0 ]` over the operators MAX, MIN, MED (median, rounded down) and SM (sum modulo 10), digits
0-9; the label is its value (10 classes), drawn by LRA's generator (`lra.data`). Model (`lra.model`):
embeddings, `depth` mixer blocks with the chosen mixer, a masked mean pool, a linear head. Config keys are the
fields of `lra.recipe.ListOpsConfig`.

The run folder (default: a new `runs/lra_listops/<name>/<timestamp>`, `latest` points to the newest; rules in
docs/harness.md) gets `config.yaml`, `train.log`, `log.jsonl`, `tb/`,
`last.pt` (every epoch, atomic), `best.pt` and `final_metrics.json` (with the majority-class baseline).
"""

from __future__ import annotations

import engine
from lra.recipe import ListOpsRecipe, report


def main(argv: list[str] | None = None) -> dict:
    return engine.main(ListOpsRecipe, argv, description=__doc__, report=report)


if __name__ == "__main__":
    main()
