"""What ``tools/bench_vision.py`` measures and the target it declares: inference and train-step images/s of the vision
models against DeiT measured in the same run (:func:`benchmark`), and Ours-1 against DeiT-tiny
(:func:`measure.bench.target`)."""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import timm
import torch
import torch.nn.functional as F

from measure.bench import allow_recompiles, capture_call, profile_step, target, time_train_and_infer
from measure.stats import count_gmacs, count_params

from .recipe import DeiTConfig, model_spec

__all__ = [
    "BASELINES",
    "COMPILE_CHOICES",
    "GRAPH_MODES",
    "OURS_1",
    "SHAPE_KNOBS",
    "TARGETS",
    "benchmark",
    "config_models",
    "model_names",
    "ours_target",
    "registered",
    "table",
    "timed_calls",
    "width_of",
]

_logger = logging.getLogger(__name__)

BASELINES = {"tiny": "deit_tiny_patch16_224", "small": "deit_small_patch16_224"}
OURS_1 = "centroid_deit_tiny_c6_patch16_224"
# Ours-1's inference images/s over DeiT-tiny's: fp32 on CPU; bf16 autocast on CUDA, 95% of its MAC ratio (1.25 / 0.794
# GMACs = 1.58x; Token Merging's best DeiT-Ti result is 1.56x)
TARGETS = {"cpu": 1.4, "cuda": 1.5}
# --compile: every model eager, every model compiled, or each both ways (two rows)
COMPILE_CHOICES = {"no": (False,), "yes": (True,), "both": (False, True)}
# The constructor keywords that shape a ViT: a config's model is timed against the DeiT of its width built with its own
SHAPE_KNOBS = ("img_size", "patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio")
# the torch.compile modes that run the model in CUDA graphs (recorded on a call after the compiling one)
GRAPH_MODES = ("reduce-overhead", "max-autotune")


def registered() -> list[str]:
    """Every timm model that :mod:`vision` registers (timm files models under their module's last name)."""
    return sorted({n for module in ("centroid_deit", "baselines") for n in timm.list_models(module=module)})


def width_of(name: str) -> str:
    """``"small"`` or ``"tiny"``: the DeiT a model is compared with."""
    return "small" if "small" in name else "tiny"


def ours_target(results: Sequence[dict], device: torch.device | str) -> dict:
    """Ours-1's inference images/s over DeiT-tiny's, run the same way (eager or compiled), against :data:`TARGETS` of
    the device type: the better of the modes measured, which the detail names.

    Rows of one batch size: their ``infer_vs_deit``. Rows of several (a ``"batch"`` key each, ``tools/bench_vision.py
    --batch 512 2048``): each model's throughput is its images/s at its best batch of those timed, as DeiT and Token
    Merging report throughput (a batch large enough to fill the GPU); the detail names both batches."""
    kind = torch.device(device).type
    want = TARGETS["cuda" if kind == "cuda" else "cpu"]
    if len({r["batch"] for r in results if "batch" in r}) > 1:
        rows = _at_best_batches(results)
    else:
        rows = [r for r in results if r["model"] == OURS_1 and r.get("infer_vs_deit") is not None]
    name = f"Ours-1 inference images/s vs DeiT-tiny on {kind.upper()}"
    if not rows:
        why = "; ".join(f"{r.get('label', r['model'])}: {r['error']}" for r in results if "error" in r)
        return target(name, None, ">=", want, device=device, detail=why or f"{OURS_1} not in --models")
    best = max(rows, key=lambda r: r["infer_vs_deit"])
    detail = ""
    if len(rows) > 1:  # --compile both: both models eager, and both compiled
        mode = lambda r: (  # noqa: E731
            (f"compiled ({r.get('compile_mode') or 'default'})" if r.get("compiled") else "eager")
            + (", captured" if r.get("captured") else "")
        )
        ratios = (f"{mode(r)} {r['infer_vs_deit']:.3g}{r.get('batches', '')}" for r in rows)
        detail = f"{mode(best)}; " + ", ".join(ratios)
    elif "batches" in best:
        detail = best["batches"].strip()
    return target(name, best["infer_vs_deit"], ">=", want, device=device, detail=detail)


