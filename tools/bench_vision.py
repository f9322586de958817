"""Throughput of the vision models against DeiT measured in the same run: images/s for inference and a train step.

    python tools/bench_vision.py                                   # CPU, fp32, batch 32
    python tools/bench_vision.py --device cuda --amp --compile     # GPU, bf16 autocast, torch.compile

Rows: timm's ``deit_tiny_patch16_224`` and ``deit_small_patch16_224`` (the baselines) and every model registered by
:mod:`vision` (or ``--models``), all at 224 px, 1000 classes, random images, with the same settings for every row:
fused attention as timm configures it (``scaled_dot_product_attention`` where available, in timm's blocks and ours),
``--compile`` for all or none, fp32 on CPU, ``--amp`` (bf16 autocast) on CUDA.

* inference: eval mode, ``torch.no_grad``;
* train step: train mode, forward + cross-entropy + backward + AdamW step;
* rows are timed round-robin over ``--repeats`` rounds after ``--warmup`` untimed calls each, so a change in
  background load hits every row alike; images/s = batch / the median (or ``--stat min``) time of a round;
* ``vs DeiT`` = images/s over the same-width DeiT's images/s in the same run (tiny rows against DeiT-tiny, small
  rows against DeiT-small).

Targets (issue 4, :func:`vision.bench.ours_target`): Ours-1 (``centroid_deit_tiny_c6_patch16_224``) at least 1.4x
DeiT-tiny's inference images/s on CPU fp32, and at least 1.6x on a GPU with AMP (Token Merging's best DeiT-Ti result
is 1.56x). The verdict prints under the table; ``--json`` writes it with every row.
"""

from __future__ import annotations

import argparse
import statistics
import sys

import timm
import torch
import torch.nn.functional as F

from engine import count_gmacs, count_params
from engine.bench import describe_machine, format_target, print_table, time_round_robin, write_report
from vision.bench import BASELINES, ours_target, registered, width_of


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--img-size", type=int, default=224)
    parser.add_argument("--models", nargs="+", default=None, help="default: DeiT-tiny/small + every vision model")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--stat", choices=("median", "min"), default="median")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast (CUDA)")
    parser.add_argument("--compile", action="store_true", help="torch.compile every model")
    parser.add_argument("--no-train", action="store_true", help="inference only")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the rows and the target to this JSON file")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    names = args.models or [BASELINES["tiny"], BASELINES["small"], *registered()]
    for width in {width_of(n) for n in names}:
        if BASELINES[width] not in names:
            names.insert(0, BASELINES[width])
    amp = args.amp and device.type == "cuda"
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(args.batch, 3, args.img_size, args.img_size, generator=gen).to(device)
    labels = torch.randint(0, 1000, (args.batch,), generator=gen).to(device)

    rows = {}
    for name in names:
        torch.manual_seed(0)
        model = timm.create_model(name, img_size=args.img_size)
        stats = {
            "params_m": count_params(model) / 1e6,
            "gmacs": count_gmacs(model, torch.randn(1, 3, args.img_size, args.img_size)),
        }
        model.to(device)
        fwd = torch.compile(model) if args.compile else model
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def infer(m=model, f=fwd) -> None:
            m.eval()
            with torch.no_grad(), torch.autocast(device.type, torch.bfloat16, enabled=amp):
                f(images)

        def train(m=model, f=fwd, opt=optimizer) -> None:
            m.train()
            with torch.autocast(device.type, torch.bfloat16, enabled=amp):
                loss = F.cross_entropy(f(images).float(), labels)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()

        fns = {"infer": infer} if args.no_train else {"infer": infer, "train": train}
        for fn in fns.values():
            for _ in range(args.warmup):
                fn()
        rows[name] = {"model": name, **stats, "fns": fns}
        print(f"  built {name}", file=sys.stderr)

    fns = [fn for row in rows.values() for fn in row["fns"].values()]
    rounds = iter(time_round_robin(fns, device, args.repeats))  # (each fn was warmed up as it was built)
    reduce = min if args.stat == "min" else statistics.median
    results = []
    for row in rows.values():
        res = {k: v for k, v in row.items() if k != "fns"}
        for kind in row["fns"]:
            res[f"{kind}_ips"] = args.batch / (reduce(next(rounds)) / 1e3)
        results.append(res)
    by_name = {r["model"]: r for r in results}
    table = []
    for r in results:
        base = by_name[BASELINES[width_of(r["model"])]]
        r["infer_vs_deit"] = r["infer_ips"] / base["infer_ips"]
        line = [r["model"], r["params_m"], r["gmacs"], r["infer_ips"], r["infer_vs_deit"]]
        if not args.no_train:
            r["train_vs_deit"] = r["train_ips"] / base["train_ips"]
            line += [r["train_ips"], r["train_vs_deit"]]
        table.append(line)
    what = f"bf16 autocast {amp}, compile {args.compile}, {args.stat} of {args.repeats} rounds"
    print(f"# bench_vision on {device}: {describe_machine(device)}")
    print(f"# batch {args.batch}, {args.img_size} px, fp32 weights, {what}\n")
    headers = ["model", "params (M)", "GMACs", "infer img/s", "infer vs DeiT"]
    if not args.no_train:
        headers += ["train img/s", "train vs DeiT"]
    print_table(headers, table)
    targets = [ours_target(results, device)]
    print()
    for t in targets:
        print(format_target(t))
    if args.json:
        write_report(args.json, "bench_vision", device, vars(args), results=results, targets=targets)
    return results


if __name__ == "__main__":
    main()
