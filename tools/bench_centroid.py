"""Benchmark of centroid attention: dense vs KNN, time (forward + backward) and peak memory.

    python tools/bench_centroid.py                 # CPU
    python tools/bench_centroid.py --device cuda   # GPU machine

N in {1024, 4096, 8192, 16384}, M = N / 4 centroids, K = 32 neighbours, C = 128 channels, 4 heads, batch 1.
Four implementations of one attention step from M centroids to N inputs, with the same projections:

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
import json
import sys

import torch

from attention import CentroidAttention, attention_step_reference
from engine.bench import (
    add_isolate_option,
    current_rss_bytes,
    describe_machine,
    isolate_configs,
    peak_rss_bytes,
    print_table,
    run_config,
    time_fn,
    write_report,
)


def child(cfg: dict) -> None:
    print(json.dumps(measure(cfg)))


def measure(cfg: dict) -> dict:
    """Time (ms) and peak memory (MB; None where the resident set did not grow) of one configuration's step."""
    device = torch.device(cfg["device"])
    torch.manual_seed(0)
    B, N, M, C, H, K = cfg["B"], cfg["N"], cfg["M"], cfg["C"], cfg["H"], cfg["K"]
    knn = cfg["mode"].startswith("knn")
    backend = "masked" if cfg["mode"] == "knn-masked" else "gather"
    layer = CentroidAttention(C, H, num_neighbors=K if knn else None, attn_backend=backend).to(device)
    x = torch.randn(B, N, C, device=device, requires_grad=True)
    u = torch.randn(B, M, C, device=device, requires_grad=True)

    def step() -> None:
        out = attention_step_reference(layer, x, u) if cfg["mode"] == "dense-matmul" else layer(x, u)
        out.sum().backward()
        x.grad = u.grad = None
        layer.zero_grad(set_to_none=True)

    step()  # warm-up; then measure the peak of one clean step
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        base = current_rss_bytes()
        before = peak_rss_bytes()
        step()
        peak = max(peak_rss_bytes() - base, 0) if peak_rss_bytes() > before else None
    ms = time_fn(step, device, repeats=cfg["repeats"], warmup=0)
    return {"ms": ms, "peak_mb": None if peak is None else peak / 2**20}


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
    add_isolate_option(parser)
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return
    isolate = isolate_configs(args.isolate, args.device)
    print(f"# bench_centroid on {args.device}: {describe_machine(args.device)}")
    print(f"# B={args.batch}, C={args.dim}, H={args.heads}, M=N/4, K={args.k}; forward + backward\n")
    rows = []
    for N in args.points:
        res = {}
        for mode in ("dense-matmul", "dense-sdpa", "knn", "knn-masked"):
            cfg = dict(mode=mode, device=args.device, B=args.batch, N=N, M=N // 4, C=args.dim, H=args.heads)
            res[mode] = run_config(__file__, measure, {**cfg, "K": args.k, "repeats": args.repeats}, isolate)
            print(f"  N={N} {mode}: {res[mode]}", file=sys.stderr)
        for mode, r in res.items():
            if "error" in r:
                rows.append([N, N // 4, mode, "error: " + r["error"][:60], "", "", "", "", ""])
                continue
            ratios = []
            for base in ("dense-matmul", "dense-sdpa"):
                b = res[base]
                ratios.append(b["ms"] / r["ms"] if "ms" in b else float("nan"))
                ok = "peak_mb" in b and b["peak_mb"] and r["peak_mb"] is not None
                ratios.append(r["peak_mb"] / b["peak_mb"] if ok else float("nan"))
            peak = r["peak_mb"] if r["peak_mb"] is not None else float("nan")
            rows.append([N, N // 4, mode, r["ms"], peak, *ratios])
    print_table(HEADERS, rows)
    if args.json:
        results = [dict(zip(HEADERS, r)) for r in rows]
        write_report(args.json, "bench_centroid", args.device, vars(args), results=results, targets=[])


if __name__ == "__main__":
    main()
