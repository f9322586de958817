"""Throughput of the ModelNet40 models (``tools/bench_modelnet.py``): train-step and inference samples/s, params,
GMACs and dispatched ops, every row measured in one run, and the targets that run declares.

Rows (:func:`plan`): the centroid transformer with T = 1, 2, 3 attention steps (one row per KNN attention form
other than ``auto``, labelled with it, e.g. ``T=1 masked``: :func:`attention.centroid.masked_knn_attention`, ``T=1
triton``: the fused kernel; one per chunk budget, e.g. ``T=1 chunks 16 MiB``: the gather form and the KNN searches
chunked at that budget instead of the device's default, :func:`attention.chunking.chunk_budget`; and one per form to
compile, e.g. ``T=1 masked compiled``: ``torch.compile`` of the model in that form, static shapes, what the compiler
alone gives to the eager path; ``T=1 compiled`` and ``T=1 triton compiled`` keep the fused kernels on CUDA as opaque
operators inside the compiled graph, :mod:`attention.kernels.ops`), its downsampling-only twins (``_random``,
``_fps``, ``_kmeans``: the centroid blocks keep their init and MLP, no attention step) and every peer model registered
in :mod:`pointcloud` (names not starting with ``centroid_transformer``), all on the same random batch of unit-sphere
clouds, 40 classes.

* train step: forward + cross-entropy + backward + AdamW step, in train mode;
* inference: eval-mode forward under ``torch.no_grad``;
* all rows are built first, warmed up, then timed round-robin (:func:`measure.bench.time_round_robin`), so a change
  in background load hits all rows alike; samples/s = batch / the median (or fastest) round;
* ``train_vs_random`` = samples/s / the random twin's samples/s in the same run; ``paper_train_sps`` = the paper's
  training throughput (samples/s on their GPU: T=1 60, T=2 55, T=3 52, random 312, FPS 66, k-means 54) and its ratio
  to their random twin, the number to compare ours with;
* params and GMACs per sample, counted at batch 1 (matmuls incl. attention; FPS, KNN gathers and other element-wise
  work cost time but no GMACs: that gap is what this table shows), on the run's device, where ``"auto"`` picks the
  form of the KNN attention (the fused kernel on CUDA, gather on CPU);
* ``ops_per_step``: aten ops one train step dispatches (forward and backward, not the optimizer; one extra untimed
  step) and ``kernel_ops_per_step`` those that are not views, i.e. launch kernels on a GPU
  (:func:`measure.bench.count_aten_ops`). A GPU runs small-kernel models at the speed the host issues them, a few
  microseconds per op, so this column predicts that cost on any device. A fused kernel's operator
  (:mod:`attention.kernels.ops`: one launch, or two or three for a pass of a multi-kernel scan) counts as one op;
  compiled rows count nothing (``-``: their work runs as generated kernels).

Targets (:func:`targets`): the centroid model (T = 1) trains at >= 0.5x the random twin's samples/s (the paper:
60 / 312 = 0.19x, FPS being their bottleneck); on CUDA, the centroid model (T = 1) trains at >= 1.3x PointNet++'s
samples/s in the ``auto`` form (the fused kernels, eager or compiled: the fastest of the ``T=1`` row and its compiled
rows, ``T=1 compiled`` and e.g. ``T=1 compiled reduce-overhead``) and at least as fast in the gather form.
``tools/bench_modelnet.py --batch 32 128`` times every row at both batch sizes, one table each, and names the batch
in each verdict.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F

from attention import backends
from attention.chunking import CHUNK_BUDGETS
from engine.trainer import COMPILE_MODES
from measure.bench import (
    allow_recompiles,
    count_aten_ops,
    profile_step,
    target,
    time_train_and_infer,
    unit_sphere_clouds,
)
from measure.stats import count_gmacs, count_params

from .model import create_model, list_models

__all__ = [
    "CENTROID",
    "COMPILE_FORMS",
    "PAPER_TRAIN",
    "POINTNET2",
    "RANDOM",
    "TWINS",
    "benchmark",
    "check_settings",
    "check_throughput_settings",
    "chunk_budget",
    "default_models",
    "parse_variant",
    "plan",
    "prepare",
    "runnable",
    "table",
    "targets",
]

_logger = logging.getLogger(__name__)

CENTROID = "centroid_transformer_modelnet40"
RANDOM = f"{CENTROID}_random"
TWINS = [RANDOM, f"{CENTROID}_fps", f"{CENTROID}_kmeans"]
POINTNET2 = "pointnet2_ssg_modelnet40"
NUM_CLASSES = 40
RANDOM_TARGET = 0.5  # centroid (T = 1) train samples/s over the random twin's
POINTNET2_TARGET = 1.3  # centroid (T = 1, "auto": the fused kernels) train samples/s over PointNet++'s, on CUDA
POINTNET2_GATHER_TARGET = 1.0  # the same in the gather form
COMPILE_FORMS = ("auto", "gather", "masked", "triton")  # the fused kernel: an opaque operator in the compiled graph

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
    models: Sequence[str],
    steps: Sequence[int],
    num_centroids: Sequence[int] | None,
    attn_backends: Sequence[str] = ("auto",),
    chunk_mb: Sequence[int] = (),
    compile_forms: Sequence[str] = (),
    compile_modes: Sequence[str] = ("default",),
    variants: Sequence[tuple[str, dict]] = (),
) -> list[Row]:
    """One row per model; the centroid model gets one row per T and attention backend (and per chunk budget of its
    gather form, ``chunk_mb``, kwarg ``_chunk_mb``; and per form in ``compile_forms`` and ``torch.compile`` mode in
    ``compile_modes``, compiled: kwarg ``_compile``, the mode; labelled ``compiled``, or ``compiled <mode>`` for a
    mode other than ``"default"``), the twins T = 0, peers None. Each of ``variants`` (a label and constructor
    keywords, :func:`parse_variant`) adds a row of the centroid model built with those keywords, labelled with its
    label; its T is its ``num_steps`` (default 1)."""
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
                for b in compile_forms:
                    for mode in compile_modes:
                        label = f"{name} T={t}" + ("" if b == "auto" else f" {b}") + " compiled"
                        label += "" if mode == "default" else f" {mode}"
                        rows.append((label, name, t, {**kwargs, "num_steps": t, "attn_backend": b, "_compile": mode}))
            for label, extra in variants:
                rows.append((f"{name} {label}", name, int(extra.get("num_steps", 1)), {**kwargs, **extra}))
        else:
            rows.append((name, name, 0 if name in TWINS else None, kwargs))
    return rows


def parse_variant(spec: str) -> tuple[str, dict]:
    """``"LABEL:key=value,key=value"`` -> ``(LABEL, {key: value})``, values read as YAML (``true``, ``0.0``, ``xyz``):
    a row of the centroid model built with those keywords (``--variant``)."""
    import yaml

    label, sep, items = spec.partition(":")
    if not sep or not label or not items:
        raise ValueError(f"a variant is LABEL:key=value[,key=value...], got {spec!r}")
    kwargs = {}
    for item in items.split(","):
        key, eq, value = item.partition("=")
        if not eq or not key.strip():
            raise ValueError(f"variant {label!r}: expected key=value, got {item!r}")
        kwargs[key.strip()] = yaml.safe_load(value)
    return label, kwargs


def runnable(rows: Sequence[Row], device: str) -> tuple[list[Row], dict[str, str]]:
    """The rows that can run on ``device``, and why each other one cannot (a KNN attention form that needs another
    device or a missing package, e.g. ``triton`` on a CPU): a CPU run times the rest."""
    kept, skipped = [], {}
    for row in rows:
        form = row[3].get("attn_backend", "auto")
        b = backends.BACKENDS["knn_attention"].get(form)
        why = None if b is None else b.unsupported(device)
        if b is not None and why is None and not b.installed():
            why = f"needs {backends.INSTALL_HINTS[b.package]}"
        if why is None:
            kept.append(row)
        else:
            skipped[row[0]] = why
    return kept, skipped


@contextlib.contextmanager
def chunk_budget(mb: int | None) -> Iterator[None]:
    """Within: the KNN attention's and the KNN searches' default chunk budgets are ``mb`` MiB on every device."""
    saved = {op: CHUNK_BUDGETS[op] for op in ("knn_attention", "knn")}
    if mb is not None:
        for op in saved:
            CHUNK_BUDGETS[op] = {"default": mb * 2**20}
    try:
        yield
    finally:
        CHUNK_BUDGETS.update(saved)


def prepare(
    name: str, kwargs: dict, device: torch.device | str, batch: int, num_points: int, amp: bool = False
) -> tuple[dict, Callable[[], None], Callable[[], None]]:
    """Params, GMACs and ops per step of one model configuration, and its train-step and inference closures on a
    batch of ``batch`` clouds of ``num_points`` points."""
    device = torch.device(device)
    torch.manual_seed(0)
    kwargs = dict(kwargs)
    chunk_mb = kwargs.pop("_chunk_mb", None)
    compiled = kwargs.pop("_compile", None)  # a torch.compile mode, or None: eager
    model = create_model(name, **kwargs)
    model.to(device)
    # on the run's device: "auto" forms are chosen per device (the KNN attention is masked on CUDA, gather on CPU)
    example = unit_sphere_clouds(1, num_points).to(device)  # (B, N, 3)
    stats = {"params_m": count_params(model) / 1e6, "gmacs": count_gmacs(model, example)}
    gen = torch.Generator().manual_seed(1)
    points = unit_sphere_clouds(batch, num_points, seed=1).to(device)  # (B, N, 3)
    labels = torch.randint(0, NUM_CLASSES, (batch,), generator=gen).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-4)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp)
    # static shapes: every call has the bench's batch; compiled in the first (untimed) call
    mode = {} if compiled in (None, "default") else {"mode": compiled}  # reduce-overhead: CUDA graphs as well
    run = torch.compile(model, dynamic=False, **mode) if compiled else model
    if compiled:  # one graph per (T, form, batch, mode, train or eval) of the model's forward
        allow_recompiles()

    def forward_backward() -> None:
        if not model.training:  # Module.train() walks every submodule: host time, not the step's
            model.train()
        with chunk_budget(chunk_mb):  # (the backward pass reuses the chunk rows its forward chose)
            with autocast:
                loss = F.cross_entropy(run(points).float(), labels)
            loss.backward()

    def train_step() -> None:
        forward_backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    def infer() -> None:
        if model.training:
            model.eval()
        with torch.no_grad(), autocast, chunk_budget(chunk_mb):
            run(points)

    if compiled:  # generated kernels, not aten ops
        stats |= {"ops_per_step": None, "kernel_ops_per_step": None}
    else:
        ops, views = count_aten_ops(forward_backward)
        model.zero_grad(set_to_none=True)
        stats |= {"ops_per_step": ops, "kernel_ops_per_step": ops - views}
    return stats, train_step, infer


def check_settings(
    models: Sequence[str],
    device: str,
    amp: bool,
    batch: int,
    repeats: int,
    chunk_mb: Sequence[int] = (),
    compile_forms: Sequence[str] = (),
    compile_modes: Sequence[str] = ("default",),
) -> None:
    """Raises ``ValueError`` for settings :func:`benchmark` cannot run, naming the fix."""
    check_throughput_settings(models, list_models(), device, amp, batch, repeats)
    if any(mb < 1 for mb in chunk_mb):
        raise ValueError("--chunk-mb budgets must be >= 1 MiB")
    if set(compile_forms) - set(COMPILE_FORMS):
        raise ValueError(
            f"--compile takes the forms torch.compile traces, {list(COMPILE_FORMS)}; got {list(compile_forms)}"
        )
    if set(compile_modes) - set(COMPILE_MODES):
        raise ValueError(f"--compile-mode takes torch.compile's modes {list(COMPILE_MODES)}; got {list(compile_modes)}")
    if list(compile_modes) != ["default"] and not compile_forms:
        raise ValueError("--compile-mode applies to the compiled rows: name their forms with --compile FORM")


def check_throughput_settings(
    models: Sequence[str], registered: Sequence[str], device: str, amp: bool, batch: int, repeats: int
) -> None:
    """The settings checks every point-model throughput bench shares (``models`` among ``registered``), raising
    ``ValueError``s that name the fix."""
    if amp and device != "cuda":
        raise ValueError("--amp is CUDA bf16 autocast: use it with --device cuda")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda but torch sees no CUDA device")
    if repeats < 1:
        raise ValueError("--repeats must be >= 1")
    if batch < 2:
        raise ValueError("--batch must be >= 2 (BatchNorm in train mode needs two samples)")
    unknown = sorted(set(models) - set(registered))
    if unknown:
        raise ValueError(f"unknown models {unknown}; registered: {list(registered)}")


def benchmark(
    rows: Sequence[Row],
    device: str = "cpu",
    batch: int = 32,
    num_points: int = 1024,
    amp: bool = False,
    repeats: int = 5,
    warmup: int = 2,
    stat: str = "median",
    profile: str | None = None,
) -> list[dict]:
    """Measures every row of :func:`plan`: one dict per row with its stats, ``{train,infer}_ms`` (and each round's
    ``_ms_rounds``), ``{train,infer}_sps`` and the ratios to the random twin and the paper's; with a ``profile``
    folder, the train step's :func:`measure.bench.profile_step` summary after timing (``"profile"``).

    Each row is built and called once (train step and inference; a compiled row compiles there) before any is timed:
    a row that raises (a compile that fails, memory that runs out) gets ``error`` instead of figures, and the other
    rows are timed as usual."""
    prepared, failed = [], {}
    for label, name, steps, kwargs in rows:
        row = {"label": label, "model": name, "num_steps": steps}
        try:
            stats, train_step, infer = prepare(name, kwargs, device, batch, num_points, amp)
            train_step()
            infer()
        except Exception as e:  # the row reports its error; the other rows still run
            failed[label] = {**row, "error": f"{type(e).__name__}: {e}"[:300]}
            _logger.warning("%s failed: %s", label, failed[label]["error"])
            continue
        prepared.append(({**row, **stats}, train_step, infer))
    timed = {r["label"]: r for r in time_train_and_infer(prepared, device, batch, repeats, warmup, stat)}
    for row, train_step, _ in prepared if profile else ():
        name = re.sub(r"[^\w.=-]+", "_", f"b{batch}-{row['label']}")
        timed[row["label"]]["profile"] = profile_step(train_step, device, profile, name)
    results = [timed.get(label) or failed[label] for label, *_ in rows]
    base = next((r for r in results if r["model"] == RANDOM and "error" not in r), None)
    paper_base = PAPER_TRAIN[RANDOM]
    for r in results:
        if "error" in r:
            continue
        r["train_vs_random"] = r["train_sps"] / base["train_sps"] if base else None
        r["infer_vs_random"] = r["infer_sps"] / base["infer_sps"] if base else None
        r["paper_train_sps"] = PAPER_TRAIN.get(r["label"])
        r["paper_train_vs_random"] = r["paper_train_sps"] / paper_base if r["paper_train_sps"] else None
    return results


def table(results: Sequence[dict]) -> tuple[list[str], list[list]]:
    """The printed table's headers and rows (``"-"`` where a ratio has no baseline)."""

    def cell(v: float | None) -> object:
        return "-" if v is None else v

    headers = ["model", "T", "params (M)", "GMACs", "ops/step", "non-view ops", "train samples/s", "train vs random",
               "paper train samples/s", "paper vs random", "infer samples/s", "infer vs random"]  # fmt: skip
    rows = [[r["label"], cell(r["num_steps"]), r["params_m"], r["gmacs"], cell(r["ops_per_step"]),
             cell(r["kernel_ops_per_step"]), r["train_sps"], cell(r["train_vs_random"]), cell(r["paper_train_sps"]),
             cell(r["paper_train_vs_random"]), r["infer_sps"], cell(r["infer_vs_random"])]
            if "error" not in r else [r["label"], cell(r["num_steps"]), r["error"][:80], *["-"] * (len(headers) - 3)]
            for r in results]  # fmt: skip
    return headers, rows


