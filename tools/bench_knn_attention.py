"""The fused KNN-attention kernel's heads per program (`block_h`) at a model's shapes, against the gather path.

    python tools/bench_knn_attention.py --device cuda                    # the ModelNet40 model's four blocks
    python tools/bench_knn_attention.py --device cuda --preset centroid  # tools/bench_centroid.py's step
    python tools/bench_knn_attention.py --device cuda --block-h 1 4 --batch 128 --dtype fp32

Shapes (`attention.bench.KNN_KERNEL_PRESETS`): `modelnet`, the four KNN attentions of the ModelNet40 centroid
transformer at 1024 points (two self-attention blocks over each point's 24 nearest points, two centroid blocks),
batch 32; `centroid`, one centroid-attention step of `tools/bench_centroid.py` (M = N / 4, K = 32, C = 128 in 4
heads, N = 1K, 4K, 16K), batch 1. Rows (`attention.bench.knn_kernel_rows`): the gather path, and the fused
kernel (`attention.kernels.knn_attention_triton.knn_attention_triton`, CUDA) at each `--block-h`: forward
alone and forward + backward, each call `--inner` times a round (the GPU runs the launches back to back), the forms
of a shape timed round-robin over `--repeats` rounds, the median round per call; the kernel's speedup over
`block_h=1` and over the gather path, and its output's largest difference from the gather path's.

The second table sums forward + backward over the shapes for each `block_h`: the one with the least time is what
the layer's default should be for that model on that GPU. Under `TRITON_INTERPRET=1` the kernel also runs on CPU
(slowly: only its outputs mean anything there); otherwise a CPU run times the gather path alone.
"""

from __future__ import annotations

import argparse
import logging

import torch

from attention.bench import (
    KNN_KERNEL_HEADERS,
    KNN_KERNEL_PRESETS,
    knn_kernel_fastest,
    knn_kernel_rows,
    knn_kernel_shapes,
    knn_kernel_table,
)
from measure.bench import describe_machine, finish, print_table

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--preset", default="modelnet", choices=sorted(KNN_KERNEL_PRESETS))
    parser.add_argument("--shape", nargs=6, action="append", default=None, metavar=("NAME", "M", "N", "K", "H", "D"),
                        help="time these shapes instead of the preset's (repeat the flag for several)")  # fmt: skip
    parser.add_argument("--batch", type=int, default=None,
                        help="default: the preset's (modelnet 32, centroid 1); 1 with --shape")  # fmt: skip
    parser.add_argument("--block-h", type=int, nargs="+", default=[1, 2, 4],
                        help="heads per program of the kernel's rows (powers of two)")  # fmt: skip
    parser.add_argument("--dtype", choices=sorted(DTYPES), default=None,
                        help="of q, k, v (default: bf16 on CUDA, as under AMP; fp32 on CPU)")  # fmt: skip
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--inner", type=int, default=None, help="calls per timed round (default: 20 on CUDA, 1 on CPU)")
    parser.add_argument("--json", default=None, help="also write the rows to this JSON file")
    args = parser.parse_args(argv)
    bad = [b for b in args.block_h if b < 1 or b & (b - 1)]
    if bad:
        parser.error(f"--block-h takes powers of two, got {bad}")
    for flag, value in (("--batch", args.batch), ("--repeats", args.repeats), ("--inner", args.inner)):
        if value is not None and value < 1:
            parser.error(f"{flag} must be >= 1, got {value}")
    preset = args.preset
    if args.shape:
        try:
            preset = [(name, *(int(n) for n in sizes)) for name, *sizes in args.shape]
        except ValueError:
            parser.error(f"--shape takes a name and five integers M N K H D, got {args.shape}")
    try:
        shapes = knn_kernel_shapes(preset, args.batch)
    except ValueError as e:
        parser.error(str(e))
    logging.basicConfig(level=logging.INFO, format="  %(message)s")  # each shape as it is timed, on stderr
    cuda = args.device == "cuda"
    dtype = DTYPES[args.dtype or ("bf16" if cuda else "fp32")]
    inner = args.inner or (20 if cuda else 1)
    print(f"# bench_knn_attention on {args.device}: {describe_machine(args.device)}")
    what = "shapes of --shape" if args.shape else f"preset {args.preset}"
    print(f"# {what}, {dtype}, median of {args.repeats} rounds of {inner} calls\n", flush=True)
    rows = knn_kernel_rows(shapes, args.device, block_hs=args.block_h, dtype=dtype, repeats=args.repeats, inner=inner)
    tables: list[dict] = []
    print_table(KNN_KERNEL_HEADERS, knn_kernel_table(rows), tables)
    fastest = knn_kernel_fastest(rows)
    if fastest is not None:
        one = {s["block_h"]: s["step_ms"] for s in fastest["sums"]}.get(1)
        summed = [[s["block_h"], s["step_ms"], one / s["step_ms"] if one else "-"] for s in fastest["sums"]]
        print_table(["block_h", "fwd+bwd ms", "vs block_h=1"], summed, tables, title="fwd+bwd summed over the shapes")
        print(f"fastest: block_h={fastest['block_h']} ({fastest['step_ms']:.3g} ms over the shapes)")
    finish("bench_knn_attention", args.device, args, [], argv=argv, results=rows, tables=tables, fastest=fastest)
    return {"rows": rows, "fastest": fastest}


if __name__ == "__main__":
    main()
