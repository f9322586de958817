"""Benchmark of centroid attention: dense vs the KNN forms, time (forward + backward) and peak memory.

    python tools/bench_centroid.py                 # CPU (the Triton and compiled rows say why they are skipped)
    python tools/bench_centroid.py --device cuda   # GPU machine: every row and the target verdicts

N in {1024, 4096, 8192, 16384}, M = N / 4 centroids, K = 32 neighbours, C = 128 channels, 4 heads, batch 1.
Implementations of one attention step from M centroids to N inputs, with the same projections
(:data:`attention.bench.CENTROID_PATHS`):

* ``dense-matmul``: softmax(Q K^T) V with the (B, H, M, N) score matrix materialized (a plain implementation);
* ``dense-sdpa``:   the layer's dense path, ``scaled_dot_product_attention`` (fused kernels where torch has them);
* ``knn``:          the layer's KNN path (K nearest inputs in feature space, gathered keys and values);
* ``knn-masked``:   the same neighbours, attention as dense products under the (B, M, N) neighbour mask;
* ``knn-triton``:   the same neighbours, the fused Triton kernel (``attn_backend="triton"``; CUDA only);
* ``knn-compiled``: ``torch.compile`` of the KNN path in the form ``"auto"`` took before the fused kernel (masked
  while N / K <= 128, else gather): what the compiler alone gives (``--compiled``, default on CUDA only).

Peak memory is the growth of the peak resident set of a fresh process during forward + backward on CPU (a process
per configuration), and ``torch.cuda.max_memory_allocated`` on CUDA (all in this process; ``--isolate`` says).
Ratios are against ``dense-matmul`` and ``dense-sdpa`` of the same N. Targets (:func:`attention.bench.
centroid_targets`, verdicts on CUDA): the fused step faster than SDPA at every N from 1K to 16K, with a lower peak.
"""

from __future__ import annotations

import argparse
import json
import sys

from attention.bench import CENTROID_PATHS, centroid_path_skipped, centroid_step, centroid_targets
from engine.bench import (
    add_isolate_option,
    describe_machine,
    format_target,
    isolate_configs,
    print_table,
    run_config,
    write_report,
)

HEADERS = ["N", "M", "path", "ms", "peak MB", "speedup vs matmul", "memory vs matmul", "speedup vs sdpa",
           "memory vs sdpa"]  # fmt: skip


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--points", type=int, nargs="+", default=[1024, 4096, 8192, 16384])
    parser.add_argument("--k", type=int, default=32)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--paths", nargs="+", default=list(CENTROID_PATHS), choices=CENTROID_PATHS,
                        help="rows to time (default: all)")  # fmt: skip
    parser.add_argument("--compiled", choices=["auto", "yes", "no"], default="auto",
                        help="time the knn-compiled row (auto: on CUDA only; a CPU compiles for minutes)")  # fmt: skip
    add_isolate_option(parser)
    parser.add_argument("--json", default=None, help="also write the rows and targets to this JSON file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(centroid_step(json.loads(args.child))))
        return
    isolate = isolate_configs(args.isolate, args.device)
    compiled = args.compiled == "yes" or (args.compiled == "auto" and args.device.startswith("cuda"))
    print(f"# bench_centroid on {args.device}: {describe_machine(args.device)}")
    print(f"# B={args.batch}, C={args.dim}, H={args.heads}, M=N/4, K={args.k}; forward + backward")
    skipped = {p: why for p in args.paths if (why := centroid_path_skipped(p, args.device, compiled))}
    for path, why in skipped.items():
        print(f"# {path}: not measured: {why}")
    print()
    rows, results = [], []
    for N in args.points:
        res = {}
        for path in args.paths:
            if path in skipped:
                res[path] = {"note": skipped[path]}
                continue
            cfg = dict(path=path, device=args.device, B=args.batch, N=N, M=N // 4, C=args.dim, H=args.heads)
            res[path] = run_config(__file__, centroid_step, {**cfg, "K": args.k, "repeats": args.repeats}, isolate)
            print(f"  N={N} {path}: {res[path]}", file=sys.stderr)
        for path, r in res.items():
            results.append({"N": N, "M": N // 4, "path": path, **r})
            if "ms" not in r:
                note = f"error: {r['error'][:60]}" if "error" in r else "not measured (see above)"
                rows.append([N, N // 4, path, note, "", "", "", "", ""])
                continue
            ratios = []
            for base in ("dense-matmul", "dense-sdpa"):
                b = res.get(base, {})
                ratios.append(b["ms"] / r["ms"] if "ms" in b else float("nan"))
                ok = b.get("peak_mb") and r["peak_mb"] is not None
                ratios.append(r["peak_mb"] / b["peak_mb"] if ok else float("nan"))
            peak = r["peak_mb"] if r["peak_mb"] is not None else float("nan")
            label = f"{path} ({r['form']})" if "form" in r else path
            rows.append([N, N // 4, label, r["ms"], peak, *ratios])
    print_table(HEADERS, rows)
    goals = centroid_targets(results, args.device)
    print()
    for t in goals:
        print(format_target(t))
    if args.json:
        write_report(args.json, "bench_centroid", args.device, vars(args), results=results, targets=goals)


if __name__ == "__main__":
    main()
