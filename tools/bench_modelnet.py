"""Throughput of the ModelNet40 models: train-step and inference samples/s, params and GMACs, in one run.

    python tools/bench_modelnet.py                                  # CPU, batch 32, 1024 points
    python tools/bench_modelnet.py --device cuda --amp              # GPU, bf16 autocast
    python tools/bench_modelnet.py --batch 16 --repeats 2 --models centroid_transformer_modelnet40 \\
        centroid_transformer_modelnet40_random

Rows: the centroid transformer with T = 1, 2, 3 attention steps (``--steps``; one row per ``--attn-backends`` entry
other than ``auto``, labelled with it, e.g. ``T=1 masked``: the KNN attention as dense products under the neighbour
mask, :func:`attention.centroid.masked_knn_attention`; and one per ``--chunk-mb`` budget, e.g. ``T=1 chunks 16 MiB``:
the gather form and the KNN searches chunked at that budget instead of the device's default,
:func:`attention.centroid.attn_chunk_bytes`), its downsampling-only twins
(``_random``, ``_fps``, ``_kmeans``: the centroid blocks keep their init and MLP, no attention step) and every peer
model registered in :mod:`pointcloud` (names not starting with ``centroid_transformer``), all on the same random
batch of ``--batch`` clouds of ``--points`` xyz points, 40 classes.

* train step: forward + cross-entropy + backward + AdamW step, in train mode;
* inference: eval-mode forward under ``torch.no_grad``;
* all rows are built first, warmed up (``--warmup`` untimed calls each), then timed round-robin: each of
  ``--repeats`` rounds times one call of every row in turn, so a change in background load hits all rows alike;
  samples/s = batch / the median time (``--stat min``: the fastest round, the least disturbed by other jobs on a
  shared machine); every round's time goes to ``--json``;
* ``vs random`` = samples/s / the random twin's samples/s in the same run (needs the random twin in ``--models``);
  ``paper`` = the paper's training throughput (samples/s on their GPU: T=1 60, T=2 55, T=3 52, random 312, FPS 66,
  k-means 54) and its ratio to their random twin, the number to compare ours with;
* params and GMACs per sample, counted at batch 1 as in ``tools/model_stats.py`` (matmuls incl. attention; FPS, KNN
  gathers and other element-wise work cost time but no GMACs: that gap is what this table shows), on the run's
  device, where ``"auto"`` picks the form of the KNN attention (masked on CUDA at these sizes, gather on CPU);
* ``ops/step``: aten ops one train step dispatches (forward and backward, not the optimizer; one extra untimed step)
  and how many of them are not views, i.e. launch kernels on a GPU (:func:`engine.bench.count_aten_ops`). A GPU runs
  small-kernel models at the speed the host issues them, a few microseconds per op, so this column predicts that
  cost on any device.

Target: the centroid model (T = 1) trains at >= 0.5x the random twin's samples/s (the paper: 60 / 312 = 0.19x,
FPS being their bottleneck). The verdict is printed under the table.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing

import torch
import torch.nn.functional as F

import attention.centroid.functional as attn_functional
import attention.points as points
from attention import backend_names
from engine import atomic_write_text, count_gmacs, count_params
from engine.bench import count_aten_ops, describe_machine, print_table, sync, time_fn, unit_sphere_clouds
from pointcloud import create_model, list_models

CENTROID = "centroid_transformer_modelnet40"
RANDOM = f"{CENTROID}_random"
TWINS = [RANDOM, f"{CENTROID}_fps", f"{CENTROID}_kmeans"]
NUM_CLASSES = 40
TARGET = 0.5  # centroid (T = 1) train samples/s over the random twin's

# Paper training throughput, samples/s (section 3.2), by row label.
PAPER_TRAIN = {f"{CENTROID} T=1": 60, f"{CENTROID} T=2": 55, f"{CENTROID} T=3": 52, RANDOM: 312}
PAPER_TRAIN |= {f"{CENTROID}_fps": 66, f"{CENTROID}_kmeans": 54}


def default_models() -> list[str]:
    """The centroid model, its twins and every registered peer (in that order), as far as registered."""
    registered = list_models()
    peers = [n for n in registered if not n.startswith("centroid_transformer")]
    return [n for n in [CENTROID, *TWINS] if n in registered] + peers


Row = tuple[str, str, int | None, dict]  # (label, registered name, T or None, create_model kwargs)


def plan(
    models: list[str],
    steps: list[int],
    num_centroids: list[int] | None,
    attn_backends: Sequence[str] = ("auto",),
    chunk_mb: Sequence[int] = (),
) -> list[Row]:
    """One row per model; the centroid model gets one row per T and attention backend (and per chunk budget of its
    gather form, ``chunk_mb``, kwarg ``_chunk_mb``), the twins T = 0, peers None."""
    rows = []
    for name in models:
        kwargs: dict = {"num_classes": NUM_CLASSES}
        if name.startswith("centroid_transformer") and num_centroids:
            kwargs["num_centroids"] = tuple(num_centroids)
        if name == CENTROID:
            for t in steps:
                for b in attn_backends:
                    label = f"{name} T={t}" + ("" if b == "auto" else f" {b}")
                    rows.append((label, name, t, {**kwargs, "num_steps": t, "attn_backend": b}))
                for mb in chunk_mb:
                    label = f"{name} T={t} chunks {mb} MiB"
                    rows.append((label, name, t, {**kwargs, "num_steps": t, "attn_backend": "gather", "_chunk_mb": mb}))
        else:
            rows.append((name, name, 0 if name in TWINS else None, kwargs))
    return rows


@contextlib.contextmanager
def chunk_budget(mb: int | None) -> Iterator[None]:
    """Within: the KNN attention's and the KNN searches' default chunk budgets are ``mb`` MiB on every device."""
    names = [(attn_functional, "ATTN_CHUNK_BYTES"), (attn_functional, "ATTN_CHUNK_BYTES_CUDA"),
             (points, "KNN_CHUNK_BYTES"), (points, "KNN_CHUNK_BYTES_CUDA")]  # fmt: skip
    saved = [getattr(m, n) for m, n in names]
    if mb is not None:
        for m, n in names:
            setattr(m, n, mb * 2**20)
    try:
        yield
    finally:
        for (m, n), v in zip(names, saved):
            setattr(m, n, v)


def prepare(name: str, kwargs: dict, args: argparse.Namespace) -> tuple[dict, Callable[[], None], Callable[[], None]]:
    """Params and GMACs of one model configuration, and its train-step and inference closures on the batch."""
    device = torch.device(args.device)
    torch.manual_seed(0)
    kwargs = dict(kwargs)
    chunk_mb = kwargs.pop("_chunk_mb", None)
    model = create_model(name, **kwargs)
    model.to(device)
    # on the run's device: "auto" forms are chosen per device (the KNN attention is masked on CUDA, gather on CPU)
    example = unit_sphere_clouds(1, args.points).to(device)  # (B, N, 3)
    stats = {"params_m": count_params(model) / 1e6, "gmacs": count_gmacs(model, example)}
    gen = torch.Generator().manual_seed(1)
    points = unit_sphere_clouds(args.batch, args.points, seed=1).to(device)  # (B, N, 3)
    labels = torch.randint(0, NUM_CLASSES, (args.batch,), generator=gen).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.amp)

    def forward_backward() -> None:
        model.train()
        with chunk_budget(chunk_mb):  # (the backward pass reuses the chunk rows its forward chose)
            with autocast:
                loss = F.cross_entropy(model(points).float(), labels)
            loss.backward()

    def train_step() -> None:
        forward_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def infer() -> None:
        model.eval()
        with torch.no_grad(), autocast, chunk_budget(chunk_mb):
            model(points)

    ops, views = count_aten_ops(forward_backward)
    model.zero_grad(set_to_none=True)
    stats |= {"ops_per_step": ops, "kernel_ops_per_step": ops - views}
    return stats, train_step, infer


def time_round_robin(fns: list[Callable[[], None]], args: argparse.Namespace) -> list[list[float]]:
    """Times (ms) of each fn: warm-up, then ``repeats`` rounds that time one call of every fn in turn."""
    for fn in fns:
        for _ in range(args.warmup):
            fn()
    sync(args.device)
    times: list[list[float]] = [[] for _ in fns]
    for _ in range(args.repeats):
        for t, fn in zip(times, fns):
            t.append(time_fn(fn, args.device, repeats=1, warmup=0))
    return times


def _fmt(v: float | None) -> object:
    return "-" if v is None else v


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--points", type=int, default=1024)
    parser.add_argument("--num-centroids", type=int, nargs=2, default=None, metavar=("N1", "N2"),
                        help="centroids of the two CA blocks (default: the model's)")  # fmt: skip
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 2, 3], help="T values of the centroid model")
    forms = ["auto", *backend_names("knn_attention")]
    parser.add_argument("--attn-backends", nargs="+", default=["auto"], choices=forms,
                        help="KNN attention forms of the centroid rows (attention.CentroidAttention)")  # fmt: skip
    parser.add_argument("--chunk-mb", nargs="+", type=int, default=[],
                        help="extra centroid rows: the gather form chunked at these budgets (MiB)")  # fmt: skip
    parser.add_argument("--models", nargs="+", default=None, help="subset of registered names (default: all)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2, help="untimed calls before timing")
    parser.add_argument("--stat", default="median", choices=["median", "min"],
                        help="summary of the rounds; min resists background load on a shared machine")  # fmt: skip
    parser.add_argument("--amp", action="store_true", help="bf16 autocast (CUDA only)")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    if args.amp and args.device != "cuda":
        parser.error("--amp is CUDA bf16 autocast: use it with --device cuda")
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda but torch sees no CUDA device")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    if args.batch < 2:
        parser.error("--batch must be >= 2 (BatchNorm in train mode needs two samples)")
    models = args.models or default_models()
    unknown = sorted(set(models) - set(list_models()))
    if unknown:
        parser.error(f"unknown models {unknown}; registered: {list_models()}")
    if args.threads:
        torch.set_num_threads(args.threads)

    print(f"# bench_modelnet on {args.device}: {describe_machine(args.device)}")
    nc = args.num_centroids or "model default"
    print(f"# batch {args.batch}, {args.points} points (xyz), num_centroids {nc}, amp {args.amp}, "
          f"{args.stat} of {args.repeats} rounds after {args.warmup} warm-up\n")  # fmt: skip
    results, train_fns, infer_fns = [], [], []
    if any(mb < 1 for mb in args.chunk_mb):
        parser.error("--chunk-mb budgets must be >= 1 MiB")
    for label, name, steps, kwargs in plan(models, args.steps, args.num_centroids, args.attn_backends, args.chunk_mb):
        stats, train_step, infer = prepare(name, kwargs, args)
        results.append({"label": label, "model": name, "num_steps": steps, **stats})
        train_fns.append(train_step)
        infer_fns.append(infer)
    for key, fns in (("train", train_fns), ("infer", infer_fns)):
        for r, times in zip(results, time_round_robin(fns, args)):
            ms = min(times) if args.stat == "min" else statistics.median(times)
            r[f"{key}_ms"], r[f"{key}_ms_rounds"], r[f"{key}_sps"] = ms, times, args.batch / (ms / 1e3)

    base = next((r for r in results if r["model"] == RANDOM), None)
    paper_base = PAPER_TRAIN[RANDOM]
    for r in results:
        r["train_vs_random"] = r["train_sps"] / base["train_sps"] if base else None
        r["infer_vs_random"] = r["infer_sps"] / base["infer_sps"] if base else None
        r["paper_train_sps"] = PAPER_TRAIN.get(r["label"])
        r["paper_train_vs_random"] = r["paper_train_sps"] / paper_base if r["paper_train_sps"] else None
    print_table(
        ["model", "T", "params (M)", "GMACs", "ops/step", "non-view ops", "train samples/s", "train vs random",
         "paper train samples/s", "paper vs random", "infer samples/s", "infer vs random"],
        [
            [r["label"], _fmt(r["num_steps"]), r["params_m"], r["gmacs"], r["ops_per_step"], r["kernel_ops_per_step"],
             r["train_sps"], _fmt(r["train_vs_random"]), _fmt(r["paper_train_sps"]), _fmt(r["paper_train_vs_random"]),
             r["infer_sps"], _fmt(r["infer_vs_random"])]
            for r in results
        ],
    )  # fmt: skip

    t1 = next((r for r in results if r["label"] == f"{CENTROID} T=1"), None)
    target = {"ratio": TARGET, "measured": None, "met": None}
    if t1 is None or base is None:
        print(f"\ntarget (centroid T=1 train >= {TARGET}x the random twin): not measured, needs both in --models")
    else:
        target.update(measured=t1["train_vs_random"], met=t1["train_vs_random"] >= TARGET)
        print(
            f"\ntarget: centroid (T=1) train throughput >= {TARGET}x the random twin's: "
            f"{'MET' if target['met'] else 'NOT MET'} ({t1['train_vs_random']:.2f}x: {t1['train_sps']:.1f} vs "
            f"{base['train_sps']:.1f} samples/s; paper {PAPER_TRAIN[t1['label']] / paper_base:.2f}x)"
        )
    if args.json:
        payload = {"tool": "bench_modelnet", "machine": describe_machine(args.device), "args": vars(args)}
        atomic_write_text(args.json, json.dumps({**payload, "target": target, "results": results}, indent=2) + "\n")
    return results


if __name__ == "__main__":
    main()