def targets(
    results: Sequence[dict], device: str, amp: bool = False, num_points: int = 1024, batch: int | None = None
) -> list[dict]:
    """The centroid model (T = 1) against the random twin (>= 0.5x, any device) and, on CUDA, against PointNet++
    (>= 1.3x in the ``auto`` form, the fused kernels, eager or compiled: the fastest of the ``T=1`` row and its
    compiled rows, which the detail names; >= 1x in the gather form): train samples/s of the same run. ``batch``
    (the run's) goes into the names, so that runs at two batch sizes keep their verdicts apart."""
    by = {r["label"]: r for r in results if "error" not in r}
    t1, base, pn = by.get(f"{CENTROID} T=1"), by.get(RANDOM), by.get(POINTNET2)
    at = "" if batch is None else f" at batch {batch}"
    name = f"centroid T=1 train samples/s vs the random twin's{at}"
    if t1 is None or base is None:
        out = [target(name, None, ">=", RANDOM_TARGET, device=device, detail="needs both in --models")]
    else:
        paper = f"paper {PAPER_TRAIN[t1['label']] / PAPER_TRAIN[RANDOM]:.2f}x"
        detail = f"{t1['train_sps']:.1f} vs {base['train_sps']:.1f} samples/s; {paper}"
        out = [target(name, t1["train_vs_random"], ">=", RANDOM_TARGET, device=device, detail=detail)]
    setting = ", ".join([*([f"batch {batch}"] if batch is not None else []), *(["AMP"] if amp else []),
                         f"{num_points} points"])  # fmt: skip
    eager_t1 = f"{CENTROID} T=1"
    for pick, what, want in (
        (lambda label: label == eager_t1 or label.startswith(f"{eager_t1} compiled"), "centroid T=1", POINTNET2_TARGET),
        (lambda label: label == f"{eager_t1} gather", "centroid T=1, attn_backend=gather,", POINTNET2_GATHER_TARGET),
    ):
        name = f"{what} train samples/s vs PointNet++ ({setting})"
        rows = [r for label, r in by.items() if pick(label)]
        if not rows or pn is None:
            out.append(target(name, None, ">=", want, device=device, on="cuda", detail="rows not measured"))
            continue
        ct = max(rows, key=lambda r: r["train_sps"])
        how = lambda r: r["label"].removeprefix(f"{eager_t1} ")  # noqa: E731  (compiled, compiled reduce-overhead)
        if ct["ops_per_step"] is None:  # compiled: its work runs as generated kernels, no ops/step
            detail = f"{how(ct)}, {ct['train_sps']:.0f} vs {pn['train_sps']:.0f} samples/s (PointNet++ eager)"
        else:
            detail = f"ops/step {ct['ops_per_step']} vs {pn['ops_per_step']}"
            detail += "".join(f"; {how(r)} {r['train_sps']:.0f} samples/s" for r in rows if r is not ct)
        out.append(target(name, ct["train_sps"] / pn["train_sps"], ">=", want, device=device, on="cuda", detail=detail))
    return out
