"""Throughput of the part-segmentation models: params, GMACs, train and inference samples/s, as ratios to PointNet++.

    python tools/bench_partseg.py                                   # CPU, batch 8, 2048 points (ShapeNet Part's)
    python tools/bench_partseg.py --points 256 --batch 16           # the main job's clouds
    python tools/bench_partseg.py --device cuda --amp --batch 32    # GPU, bf16 autocast

Rows and columns are described in `pointcloud.partseg.bench`: every registered part-segmentation model at its
defaults and the centroid model at the main job's size, 50 parts and 16 categories, all on the same batch, timed
round-robin (`--repeats` rounds after `--warmup` untimed calls; `--stat min`: the fastest round, the least
disturbed by other jobs on a shared machine). `--json` writes every row (each round's time included).
"""

from __future__ import annotations

import argparse

import torch

from measure.bench import add_throughput_arguments, describe_machine, finish, print_table
from pointcloud.partseg import list_models
from pointcloud.partseg.bench import benchmark, check_settings, plan, table


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_throughput_arguments(parser, batch=8, points=2048, repeats=3, warmup=1)
    parser.add_argument("--no-main-job", action="store_true", help="leave out the centroid model at main-job size")
    parser.add_argument("--no-normals", action="store_true", help="x, y, z only (default: with normals, 6 channels)")
    args = parser.parse_args(argv)
    models = args.models or list_models()
    try:
        check_settings(models, args.device, args.amp, args.batch, args.repeats)
    except ValueError as e:
        parser.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"# bench_partseg on {args.device}: {describe_machine(args.device)}")
    channels = "xyz" if args.no_normals else "xyz + normals"
    print(f"# batch {args.batch}, {args.points} points ({channels}), 50 parts, 16 categories, amp {args.amp}, "
          f"{args.stat} of {args.repeats} rounds after {args.warmup} warm-up\n")  # fmt: skip
    rows = plan(models, main_job=not args.no_main_job)
    results = benchmark(rows, args.device, args.batch, args.points, args.amp, args.repeats, args.warmup, args.stat,
                        use_normals=not args.no_normals)  # fmt: skip
    tables: list[dict] = []
    print_table(*table(results), tables)
    finish("bench_partseg", args.device, args, [], argv=argv, results=results, tables=tables)
    return results


if __name__ == "__main__":
    main()
