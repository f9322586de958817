"""Benchmark of the point ops: FPS and KNN time per backend, with ratios to torch_cluster.

    python tools/bench_points.py                 # CPU grid
    python tools/bench_points.py --device cuda   # on a GPU machine

Grid: B in {8, 32}, N in {1024, 4096}, M in {N/2, N/4}. FPS samples M of N points; KNN finds the k nearest of the
N points for each of the M sampled points, in xyz (C = 3) and in a 64-d feature space. ``speedup vs cluster`` =
torch_cluster's time / the backend's time (> 1: faster than torch_cluster). Every backend's FPS indices are checked
against the reference in the same run.

Large single clouds (``--large``, default 50K / M = 4096 and 100K / M = 8192, CPU): every exact FPS backend and the
approximate ``fpsample_bucket``, with each one's time relative to the bucket FPS and to the reference, and its
coverage (the largest distance from a point to its nearest sample, which FPS greedily minimizes) relative to exact
FPS, on a uniform cloud in the unit cube and a clustered one (``--clouds``: 16 Gaussian blobs, where a spatial index
prunes differently). The ``auto`` row shows which backend ``backend="auto"`` picks for that shape.

Target (:func:`attention.bench.fps_cluster_target`, on CUDA): the Triton FPS at least 2x torch-cluster's at B=32,
N=1024, M=512; printed under the tables and written with every row to ``--json``.

With numba installed, the first line also gives the numba FPS's first-call cost in a fresh process: compiling into an
empty cache, and loading the compiled code from the cache (the usual case after the first run).
"""

from __future__ import annotations

import argparse
import itertools
import os
import subprocess
import sys
import tempfile
from functools import partial

import torch

from attention import backends, points
from attention.bench import fps_cluster_target
from engine.bench import describe_machine, format_target, print_table, time_fn, write_report

FPS_HEADERS = ["B", "N", "M", "backend", "ms", "speedup vs cluster", "same indices"]
KNN_HEADERS = ["B", "N", "M", "C", "k", "backend", "ms", "speedup vs cluster"]
LARGE_HEADERS = ["cloud", "N", "M", "backend", "kind", "ms", "time / bucket", "speedup vs reference",
                 "same indices as exact", "coverage / exact"]  # fmt: skip


def _coverage(x: torch.Tensor, idx: torch.Tensor) -> float:
    """Largest distance from a point to its nearest sample (the quantity FPS greedily minimizes)."""
    return float(points.knn(x, points.gather(x, idx), 1, backend="torch")[0].max().sqrt())


def _cloud(kind: str, N: int, device: torch.device) -> torch.Tensor:
    g = torch.Generator(device).manual_seed(N)
    if kind == "uniform":
        return torch.rand(1, N, 3, device=device, generator=g)
    centres = torch.rand(16, 3, device=device, generator=g)
    which = torch.randint(0, 16, (N,), device=device, generator=g)
    return (centres[which] + 0.02 * torch.randn(N, 3, device=device, generator=g))[None]


_FIRST_CALL = (
    "import time, torch; t = time.perf_counter(); from attention.points import farthest_point_sample; "
    "farthest_point_sample(torch.rand(1, 100, 3), 10, backend='numba'); print((time.perf_counter() - t) * 1e3)"
)


def numba_first_call_ms() -> tuple[float, float]:
    """Import + first numba FPS call in a fresh process: compiling into an empty cache, then loading from it."""
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        cold, warm = (float(subprocess.check_output([sys.executable, "-c", _FIRST_CALL], env=env)) for _ in range(2))
    return cold, warm


