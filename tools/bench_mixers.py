"""Benchmark of the sequence mixers: forward + backward time and peak memory against softmax attention.

    python tools/bench_mixers.py --lengths 1024 2048 4096 8192              # CPU (the table in docs/benchmarks.md)
    python tools/bench_mixers.py --device cuda                              # GPU: L up to 16K, every mixer

One layer of each mixer (width 256, 4 heads, batch 1, training mode: FSAT draws its random edges), training steps
``mixer(x).sum().backward()``, every configuration in a fresh process (on CPU; on CUDA in this one, ``--isolate``):
after one warm-up step, the peak memory of one
step (on CPU exact tensor accounting, PyTorch's ``MemTracker``: the bytes of the tensors the step creates, alive at
its peak; on CUDA ``torch.cuda.max_memory_allocated`` above what was allocated before the step), then the median time
of ``--repeats`` untracked steps. Ratios are against two baselines of the same L measured in the same run:

* ``attention-matmul``: vanilla softmax attention with explicit matmuls (the ``(B, H, L, L)`` scores materialized),
* ``attention-sdpa``: ``scaled_dot_product_attention`` (fused kernels where torch has them).

``hydra`` is Hydra's quasiseparable mixer (two SSMs, chunked scans: O(L) time and memory), ``linear`` normalized
linear attention and ``lowrank`` the framework's unnormalized low-rank mixer (both O(L D^2)).
Cauchy and Vandermonde cost O(L^2 D) operations (their matrices are sums over D): on CPU they run up to
``--max-quadratic-len``; their ``dense BHLLD MB`` column is what materializing the ``(B, H, L, L, D)`` tensor of the
public code would take (computed, float32), and ``vs BHLLD`` the ratio of our measured peak to it. They are built with
the default ``backend="auto"``: the chunked PyTorch path on CPU, the Triton kernels of
``attention/kernels/mixers_triton.py`` with ``--device cuda``.

Target (:func:`attention.bench.fsat_target`, on CUDA): FSAT faster than SDPA at L >= 16K (time as a fraction of
SDPA's < 1); printed under the table and written with every row to ``--json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from attention import build_mixer
from attention.bench import fsat_target
from engine.bench import (
    add_isolate_option,
    describe_machine,
    format_target,
    isolate_configs,
    peak_tensor_bytes,
    print_table,
    run_config,
    time_fn,
    write_report,
)

BASELINES = ("attention-matmul", "attention-sdpa")
MIXERS = (*BASELINES, "fsat", "fat", "linear", "lowrank", "toeplitz", "hydra", "cauchy", "vandermonde")
QUADRATIC = ("cauchy", "vandermonde", "cauchy_static", "vandermonde_static")


def _build(name: str, dim: int, heads: int, max_len: int) -> torch.nn.Module:
    if name == "attention-matmul":
        return build_mixer("softmax", dim, heads, sdpa=False)
    if name == "attention-sdpa":
        return build_mixer("softmax", dim, heads)
    return build_mixer(name, dim, heads, max_len=max_len)


def child(cfg: dict) -> None:
    print(json.dumps(measure(cfg)))


def measure(cfg: dict) -> dict:
    """Time (ms) and peak memory (MB) of one configuration's training step."""
    device = torch.device(cfg["device"])
    torch.manual_seed(0)
    B, L, C, H = cfg["B"], cfg["L"], cfg["C"], cfg["H"]
    layer = _build(cfg["mixer"], C, H, L).to(device).train()
    x = torch.randn(B, L, C, device=device, requires_grad=True)

    def step() -> None:
        layer(x).sum().backward()
        x.grad = None
        layer.zero_grad(set_to_none=True)

    if cfg["warmup"]:
        step()  # warm-up
    # Peak memory of one step: exact tensor accounting on CPU (tensors the step creates: activations, gradients,
    # temporaries), the allocator's peak above what was allocated before on CUDA.
    base = torch.cuda.memory_allocated(device) if device.type == "cuda" else 0
    t0 = time.perf_counter()
    peak = peak_tensor_bytes(step, device) - base
    ms = (time.perf_counter() - t0) * 1e3
    if cfg["time_separately"]:  # the tracked step carries the tracker's per-op overhead: time clean steps
        ms = time_fn(step, device, repeats=cfg["repeats"], warmup=0)
    return {"ms": ms, "peak_mb": peak / 2**20}


