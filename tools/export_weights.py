"""Export a run's checkpoint as `model.safetensors` plus a timm-style `config.json`, for use in other projects.

    python tools/export_weights.py runs/modelnet40/main/latest/best.pt --out exported/ct
    python tools/export_weights.py runs/deit/synthetic_centroid_tiny/latest/best.pt --out exported/ours1 --ema

The model is rebuilt from what the checkpoint records (its name and constructor keywords, however the run was
started: `--set`, `--config`), its weights (`model`, or `ema` with `--ema`) are loaded strictly, and the
export is checked to load back. `--set KEY=VALUE` may add constructor keywords (values read as YAML, as in the
training CLIs); changing one the run recorded is refused. For a checkpoint written outside the training CLIs, which
records no model, name it with `--model` and give its keywords with `--set` (`engine.export`).

Loading the result:

* any exported model (its package imported first: `pointcloud`, `capsules`, `lra`, `vision`):

      from engine.export import load_exported
      model = load_exported("exported/ct")

* vision (timm), with `config.json`'s `model_args` passed again:

      import timm, vision
      model = timm.create_model(name, pretrained=True, **model_args,
                                pretrained_cfg_overlay=dict(file="exported/ours1/model.safetensors"))

* point models:

      model = pointcloud.create_model(name, checkpoint="exported/ct/model.safetensors", **model_args)
"""

from __future__ import annotations

import argparse

import capsules  # noqa: F401  (registers the capsule models)
import lra  # noqa: F401  (registers the ListOps classifier)
import pointcloud  # noqa: F401  (registers the point models)
import vision  # noqa: F401  (registers the DeiT models in timm)
from engine import add_checkpoint_flags, setup_logging, user_errors
from engine.config import add_overrides_arg
from engine.export import export_weights, model_args_from_overrides


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a run's best.pt / last.pt")
    parser.add_argument("--out", required=True, help="output folder (model.safetensors, config.json)")
    parser.add_argument("--model", default=None, help="model name, for a checkpoint that records none")
    add_overrides_arg(parser, "constructor keywords to add, e.g. --set backend=torch (values as YAML)")
    parser.add_argument("--ema", action="store_true", help="export the EMA weights instead of the raw model's")
    add_checkpoint_flags(parser)
    args = parser.parse_args(argv)
    setup_logging(None)
    with user_errors(args.debug):
        model_args = model_args_from_overrides(args.overrides)
        path = export_weights(args.checkpoint, args.out, args.model, model_args, args.ema, args.trust_checkpoint)
    print(f"wrote {path} and {path.with_name('config.json')}")


if __name__ == "__main__":
    main()