def large_cloud_rows(sizes: list[tuple[int, int]], device: torch.device, repeats: int, clouds: list[str]) -> list[list]:
    """FPS on one large cloud per size and kind: every installed backend, times relative to the bucket FPS and the
    reference, coverage."""
    rows = []
    names = [b for b in backends.backend_names("fps") if backends.available("fps", b, device)]
    for (N, M), kind in itertools.product(sizes, clouds):
        x = _cloud(kind, N, device)
        start = torch.zeros(1, dtype=torch.long, device=device)
        ref = points.farthest_point_sample(x, M, start=start, backend="torch")
        ref_cov = _coverage(x, ref)
        results = {}
        for b in names:
            if backends.BACKENDS["fps"][b].unsupported(device, {"N": N, "C": 3}) is not None:
                continue
            fn = partial(points.farthest_point_sample, x, M, start=start, backend=b)
            idx = fn()
            results[b] = (time_fn(fn, device, repeats=repeats), torch.equal(idx, ref), _coverage(x, idx) / ref_cov)
        bucket_ms = results.get("fpsample_bucket", (float("nan"),))[0]
        ref_ms = results["torch"][0]
        shape = {"B": 1, "N": N, "C": 3, "M": M, "masked": False}
        auto = backends.resolve("fps", "auto", device, shape)
        for b, (ms, same, cov) in results.items():
            exact = backends.BACKENDS["fps"][b].exact
            name = f"{b} (auto)" if b == auto else b
            kind_ = "exact" if exact else "approx"
            rows.append([kind, N, M, name, kind_, ms, ms / bucket_ms, ref_ms / ms, "yes" if same else "no", cov])
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--points", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--k", type=int, default=16, help="neighbours for the KNN rows")
    parser.add_argument("--channels", type=int, nargs="+", default=[3, 64], help="KNN dims (xyz, features)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--clouds", nargs="+", default=["uniform", "clustered"], choices=["uniform", "clustered"])
    parser.add_argument(
        "--large",
        type=int,
        nargs="*",
        default=[50000, 4096, 100000, 8192],
        help="single-cloud FPS rows as N M pairs (empty: skip)",
    )
    parser.add_argument("--json", default=None, help="also write the rows and the target to this JSON file")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    # every installed FPS backend but the bucket approximation (it has its own table); `same indices` shows which
    # ones are exact
    names = [
        b for b in backends.backend_names("fps") if b != "fpsample_bucket" and backends.available("fps", b, device)
    ]
    print(f"# bench_points on {device}: {describe_machine(device)}; FPS backends: {', '.join(names)}")
    print(f"# load average before the run: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    if backends.available("fps", "numba", device):
        cold, warm = numba_first_call_ms()
        print(f"# numba FPS first call in a fresh process: {cold:.0f} ms compiling, {warm:.0f} ms from the cache")
    print()
    fps_rows, knn_rows = [], []
    for B, N in itertools.product(args.batch, args.points):
        x = torch.rand(B, N, 3, device=device, generator=None)
        for M in (N // 2, N // 4):
            start = torch.zeros(B, dtype=torch.long, device=device)
            ref = points.farthest_point_sample(x, M, start=start, backend="torch")
            times = {}
            for b in names:
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
                for b in [b for b in backends.backend_names("knn") if backends.available("knn", b, device)]:
                    fn = partial(points.knn, q, feats, args.k, backend=b)
                    ktimes[b] = time_fn(fn, device, repeats=args.repeats)
                kbase = ktimes.get("cluster", float("nan"))
                for b, ms in ktimes.items():
                    knn_rows.append([B, N, M, C, args.k, b, ms, kbase / ms])
    print("## Farthest point sampling\n")
    print_table(FPS_HEADERS, fps_rows)
    print("\n## K nearest neighbours (M queries, N references)\n")
    print_table(KNN_HEADERS, knn_rows)
    large_rows = []
    if args.large:
        sizes = list(zip(args.large[::2], args.large[1::2]))
        large_rows = large_cloud_rows(sizes, device, args.repeats, args.clouds)
        print("\n## FPS on one large cloud (C = 3)\n")
        print_table(LARGE_HEADERS, large_rows)
        print(f"\n# load average after the run: {' '.join(f'{v:.2f}' for v in os.getloadavg())}")
    results = {
        "fps": [dict(zip(FPS_HEADERS, r)) for r in fps_rows],
        "knn": [dict(zip(KNN_HEADERS, r)) for r in knn_rows],
        "large": [dict(zip(LARGE_HEADERS, r)) for r in large_rows],
    }
    targets = [fps_cluster_target(results["fps"], args.device)]
    print()
    for t in targets:
        print(format_target(t))
    if args.json:
        write_report(args.json, "bench_points", device, vars(args), results=results, targets=targets)


if __name__ == "__main__":
    main()
