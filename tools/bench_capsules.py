"""Dynamic routing vs centroid attention in the point capsule autoencoder, both sizes, in one run.

    python tools/bench_capsules.py                                    # CPU: 2048 points, batch 8, budget 12 GB
    python tools/bench_capsules.py --device cuda --budget-gb 12       # GPU: peak memory from the CUDA allocator
    python tools/bench_capsules.py --models pointcaps_routing_small pointcaps_centroid_small --train-steps 20
    python tools/bench_capsules.py --models pointcaps_routing_small pointcaps_centroid_small --routing-impls einsum \\
        --points 128 --batch 2 --mem-batches 2 3 --train-steps 2 --chamfer-points 64 --train-per-class 2   # seconds

For every registered model (`pointcaps_{routing,centroid}_{small,base}`), on the same random unit-sphere clouds, and
for the routing models once per implementation (`--routing-impls`: `einsum`, ours, and `reference`, the
reference code's matmul that expands W over the batch; same function, tested equal):

* params;
* train-step time: forward + Chamfer loss + backward + Adam step at `--batch` clouds of `--points` points; all
  models are built first and timed round-robin (each of `--repeats` rounds times one step of every model in turn,
  so background load hits all alike), median (or `--stat min`) of the rounds;
* peak memory of forward + backward with the weights, gradients and Adam states in memory, at two batch sizes
  (`--mem-batches`): on CPU by exact tensor accounting (PyTorch's `MemTracker`: every tensor storage counted
  while it is alive, repeatable to the byte, unlike the resident set), on CUDA `torch.cuda.max_memory_allocated`.
  The optimizer step is left out (its temporaries do not grow with the batch). Memory per sample = the slope between
  the two batch sizes; the largest batch within `--budget-gb` = `floor((budget - fixed) / slope)` with
  `fixed` the intercept (weights, gradients, Adam states, batch-independent temporaries);
* Chamfer distance (`capsules.CHAMFER_DEFINITION`), part purity and its chance level (the same reconstructions cut
  into random patches of the capsules' sizes) on the embedded synthetic part shapes' test split after
  `--train-steps` Adam steps (lr `--lr`, batch 8, `--chamfer-points` points, the same shapes in the same order for
  every model), once per decoder of `--decoders` (`patch`, the default decoder, and `heads`, the reference's):
  the second table, with the patch spread (`capsules.metrics.patch_spread`: about 1 when each capsule's points
  are scattered over the whole shape). The main table's Chamfer and purity columns are the first decoder's. Not
  repeated for the reference routing impl, which trains identically.

Ratios: each centroid model against the routing model of its size (each implementation), measured in the same run
(`capsules.bench`). Targets: centroid max batch >= 3x routing (paper 58 vs 22 at 12 capsules, 36 vs 12 at 64),
params <= 1/3 of routing, lower Chamfer after the same steps (paper x 1e-3: 1.6 vs 2.7 at 12 capsules, 1.4 vs 1.5 at
64, after full training). Each target prints under the tables; `--json` writes them with every row. Absolute times
are meaningful only on an otherwise idle machine.
"""

from __future__ import annotations

import argparse
import json

import torch

from capsules import CHAMFER_DEFINITION, list_models
from capsules.bench import benchmark, check_settings, decoder_table, table, targets
from capsules.model import DECODERS, ROUTING_IMPLS
from measure.bench import describe_machine, finish, print_table


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
    models = args.models or list_models()
    try:
        check_settings(models, args.device, args.batch, args.mem_batches)
    except ValueError as e:
        parser.error(str(e))
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"# bench_capsules on {args.device}: {describe_machine(args.device)}")
    print(f"# primary capsules: {args.primary_backend}; time: batch {args.batch} x {args.points} points, {args.stat} "
          f"of {args.repeats} rounds; memory: batches {args.mem_batches}, budget {args.budget_gb} GB; Chamfer: "
          f"{args.train_steps} steps at {args.chamfer_points} points on synthetic parts")  # fmt: skip
    print(f"# {CHAMFER_DEFINITION}\n")
    results, decoded = benchmark(
        models, args.device, routing_impls=args.routing_impls, num_points=args.points, batch=args.batch,
        repeats=args.repeats, warmup=args.warmup, stat=args.stat, budget_gb=args.budget_gb,
        mem_batches=args.mem_batches, primary_backend=args.primary_backend, train_steps=args.train_steps,
        decoders=args.decoders, chamfer_points=args.chamfer_points, train_per_class=args.train_per_class, lr=args.lr,
        model_kwargs=args.model_kwargs,
    )  # fmt: skip
    goals = targets(results, args.device, args.train_steps)
    tables: list[dict] = []
    print_table(*table(results, args.routing_impls, args.budget_gb, args.train_steps, args.decoders[0]), tables)
    print()
    title = f"Decoders: Chamfer and part purity after {args.train_steps} steps ({args.chamfer_points} points)"
    print_table(*decoder_table(decoded, args.train_steps), tables, title=title)
    finish("bench_capsules", args.device, args, goals, argv=argv, chamfer_definition=CHAMFER_DEFINITION,
           results=results, decoders=decoded, tables=tables)  # fmt: skip
    return results


if __name__ == "__main__":
    main()
