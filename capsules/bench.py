"""What ``tools/bench_capsules.py`` measures: dynamic routing against centroid attention in the point capsule
autoencoder, each size, in one run, and the targets that run declares.

Rows (:func:`entries`): every model of ``models``, and the routing models once per implementation of
``routing_impls`` (``einsum``, ours, and ``reference``, the reference code's matmul that expands W over the batch;
same function, tested equal). For each row (:func:`benchmark`), on the same random unit-sphere clouds:

* params;
* train-step time: forward + Chamfer loss + backward + Adam step; all models are built first and timed round-robin
  (:func:`measure.bench.time_round_robin`: background load hits all alike), median (or fastest) of the rounds;
* peak memory of forward + backward at two batch sizes (:func:`measure_memory`), hence memory per sample and the
  largest batch within a memory budget;
* Chamfer distance, part purity and its chance level, and patch spread on the embedded synthetic part shapes after a
  few Adam steps (:func:`train_chamfer`), once per model and decoder (the reference routing impl trains identically:
  not repeated).

Ratios: each centroid model against the routing model of its size (each implementation), measured in the same run.
Targets (:func:`targets`): centroid max batch >= 3x routing (paper 58 vs 22 at 12 capsules, 36 vs 12 at 64),
params <= 1/3 of routing, lower Chamfer after the same steps (paper x 1e-3: 1.6 vs 2.7 at 12 capsules, 1.4 vs 1.5 at
64, after full training).

The Chamfer loss's own backends are timed by ``tools/bench_points.py`` (:func:`chamfer_backend_rows`, beside the other
point ops): each installed backend's loss and backward pass against the dense reference and the chunked search.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from collections.abc import Callable, Sequence
from functools import partial

import numpy as np
import torch

from attention import available
from measure.bench import peak_tensor_bytes, target, time_round_robin, unit_sphere_clouds
from measure.stats import count_params

from .chamfer import CHAMFER_BACKENDS, chamfer_distance
from .data import SyntheticParts
from .metrics import capsule_purity, patch_spread, random_patches
from .model import create_model, list_models

__all__ = [
    "CHAMFER_DENSE_MAX_BYTES",
    "CHAMFER_HEADERS",
    "CLASSES",
    "PAIRS",
    "PAPER",
    "TARGETS",
    "benchmark",
    "chamfer_backend_rows",
    "check_settings",
    "decoder_table",
    "entries",
    "measure_memory",
    "table",
    "targets",
    "train_chamfer",
]

PAIRS = {"small": ("pointcaps_routing_small", "pointcaps_centroid_small"),
         "base": ("pointcaps_routing_base", "pointcaps_centroid_base")}  # fmt: skip
# Paper (section 3.3): Chamfer x 1e-3, params (M), max batch per GPU.
PAPER = {
    "pointcaps_routing_small": (2.7, 18.4, 22),
    "pointcaps_centroid_small": (1.6, 0.6, 58),
    "pointcaps_routing_base": (1.5, 19.8, 12),
    "pointcaps_centroid_base": (1.4, 5.3, 36),
}
TARGETS = {"max_batch": 3.0, "params": 1 / 3}  # centroid over routing: max batch at least, params at most
CLASSES = ("table", "chair", "airplane", "lamp", "mug")  # the synthetic part shapes of the Chamfer columns
CHAMFER_BATCH = 8  # clouds per Adam step of the Chamfer columns


def check_settings(models: Sequence[str], device: str, batch: int, mem_batches: Sequence[int]) -> None:
    """Raises ``ValueError`` for settings :func:`benchmark` cannot run, naming the fix."""
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but torch sees no CUDA device")
    if batch < 2 or min(mem_batches) < 2 or mem_batches[0] >= mem_batches[1]:
        raise ValueError("--batch and --mem-batches need >= 2 clouds (BatchNorm), and B1 < B2")
    unknown = sorted(set(models) - set(list_models()))
    if unknown:
        raise ValueError(f"unknown models {unknown}; registered: {list_models()}")


def _step_fn(model: torch.nn.Module, opt: torch.optim.Optimizer, clouds: torch.Tensor) -> Callable[[], None]:
    def step() -> None:
        opt.zero_grad(set_to_none=True)
        loss = chamfer_distance(model(clouds), clouds)
        loss.backward()
        opt.step()

    return step


def entries(
    models: Sequence[str],
    routing_impls: Sequence[str],
    primary_backend: str = "fused",
    model_kwargs: dict | None = None,
) -> list[dict]:
    """One row ``{"model", "impl", "kwargs"}`` per model, and per routing implementation for the routing models."""
    rows = []
    for name in models:
        kwargs = {"primary_backend": primary_backend, **(model_kwargs or {})}
        if "routing" not in name:
            rows.append({"model": name, "impl": "-", "kwargs": kwargs})
            continue
        for impl in routing_impls:
            rows.append({"model": name, "impl": impl, "kwargs": {**kwargs, "routing_impl": impl}})
    return rows


def measure_memory(
    name: str, model_kwargs: dict, device: str, num_points: int, mem_batches: Sequence[int], budget_gb: float
) -> dict:
    """Peak memory of forward + backward at the two batch sizes of ``mem_batches``; slope = bytes per sample; the
    largest batch within ``budget_gb`` = ``floor((budget - fixed) / slope)``, ``fixed`` the intercept.

    The peak counts every live tensor: weights, gradients, Adam's states (after a warm-up step), activations and
    temporaries (:func:`measure.bench.peak_tensor_bytes`: exact tensor accounting on CPU, the CUDA allocator's peak on
    GPU). The optimizer step itself is left out: its temporaries do not grow with the batch.
    """
    device = torch.device(device)
    torch.manual_seed(0)
    model = create_model(name, num_points=num_points, **model_kwargs).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    _step_fn(model, opt, unit_sphere_clouds(2, num_points, seed=1).to(device))()  # gradients and Adam states exist
    peaks = []
    for batch in mem_batches:
        clouds = unit_sphere_clouds(batch, num_points, seed=2).to(device)
        peaks.append(peak_tensor_bytes(lambda c=clouds: chamfer_distance(model(c), c).backward(), device, model, opt))
    (b1, b2), (p1, p2) = mem_batches, peaks
    per_sample = max((p2 - p1) / (b2 - b1), 1.0)
    fixed = p1 - per_sample * b1  # weights, gradients, Adam states and batch-independent temporaries
    max_batch = math.floor((budget_gb * 2**30 - fixed) / per_sample)
    return {"mem_mb_per_sample": per_sample / 2**20, "mem_peak_mb": [p / 2**20 for p in peaks],
            "mem_fixed_mb": fixed / 2**20, "max_batch": max(max_batch, 0)}  # fmt: skip


def train_chamfer(
    name: str,
    train: SyntheticParts,
    test: SyntheticParts,
    decoder: str,
    *,
    device: str = "cpu",
    train_steps: int = 60,
    lr: float = 1e-3,
    primary_backend: str = "fused",
    model_kwargs: dict | None = None,
) -> dict:
    """Chamfer, part purity (and its chance level: the same reconstructions cut into random patches of the
    capsules' sizes) and patch spread on ``test`` after ``train_steps`` Adam steps on ``train`` from the same seed
    and order for every model."""
    torch.manual_seed(0)
    device = torch.device(device)
    kwargs = {"num_points": train.num_points, "primary_backend": primary_backend, "decoder": decoder,
              **(model_kwargs or {})}  # fmt: skip
    model = create_model(name, **kwargs).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    xs = torch.stack([train[i][0] for i in range(len(train))])
    B = CHAMFER_BATCH
    order = np.random.default_rng(0).permutation(np.tile(np.arange(len(train)), train_steps * B // len(train) + 1))
    start = time.perf_counter()
    for s in range(train_steps):
        batch = xs[order[s * B : (s + 1) * B]].to(device)
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


def benchmark(
    models: Sequence[str],
    device: str,
    *,
    routing_impls: Sequence[str],
    num_points: int,
    batch: int,
    repeats: int,
    warmup: int,
    stat: str,
    budget_gb: float,
    mem_batches: Sequence[int],
    primary_backend: str,
    train_steps: int,
    decoders: Sequence[str],
    chamfer_points: int,
    train_per_class: int,
    lr: float,
    model_kwargs: dict,
) -> tuple[list[dict], list[dict]]:
    """Measures every row of :func:`entries`; the settings are ``tools/bench_capsules.py``'s flags of the same names
    (its defaults; ``num_points`` is ``--points``).

    Returns:
        ``(results, decoded)``: one dict per row (params, ``step_ms`` and each round's ``step_ms_rounds``, the
        memory columns of :func:`measure_memory`, the first decoder's :func:`train_chamfer` columns, the paper's
        figures and, for the centroid models, ``vs_routing``: ratios against each routing impl of the same size);
        and one dict per model and decoder of ``decoders`` (:func:`train_chamfer`).
    """
    device = torch.device(device)
    results, steps = entries(models, routing_impls, primary_backend, model_kwargs), []
    for r in results:
        torch.manual_seed(0)
        model = create_model(r["model"], num_points=num_points, **r["kwargs"]).to(device)
        r["params_m"] = count_params(model) / 1e6
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        steps.append(_step_fn(model, opt, unit_sphere_clouds(batch, num_points, seed=3).to(device)))
    rounds = time_round_robin(steps, device, repeats, warmup)
    del steps
    train = SyntheticParts("train", chamfer_points, CLASSES, samples_per_class=train_per_class, seed=0)
    test = SyntheticParts("test", chamfer_points, CLASSES, samples_per_class=4, seed=0)
    decoded = []  # every model with every decoder
    for name in models:  # the reference routing impl computes the same function (tested): trained once
        for decoder in decoders:
            trained = train_chamfer(name, train, test, decoder, device=device, train_steps=train_steps, lr=lr,
                                    primary_backend=primary_backend, model_kwargs=model_kwargs)  # fmt: skip
            decoded.append({"model": name, "decoder": decoder, **trained})
    for r, times in zip(results, rounds, strict=True):
        r["step_ms"] = min(times) if stat == "min" else statistics.median(times)
        r["step_ms_rounds"] = times
        r.update(measure_memory(r["model"], r["kwargs"], device, num_points, mem_batches, budget_gb))
        if r["impl"] != "reference":
            first = next(d for d in decoded if d["model"] == r["model"] and d["decoder"] == decoders[0])
            r.update({k: v for k, v in first.items() if k != "model"})
        r["paper_chamfer_1e3"], r["paper_params_m"], r["paper_max_batch"] = PAPER[r["model"]]
    for _, (routing, centroid) in PAIRS.items():
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
            if "chamfer" in a:
                ratios["chamfer"] = c["chamfer"] / a["chamfer"]
    for r in results:
        r.pop("kwargs")
    return results, decoded


def targets(results: Sequence[dict], device: torch.device | str, train_steps: int) -> list[dict]:
    """Each centroid model against each routing impl of its size: max batch (>= 3x), params (<= 1/3) and, where the
    routing row was trained, Chamfer after ``train_steps`` steps (< 1x)."""
    out = []
    for size, (routing, centroid) in PAIRS.items():
        c = next((r for r in results if r["model"] == centroid and "vs_routing" in r), None)
        if c is None:
            continue
        for a in (r for r in results if r["model"] == routing):
            ratios = c["vs_routing"][a["impl"]]
            vs = f"{size} vs {a['impl']} routing"
            paper_batch = c["paper_max_batch"] / a["paper_max_batch"]
            detail = f"{c['max_batch']} vs {a['max_batch']}; paper {paper_batch:.2f}x"
            out.append(target(f"{vs}: max batch", ratios["max_batch"], ">=", TARGETS["max_batch"], device=device,
                              detail=detail))  # fmt: skip
            out.append(target(f"{vs}: params", ratios["params"], "<=", TARGETS["params"], device=device))
            if "chamfer" in ratios:
                detail = f"{c['chamfer']:.4g} vs {a['chamfer']:.4g}"
                out.append(target(f"{vs}: Chamfer after {train_steps} steps", ratios["chamfer"], "<", 1,
                                  device=device, detail=detail))  # fmt: skip
    return out


def table(
    results: Sequence[dict], routing_impls: Sequence[str], budget_gb: float, train_steps: int, decoder: str
) -> tuple[list[str], list[list]]:
    """The main table's headers and rows (``"-"`` where a row has no such column); ``decoder``: the one whose
    Chamfer and purity fill it."""
    impls = [i for i in routing_impls if any(r["impl"] == i for r in results)]
    headers = ["model", "routing impl", "params (M)", "paper params (M)", "train step (ms)", "MB / sample",
               f"max batch ({budget_gb:g} GB)", "paper max batch", f"Chamfer @{train_steps} steps ({decoder})",
               "part purity", "purity chance"]  # fmt: skip
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
    return headers, rows


def decoder_table(decoded: Sequence[dict], train_steps: int) -> tuple[list[str], list[list]]:
    """The decoder table: Chamfer, part purity, its chance level and patch spread of every model and decoder."""
    headers = ["model", "decoder", f"Chamfer @{train_steps} steps", "part purity", "purity chance", "purity - chance",
               "patch spread"]  # fmt: skip
    rows = [[d["model"], d["decoder"], d["chamfer"], d["part_purity"], d["part_purity_chance"],
             d["part_purity"] - d["part_purity_chance"], d["patch_spread"]] for d in decoded]  # fmt: skip
    return headers, rows


# ------------------------------------------------------------------------ the Chamfer loss's backends (bench_points)

CHAMFER_HEADERS = ["B", "N", "C", "backend", "ms", "speedup vs dense", "speedup vs chunked", "same indices"]
# The dense reference builds (B, N, N, C) differences (and their gradient): not timed where that tensor is larger.
CHAMFER_DENSE_MAX_BYTES = 2**30


def _chamfer_step(a: torch.Tensor, b: torch.Tensor, backend: str) -> None:
    chamfer_distance(a, b, backend=backend).backward()


def chamfer_backend_rows(
    device: torch.device | str, batches: Sequence[int], num_points: Sequence[int], repeats: int
) -> list[list]:
    """The Chamfer loss per backend (rows of :data:`CHAMFER_HEADERS`): for every B of ``batches`` and N of
    ``num_points``, two unit-sphere clouds of N points (C = 3), the loss and its backward pass (a training step's use)
    of each installed backend, timed round robin (:func:`measure.bench.time_round_robin`, median of ``repeats``
    rounds); each one's speedup over the dense reference and over the chunked search of the same run, and whether its
    nearest indices equal the chunked search's (the dense reference's: ``tests/capsules/test_chamfer.py``). The dense
    reference sits out where its ``(B, N, N, C)`` differences exceed :data:`CHAMFER_DENSE_MAX_BYTES` (NaN ratios)."""
    device = torch.device(device)
    rows = []
    for B, N in itertools.product(batches, num_points):
        a = unit_sphere_clouds(B, N, seed=0).to(device).requires_grad_()
        b = unit_sphere_clouds(B, N, seed=1).to(device).requires_grad_()
        dense_fits = B * N * N * 3 * a.element_size() <= CHAMFER_DENSE_MAX_BYTES
        names = [n for n in CHAMFER_BACKENDS if available("chamfer", n, device) and (n != "dense" or dense_fits)]
        steps = [partial(_chamfer_step, a, b, name) for name in names]
        times = time_round_robin(steps, device, repeats, warmup=1)
        ms = dict(zip(names, (statistics.median(t) for t in times)))
        ref = chamfer_distance(a.detach(), b.detach(), return_indices=True, backend="chunked")
        for name in names:
            out = chamfer_distance(a.detach(), b.detach(), return_indices=True, backend=name)
            same = torch.equal(out.idx_a, ref.idx_a) and torch.equal(out.idx_b, ref.idx_b)
            vs_dense = ms["dense"] / ms[name] if "dense" in ms else float("nan")
            rows.append([B, N, 3, name, ms[name], vs_dense, ms["chunked"] / ms[name], "yes" if same else "NO"])
    return rows
