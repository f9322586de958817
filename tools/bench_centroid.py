"""Benchmark of centroid attention: dense vs the KNN forms, time (forward + backward) and peak memory.

    python tools/bench_centroid.py                 # CPU (the Triton and compiled rows say why they are skipped)
    python tools/bench_centroid.py --device cuda   # GPU machine: every row and the target verdicts
    python tools/bench_centroid.py --device cuda --points 1024 --profile runs/profile   # what bounds each step
    python tools/bench_centroid.py --points 256 1024 --dim 32 --k 8 --repeats 1   # seconds

N in {1024, 4096, 8192, 16384}, M = N / 4 centroids, K = 32 neighbours, C = 128 channels, 4 heads, batch 1.
Implementations of one attention step from M centroids to N inputs, with the same projections
(`attention.bench.CENTROID_PATHS`):

* `dense-matmul`: softmax(Q K^T) V with the (B, H, M, N) score matrix materialized (a plain implementation);
* `dense-sdpa`:   the layer's dense path, `scaled_dot_product_attention` (fused kernels where torch has them);
* `knn`:          the layer's KNN path (K nearest inputs in feature space, gathered keys and values);
* `knn-masked`:   the same neighbours, attention as dense products under the (B, M, N) neighbour mask;
* `knn-triton`:   the same neighbours, the fused Triton kernel (`attn_backend="triton"`; CUDA only);
* `knn-compiled`: `torch.compile` of the KNN path in the form `"auto"` took before the fused kernel (masked
  while N / K <= 128, else gather): what the compiler alone gives (`--compiled`, default on CUDA only);
* `knn-triton-compiled`: `torch.compile` of the layer with the fused kernel, which stays one opaque operator in
  the compiled graph (`attention.kernels.ops`): what a compiled model runs (`--compiled`; CUDA only);
* `knn-triton-graphs`, `dense-sdpa-graphs`: the fused step and SDPA's compiled with `mode="reduce-overhead"`
  (CUDA graphs: a step is one replay, no per-kernel launch cost; `--compiled`; CUDA only);
* `knn-triton-captured`, `dense-sdpa-captured`: the same eager steps captured whole into CUDA graphs
  (`measure.bench.capture_graphs`: one replay forward and one backward, no compiler and no guards, the least
  host work a step; CUDA only).

Peak memory is the growth of the peak resident set of a fresh process during forward + backward on CPU (a process
per configuration), and `torch.cuda.max_memory_allocated` on CUDA (all in this process; `--isolate` says).
Ratios are against `dense-matmul` and `dense-sdpa` of the same N. Targets (`attention.bench.centroid_targets`,
verdicts on CUDA): the fused step faster than SDPA at every N from 1K to 16K (its fastest row against eager SDPA, and
both in CUDA graphs, each its faster graph row), with a lower peak (both eager).
"""

from __future__ import annotations

import argparse
import logging

from attention.bench import CENTROID_HEADERS, CENTROID_PATHS, centroid_results, centroid_rows, centroid_targets
from measure.bench import (
    PROFILE_HEADERS,
    add_isolate_option,
    add_profile_option,
    describe_machine,
    finish,
    isolate_configs,
    print_table,
    profile_rows,
)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--points", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", nargs="+", default=list(CENTROID_PATHS), choices=CENTROID_PATHS, metavar="PATH",
                        help=f"rows to time, of {', '.join(CENTROID_PATHS)} (default: all)")  # fmt: skip
    parser.add_argument("--compiled", choices=["auto", "yes", "no"], default="auto",
                        help="time the compiled rows (auto: on CUDA only; a CPU compiles for minutes)")  # fmt: skip
    add_isolate_option(parser)
    parser.add_argument("--json", default=None, help="also write the rows and targets to this JSON file")
    add_profile_option(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="  %(message)s")  # each configuration's result, on stderr
    compiled = args.compiled == "yes" or (args.compiled == "auto" and args.device.startswith("cuda"))
    print(f"# bench_centroid on {args.device}: {describe_machine(args.device)}")
    print(f"# B={args.batch}, C={args.dim}, H={args.heads}, M=N/4, K={args.k}; forward + backward\n")
    results = centroid_results(args.device, args.points, paths=args.paths, compiled=compiled, k=args.k, dim=args.dim,
                               heads=args.heads, batch=args.batch, repeats=args.repeats,
                               isolate=isolate_configs(args.isolate, args.device), profile=args.profile)  # fmt: skip
    for r in results:
        if "note" in r and r["N"] == args.points[0]:
            print(f"# {r['path']}: not measured: {r['note']}")
    tables: list[dict] = []
    print_table(CENTROID_HEADERS, centroid_rows(results), tables)
    if args.profile:
        print()
        profiled = profile_rows(results, lambda r: f"N={r['N']} {r['path']}")
        print_table(PROFILE_HEADERS, profiled, tables, title=f"profile ({args.profile})")
    goals = centroid_targets(results, args.device)
    finish("bench_centroid", args.device, args, goals, argv=argv, results=results, tables=tables)


if __name__ == "__main__":
    main()