def _ratio(a: float | None, b: float | None) -> float:
    return a / b if a and b else float("nan")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lengths", type=int, nargs="+", default=[1024, 2048, 4096, 8192, 16384])
    parser.add_argument("--mixers", nargs="+", default=list(MIXERS), help="baselines are always measured")
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=1, help="timed steps (1: the peak-memory step is timed)")
    parser.add_argument("--max-quadratic-len", type=int, default=None, help="skip Cauchy/Vandermonde above this L")
    parser.add_argument("--json", default=None, help="also write the rows and the target to this JSON file")
    add_isolate_option(parser)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(json.loads(args.child))
        return []
    isolate = isolate_configs(args.isolate, args.device)
    names = [*BASELINES, *(m for m in args.mixers if m not in BASELINES)]
    B, C, H = args.batch, args.dim, args.heads
    print(f"# bench_mixers on {args.device}: {describe_machine(args.device)}")
    print(f"# B={B}, C={C}, H={H}, one forward + backward, training mode; {args.repeats} timed step(s)\n")
    results: list[dict] = []
    for L in args.lengths:
        res: dict[str, dict] = {}
        for name in names:
            if name in QUADRATIC and args.max_quadratic_len is not None and L > args.max_quadratic_len:
                res[name] = {"error": f"skipped (L > --max-quadratic-len {args.max_quadratic_len})"}
                continue
            # the O(L^2 D) mixers skip the warm-up step on CPU: one step is minutes there, one-time costs negligible
            # and time the memory step itself (the tracker's per-op overhead is nothing against their few large ops)
            slow = name in QUADRATIC and args.device == "cpu"
            cfg = dict(mixer=name, device=args.device, B=B, L=L, C=C, H=H, repeats=args.repeats, warmup=not slow,
                       time_separately=not slow)  # fmt: skip
            res[name] = run_config(__file__, measure, cfg, isolate)
            print(f"  L={L} {name}: {res[name]}", file=sys.stderr)
        for name, r in res.items():
            row = {"L": L, "mixer": name, **r}
            if "ms" in r:
                for base in BASELINES:
                    row[f"speedup vs {base}"] = _ratio(res[base].get("ms"), r["ms"])
                    row[f"memory vs {base}"] = _ratio(r["peak_mb"], res[base].get("peak_mb"))
            if name in QUADRATIC:
                row["dense_bhlld_mb"] = B * H * L * L * (C // H) * 4 / 2**20
                row["vs_bhlld"] = _ratio(r.get("peak_mb"), row["dense_bhlld_mb"])
            results.append(row)
    headers = ["L", "mixer", "ms", "peak MB"]
    headers += [f"{k} vs {b.split('-')[1]}" for b in BASELINES for k in ("time", "memory")]
    headers += ["dense BHLLD MB", "vs BHLLD"]
    rows = []
    for r in results:
        if "ms" not in r:
            rows.append([r["L"], r["mixer"], r.get("error", "")[:60], *[""] * (len(headers) - 3)])
            continue
        cells = [r["L"], r["mixer"], r["ms"], r["peak_mb"] if r["peak_mb"] is not None else float("nan")]
        for b in BASELINES:  # time as a fraction of the baseline's (the paper's "speed" is its inverse)
            cells += [1 / r[f"speedup vs {b}"] if r[f"speedup vs {b}"] else float("nan"), r[f"memory vs {b}"]]
        cells += [r["dense_bhlld_mb"], r["vs_bhlld"]] if "dense_bhlld_mb" in r else ["", ""]
        rows.append(cells)
    print_table(headers, rows)
    targets = [fsat_target(results, args.device)]
    print()
    for t in targets:
        print(format_target(t))
    if args.json:
        write_report(args.json, "bench_mixers", args.device, vars(args), results=results, targets=targets)
    return results


if __name__ == "__main__":
    main()
