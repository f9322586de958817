"""Benchmark of the point ops: FPS and KNN time per backend, with ratios to torch_cluster.

    python tools/bench_points.py                 # CPU grid
    python tools/bench_points.py --device cuda   # on a GPU machine

Grid: B in {8, 32}, N in {1024, 4096}, M in {N/2, N/4}. FPS samples M of N points; KNN finds the k nearest of the
N points for each of the M sampled points, in xyz (C = 3) and in a 64-d feature space. ``speedup vs cluster`` =
torch_cluster's time / the backend's time (> 1: faster than torch_cluster). Every backend's FPS indices are checked
against the reference in the same run.
"""

from __future__ import annotations

import argparse
import itertools
from functools import partial

import torch
from benchutil import describe_machine, print_table, time_fn

from attention import points


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--points", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--k", type=int, default=16, help="neighbours for the KNN rows")
    parser.add_argument("--channels", type=int, nargs="+", default=[3, 64], help="KNN dims (xyz, features)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    backends = [b for b in ("torch", "cluster", "pytorch3d", "triton") if points._available(b, device)]
    print(f"# bench_points on {device}: {describe_machine(device)}; backends: {', '.join(backends)}\n")
    fps_rows, knn_rows = [], []
    for B, N in itertools.product(args.batch, args.points):
        x = torch.rand(B, N, 3, device=device, generator=None)
        for M in (N // 2, N // 4):
            start = torch.zeros(B, dtype=torch.long, device=device)
            ref = points.farthest_point_sample(x, M, start=start, backend="torch")
            times = {}
            for b in backends:
                fn = partial(points.farthest_point_sample, x, M, start=start, backend=b)
                same = torch.equal(fn(), ref)
                times[b] = (time_fn(fn, device, repeats=args.repeats), same)
            base = times.get("cluster", (float("nan"), True))[0]
            for b, (ms, same) in times.items():
                fps_rows.append([B, N, M, b, ms, base / ms, "yes" if same else "NO"])
            for C in args.channels:
                feats = x if C == 3 else torch.randn(B, N, C, device=device)
                q = points.gather(feats, ref)
                ktimes = {}
                for b in [b for b in backends if b in points.KNN_BACKENDS]:
                    fn = partial(points.knn, q, feats, args.k, backend=b)
                    ktimes[b] = time_fn(fn, device, repeats=args.repeats)
                kbase = ktimes.get("cluster", float("nan"))
                for b, ms in ktimes.items():
                    knn_rows.append([B, N, M, C, args.k, b, ms, kbase / ms])
    print("## Farthest point sampling\n")
    print_table(["B", "N", "M", "backend", "ms", "speedup vs cluster", "same indices"], fps_rows)
    print("\n## K nearest neighbours (M queries, N references)\n")
    print_table(["B", "N", "M", "C", "k", "backend", "ms", "speedup vs cluster"], knn_rows)


if __name__ == "__main__":
    main()
