"""Benchmark of centroid attention: dense vs KNN, time (forward + backward) and peak memory.

    python tools/bench_centroid.py                 # CPU
    python tools/bench_centroid.py --device cuda   # GPU machine
    python tools/bench_centroid.py --points 256 1024 --dim 32 --k 8 --repeats 1   # seconds

N in {1024, 4096, 8192, 16384}, M = N / 4 centroids, K = 32 neighbours, C = 128 channels, 4 heads, batch 1.
Four implementations of one attention step from M centroids to N inputs, with the same projections
(:func:`attention.bench.centroid_rows`):

* ``dense-matmul``: softmax(Q K^T) V with the (B, H, M, N) score matrix materialized (a plain implementation);
* ``dense-sdpa``:   the layer's dense path, ``scaled_dot_product_attention`` (fused kernels where torch has them);
* ``knn``:          the layer's KNN path (K nearest inputs in feature space, gathered keys and values);
* ``knn-masked``:   the same neighbours, attention as dense products under the (B, M, N) neighbour mask
  (``attn_backend="masked"``).

Peak memory is the growth of the peak resident set of a fresh process during forward + backward on CPU (a process
per configuration), and ``torch.cuda.max_memory_allocated`` on CUDA (all in this process; ``--isolate`` says).
Ratios are against ``dense-matmul`` and ``dense-sdpa`` of the same N. This bench declares no target (``--json``
writes the rows and an empty target list).
"""

from __future__ import annotations

import argparse
import logging

from attention.bench import CENTROID_HEADERS, centroid_rows
from engine.bench import add_isolate_option, describe_machine, isolate_configs, print_table, write_report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--points", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    add_isolate_option(parser)
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="  %(message)s")  # each configuration's result, on stderr
    print(f"# bench_centroid on {args.device}: {describe_machine(args.device)}")
    print(f"# B={args.batch}, C={args.dim}, H={args.heads}, M=N/4, K={args.k}; forward + backward\n")
    isolate = isolate_configs(args.isolate, args.device)
    rows = centroid_rows(args.device, args.points, k=args.k, dim=args.dim, heads=args.heads, batch=args.batch,
                         repeats=args.repeats, isolate=isolate)  # fmt: skip
    print_table(CENTROID_HEADERS, rows)
    if args.json:
        results = [dict(zip(CENTROID_HEADERS, r)) for r in rows]
        write_report(args.json, "bench_centroid", args.device, vars(args), results=results, targets=[])


if __name__ == "__main__":
    main()
