"""Throughput of the ModelNet40 models: train-step and inference samples/s, params, GMACs and ops/step, in one run.

    python tools/bench_modelnet.py                                  # CPU, batch 32, 1024 points
    python tools/bench_modelnet.py --device cuda --amp              # GPU, bf16 autocast
    python tools/bench_modelnet.py --device cuda --amp --batch 32 128 --steps 1 --compile auto \\
        --compile-mode default reduce-overhead                      # the PointNet++ target's settings
    python tools/bench_modelnet.py --batch 16 --repeats 2 --models centroid_transformer_modelnet40 \\
        centroid_transformer_modelnet40_random
    python tools/bench_modelnet.py --device cuda --amp --steps 1 --profile runs/profile   # what bounds each train step

Rows, columns and targets are described in `pointcloud.bench`: the centroid transformer for each T
(`--steps`), KNN attention form (`--attn-backends`), chunk budget (`--chunk-mb`) and compiled form
(`--compile`, in each `torch.compile` mode of `--compile-mode`), its downsampling-only twins and every
registered peer, all on the same batch (one table per size of `--batch`); `--repeats` rounds
timed round-robin after `--warmup` untimed calls (`--stat min`: the fastest round, the least disturbed by other
jobs on a shared machine). The verdicts print under the table; `--json` writes every row (each round's time
included) and the targets.
"""

from __future__ import annotations

import argparse

import torch

from attention import backend_names
from engine.trainer import COMPILE_MODES
from measure.bench import (
    PROFILE_HEADERS,
    add_profile_option,
    add_throughput_arguments,
    describe_machine,
    finish,
    print_table,
    profile_rows,
)
from pointcloud.bench import (
    COMPILE_FORMS,
    benchmark,
    check_settings,
    default_models,
    parse_variant,
    plan,
    runnable,
    table,
    targets,
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_throughput_arguments(parser, batch=32, points=1024, repeats=5, warmup=2, batches=True)
    parser.add_argument("--num-centroids", type=int, nargs=2, default=None, metavar=("N1", "N2"),
                        help="centroids of the two CA blocks (default: the model's)")  # fmt: skip
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3], help="T values of the centroid model")
    parser.add_argument("--variant", nargs="+", default=[], metavar="LABEL:KEY=VALUE,...",
                        help="extra rows of the centroid model built with these keywords, e.g. "
                        "'CA pos. enc.:ca_pos_encoding=true' (the lever table's designs)")  # fmt: skip
    forms = ["auto", *backend_names("knn_attention")]
    parser.add_argument("--attn-backends", nargs="+", default=["auto"], choices=forms,
                        help="KNN attention forms of the centroid rows (attention.CentroidAttention)")  # fmt: skip
    parser.add_argument("--chunk-mb", nargs="+", type=int, default=[],
                        help="extra centroid rows: the gather form chunked at these budgets (MiB)")  # fmt: skip
    parser.add_argument("--compile", nargs="+", default=[], choices=COMPILE_FORMS, metavar="FORM",
                        help="extra centroid rows: torch.compile of the model in these forms (masked is what auto "
                        "took on CUDA before the fused kernel; auto and triton keep the kernels on CUDA)")  # fmt: skip
    parser.add_argument("--compile-mode", nargs="+", default=["default"], choices=COMPILE_MODES, metavar="MODE",
                        help="torch.compile modes of the compiled rows, a row each (reduce-overhead: CUDA graphs "
                        "too)")  # fmt: skip
    add_profile_option(parser)
    args = parser.parse_args(argv)
    models = args.models or default_models()
    try:
        for batch in args.batch:
            check_settings(models, args.device, args.amp, batch, args.repeats, args.chunk_mb, args.compile,
                           args.compile_mode)  # fmt: skip
    except ValueError as e:
        parser.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"# bench_modelnet on {args.device}: {describe_machine(args.device)}")
    nc = args.num_centroids or "model default"
    print(f"# batch {' and '.join(map(str, args.batch))}, {args.points} points (xyz), num_centroids {nc}, "
          f"amp {args.amp}, {args.stat} of {args.repeats} rounds after {args.warmup} warm-up")  # fmt: skip
    try:
        variants = [parse_variant(v) for v in args.variant]
    except ValueError as e:
        parser.error(str(e))
    planned = plan(models, args.steps, args.num_centroids, args.attn_backends, args.chunk_mb, args.compile,
                   args.compile_mode, variants)  # fmt: skip
    rows, skipped = runnable(planned, args.device)
    for label, why in skipped.items():
        print(f"# {label}: not measured: {why}")
    print()
    results: list[dict] = []
    tables: list[dict] = []
    goals: list[dict] = []
    several = len(args.batch) > 1
    for batch in args.batch:
        measured = benchmark(rows, args.device, batch, args.points, args.amp, args.repeats, args.warmup, args.stat,
                             profile=args.profile)  # fmt: skip
        results += [{"batch": batch, **r} for r in measured]
        print_table(*table(measured), tables, title=f"batch {batch}" if several else None)
        print()
        if args.profile:  # the train steps
            profiled = profile_rows(measured, lambda r: r["label"], ms_key="train_ms")
            print_table(PROFILE_HEADERS, profiled, tables, title=f"profile, train step, batch {batch} ({args.profile})")
            print()
        goals += targets(measured, args.device, args.amp, args.points, batch=batch if several else None)
    finish("bench_modelnet", args.device, args, goals, argv=argv, results=results, tables=tables)


if __name__ == "__main__":
    main()
