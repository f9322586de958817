"""Benchmark of the sequence mixers: forward + backward time and peak memory against softmax attention.

    python tools/bench_mixers.py --lengths 1024 2048 4096 8192              # CPU (the table in docs/benchmarks.md)
    python tools/bench_mixers.py --device cuda                              # GPU: L up to 16K, every mixer
    python tools/bench_mixers.py --lengths 128 --dim 32 --heads 2 --mixers fsat cauchy   # seconds
    python tools/bench_mixers.py --device cuda --lengths 4096 --mixers fsat --profile runs/profile   # what bounds it

One layer of each mixer (width 256, 4 heads, batch 1, training mode: FSAT draws its random edges), training steps
`mixer(x).sum().backward()`, every configuration in a fresh process (on CPU; on CUDA in this one, `--isolate`):
after one warm-up step, the peak memory of one step (on CPU exact tensor accounting, PyTorch's `MemTracker`: the
bytes of the tensors the step creates, alive at its peak; on CUDA `torch.cuda.max_memory_allocated` above what was
allocated before the step), then the median time of `--repeats` untracked steps (`attention.bench.mixer_rows`).
Ratios are against two baselines of the same L measured in the same run:

* `attention-matmul`: vanilla softmax attention with explicit matmuls (the `(B, H, L, L)` scores materialized),
* `attention-sdpa`: `scaled_dot_product_attention` (fused kernels where torch has them).

`hydra` is Hydra's quasiseparable mixer (two SSMs, chunked scans: O(L) time and memory), `linear` normalized
linear attention and `lowrank` the framework's unnormalized low-rank mixer (both O(L D^2)).

`fsat` and `hydra` run what `"auto"` picks: on CUDA the fused Triton kernels
(`attention/kernels/fsat_triton.py`, `attention/kernels/ssd_triton.py`). Beside them, `fsat-torch` /
`hydra-torch` run the plain PyTorch path auto picks without the kernels (FSAT: gather on CUDA, csr on CPU; Hydra:
the chunked scan; a CPU run skips these rows, the same paths as `fsat` / `hydra` there), and `fsat-compiled` /
`hydra-compiled` that path under `torch.compile` (FSAT's gather products: dynamo does not trace csr's sparse
tensors), compiled in the warm-up step: what the compiler alone gives. `fsat-fused-compiled` /
`hydra-fused-compiled` compile the layer with the kernels, which stay opaque operators in the compiled graph
(`attention.kernels.ops`) while inductor fuses the small ops around them: what `"auto"` runs in a compiled
model. `fsat-fused-graphs` / `hydra-fused-graphs` compile them with `mode="reduce-overhead"`: CUDA graphs replay
the whole step without a CPU cost per launch, which bounds small batches (no peak memory: the graphs' pool holds their
tensors, see the GPU guide). `fsat-fused-captured` / `hydra-fused-captured` capture the eager kernels' step whole
(`measure.bench.capture_graphs`: one replay forward and one backward, no compiler and no guards, the least host
work a step; no peak either), and `fsat-fused-compiled-captured` / `hydra-fused-compiled-captured` capture the
compiled step so (inductor's fused kernels, `mode="default"`, compiled in the capture's warm-up steps), which is
what a `reduce-overhead` row runs without its cudagraph trees' host work. The fused rows run on CUDA only (a CPU
run skips them). The table names each of these rows' path.

Cauchy and Vandermonde cost O(L^2 D) operations (their matrices are sums over D): on CPU they run up to
`--max-quadratic-len`; their `dense BHLLD MB` column is what materializing the `(B, H, L, L, D)` tensor of the
public code would take (computed, float32), and `vs BHLLD` the ratio of our measured peak to it. They are built with
the default `backend="auto"`: the chunked PyTorch path on CPU, the Triton kernels of
`attention/kernels/mixers_triton.py` with `--device cuda`.

Targets (on CUDA; printed under the table and written with every row to `--json`): FSAT faster than SDPA at
L >= 16K (`attention.bench.fsat_target`), and those of the fused kernels, eager, compiled or in CUDA graphs
(compiled or captured), whichever row ran fastest (`attention.bench.mixer_kernel_targets`, for B = 1 and
B = 8): FSAT at most 0.4x vanilla attention's time and 0.16x its peak memory at 4K and faster than SDPA from 8K,
Hydra faster than SDPA from 4K and at most 2.2x slower at 16K than at 8K. `--batch` takes several sizes, one table
each, the batch named in each verdict:

    python tools/bench_mixers.py --device cuda --lengths 1024 2048 4096 8192 16384 --batch 1 8
"""

from __future__ import annotations

import argparse
import logging

from attention.bench import BENCH_MIXERS, fsat_target, mixer_kernel_targets, mixer_rows, mixer_table
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


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--mixers", nargs="+", default=list(BENCH_MIXERS), help="baselines are always measured")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, nargs="+", default=[1], help="one table per batch size")
    parser.add_argument("--repeats", type=int, default=1, help="timed steps (1: the peak-memory step is timed)")
    parser.add_argument("--max-quadratic-len", type=int, default=None, help="skip Cauchy/Vandermonde above this L")
    parser.add_argument("--json", default=None, help="also write the rows and the target to this JSON file")
    add_profile_option(parser)
    add_isolate_option(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="  %(message)s")  # each configuration's result, on stderr
    print(f"# bench_mixers on {args.device}: {describe_machine(args.device)}")
    print(f"# B={' and '.join(map(str, args.batch))}, C={args.dim}, H={args.heads}, one forward + backward, training "
          f"mode; {args.repeats} timed step(s)\n")  # fmt: skip
    isolate = isolate_configs(args.isolate, args.device)
    several = len(args.batch) > 1
    results: list[dict] = []
    tables: list[dict] = []
    targets: list[dict] = []
    for batch in args.batch:
        rows = mixer_rows(args.device, args.lengths, args.mixers, dim=args.dim, heads=args.heads, batch=batch,
                          repeats=args.repeats, max_quadratic_len=args.max_quadratic_len, isolate=isolate,
                          profile=args.profile)  # fmt: skip
        results += [{"B": batch, **r} for r in rows]
        print_table(*mixer_table(rows), tables, title=f"B = {batch}" if several else None)
        print()
        if args.profile:
            profiled = profile_rows(rows, lambda r: f"L={r['L']} {r['mixer']}")
            print_table(PROFILE_HEADERS, profiled, tables, title=f"profile, B = {batch} ({args.profile})")
            print()
        named = batch if several else None
        targets += [fsat_target(rows, args.device, named), *mixer_kernel_targets(rows, args.device, named)]
    finish("bench_mixers", args.device, args, targets, argv=argv, results=results, tables=tables)
    return results


if __name__ == "__main__":
    main()
