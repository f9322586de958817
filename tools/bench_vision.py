"""Throughput of the vision models against DeiT measured in the same run: images/s for inference and a train step.

    python tools/bench_vision.py                                   # CPU, fp32, batch 32
    python tools/bench_vision.py --device cuda --amp --compile     # GPU, bf16 autocast, torch.compile
    python tools/bench_vision.py --batch 2 --img-size 32 --repeats 1 --warmup 0 \\
        --models deit_tiny_patch16_224 centroid_deit_tiny_c6_patch16_224                     # seconds

Rows: timm's `deit_tiny_patch16_224` and `deit_small_patch16_224` (the baselines) and every model registered by
`vision` (or `--models`), all at 224 px (`--img-size`), 1000 classes, random images, with the same settings for every
row:
fused attention as timm configures it (`scaled_dot_product_attention` where available, in timm's blocks and ours),
`--compile` for all or none (`--compile both`: every model both ways, two rows each; `--compile-mode
reduce-overhead` adds CUDA graphs), fp32 on CPU, `--amp` (bf16 autocast) on CUDA, where cuDNN picks its fastest
convolution for the fixed shapes (`torch.backends.cudnn.benchmark`, as timm's `benchmark.py` sets it).

* inference: eval mode, `torch.no_grad`;
* train step: train mode, forward + cross-entropy + backward + AdamW step;
* rows are timed round-robin (`vision.bench.benchmark`) over `--repeats` rounds after `--warmup` untimed
  calls each, so a change in background load hits every row alike (every row's train steps, then every row's
  inference calls, so that no timed call switches its model's mode); images/s = batch / the median (or
  `--stat min`) time of a round;
* `vs DeiT` = images/s over the same-width DeiT's images/s in the same run (tiny rows against DeiT-tiny, small
  rows against DeiT-small);
* `--batch` takes several sizes: every row at each, one table per size.

Targets (`vision.bench.ours_target`): Ours-1 (`centroid_deit_tiny_c6_patch16_224`) at least 1.4x
DeiT-tiny's inference images/s on CPU fp32, and at least 1.5x on a GPU with AMP (95% of its MAC ratio; Token
Merging's best DeiT-Ti result is 1.56x), both models run the same way: `--compile both` times each model eager and
compiled and the verdict takes the better mode (naming it). With several batch sizes each model's throughput is its
images/s at its best one, as DeiT and Token Merging report throughput (at a batch that fills the GPU; Ours-1's
50-token blocks launch kernels a quarter the size of DeiT's). The verdict prints under the tables; `--json` writes
it with every row:

    python tools/bench_vision.py --device cuda --amp --batch 512 2048 --compile both \\
        --models deit_tiny_patch16_224 centroid_deit_tiny_c6_patch16_224

`--capture` (CUDA, `--no-train`) captures each row's inference call, eager or compiled (`--compile-mode
default`), whole into one CUDA graph: a timed call copies the batch into the graph's input and replays it, so the
rows time the models' kernels and not the host's launches, guards or cudagraph-tree bookkeeping (a
`reduce-overhead` row still times those: each timed call ends in a synchronize, as in timm's `benchmark.py`, so
host work before the replay adds to it):

    python tools/bench_vision.py --device cuda --amp --batch 512 2048 --compile both --capture --no-train \\
        --channels-last --models deit_tiny_patch16_224 centroid_deit_tiny_c6_patch16_224

`--config` and `--set` read a training config as `tools/train_deit.py` does (dataclass defaults < YAML < `--set`) and
time its model as that run builds it (image and patch size, width, depth, heads, MLP ratio, centroid block,
`model_kwargs`), beside the DeiT of its width built at the same sizes; without a `--config`, `--set` starts from the
main job's config. The Ours-1 target is a 224 px verdict, so such a run prints none:

    python tools/bench_vision.py --config configs/vision/small_images.yaml --batch 64          # the 32 px models
    python tools/bench_vision.py --config configs/vision/small_images.yaml --set embed_dim=192 num_heads=3

`--profile DIR` profiles each row's inference call after timing it: an op table and a Chrome trace per row, and a
table of device time against the call's time (what bounds it: launches or the GPU's work).
"""

from __future__ import annotations

import argparse
import logging

import torch