def _at_best_batches(results: Sequence[dict]) -> list[dict]:
    """One row per mode that both Ours-1 and DeiT-tiny ran in, at any of several batch sizes: ``infer_vs_deit`` =
    Ours-1's best images/s over the batches where it ran / DeiT-tiny's best in the same mode, ``batches`` names the
    two batch sizes (a batch where a model failed, e.g. out of memory, is not one of its candidates)."""
    mode = lambda r: (bool(r.get("compiled")), r.get("compile_mode"), bool(r.get("captured")))  # noqa: E731
    fastest = lambda rs: max(rs, key=lambda r: r["infer_ips"])  # noqa: E731
    ran = [r for r in results if "error" not in r and r.get("infer_ips")]
    ours = [r for r in ran if r["model"] == OURS_1]
    deit = [r for r in ran if r["model"] == BASELINES["tiny"]]
    out = []
    for m in dict.fromkeys(mode(r) for r in ours):
        base_rows = [r for r in deit if mode(r) == m]
        if not base_rows:
            continue
        best, base = fastest([r for r in ours if mode(r) == m]), fastest(base_rows)
        batches = f" (batch {best['batch']}; DeiT-tiny's {base['batch']})"
        out.append({**best, "infer_vs_deit": best["infer_ips"] / base["infer_ips"], "batches": batches})
    return out


def config_models(cfg: DeiTConfig, num_classes: int = 1000) -> dict[str, dict[str, Any]]:
    """The models that ``tools/bench_vision.py --config`` times, name -> :func:`benchmark`'s ``model_kwargs``: the
    config's model as its training run builds it (:func:`vision.recipe.model_spec`: image and patch size, width,
    depth, heads, MLP ratio, the centroid block, ``model_kwargs``), with ``num_classes`` classes, after the DeiT of its
    width built with the same :data:`SHAPE_KNOBS`, so that ``vs DeiT`` compares models of one shape (a DeiT config's
    model is its own baseline: one row)."""
    name, kwargs = model_spec(cfg, num_classes)
    shape = {k: v for k, v in kwargs.items() if k in SHAPE_KNOBS}
    models = {BASELINES[width_of(name)]: {**shape, "num_classes": num_classes}}
    models[name] = kwargs
    return models


def model_names(models: Sequence[str] | None = None) -> list[str]:
    """``models`` (default: both DeiT baselines and every :func:`registered` model), with the DeiT of each model's
    width put first where it is missing."""
    names = list(models) if models else [BASELINES["tiny"], BASELINES["small"], *registered()]
    for width in {width_of(n) for n in names}:
        if BASELINES[width] not in names:
            names.insert(0, BASELINES[width])
    return names


