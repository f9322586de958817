"""Export a run's checkpoint as ``model.safetensors`` plus a timm-style ``config.json``, for use in other projects.

:func:`export_weights` reads the checkpoint with :func:`engine.checkpoint.load_checkpoint` (the harness's one loader)
and loads its ``model`` weights (or ``ema``) strictly into a freshly built model, so a wrong name or wrong model
arguments fail here, not in the user's project. The model name defaults to the run config's ``model``; it is looked up
in the model registries of the domain packages imported so far (:func:`engine.registry.find_registry`: import
``pointcloud`` / ``capsules`` first), then in timm's (import ``vision`` to register the DeiT models).
``tools/export_weights.py`` is the command line; its ``--set key=value`` model arguments use the training CLIs'
grammar (:func:`engine.config.parse_overrides`: each value read as YAML).

``config.json`` holds ``architecture``, ``num_classes``, ``model_args`` (which must be passed again to
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
from engine.registry import ModelRegistry, find_registry

__all__ = ["build_by_name", "export_weights", "model_args_from_overrides"]


def model_args_from_overrides(overrides: Sequence[str]) -> dict[str, Any]:
    """``["img_size=32", "global_pool=avg"]`` -> ``{"img_size": 32, "global_pool": "avg"}``: the ``--set`` grammar of
    every CLI (:func:`engine.config.parse_overrides`)."""
    return {key: value for key, (value, _) in parse_overrides(overrides).items()}


def build_by_name(name: str, model_args: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """The model ``name`` built with ``model_args``, and its timm pretrained cfg (empty for registry models).

    Raises:
        ValueError: ``name`` is in no imported registry and not a timm model, or the model rejects a keyword.
    """
    registry = find_registry(name)
    if registry is not None:
        return registry.create_model(name, **model_args), {}
    import timm

    if timm.is_model(name):
        model = timm.create_model(name, pretrained=False, **model_args)
        return model, dict(model.pretrained_cfg)
    known = "; ".join(f"{r.domain}: {r.list_models()}" for r in ModelRegistry.instances)
    raise ValueError(f"unknown model {name!r}: neither a timm model nor a registered one ({known or 'none imported'})")


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
) -> Path:
    """Writes ``out_dir/model.safetensors`` and ``out_dir/config.json``; returns the safetensors path.

    Args:
        checkpoint: A run's ``best.pt`` / ``last.pt``.
        out_dir: The output folder (created).
        name: The registered model name (default: the run config's ``model``).
        model_args: Constructor keywords of the model (the run's model options).
        ema: Export the EMA weights instead of the model's.

    Raises:
        ValueError: No model name, no such weights in the checkpoint, or weights that do not fit the model built.
    """
    from safetensors.torch import save_file

    checkpoint = Path(checkpoint)
    state = load_checkpoint(checkpoint)
    config = state.get("config") or {}
    if name is None:
        name = config.get("model") if isinstance(config, dict) else None
        if not isinstance(name, str):
            raise ValueError(f"checkpoint {checkpoint} names no model in its config: pass --model NAME")
    model_args = dict(model_args or {})
    model, pretrained_cfg = build_by_name(name, model_args)
    try:
        model.load_state_dict(_weights(state, ema, checkpoint))
    except RuntimeError as e:
        raise ValueError(
            f"the weights in {checkpoint} do not fit {name} built with {model_args}: pass the run's model options "
            f"with --set (e.g. img_size=..., num_classes=...); {e}"
        ) from e
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "model.safetensors"
    # clone: modules shared under two names (e.g. a shared norm) would otherwise alias storage, which safetensors
    # refuses; each name gets its own copy and loads back into the same module.
    tensors = {k: v.detach().clone().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(tensors, str(path), metadata={"format": "pt", "architecture": name})
    num_classes = getattr(model, "num_classes", None)
    cfg = {k: v for k, v in pretrained_cfg.items() if isinstance(v, (str, int, float, bool, list, tuple, type(None)))}
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
    return path
