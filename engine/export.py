"""Export a run's checkpoint as ``model.safetensors`` plus a timm-style ``config.json``, for use in other projects.

:func:`export_weights` reads the checkpoint with :func:`engine.checkpoint.load_checkpoint` (the harness's one loader)
and rebuilds the trained model from the ``model_spec`` the checkpoint records (its registered name and constructor
keywords, :meth:`engine.Recipe.model_spec`), so a run started with ``--set`` or ``--config`` exports as it was trained
without repeating its options. The weights (``model``, or ``ema``) are loaded strictly, so an export that does not
fit fails here, not in the user's project. Keywords given on top (``--set`` on the command line, read as YAML like
the training CLIs' :func:`engine.config.parse_overrides`) may add constructor keywords; one that changes a recorded
keyword is refused with the difference, since the weights were trained with the recorded value. An added keyword
must keep the model's function too (a backend, or a dropout rate, which eval mode does not use): the model built
with it and the one the checkpoint records, both holding the weights, are run in eval mode on the same
deterministic batch (:func:`engine.registry.example_inputs`, sized by the run's config), and unless their outputs
agree within :data:`PROBE_RTOL` / :data:`PROBE_ATOL` the export is refused, naming the keywords. Weights of the same
shapes can hold another function (``num_heads``, a routing model's iterations), so loading them proves nothing. A
checkpoint without a ``model_spec`` (written by other code) is rebuilt from its config's ``model`` and the given
keywords only: there is no recorded model to compare with.

``model.safetensors`` carries the sha256 of its tensors in its metadata (:mod:`engine.weights`); every reader here
checks it and refuses non-finite weights, and non-finite weights are not exported.

Models are looked up by name in the registries of the domain packages imported so far (import ``pointcloud``,
``capsules``, ``lra``), then in timm's (import ``vision`` to register the DeiT models):
:func:`engine.registry.create_by_name`. :func:`load_exported` builds a model back from an export folder.

``config.json`` holds ``architecture``, ``num_classes``, ``model_args`` (the constructor keywords, to pass again to
``create_model``) and ``pretrained_cfg`` (timm's default cfg of the model, with ``num_classes`` and ``file``), as
timm's Hugging Face exports do.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from engine.checkpoint import load_checkpoint, unwrap_state_dict
from engine.config import parse_overrides
from engine.registry import create_by_name, example_inputs
from engine.weights import load_weights, nonfinite_weights, save_weights

__all__ = ["PROBE_ATOL", "PROBE_RTOL", "export_weights", "load_exported", "model_args_from_overrides"]

#: How far the outputs of a model built with added ``--set`` keywords may lie from the recorded model's on the probe
#: batch (``|a - b| <= atol + rtol * |b|``, as ``torch.allclose``): float rounding of another backend passes, a knob
#: that changes the function (0.02 on logits) does not.
PROBE_RTOL = 1e-4
PROBE_ATOL = 1e-5


def model_args_from_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """``["img_size=32", "global_pool=avg"]`` -> ``{"img_size": 32, "global_pool": "avg"}``: the ``--set`` grammar of
    every CLI (:func:`engine.config.parse_overrides`)."""
    return {key: value for key, (value, _) in parse_overrides(overrides).items()}


def _pretrained_cfg(model: nn.Module) -> dict[str, Any]:
    """timm's pretrained cfg of ``model`` as plain JSON values (empty for registry models)."""
    cfg = getattr(model, "pretrained_cfg", None) or {}
    return {k: v for k, v in dict(cfg).items() if isinstance(v, (str, int, float, bool, list, tuple, type(None)))}


def _recorded_model(
    state: dict[str, Any], path: Path, name: str | None, model_args: dict[str, Any]
) -> tuple[str, dict[str, Any]]:
    """The model name and keywords to build: the checkpoint's ``model_spec`` with ``model_args`` added on top."""
    spec = state.get("model_spec")
    if not isinstance(spec, dict):  # a checkpoint written without a recipe: name from the config, keywords as given
        config = state.get("config") if isinstance(state.get("config"), dict) else {}
        name = name or config.get("model")
        if not isinstance(name, str):
            raise ValueError(f"checkpoint {path} records no model (no model_spec or config 'model'): pass --model NAME")
        return name, dict(model_args)
    if name is not None and name != spec["name"]:
        raise ValueError(f"checkpoint {path} holds a {spec['name']}, not a {name}: drop --model")
    recorded = dict(spec.get("kwargs") or {})
    changed = {k: (recorded[k], v) for k, v in model_args.items() if k in recorded and recorded[k] != v}
    if changed:
        lines = "; ".join(f"{k}: {a!r} in the run, {b!r} now" for k, (a, b) in changed.items())
        raise ValueError(
            f"refusing to export {path} as another model ({lines}): the weights were trained with the recorded "
            "keywords, which the export uses without --set; drop these from --set"
        )
    return spec["name"], {**recorded, **model_args}


