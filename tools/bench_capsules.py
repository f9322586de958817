"""Dynamic routing vs centroid attention in the point capsule autoencoder, both sizes, in one run.

    python tools/bench_capsules.py                                    # CPU: 2048 points, batch 8, budget 12 GB
    python tools/bench_capsules.py --device cuda --budget-gb 12       # GPU: peak memory from the CUDA allocator
    python tools/bench_capsules.py --models pointcaps_routing_small pointcaps_centroid_small --train-steps 20

For every registered model (``pointcaps_{routing,centroid}_{small,base}``), on the same random unit-sphere clouds, and
for the routing models once per implementation (``--routing-impls``: ``einsum``, ours, and ``reference``, the
reference code's matmul that expands W over the batch; same function, tested equal):

* params;
* train-step time: forward + Chamfer loss + backward + Adam step at ``--batch`` clouds of ``--points`` points; all
  models are built first and timed round-robin (each of ``--repeats`` rounds times one step of every model in turn,
  so background load hits all alike), median (or ``--stat min``) of the rounds;
* peak memory of forward + backward with the weights, gradients and Adam states in memory, at two batch sizes
  (``--mem-batches``): on CPU by exact tensor accounting (PyTorch's ``MemTracker``: every tensor storage counted
  while it is alive, repeatable to the byte, unlike the resident set), on CUDA ``torch.cuda.max_memory_allocated``.
  The optimizer step is left out (its temporaries do not grow with the batch). Memory per sample = the slope between
  the two batch sizes; the largest batch within ``--budget-gb`` = ``floor((budget - fixed) / slope)`` with
  ``fixed`` the intercept (weights, gradients, Adam states, batch-independent temporaries);
* Chamfer distance (``capsules.CHAMFER_DEFINITION``), part purity and its chance level (the same reconstructions cut
  into random patches of the capsules' sizes) on the embedded synthetic part shapes' test split after
  ``--train-steps`` Adam steps (lr ``--lr``, batch 8, ``--chamfer-points`` points, the same shapes in the same order for
  every model), once per decoder of ``--decoders`` (``patch``, the default decoder, and ``heads``, the reference's):
  the second table, with the patch spread (:func:`capsules.metrics.patch_spread`: about 1 when each capsule's points
  are scattered over the whole shape). The main table's Chamfer and purity columns are the first decoder's. Not
  repeated for the reference routing impl, which trains identically.

Ratios: each centroid model against the routing model of its size (each implementation), measured in the same run.
Targets (issue 5): centroid max batch >= 3x routing (paper 58 vs 22 at 12 capsules, 36 vs 12 at 64), params <= 1/3
of routing, lower Chamfer after the same steps (paper x 1e-3: 1.6 vs 2.7 at 12 capsules, 1.4 vs 1.5 at 64, after
full training). Each target prints under the tables; ``--json`` writes them with every row. Absolute times are
meaningful only on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time

import numpy as np
import torch

from capsules import CHAMFER_DEFINITION, chamfer_distance, create_model, list_models
from capsules.data import SyntheticParts
from capsules.metrics import capsule_purity, patch_spread, random_patches
from capsules.model import DECODERS, ROUTING_IMPLS
from engine import count_params
from engine.bench import (
    describe_machine,
    format_target,
    peak_tensor_bytes,
    print_table,
    target,
    time_round_robin,
    unit_sphere_clouds,
    write_report,
)

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


def measure_memory(name: str, args: argparse.Namespace, model_kwargs: dict) -> dict:
    """Peak memory of forward + backward at two batch sizes; slope = bytes per sample; max batch in the budget.

    The peak counts every live tensor: weights, gradients, Adam's states (after a warm-up step), activations and
    temporaries (:func:`engine.bench.peak_tensor_bytes`: exact tensor accounting on CPU, the CUDA allocator's peak on
    GPU). The optimizer step itself is left out: its temporaries do not grow with the batch.
    """
    device = torch.device(args.device)
    torch.manual_seed(0)
    model = create_model(name, num_points=args.points, **model_kwargs).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    _step_fn(model, opt, unit_sphere_clouds(2, args.points, seed=1).to(device))()  # gradients and Adam states exist
    peaks = []
    for batch in args.mem_batches:
        clouds = unit_sphere_clouds(batch, args.points, seed=2).to(device)
        peaks.append(peak_tensor_bytes(lambda c=clouds: chamfer_distance(model(c), c).backward(), device, model, opt))
    (b1, b2), (p1, p2) = args.mem_batches, peaks
    per_sample = max((p2 - p1) / (b2 - b1), 1.0)
    fixed = p1 - per_sample * b1  # weights, gradients, Adam states and batch-independent temporaries
    max_batch = math.floor((args.budget_gb * 2**30 - fixed) / per_sample)
    return {"mem_mb_per_sample": per_sample / 2**20, "mem_peak_mb": [p / 2**20 for p in peaks],
            "mem_fixed_mb": fixed / 2**20, "max_batch": max(max_batch, 0)}  # fmt: skip


def train_chamfer(name: str, args: argparse.Namespace, train, test, decoder: str) -> dict:
    """Chamfer and part purity on the test shapes after ``--train-steps`` Adam steps from the same seed and order."""
    torch.manual_seed(0)
    device = torch.device(args.device)
    kwargs = {"num_points": args.chamfer_points, "primary_backend": args.primary_backend, "decoder": decoder,
              **args.model_kwargs}  # fmt: skip
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
        purity, chance = (
            capsule_purity(recon, caps, points, parts, num_capsules=model.num_latent)
            for caps in (model.point_capsule, random_patches(model.point_capsule))
        )
    return {"chamfer": chamfer, "part_purity": float(purity[~torch.isnan(purity)].mean()),
            "part_purity_chance": float(chance[~torch.isnan(chance)].mean()),
            "patch_spread": patch_spread(recon, model.point_capsule), "train_s": elapsed}  # fmt: skip


def _entries(models: list[str], args: argparse.Namespace) -> list[dict]:
    """One row per model, and per routing implementation for the routing models."""
    rows = []
    for name in models:
        kwargs = {"primary_backend": args.primary_backend, **args.model_kwargs}
        if "routing" not in name:
            rows.append({"model": name, "impl": "-", "kwargs": kwargs})
            continue
        for impl in args.routing_impls:
            rows.append({"model": name, "impl": impl, "kwargs": {**kwargs, "routing_impl": impl}})
    return rows


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--models", nargs="+", default=None, help="subset of the registered models (default: all)")
    parser.add_argument("--routing-impls", nargs="+", default=["einsum", "reference"], choices=ROUTING_IMPLS,
                        help="routing implementations to measure (reference: the batch-expanding matmul)")  # fmt: skip
    parser.add_argument("--points", type=int, default=2048, help="points per cloud for time and memory")
    parser.add_argument("--batch", type=int, default=8, help="batch of the timed train steps")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--stat", default="median", choices=["median", "min"])
    parser.add_argument("--budget-gb", type=float, default=12.0, help="memory budget of the max-batch column")
    parser.add_argument("--mem-batches", type=int, nargs=2, default=[2, 4], metavar=("B1", "B2"))
    parser.add_argument("--primary-backend", default="fused", choices=["fused", "torch"],
                        help="primary capsules: fused (ours) or torch (Conv1d + BN + max)")  # fmt: skip
    parser.add_argument("--train-steps", type=int, default=60, help="Adam steps before the Chamfer column")
    parser.add_argument("--decoders", nargs="+", default=["patch", "heads"], choices=sorted(DECODERS),
                        help="decoders of the Chamfer / purity table (the first fills the main table)")  # fmt: skip
    parser.add_argument("--chamfer-points", type=int, default=256, help="points per cloud for the Chamfer column")
    parser.add_argument("--train-per-class", type=int, default=16, help="synthetic train shapes per class")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--model-kwargs", type=json.loads, default={},
                        help='JSON overrides for every model, e.g. \'{"num_primary": 32}\' (smoke tests)')  # fmt: skip
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
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
    results, steps = _entries(models, args), []
    for r in results:
        torch.manual_seed(0)
        model = create_model(r["model"], num_points=args.points, **r["kwargs"]).to(device)
        r["params_m"] = count_params(model) / 1e6
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        steps.append(_step_fn(model, opt, unit_sphere_clouds(args.batch, args.points, seed=3).to(device)))
    rounds = time_round_robin(steps, device, args.repeats, args.warmup)
    del steps
    classes = ("table", "chair", "airplane", "lamp", "mug")
    train = SyntheticParts("train", args.chamfer_points, classes, samples_per_class=args.train_per_class, seed=0)
    test = SyntheticParts("test", args.chamfer_points, classes, samples_per_class=4, seed=0)
    decoded = []  # the second table: every model with every decoder
    for name in models:  # the reference routing impl computes the same function (tested): trained once
        for decoder in args.decoders:
            decoded.append({"model": name, "decoder": decoder, **train_chamfer(name, args, train, test, decoder)})
    for r, times in zip(results, rounds, strict=True):
        r["step_ms"] = min(times) if args.stat == "min" else statistics.median(times)
        r["step_ms_rounds"] = times
        r.update(measure_memory(r["model"], args, r["kwargs"]))
        if r["impl"] != "reference":
            first = next(d for d in decoded if d["model"] == r["model"] and d["decoder"] == args.decoders[0])
            r.update({k: v for k, v in first.items() if k != "model"})
        r["paper_chamfer_1e3"], r["paper_params_m"], r["paper_max_batch"] = PAPER[r["model"]]

    targets = []
    for size, (routing, centroid) in PAIRS.items():
        c = next((r for r in results if r["model"] == centroid), None)
        baselines = [r for r in results if r["model"] == routing]
        if c is None or not baselines:
            continue
        c["vs_routing"] = {}
        for a in baselines:
            c["vs_routing"][a["impl"]] = ratios = {
                "params": c["params_m"] / a["params_m"],
                "step_time": c["step_ms"] / a["step_ms"],
                "mem_per_sample": c["mem_mb_per_sample"] / a["mem_mb_per_sample"],
                "max_batch": c["max_batch"] / max(a["max_batch"], 1),
            }
            vs = f"{size} vs {a['impl']} routing"
            paper_batch = c["paper_max_batch"] / a["paper_max_batch"]
            detail = f"{c['max_batch']} vs {a['max_batch']}; paper {paper_batch:.2f}x"
            targets.append(target(f"{vs}: max batch", ratios["max_batch"], ">=", TARGETS["max_batch"],
                                  device=device, detail=detail))  # fmt: skip
            targets.append(target(f"{vs}: params", ratios["params"], "<=", TARGETS["params"], device=device))
            if "chamfer" in a:
                ratios["chamfer"] = c["chamfer"] / a["chamfer"]
                detail = f"{c['chamfer']:.4g} vs {a['chamfer']:.4g}"
                targets.append(target(f"{vs}: Chamfer after {args.train_steps} steps", ratios["chamfer"], "<", 1,
                                      device=device, detail=detail))  # fmt: skip
    impls = [i for i in args.routing_impls if any(r["impl"] == i for r in results)]
    headers = ["model", "routing impl", "params (M)", "paper params (M)", "train step (ms)", "MB / sample",
               f"max batch ({args.budget_gb:g} GB)", "paper max batch",
               f"Chamfer @{args.train_steps} steps ({args.decoders[0]})", "part purity", "purity chance"]  # fmt: skip
    for impl in impls:
        headers += [f"{k} vs {impl} routing" for k in ("step", "MB/sample", "max batch")]
    headers += ["params vs routing", "Chamfer vs routing"]
    rows = []
    for r in results:
        row = [r["model"], r["impl"], r["params_m"], r["paper_params_m"], r["step_ms"], r["mem_mb_per_sample"],
               r["max_batch"], r["paper_max_batch"], r.get("chamfer", "-"), r.get("part_purity", "-"),
               r.get("part_purity_chance", "-")]  # fmt: skip
        vs = r.get("vs_routing", {})
        for impl in impls:
            q = vs.get(impl)
            row += [q["step_time"], q["mem_per_sample"], q["max_batch"]] if q else ["-"] * 3
        q = vs.get("einsum") or next(iter(vs.values()), None)
        row += [q["params"], q.get("chamfer", "-")] if q else ["-"] * 2
        rows.append(row)
    print_table(headers, rows)
    print(f"\n# decoders: Chamfer and part purity after {args.train_steps} steps ({args.chamfer_points} points)\n")
    print_table(
        ["model", "decoder", f"Chamfer @{args.train_steps} steps", "part purity", "purity chance",
         "purity - chance", "patch spread"],
        [[d["model"], d["decoder"], d["chamfer"], d["part_purity"], d["part_purity_chance"],
          d["part_purity"] - d["part_purity_chance"], d["patch_spread"]] for d in decoded],
    )  # fmt: skip
    print()
    for t in targets:
        print(format_target(t))
    for r in results:
        r.pop("kwargs")
    if args.json:
        write_report(args.json, "bench_capsules", device, vars(args), chamfer_definition=CHAMFER_DEFINITION,
                     results=results, decoders=decoded, targets=targets)  # fmt: skip
    return results


if __name__ == "__main__":
    main()