def timed_calls(
    model: torch.nn.Module, fwd: Callable, images: torch.Tensor, labels: torch.Tensor, amp: bool, train: bool
) -> dict[str, Callable[..., object]]:
    """The timed calls of one model: ``infer`` (eval mode, no grad; of ``images``, or of the batch it is given) and,
    with ``train``, ``train`` (forward + cross-entropy + backward + AdamW step), under bf16 autocast where ``amp``.
    Each switches the model's mode only when it is in the other one: ``Module.eval()`` walks every submodule, host
    time that a timed call would otherwise count."""
    device_type = images.device.type
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

    def infer(batch: torch.Tensor = images) -> torch.Tensor:
        if model.training:
            model.eval()
        with torch.no_grad(), torch.autocast(device_type, torch.bfloat16, enabled=amp):
            return fwd(batch)

    def train_step() -> None:
        if not model.training:
            model.train()
        with torch.autocast(device_type, torch.bfloat16, enabled=amp):
            loss = F.cross_entropy(fwd(images).float(), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    return {"infer": infer, "train": train_step} if train else {"infer": infer}


def benchmark(
    names: Sequence[str],
    device: torch.device | str,
    *,
    batch: int,
    img_size: int,
    repeats: int,
    warmup: int,
    stat: str,
    amp: bool,
    compile_models: bool | str,
    train: bool,
    compile_mode: str = "default",
    channels_last: bool = False,
    capture: bool = False,
    profile: str | None = None,
    model_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
) -> list[dict]:
    """Images/s of every model of ``names`` (1000 classes, random images), all rows timed round-robin after ``warmup``
    untimed calls each (:func:`measure.bench.time_train_and_infer`: every row's train steps, then every row's
    inference calls), images/s = batch / the median (or ``stat="min"``: fastest) round. The settings are
    ``tools/bench_vision.py``'s flags (its defaults); ``amp`` is bf16 autocast; ``compile_models`` (a key of
    :data:`COMPILE_CHOICES`, or a bool) runs every model eager (``"no"``), wrapped in ``torch.compile`` (``"yes"``),
    or both ways, as two rows (``"both"``), compiled in ``compile_mode`` (``"reduce-overhead"``: CUDA graphs too;
    the row's ``compile_mode``), with static shapes, after ``torch.compiler.reset()`` (the process's earlier
    compiled graphs go). ``channels_last`` puts the images and every model's weights in that memory format (timm's
    ``benchmark.py --channels-last``): the patch embedding's convolution then reads NHWC data. ``capture`` (CUDA, with
    ``train`` False and a ``compile_mode`` without CUDA graphs of its own) captures every row's inference call, eager
    or compiled, whole into one CUDA graph (:func:`measure.bench.capture_call`): a timed call copies the batch into the
    graph's input and replays it, so a row's time is its kernels' and not the host's (``captured`` ends its label).
    With a ``profile`` folder, each row's inference call (what the target reads) is profiled after timing
    (:func:`measure.bench.profile_step`, ``"profile"``). Each model is ``timm.create_model(name, img_size=img_size)``
    with the keywords ``model_kwargs`` holds for its name, if any (:func:`config_models`: a config's sizes); an
    ``img_size`` there must be ``img_size``, the images' size.

    Returns:
        One dict per model and mode: ``label`` (the name, `` compiled`` added in a ``"both"`` run's compiled rows),
        ``model``, ``compiled``, ``compile_mode``, ``captured``, ``img_size``, ``kwargs`` (the constructor keywords
        besides ``img_size``), ``params_m``, ``gmacs`` (per image), ``infer_ms``,
        ``infer_ips`` and ``infer_vs_deit`` (over the same-width DeiT's run the same way, which ``names`` must hold:
        :func:`model_names`), and with ``train`` the same for the train step; with ``profile``, ``"profile"``.
    """
    modes = COMPILE_CHOICES[{False: "no", True: "yes"}.get(compile_models, compile_models)]
    model_kwargs = {name: dict(kw) for name, kw in (model_kwargs or {}).items()}
    sizes = {name: kw["img_size"] for name, kw in model_kwargs.items() if kw.get("img_size", img_size) != img_size}
    if sizes:
        raise ValueError(f"model_kwargs give image sizes {sizes} that are not the images' img_size={img_size}")
    if capture and (torch.device(device).type != "cuda" or train or (any(modes) and compile_mode in GRAPH_MODES)):
        raise ValueError(
            "capture takes CUDA, inference only (train=False) and a compile mode without CUDA graphs of its own "
            f"(not {' or '.join(GRAPH_MODES)}); got device {device}, train={train}, compile_mode={compile_mode!r}"
        )
    if any(modes):
        # a fresh start for this call's graphs (a caller's earlier batch size: its graphs and CUDA-graph pools go),
        # and room for one graph per model and grad mode: models of one class share the forward dynamo counts
        torch.compiler.reset()
        allow_recompiles()
    device = torch.device(device)
    gen = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, img_size, img_size, generator=gen).to(device)
    memory_format = torch.channels_last if channels_last else torch.contiguous_format
    images = images.contiguous(memory_format=memory_format)
    labels = torch.randint(0, 1000, (batch,), generator=gen).to(device)
    rows = {}
    for name in names:
        for compiled in modes:
            label = f"{name} compiled" if compiled and len(modes) > 1 else name
            label += " captured" if capture else ""
            kwargs = {k: v for k, v in model_kwargs.get(name, {}).items() if k != "img_size"}
            row = {"label": label, "model": name, "compiled": compiled, "captured": capture, "img_size": img_size}
            row |= {"compile_mode": compile_mode if compiled else None, "kwargs": kwargs}
            try:
                torch.manual_seed(0)
                model = timm.create_model(name, img_size=img_size, **kwargs)
                row |= {
                    "params_m": count_params(model) / 1e6,
                    "gmacs": count_gmacs(model, torch.randn(1, 3, img_size, img_size)),
                }
                model.to(device, memory_format=memory_format)
                # dynamic=False: a second batch size would otherwise recompile with a dynamic batch dimension
                fwd = torch.compile(model, mode=compile_mode, dynamic=False) if compiled else model
                fns = timed_calls(model, fwd, images, labels, amp, train)
                if capture:  # the capture's warm-up calls compile a compiled row
                    graphed = capture_call(fns["infer"], images)
                    fns["infer"] = lambda graphed=graphed: graphed(images)
                for fn in fns.values():
                    # a compiled row compiles here, never in a round; CUDA graphs record on the second call
                    for _ in range(max(warmup, 3 if compiled and compile_mode in GRAPH_MODES else int(compiled))):
                        fn()
            except Exception as e:  # the row reports its error (a compile that fails, memory); the others still run
                rows[label] = {**row, "error": f"{type(e).__name__}: {e}"[:300]}
                _logger.warning("%s failed: %s", label, rows[label]["error"])
                continue
            rows[label] = {**row, "fns": fns}
            _logger.info("built %s", label)
    built = [row for row in rows.values() if "fns" in row]  # (each fn was warmed up as it was built)
    prepared = [(row, row["fns"].get("train"), row["fns"]["infer"]) for row in built]
    time_train_and_infer(prepared, device, batch, repeats, warmup=0, stat=stat, rate="ips")
    results = []
    for row in rows.values():
        res = {k: v for k, v in row.items() if k != "fns"}
        if profile and "fns" in row:
            name = re.sub(r"[^\w.=-]+", "_", f"b{batch}-{row['label']}-infer")
            res["profile"] = profile_step(row["fns"]["infer"], device, profile, name)
        results.append(res)
    by_mode = {(r["model"], r["compiled"]): r for r in results if "error" not in r}
    for r in results:
        if "error" in r:
            continue
        base = by_mode.get((BASELINES[width_of(r["model"])], r["compiled"]))
        r["infer_vs_deit"] = r["infer_ips"] / base["infer_ips"] if base else None
        if train:
            r["train_vs_deit"] = r["train_ips"] / base["train_ips"] if base else None
    return results


def table(results: Sequence[dict], train: bool = True) -> tuple[list[str], list[list]]:
    """The printed table's headers and rows (a failed row: its error)."""
    headers = ["model", "params (M)", "GMACs", "infer img/s", "infer vs DeiT"]
    if train:
        headers += ["train img/s", "train vs DeiT"]
    ratio = lambda v: "-" if v is None else v  # noqa: E731  (no baseline: its row failed)
    rows = []
    for r in results:
        if "error" in r:
            rows.append([r.get("label", r["model"]), r["error"][:80], *["-"] * (len(headers) - 2)])
            continue
        line = [r.get("label", r["model"]), r["params_m"], r["gmacs"], r["infer_ips"], ratio(r["infer_vs_deit"])]
        if train:
            line += [r["train_ips"], ratio(r["train_vs_deit"])]
        rows.append(line)
    return headers, rows