def _tensors(output: Any) -> list[torch.Tensor]:
    """The tensors of a model's output (a tensor, or tuples, lists and dicts of them), in a fixed order."""
    if isinstance(output, torch.Tensor):
        return [output]
    if isinstance(output, dict):
        return [t for key in sorted(output, key=str) for t in _tensors(output[key])]
    if isinstance(output, (list, tuple)):
        return [t for item in output for t in _tensors(item)]
    return []


@torch.no_grad()
def _probe(model: nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    """``model``'s outputs on ``inputs`` in eval mode, with the global RNG seeded (and restored after), so that two
    models that draw random numbers in eval mode draw the same ones."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        return _tensors(model.eval()(*inputs))


def _largest_difference(a: list[torch.Tensor], b: list[torch.Tensor]) -> float | None:
    """The largest ``|a - b|`` beyond the probe tolerance's allowance, 0.0 when they agree, None when the outputs
    differ in number or shape."""
    if len(a) != len(b) or any(x.shape != y.shape for x, y in zip(a, b)):
        return None
    worst = 0.0
    for x, y in zip(a, b):
        x, y = x.double(), y.double()
        if not torch.allclose(x, y, rtol=PROBE_RTOL, atol=PROBE_ATOL, equal_nan=True):
            worst = max(worst, float((x - y).abs().nan_to_num(nan=float("inf")).max()))
    return worst


def _check_same_function(
    checkpoint: Path,
    name: str,
    recorded: dict[str, Any],
    model: nn.Module,
    weights: dict[str, torch.Tensor],
    config: dict[str, Any],
    added: list[str],
) -> None:
    """Refuses the keywords ``added`` on top of the ``recorded`` ones unless ``model`` (built with them, holding the
    weights) computes what the recorded model computes on :func:`engine.registry.example_inputs`."""
    sets = ", ".join(added)
    refusal = f"refusing to export {checkpoint} with --set {sets}"
    trained = create_by_name(name, recorded)
    try:
        trained.load_state_dict(weights)
    except RuntimeError as e:
        why = " ".join(str(e).split())
        raise ValueError(
            f"the weights in {checkpoint} do not fit its own model_spec ({name}, {recorded}): {why}"
        ) from e
    try:
        inputs = example_inputs(name, trained, config)
        expected = _probe(trained, inputs)
    except Exception as e:
        raise ValueError(
            f"{refusal}: cannot check that it keeps the trained model's function ({type(e).__name__}: {e}); drop "
            f"{sets} from --set"
        ) from e
    try:
        found = _probe(model, inputs)
    except Exception as e:
        raise ValueError(
            f"{refusal}: the model it builds fails on the inputs the trained model takes ({type(e).__name__}: {e}); "
            f"drop {sets} from --set"
        ) from e
    worst = _largest_difference(found, expected)
    if worst is None or worst > 0:
        how = "outputs of other shapes" if worst is None else f"outputs up to {worst:.3g} away"
        raise ValueError(
            f"{refusal}: it changes what the trained weights compute ({how} on a probe batch, beyond "
            f"{PROBE_ATOL:g} + {PROBE_RTOL:g} x |output|); the weights fit, but were trained without it: drop {sets} "
            "from --set"
        )


def _weights(state: dict[str, Any], ema: bool, path: Path) -> dict[str, torch.Tensor]:
    key = "ema" if ema else "model"
    weights = state.get(key)
    if not isinstance(weights, dict):
        raise ValueError(f"checkpoint {path} holds no {key!r} weights (keys: {sorted(state)})")
    return unwrap_state_dict(weights)


def export_weights(
    checkpoint: str | Path,
    out_dir: str | Path,
    name: str | None = None,
    model_args: dict[str, Any] | None = None,
    ema: bool = False,
    allow_pickle: bool = False,
) -> Path:
    """Writes ``out_dir/model.safetensors`` and ``out_dir/config.json``, checks that they load back
    (:func:`load_exported`) to the same weights, and returns the safetensors path.

    Args:
        checkpoint: A run's ``best.pt`` / ``last.pt``.
        out_dir: The output folder (created).
        name: The registered model name: only for a checkpoint that records no ``model_spec`` (default: its config's
            ``model``); otherwise it must equal the recorded one.
        model_args: Constructor keywords added to the recorded ones (a changed recorded keyword is refused, and so is
            an added one that changes the model's outputs: see the module docstring).
        ema: Export the EMA weights instead of the model's.
        allow_pickle: Read a checkpoint that needs the full unpickler (trusted files only).

    Raises:
        ValueError: No model name, a changed recorded keyword, an added keyword that changes the model's function,
            no such weights in the checkpoint, weights that do not fit the model built, or non-finite weights.
    """
    checkpoint = Path(checkpoint)
    state = load_checkpoint(checkpoint, allow_pickle=allow_pickle)
    name, model_args = _recorded_model(state, checkpoint, name, dict(model_args or {}))
    model = create_by_name(name, model_args)
    pretrained_cfg = _pretrained_cfg(model)
    weights = _weights(state, ema, checkpoint)
    bad = nonfinite_weights(weights)
    if bad:
        which = "ema" if ema else "model"
        raise ValueError(
            f"refusing to export {checkpoint}: its {which} weights hold NaN or inf ({bad}); export a checkpoint whose "
            "weights are finite"
        )
    try:
        model.load_state_dict(weights)
    except RuntimeError as e:
        if "model_spec" not in state:
            hint = "pass the model's keywords with --set"
        elif model_args != state["model_spec"].get("kwargs"):
            hint = "a keyword added with --set changes the model: drop it"
        else:
            hint = "the checkpoint's weights and its model_spec disagree"
        why = " ".join(str(e).split())  # torch lists the mismatches on lines of their own: one line here
        raise ValueError(f"the weights in {checkpoint} do not fit {name} built with {model_args}: {hint}; {why}") from e
    spec = state.get("model_spec")
    if isinstance(spec, dict):
        recorded = dict(spec.get("kwargs") or {})
        added = sorted(k for k in model_args if k not in recorded)
        if added:
            config = state.get("config") if isinstance(state.get("config"), dict) else {}
            _check_same_function(checkpoint, name, recorded, model, weights, config, added)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.safetensors"
    # clone: modules shared under two names (e.g. a shared norm) would otherwise alias storage, which safetensors
    # refuses; each name gets its own copy and loads back into the same module.
    tensors = {k: v.detach().clone().contiguous().cpu() for k, v in model.state_dict().items()}
    save_weights(tensors, path, metadata={"format": "pt", "architecture": name})
    num_classes = getattr(model, "num_classes", None)
    cfg = pretrained_cfg
    if cfg:
        cfg.update(num_classes=num_classes, file="model.safetensors")
    meta = {
        "architecture": name,
        "num_classes": num_classes,
        "num_features": getattr(model, "num_features", None),
        "model_args": model_args,
        "pretrained_cfg": cfg,
        "source_checkpoint": str(checkpoint),
        "weights": "ema" if ema else "model",
    }
    (out_dir / "config.json").write_text(json.dumps(meta, indent=2, default=list) + "\n")
    back = load_exported(out_dir).state_dict()  # what a user's create_model + load gets
    if back.keys() != tensors.keys() or not all(torch.equal(back[k], tensors[k]) for k in tensors):
        raise RuntimeError(f"the export in {out_dir} does not load back to the exported weights")
    return path


def load_exported(folder: str | Path) -> nn.Module:
    """The model an export folder holds (``config.json`` + ``model.safetensors``), built by name with its
    ``model_args`` and its weights checked (:func:`engine.weights.load_weights`: the digest, finite values) and
    loaded strictly, in eval mode. Import the package that registers the model first (``pointcloud``, ``capsules``,
    ``lra``; ``vision`` for the DeiT models).

    Raises:
        FileNotFoundError: ``folder`` lacks one of the two files.
        ValueError: ``model.safetensors`` is damaged (its tensors do not match the digest it records) or holds
            non-finite weights.
    """
    folder = Path(folder)
    for name in ("config.json", "model.safetensors"):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder / name} not found: expected a folder written by tools/export_weights.py")
    meta = json.loads((folder / "config.json").read_text())
    model = create_by_name(meta["architecture"], meta.get("model_args") or {})
    model.load_state_dict(load_weights(folder / "model.safetensors"))
    return model.eval()
