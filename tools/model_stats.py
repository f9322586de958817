"""Parameters and GMACs of every registered model, next to the papers' numbers.

    python tools/model_stats.py                                   # every family that has models
    python tools/model_stats.py --family pointcloud --points 2048
    python tools/model_stats.py --models centroid_transformer_modelnet40 --json stats.json
    python tools/model_stats.py --check                           # CI: exit 1 if a checked model is off the paper

One Markdown table per family; each row is a registered model, so a model appears here as soon as its package
registers it, and a paper number whose model is not registered yet is not printed. `ratio` = ours / paper. Each
family's paper numbers, tolerances and notes live in its package: `pointcloud/stats.py`, `capsules/stats.py`,
`vision/stats.py` (measured by `measure.stats.stats_report`).

GMACs are per sample (batch 1, eval mode), counted by `measure.stats.count_gmacs`, i.e. by
`torch.utils.flop_counter.FlopCounterMode` with 1 MAC = 2 FLOPs. It counts the matmul-like aten ops that actually
run: linear layers, convolutions, `bmm`/`baddbmm` and `scaled_dot_product_attention`, so the attention matmuls
(scores and weighted sums, dense or over the K gathered neighbours) are included, and so is the brute-force KNN
distance matrix in feature space (a `baddbmm`; 0.04 GMACs of the centroid transformer at 1024 points). Not counted:
element-wise ops (norms, activations, softmax, residual adds), gather/scatter and indexing (neighbour gathering,
nearest-neighbour upsampling), sorting and top-k, farthest point sampling (a loop of element-wise ops) and
compiled extensions (torch_cluster's xyz KNN on CPU; with the brute-force backend instead, that KNN adds a few
MMACs). The cost of those point ops shows up in time, not in GMACs: see `tools/bench_modelnet.py`.

`--check` compares the models in a family's `checks` with the paper within a relative tolerance (the centroid
transformer: params 4.1 M +-15%, GMACs 5.4 +-25%) and exits with a message naming the measured and expected values.
"""

from __future__ import annotations

import argparse
import json
import sys

import capsules.stats
import pointcloud.stats
import vision.stats
from measure.atomic import atomic_write_text
from measure.bench import describe_machine
from measure.stats import check_against_paper, stats_report

FAMILIES = {"pointcloud": pointcloud.stats.FAMILY, "capsules": capsules.stats.FAMILY, "vision": vision.stats.FAMILY}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="all", choices=[*FAMILIES, "all"])
    parser.add_argument("--points", type=int, default=None, help="points per cloud (default: 1024; capsules 2048)")
    parser.add_argument("--models", nargs="+", default=None, help="only these registered names")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--check", action="store_true", help="exit 1 if a checked model is outside the tolerance")
    args = parser.parse_args(argv)
    if args.check and args.points not in (None, 1024):
        parser.error("--check compares with the paper's numbers at 1024 points: drop --points")
    families = FAMILIES if args.family == "all" else {args.family: FAMILIES[args.family]}
    try:
        results, tables = stats_report(families, args.models, args.points, args.check)
    except ValueError as e:
        parser.error(str(e))
    print(f"# model_stats: {describe_machine('cpu')}")
    print("# GMACs per sample by torch.utils.flop_counter (matmuls incl. attention; not element-wise, gather/scatter)")
    print(f"\n{tables}")
    if args.json:
        payload = {"tool": "model_stats", "machine": describe_machine("cpu"), "results": results}
        atomic_write_text(args.json, json.dumps(payload, indent=2) + "\n")
    if args.check:
        failures = check_against_paper(families, results)
        if failures:
            raise SystemExit("model_stats --check FAILED:\n  " + "\n  ".join(failures))
        checked = sorted({r["model"] for r in results if r["model"] in families[r["family"]].checks})
        print(f"\ncheck: ok ({', '.join(checked) or 'no checked model registered'})")
    return results


if __name__ == "__main__":
    sys.exit(1 if any("error" in r for r in main()) else 0)
