"""Ablation tables: every row trained with several seeds in one regime, written as Markdown and JSON.

    python tools/run_ablation.py --table fsat --seeds 3               # FSAT's Table 3 on ListOps, 3 seeds
    python tools/run_ablation.py --table sam --seeds 3 --max-runs 4   # the SAM table, 4 more runs in this call
    python tools/run_ablation.py --table modelnet --plan              # the table and its commands, no training
    python tools/run_ablation.py --table modelnet --plan --records docs/ablations/records  # the docs' table again

Tables: `fsat` and `sam` (`lra.ablation`: FSAT's switches; each matrix mixer with and without data
dependence, Dense and DFT) on ListOps at 128-256 tokens, `modelnet` (`pointcloud.ablation`: T = 1 / 2 / 3,
the downsampling-only twins, PointNet, PointNet++, DGCNN) on 13 synthetic classes at 1,024 points, and
`modelnet_levers` (the centroid step's levers against the FPS-only twin, at 256 points), and `capsules`
(`capsules.ablation`: the point capsule autoencoder's part purity with centroid attention or routing, the patch or
the reference decoder, on the synthetic part shapes). `--curves FILE.svg`
draws the finished runs' learning curves. Runs go to
`<out>/<table>/<row>/seed<N>`, each equal to the training command the table lists; finished runs are read back and
stopped ones resume, so a table fills up over several calls (`--max-runs`). The table (mean, std, every seed, the
commits and load averages the runs saw) goes to `<out>/<table>.md` and `.json` and to the console. With
`--records DIR` each finished run's result is also kept as `DIR/<table>/<row>/seed<N>.json` and runs found there
count as finished, so a table continues on another machine or from a fresh clone. A result whose path, command or
metric does not fit the table is left out and listed (its seed counts as missing); a run folder whose run is not the
kept record's stops the command: a kept record is never replaced by another run, and `--plan` writes no record.
"""

from __future__ import annotations

import argparse
import logging

import capsules.ablation  # noqa: F401  (registers the capsules table)
import lra.ablation  # noqa: F401  (registers the fsat and sam tables)
import pointcloud.ablation  # noqa: F401  (registers the modelnet table)
from engine import user_errors
from engine.ablation import TABLES, ablate


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--table", required=True, choices=sorted(TABLES))
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0 .. N-1 of every row")
    parser.add_argument("--rows", nargs="+", default=None, help="train only these rows (labels); all are reported")
    parser.add_argument("--max-runs", type=int, default=None, help="train at most this many new runs in this call")
    parser.add_argument(
        "--plan", action="store_true", help="train nothing and write no record: write the table of the finished runs"
    )
    parser.add_argument("--out", default="runs/ablation", help="folder of the runs and the tables")
    parser.add_argument("--device", default="cpu")
    parser.add_argument(
        "--records",
        default=None,
        help="also keep every finished run's result here (one JSON per run) and count the runs found here as finished: "
        "a table continues or is regenerated without its run folders (docs/ablations/records holds the docs' runs)",
    )
    parser.add_argument("--curves", default=None, help="also draw the finished runs' learning curves into this SVG")
    parser.add_argument("--debug", action="store_true", help="errors show their traceback")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    table = TABLES[args.table]
    with user_errors(args.debug):
        md = ablate(
            table,
            list(range(args.seeds)),
            args.out,
            args.device,
            args.rows,
            args.max_runs,
            f"{args.out}/{table.name}.md",
            f"{args.out}/{table.name}.json",
            args.records,
            args.plan,
            args.curves,
        )
    print(md)
    return md


if __name__ == "__main__":
    main()
