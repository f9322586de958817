"""Dynamic routing vs centroid attention in the point capsule autoencoder, both sizes, in one run.

    python tools/bench_capsules.py                                    # CPU: 2048 points, batch 8, budget 12 GB
    python tools/bench_capsules.py --device cuda --budget-gb 12       # GPU: peak memory from the CUDA allocator
    python tools/bench_capsules.py --models pointcaps_routing_small pointcaps_centroid_small --train-steps 20

For every registered model (``pointcaps_{routing,centroid}_{small,base}``), on the same random unit-sphere clouds:

* params;
* train-step time: forward + Chamfer loss + backward + Adam step at ``--batch`` clouds of ``--points`` points; all
  models are built first and timed round-robin (each of ``--repeats`` rounds times one step of every model in turn,
  so background load hits all alike), median (or ``--stat min``) of the rounds;
* peak memory of forward + backward (the batch-dependent part of a train step; the optimizer step's temporaries do
  not depend on the batch, and inside the measured peak they would hide the activations at small batches and bend
  the slope): measured in a fresh process per (model, batch size) at two batch sizes
  (``--mem-batches``): on CPU the peak resident set during the step (``VmHWM`` after resetting it through
  ``/proc/self/clear_refs``) minus the resident set after a warm-up step (model, Adam states and the framework are
  in it), on CUDA ``torch.cuda.max_memory_allocated`` minus the allocated memory
  after a warm-up step. Memory per sample = the slope between the two batch sizes; the largest batch within
  ``--budget-gb`` = ``floor((budget - static - intercept) / slope)``, static being the model + Adam state memory
  (params x 16 bytes: weights, gradients, two moments), i.e. a linear extrapolation of two measurements;
* Chamfer distance (``capsules.CHAMFER_DEFINITION``) and part purity on the embedded synthetic part shapes' test split
  after ``--train-steps`` Adam steps (lr ``--lr``, batch 8, ``--chamfer-points`` points, the same shapes in the same
  order for every model).

Ratios: each centroid model against the routing model of its size, measured in the same run. Targets (issue 5):
centroid max batch >= 3x routing (paper 58 vs 22 at 12 capsules, 36 vs 12 at 64), params <= 1/3 of routing, lower
Chamfer after the same steps (paper x 1e-3: 1.6 vs 2.7 at 12 capsules, 1.4 vs 1.5 at 64, after full training).
Absolute times are meaningful only on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing

import numpy as np
import torch
from benchutil import (
    current_rss_bytes,
    describe_machine,
    peak_rss_bytes,
    print_table,
    run_isolated,
    sync,
    unit_sphere_clouds,
)

from capsules import CHAMFER_DEFINITION, chamfer_distance, create_model, list_models
from capsules.metrics import capsule_purity
from engine import atomic_write_text, count_params

PAIRS = {"small": ("pointcaps_routing_small", "pointcaps_centroid_small"),
         "base": ("pointcaps_routing_base", "pointcaps_centroid_base")}  # fmt: skip
# Paper (section 3.3): Chamfer x 1e-3, params (M), max batch per GPU.
PAPER = {
    "pointcaps_routing_small": (2.7, 18.4, 22),
    "pointcaps_centroid_small": (1.6, 0.6, 58),
    "pointcaps_routing_base": (1.5, 19.8, 12),
    "pointcaps_centroid_base": (1.4, 5.3, 36),
}
TARGETS = {"max_batch": 3.0, "params": 1 / 3}


def _step_fn(model: torch.nn.Module, opt: torch.optim.Optimizer, clouds: torch.Tensor):
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = chamfer_distance(model(clouds), clouds)
        loss.backward()
        opt.step()

    return step


def _reset_peak_rss() -> bool:
    """Reset the kernel's peak-RSS mark (VmHWM) of this process (Linux >= 4.0); False where not allowed."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
        return True
    except OSError:
        return False


def _peak_rss_since_reset() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return peak_rss_bytes()


def child(payload: dict) -> dict:
    """One (model, batch) peak-memory measurement, run in a fresh process by :func:`measure_memory`."""
    device = torch.device(payload["device"])
    torch.manual_seed(0)
    kwargs = {"num_points": payload["points"], "primary_backend": payload["primary"], **payload["kwargs"]}
    model = create_model(payload["model"], **kwargs).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    _step_fn(model, opt, unit_sphere_clouds(2, payload["points"], seed=1).to(device))()  # Adam states exist now
    clouds = unit_sphere_clouds(payload["batch"], payload["points"], seed=2).to(device)

    def step() -> None:  # forward + backward into the existing gradient buffers; no optimizer step (see below)
        chamfer_distance(model(clouds), clouds).backward()

    if device.type == "cuda":
        sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        static = torch.cuda.memory_allocated(device)
        step()
        sync(device)
        peak = torch.cuda.max_memory_allocated(device)
    else:
        static = current_rss_bytes()
        # Without the reset, the lifetime peak could come from building the model (0.01 * randn of W is two copies).
        reset = _reset_peak_rss()
        step()
        peak = _peak_rss_since_reset() if reset else peak_rss_bytes()
    return {"static": static, "peak": peak, "step_bytes": max(peak - static, 0)}


