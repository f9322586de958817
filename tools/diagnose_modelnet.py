"""Measure what each block of trained centroid transformers does, side by side: per-block gradient norms, attention
entropy, the centroid step's update against its skip, the xyz distance of the attended neighbours and their same-part
rate (`pointcloud.diagnostics`).

    python tools/diagnose_modelnet.py --checkpoint runs/modelnet40/main/latest/last.pt
    python tools/diagnose_modelnet.py --checkpoint t1=runs/ablation/modelnet_levers/t_1/seed0/last.pt \\
        fps=runs/ablation/modelnet_levers/fps_only/seed0/last.pt --initial --out runs/diagnosis/t1_vs_fps

Each checkpoint is a `tools/train_modelnet.py` checkpoint of a centroid transformer or one of its twins (`NAME=PATH`
names its column). The gradient norms are averaged over `--batches` augmented training batches of the run's own
data, the attention statistics read the first test batch, the same-part rate the synthetic part shapes' test split.
`--initial` adds each model at a fresh initialization (seeded by its run's seed). The table goes to the console and,
with every figure, to `<out>/diagnosis.md` and `<out>/diagnosis.json`.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from engine import setup_logging, user_errors
from measure.bench import markdown_table
from pointcloud.diagnostics import diagnose_checkpoint
from pointcloud.neighbourhoods import PART_SOURCES

MEASURES = (
    ("entropy", "entropy / log K"),
    ("max_weight", "largest weight"),
    ("top_rank", "rank of top nbr / (K - 1)"),
    ("self_weight", "weight on own point"),
    ("update_ratio", "update / skip"),
    ("nbr_dist_ratio", "nbr dist / xyz KNN dist"),
    ("weighted_dist_ratio", "weighted nbr dist / KNN"),
)


def _rows(results: dict[str, dict]) -> tuple[list[str], list[list[str]]]:
    names = list(results)
    parts = list(next(iter(results.values()))["gradient_norms"])
    rows = [[f"grad norm {p}", *(f"{results[n]['gradient_norms'][p]:.3g}" for n in names)] for p in parts]
    blocks = list(next(iter(results.values()))["attention"])
    for key, label in MEASURES:
        for b in blocks:
            values = [results[n]["attention"][b].get(key) for n in names]
            if any(v is not None for v in values):
                rows.append([f"{label} {b}", *("-" if v is None else f"{v:.3f}" for v in values)])
    for key in ("feature", "xyz", "random"):
        values = [(results[n]["part_agreement"] or {}).get(key) for n in names]
        if any(v is not None for v in values):
            rows.append([f"same-part rate CA2, {key}", *("-" if v is None else f"{v:.3f}" for v in values)])
    return ["measure", *names], rows


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", nargs="+", required=True, help="checkpoints, as PATH or NAME=PATH")
    parser.add_argument("--batches", type=int, default=4, help="training batches for the gradient norms")
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--parts", default="synthetic", choices=[*PART_SOURCES, "none"], help="part-labelled shapes")
    parser.add_argument("--max-shapes", type=int, default=40, help="part shapes to measure")
    parser.add_argument("--initial", action="store_true", help="also measure each model at a fresh initialization")
    parser.add_argument("--out", default=None, help="folder for diagnosis.md and diagnosis.json")
    parser.add_argument("--allow-pickle", action="store_true", help="read checkpoints that are not weights-only")
    parser.add_argument("--debug", action="store_true", help="show tracebacks")
    args = parser.parse_args(argv)
    setup_logging(None)
    with user_errors(args.debug):
        if args.batches < 1 or args.batch_size < 1:
            raise ValueError(f"--batches and --batch-size must be >= 1, got {args.batches} and {args.batch_size}")
        results = {}
        for spec in args.checkpoint:
            name, _, path = spec.rpartition("=") if "=" in spec else (Path(spec).parent.name, "", spec)
            for initial in (False, True) if args.initial else (False,):
                results[f"{name} (init)" if initial else name] = diagnose_checkpoint(
                    path, args.batches, args.batch_size, None if args.parts == "none" else args.parts,
                    args.max_shapes, initial, args.allow_pickle,
                )  # fmt: skip
        headers, rows = _rows(results)
        md = markdown_table(headers, rows)
        if args.out:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            (out / "diagnosis.md").write_text(md + "\n")
            (out / "diagnosis.json").write_text(json.dumps(results, indent=1) + "\n")
        print(md)
        return results


if __name__ == "__main__":
    main()
