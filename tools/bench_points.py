"""Benchmark of the point ops: FPS, KNN and the Chamfer loss, time per backend, with ratios to the reference and to
torch_cluster.

    python tools/bench_points.py                 # CPU grid, the two large clouds and the KNN memory row
    python tools/bench_points.py --device cuda   # on a GPU machine
    python tools/bench_points.py --batch 2 --points 256 --channels 3 --repeats 1   # seconds: small grid only

Grid: B in {8, 32}, N in {1024, 4096}, M in {N/2, N/4}. FPS samples M of N points; KNN finds the k nearest of the
N points for each of the M sampled points, in xyz (C = 3) and in a 64-d feature space. On CUDA two more rows time the
Triton kernel itself (`attention.knn`'s NaN/Inf checks, a host sync each, are in the `triton` row only):
`triton-split` splits the N points among programs where the query blocks alone would leave the GPU idle (e.g.
`--batch 1`), `triton-1split` searches them in one part. `speedup vs torch` = the reference's time / the backend's
time, `speedup vs cluster` = torch_cluster's time / the backend's time (> 1: faster), each from the same run. Every
backend's FPS indices are checked against the reference in the same run.

Chamfer loss (`capsules.chamfer_distance`, C = 3, two clouds of N points for every B and N of the grid): the loss and
its backward pass per installed backend, timed round robin, against the dense reference (left out where its
(B, N, N, 3) differences pass 1 GiB) and the chunked search, with whether each finds the same nearest indices.

Large single clouds (`--large N M ...`; by default 50K / M = 4096 and 100K / M = 8192 with the default `--points`
grid, none with any other, so a small run stays small): every exact FPS backend and the approximate
`fpsample_bucket`, with each one's time relative to the bucket FPS and to the reference, and its coverage (the
largest distance from a point to its nearest sample, which FPS greedily minimizes) relative to exact FPS, on a uniform
cloud in the unit cube and a clustered one (`--clouds`: 16 Gaussian blobs, where a spatial index prunes
differently). The `auto` row shows which backend `backend="auto"` picks for that shape.

KNN memory (`--knn-memory M N C`; by default 20,000 queries against 200,000 points at C = 128 on CPU with the
default `--points` grid, none otherwise): the peak resident set of one exact KNN search (`attention.knn`'s
reference, `attention.points.knn_chunked`; one cloud, float32, `no_grad`, one thread unless `--threads`),
measured on CPU in a fresh process so the figure is the search's own, and the growth of that peak over the second
half of `--knn-memory-calls` searches of M / calls queries in another fresh process (the first half lets the
allocator settle).

Targets, printed under the tables and written with every row to `--json`: the Triton FPS at least 2x
torch-cluster's at B=32, N=1024, M=512 (`attention.bench.fps_cluster_target`, on CUDA); with the KNN memory row,
its peak at most 1.5 GB at 20,000 x 200,000 x 128 and at most one CPU chunk of distances (32 MB) of growth over the
repeated calls (`attention.bench.knn_memory_targets`, on CPU).

With numba installed, the first line also gives the numba FPS's first-call cost in a fresh process: compiling into an
empty cache, and loading the compiled code from the cache (the usual case after the first run).
"""

from __future__ import annotations

import argparse
import os

import torch

from attention import backends
from attention.bench import (
    FPS_HEADERS,
    GRID_POINTS,
    KNN_HEADERS,
    KNN_MEMORY_CALLS,
    KNN_MEMORY_HEADERS,
    LARGE_HEADERS,
    fps_backends,
    fps_cluster_target,
    knn_memory_row,
    knn_memory_sizes,
    knn_memory_targets,
    large_cloud_rows,
    large_clouds,
    numba_first_call_ms,
    point_op_rows,
    points_results,
)
from capsules.bench import CHAMFER_HEADERS, chamfer_backend_rows
from measure.bench import describe_machine, finish, print_table


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--points", type=int, nargs="+", default=list(GRID_POINTS), help="cloud sizes N of the grid")
    parser.add_argument("--k", type=int, default=16, help="neighbours for the KNN rows")
    parser.add_argument("--channels", type=int, nargs="+", default=[3, 64], help="KNN dims (xyz, features)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--clouds", nargs="+", default=["uniform", "clustered"], choices=["uniform", "clustered"])
    parser.add_argument("--large", type=int, nargs="*", default=None, metavar="N M",
                        help="single-cloud FPS rows as N M pairs (empty: skip; default: 50000 4096 100000 8192 with "
                        "the default --points grid, none with any other)")  # fmt: skip
    parser.add_argument("--knn-memory", type=int, nargs="*", default=None, metavar="M N C",
                        help="the KNN memory row's queries, points and channels (empty: skip; default: 20000 200000 "
                        "128 on CPU with the default --points grid, none otherwise)")  # fmt: skip
    parser.add_argument("--knn-memory-calls", type=int, default=KNN_MEMORY_CALLS,
                        help="searches of M / calls queries each for the KNN memory row's growth measure")  # fmt: skip
    parser.add_argument("--json", default=None, help="also write the rows and the target to this JSON file")
    args = parser.parse_args(argv)
    try:
        args.large = large_clouds(args.large, args.points)
        args.knn_memory = knn_memory_sizes(args.knn_memory, args.points, args.device)
    except ValueError as e:
        parser.error(str(e))
    if args.knn_memory_calls < 2:
        parser.error(f"--knn-memory-calls must be at least 2 (growth is between calls), got {args.knn_memory_calls}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"# bench_points on {device}: {describe_machine(device)}; FPS backends: {', '.join(fps_backends(device))}")
    print(f"# load average before the run: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if backends.available("fps", "numba", device):
        cold, warm = numba_first_call_ms()
        print(f"# numba FPS first call in a fresh process: {cold:.0f} ms compiling, {warm:.0f} ms from the cache")
    print()
    fps_rows, knn_rows = point_op_rows(device, args.batch, args.points, args.channels, args.k, args.repeats)
    tables: list[dict] = []
    print_table(FPS_HEADERS, fps_rows, tables, title="Farthest point sampling")
    print()
    print_table(KNN_HEADERS, knn_rows, tables, title="K nearest neighbours (M queries, N references)")
    chamfer_rows = chamfer_backend_rows(device, args.batch, args.points, args.repeats)
    print()
    print_table(CHAMFER_HEADERS, chamfer_rows, tables, title="Chamfer loss and its backward pass (C = 3)")
    large_rows = large_cloud_rows(args.large, device, args.repeats, args.clouds)
    if args.large:
        print()
        print_table(LARGE_HEADERS, large_rows, tables, title="FPS on one large cloud (C = 3)")
        print(f"\n# load average after the run: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    memory_rows = []
    if args.knn_memory:
        memory_rows.append(knn_memory_row(args.knn_memory, args.k, args.threads or 1, args.knn_memory_calls))
        print()
        title = "KNN search memory (CPU, one cloud, float32, no_grad; a fresh process per measure)"
        print_table(KNN_MEMORY_HEADERS, memory_rows, tables, title=title)
    results = points_results(fps_rows, knn_rows, large_rows, memory_rows)
    results["chamfer"] = [dict(zip(CHAMFER_HEADERS, r)) for r in chamfer_rows]
    targets = [fps_cluster_target(results["fps"], args.device)]
    targets += knn_memory_targets(results["knn_memory"][0] if memory_rows else None)
    finish("bench_points", device, args, targets, argv=argv, results=results, tables=tables)


if __name__ == "__main__":
    main()