def measure_memory(name: str, args: argparse.Namespace) -> dict:
    """Step memory at two batch sizes in isolated processes; slope = bytes per sample; max batch in the budget."""
    b1, b2 = args.mem_batches
    payloads = [{"model": name, "batch": b, "points": args.points, "device": args.device,
                 "primary": args.primary_backend, "kwargs": args.model_kwargs} for b in (b1, b2)]  # fmt: skip
    runs = [run_isolated(__file__, p) for p in payloads]
    errors = [r["error"] for r in runs if "error" in r]
    if errors:
        raise RuntimeError(f"memory measurement of {name} failed: {errors[0]}")
    per_sample = max((runs[1]["step_bytes"] - runs[0]["step_bytes"]) / (b2 - b1), 1.0)
    intercept = runs[0]["step_bytes"] - per_sample * b1
    static = args.params[name] * 16  # weights, gradients, Adam's two moments (float32)
    max_batch = math.floor((args.budget_gb * 2**30 - static - intercept) / per_sample)
    return {"mem_mb_per_sample": per_sample / 2**20, "mem_step_mb": [r["step_bytes"] / 2**20 for r in runs],
            "mem_static_mb": static / 2**20, "max_batch": max(max_batch, 0)}  # fmt: skip


def train_chamfer(name: str, args: argparse.Namespace, train, test) -> dict:
    """Chamfer and part purity on the test shapes after ``--train-steps`` Adam steps from the same seed and order."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    kwargs = {"num_points": args.chamfer_points, "primary_backend": args.primary_backend, **args.model_kwargs}
    model = create_model(name, **kwargs).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    xs = torch.stack([train[i][0] for i in range(len(train))])
    order = np.random.default_rng(0).permutation(np.tile(np.arange(len(train)), args.train_steps * 8 // len(train) + 1))
    start = time.perf_counter()
    for s in range(args.train_steps):
        batch = xs[order[s * 8 : (s + 1) * 8]].to(device)
        _step_fn(model, opt, batch)()
    elapsed = time.perf_counter() - start
    model.eval()
    points = torch.stack([test[i][0] for i in range(len(test))]).to(device)
    parts = torch.stack([test[i][1] for i in range(len(test))]).to(device)
    with torch.no_grad():
        recon = model(points)
        chamfer = float(chamfer_distance(recon, points))
        purity = capsule_purity(recon, model.point_capsule, points, parts, num_capsules=model.num_latent)
    return {"chamfer": chamfer, "part_purity": float(purity[~torch.isnan(purity)].mean()), "train_s": elapsed}


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", nargs="+", default=None, help="subset of the registered models (default: all)")
    parser.add_argument("--points", type=int, default=2048, help="points per cloud for time and memory")
    parser.add_argument("--batch", type=int, default=8, help="batch of the timed train steps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--stat", default="median", choices=["median", "min"])
    parser.add_argument("--budget-gb", type=float, default=12.0, help="memory budget of the max-batch column")
    parser.add_argument("--mem-batches", type=int, nargs=2, default=[4, 16], metavar=("B1", "B2"))
    parser.add_argument("--primary-backend", default="fused", choices=["fused", "torch"],
                        help="primary capsules: fused (ours) or torch (Conv1d + BN + max)")  # fmt: skip
    parser.add_argument("--train-steps", type=int, default=60, help="Adam steps before the Chamfer column")
    parser.add_argument("--chamfer-points", type=int, default=256, help="points per cloud for the Chamfer column")
    parser.add_argument("--train-per-class", type=int, default=16, help="synthetic train shapes per class")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model-kwargs", type=json.loads, default={},
                        help='JSON overrides for every model, e.g. \'{"num_primary": 32}\' (smoke tests)')  # fmt: skip
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.child is not None:
        if args.threads:
            torch.set_num_threads(args.threads)
        print(json.dumps(child(json.loads(args.child))))
        return []
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no CUDA device")
    if args.batch < 2 or min(args.mem_batches) < 2 or args.mem_batches[0] >= args.mem_batches[1]:
        parser.error("--batch and --mem-batches need >= 2 clouds (BatchNorm), and B1 < B2")
    models = args.models or list_models()
    unknown = sorted(set(models) - set(list_models()))
    if unknown:
        parser.error(f"unknown models {unknown}; registered: {list_models()}")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    print(f"# bench_capsules on {args.device}: {describe_machine(args.device)}")
    print(f"# primary capsules: {args.primary_backend}; time: batch {args.batch} x {args.points} points, {args.stat} "
          f"of {args.repeats} rounds; memory: batches {args.mem_batches}, budget {args.budget_gb} GB; Chamfer: "
          f"{args.train_steps} steps at {args.chamfer_points} points on synthetic parts")  # fmt: skip
    print(f"# {CHAMFER_DEFINITION}\n")
    results, steps = [], []
    args.params = {}
    for name in models:
        torch.manual_seed(0)
        model = create_model(name, num_points=args.points, primary_backend=args.primary_backend, **args.model_kwargs)
        model = model.to(device)
        args.params[name] = count_params(model)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        steps.append(_step_fn(model, opt, unit_sphere_clouds(args.batch, args.points, seed=3).to(device)))
        results.append({"model": name, "params_m": args.params[name] / 1e6})
    for step in steps:
        for _ in range(args.warmup):
            step()
    rounds: list[list[float]] = [[] for _ in steps]
    for _ in range(args.repeats):
        for i, step in enumerate(steps):
            sync(device)
            t0 = time.perf_counter()
            step()
            sync(device)
            rounds[i].append((time.perf_counter() - t0) * 1e3)
    del steps
    from capsules.data import SyntheticParts  # here: the memory children need not import the data stack

    classes = ("table", "chair", "airplane", "lamp", "mug")
    train = SyntheticParts("train", args.chamfer_points, classes, samples_per_class=args.train_per_class, seed=0)
    test = SyntheticParts("test", args.chamfer_points, classes, samples_per_class=4, seed=0)
    for r, times in zip(results, rounds, strict=True):
        r["step_ms"] = min(times) if args.stat == "min" else statistics.median(times)
        r["step_ms_rounds"] = times
        r.update(measure_memory(r["model"], args))
        r.update(train_chamfer(r["model"], args, train, test))
        r["paper_chamfer_1e3"], r["paper_params_m"], r["paper_max_batch"] = PAPER[r["model"]]

    by = {r["model"]: r for r in results}
    verdicts = []
    for size, (routing, centroid) in PAIRS.items():
        if routing not in by or centroid not in by:
            continue
        a, b = by[routing], by[centroid]
        b["vs_routing"] = ratios = {
            "params": b["params_m"] / a["params_m"],
            "step_time": b["step_ms"] / a["step_ms"],
            "mem_per_sample": b["mem_mb_per_sample"] / a["mem_mb_per_sample"],
            "max_batch": b["max_batch"] / max(a["max_batch"], 1),
            "chamfer": b["chamfer"] / a["chamfer"],
        }
        paper_batch = b["paper_max_batch"] / a["paper_max_batch"]
        verdicts.append(
            f"{size}: max batch {b['max_batch']} vs {a['max_batch']} ({ratios['max_batch']:.2f}x, target >= "
            f"{TARGETS['max_batch']:.0f}x, paper {paper_batch:.2f}x): "
            f"{'MET' if ratios['max_batch'] >= TARGETS['max_batch'] else 'NOT MET'}; params "
            f"{ratios['params']:.3f}x (target <= 1/3): {'MET' if ratios['params'] <= TARGETS['params'] else 'NOT MET'}"
            f"; Chamfer after {args.train_steps} steps {b['chamfer']:.4g} vs {a['chamfer']:.4g} "
            f"({ratios['chamfer']:.2f}x, target < 1): {'MET' if ratios['chamfer'] < 1 else 'NOT MET'}"
        )
    print_table(
        ["model", "params (M)", "paper params (M)", "train step (ms)", "MB / sample",
         f"max batch ({args.budget_gb:g} GB)", "paper max batch", f"Chamfer @{args.train_steps} steps", "part purity",
         "params vs routing", "step vs routing", "MB/sample vs routing", "max batch vs routing", "Chamfer vs routing"],
        [
            [r["model"], r["params_m"], r["paper_params_m"], r["step_ms"], r["mem_mb_per_sample"], r["max_batch"],
             r["paper_max_batch"], r["chamfer"], r["part_purity"]]
            + ([r["vs_routing"][k] for k in ("params", "step_time", "mem_per_sample", "max_batch", "chamfer")]
               if "vs_routing" in r else ["-"] * 5)
            for r in results
        ],
    )  # fmt: skip
    print()
    for v in verdicts:
        print(v)
    if args.json:
        payload = {"tool": "bench_capsules", "machine": describe_machine(args.device),
                   "args": {k: v for k, v in vars(args).items() if k != "params"},
                   "chamfer_definition": CHAMFER_DEFINITION, "verdicts": verdicts, "results": results}  # fmt: skip
        atomic_write_text(args.json, json.dumps(payload, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
