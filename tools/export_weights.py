"""Export a run's checkpoint as ``model.safetensors`` plus a timm-style ``config.json``, for use in other projects.

    python tools/export_weights.py runs/deit/synthetic_centroid_tiny/best.pt --out exported/ours1
    python tools/export_weights.py runs/modelnet/ct/best.pt --model centroid_transformer_modelnet40 --out exported/ct
    python tools/export_weights.py best.pt --model centroid_deit_tiny_c6_patch16_224 --set img_size=32 depth=2 --ema

The checkpoint is read with :func:`engine.checkpoint.load_checkpoint` (the harness's one loader); its ``model``
weights (or ``ema`` with ``--ema``) are loaded strictly into a freshly built model, so a wrong name or wrong
``--set`` overrides fail here, not in the user's project. The model name defaults to the run config's ``model``.

Loading the result:

* vision (timm)::

      import timm, vision
      model = timm.create_model(name, pretrained=True, num_classes=N,
                                pretrained_cfg_overlay=dict(file="exported/ours1/model.safetensors", num_classes=N))

* point models::

      model = pointcloud.create_model(name, checkpoint="exported/ct/model.safetensors")

``config.json`` holds ``architecture``, ``num_classes``, ``model_args`` (the ``--set`` overrides, which must be passed
again to ``create_model``) and ``pretrained_cfg`` (timm's default cfg of the model, with ``num_classes`` and
``file``), as timm's Hugging Face exports do.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing

import torch
from torch import nn

from engine.checkpoint import load_checkpoint


def _parse_value(text: str) -> object:
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def parse_overrides(pairs: list[str]) -> dict[str, object]:
    """``["img_size=32", "global_pool=avg"]`` -> ``{"img_size": 32, "global_pool": "avg"}`` (values as JSON if they
    parse, else strings)."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ValueError(f"--set takes key=value pairs, got {pair!r}")
        out[key] = _parse_value(value)
    return out


def _family(name: str) -> str:
    import timm

    import pointcloud
    import vision  # noqa: F401  (registers the timm models)

    if name in pointcloud.list_models():
        return "pointcloud"
    if timm.is_model(name):
        return "vision"
    raise ValueError(f"unknown model {name!r}: neither a timm model nor one of pointcloud's {pointcloud.list_models()}")


def build(name: str, model_args: dict) -> tuple[nn.Module, dict]:
    """The model and its timm-style pretrained cfg (empty for point models)."""
    if _family(name) == "pointcloud":
        import pointcloud

        return pointcloud.create_model(name, **model_args), {}
    import timm

    model = timm.create_model(name, pretrained=False, **model_args)
    return model, dict(model.pretrained_cfg)


def _state_dict(state: dict, ema: bool, path: Path) -> dict[str, torch.Tensor]:
    key = "ema" if ema else "model"
    sd = state.get(key)
    if not isinstance(sd, dict):
        raise ValueError(f"checkpoint {path} holds no {key!r} weights (keys: {sorted(state)})")
    prefixes = ("module.", "_orig_mod.")  # timm ModelEmaV3 / DDP wrappers, torch.compile
    out = {}
    for k, v in sd.items():
        for p in prefixes:
            if k.startswith(p):
                k = k[len(p) :]
        out[k] = v
    return out


def export(
    checkpoint: str | Path, out_dir: str | Path, name: str | None = None, model_args: dict | None = None, ema=False
) -> Path:
    """Writes ``out_dir/model.safetensors`` and ``out_dir/config.json``; returns the safetensors path."""
    from safetensors.torch import save_file

    checkpoint = Path(checkpoint)
    state = load_checkpoint(checkpoint)
    config = state.get("config") or {}
    if name is None:
        name = config.get("model") if isinstance(config, dict) else None
        if not isinstance(name, str):
            raise ValueError(f"checkpoint {checkpoint} names no model in its config: pass --model NAME")
    model_args = dict(model_args or {})
    model, pretrained_cfg = build(name, model_args)
    try:
        model.load_state_dict(_state_dict(state, ema, checkpoint))
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


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a run's best.pt / last.pt")
    parser.add_argument("--out", required=True, help="output folder (model.safetensors, config.json)")
    parser.add_argument("--model", default=None, help="registered model name (default: the run config's `model`)")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="model constructor overrides")
    parser.add_argument("--ema", action="store_true", help="export the EMA weights instead of the raw model's")
    args = parser.parse_args(argv)
    path = export(args.checkpoint, args.out, args.model, parse_overrides(args.set), ema=args.ema)
    print(f"wrote {path} and {path.with_name('config.json')}")
    return path


if __name__ == "__main__":
    main()