from engine import COMPILE_MODES, add_config_args, config_from_args
from measure.bench import PROFILE_HEADERS, add_profile_option, describe_machine, finish, print_table, profile_rows
from vision.bench import COMPILE_CHOICES, GRAPH_MODES, benchmark, config_models, model_names, ours_target, table
from vision.recipe import DeiTConfig


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--batch", type=int, nargs="+", default=[32],
                        help="one table per batch size; the target reads each model at its best one")  # fmt: skip
    parser.add_argument("--img-size", type=int, default=None, help="default: 224 (with --config / --set: its img_size)")
    parser.add_argument("--models", nargs="+", default=None, help="default: DeiT-tiny/small + every vision model")
    add_config_args(parser)  # --config PATH, --set KEY=VALUE: a training config's model at its sizes
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--stat", choices=("median", "min"), default="median")
    parser.add_argument("--amp", action="store_true", help="bf16 autocast (CUDA)")
    parser.add_argument("--compile", nargs="?", const="yes", default="no", choices=sorted(COMPILE_CHOICES),
                        help="torch.compile every model; 'both': each model eager and compiled, two rows")  # fmt: skip
    parser.add_argument("--compile-mode", default="default", choices=COMPILE_MODES,
                        help="torch.compile mode of the compiled rows (reduce-overhead, max-autotune: CUDA graphs "
                        "too)")  # fmt: skip
    parser.add_argument("--channels-last", action="store_true",
                        help="images and weights in channels-last memory format, every model (timm's benchmark.py "
                        "offers it)")  # fmt: skip
    parser.add_argument("--capture", action="store_true",
                        help="CUDA, with --no-train: capture each row's inference call whole into a CUDA graph, "
                        "eager and compiled rows alike (a call copies the batch in and replays it)")  # fmt: skip
    parser.add_argument("--no-train", action="store_true", help="inference only")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the rows and the target to this JSON file")
    add_profile_option(parser)
    args = parser.parse_args(argv)
    if args.compile == "no" and args.compile_mode != "default":
        parser.error(f"--compile-mode {args.compile_mode} needs compiled rows: add --compile (or --compile both)")
    if args.capture and torch.device(args.device).type != "cuda":
        parser.error("--capture times inference calls captured in CUDA graphs: add --device cuda")
    if args.capture and not args.no_train:
        parser.error("--capture times inference calls only: add --no-train")
    if args.capture and args.compile != "no" and args.compile_mode in GRAPH_MODES:
        parser.error(f"--capture replaces the CUDA graphs of --compile-mode {args.compile_mode}: use default")
    models, names, img_size = None, model_names(args.models), args.img_size or 224
    if args.config is not None or args.overrides:
        if args.models or args.img_size:
            parser.error("--config / --set time the config's model at the config's sizes: choose them with --set "
                         "(model=NAME img_size=N), not --models / --img-size")  # fmt: skip
        try:
            cfg = config_from_args(DeiTConfig, args)
        except ValueError as err:
            parser.error(str(err))
        models = config_models(cfg)
        names, img_size = list(models), cfg.img_size
    logging.basicConfig(level=logging.INFO, format="  %(message)s")  # each model as it is built, on stderr
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    amp = args.amp and device.type == "cuda"
    if device.type == "cuda":
        torch.backends.cudnn.benchmark = True  # the fastest convolution for the fixed shapes, as timm's benchmark.py
    compile_what = args.compile if args.compile == "no" else f"{args.compile} ({args.compile_mode})"
    what = f"bf16 autocast {amp}, compile {compile_what}, {args.stat} of {args.repeats} rounds"
    what += ", channels last" if args.channels_last else ""
    what += ", inference captured in CUDA graphs" if args.capture else ""
    print(f"# bench_vision on {device}: {describe_machine(device)}")
    config = f", {args.config or 'the main job'}{' with ' + ' '.join(args.overrides) if args.overrides else ''}"
    print(f"# batch {' and '.join(map(str, args.batch))}, {img_size} px, fp32 weights, {what}"
          f"{config if models else ''}\n", flush=True)  # fmt: skip
    results: list[dict] = []
    tables: list[dict] = []
    several = len(args.batch) > 1
    for batch in args.batch:
        measured = benchmark(names, device, batch=batch, img_size=img_size, repeats=args.repeats,
                             warmup=args.warmup, stat=args.stat, amp=amp, compile_models=args.compile,
                             train=not args.no_train, compile_mode=args.compile_mode,
                             channels_last=args.channels_last, capture=args.capture, profile=args.profile,
                             model_kwargs=models)  # fmt: skip
        results += [{"batch": batch, **r} for r in measured]
        print_table(*table(measured, train=not args.no_train), tables, title=f"batch {batch}" if several else None)
        if args.profile:
            profiled = profile_rows(measured, lambda r: r["label"], ms_key="infer_ms")
            title = f"profile, inference{f', batch {batch}' if several else ''} ({args.profile})"
            print_table(PROFILE_HEADERS, profiled, tables, title=title)
    targets = [] if models else [ours_target(results, device)]  # the target is set at 224 px
    finish("bench_vision", device, args, targets, argv=argv, results=results, tables=tables)
    return results


if __name__ == "__main__":
    main()
