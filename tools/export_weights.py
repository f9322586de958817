"""Export a run's checkpoint as ``model.safetensors`` plus a timm-style ``config.json``, for use in other projects.

    python tools/export_weights.py runs/deit/synthetic_centroid_tiny/best.pt --out exported/ours1
    python tools/export_weights.py runs/modelnet/ct/best.pt --model centroid_transformer_modelnet40 --out exported/ct
    python tools/export_weights.py best.pt --model centroid_deit_tiny_c6_patch16_224 --set img_size=32 depth=2 --ema

The weights (``model``, or ``ema`` with ``--ema``) are loaded strictly into a freshly built model, so a wrong name or
wrong ``--set`` model arguments fail here, not in the user's project; the model name defaults to the run config's
``model`` (:mod:`engine.export`). ``--set`` values are read as YAML, as in the training CLIs.

Loading the result:

* vision (timm)::

      import timm, vision
      model = timm.create_model(name, pretrained=True, num_classes=N,
                                pretrained_cfg_overlay=dict(file="exported/ours1/model.safetensors", num_classes=N))

* point models::

      model = pointcloud.create_model(name, checkpoint="exported/ct/model.safetensors")

``config.json`` holds ``architecture``, ``num_classes``, ``model_args`` (the ``--set`` values, which must be passed
again to ``create_model``) and ``pretrained_cfg``, as timm's Hugging Face exports do.
"""

from __future__ import annotations

import argparse

import pointcloud  # noqa: F401  (registers the point models)
import vision  # noqa: F401  (registers the DeiT models in timm)
from engine.config import add_overrides_arg
from engine.export import export_weights, model_args_from_overrides

if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", help="a run's best.pt / last.pt")
    parser.add_argument("--out", required=True, help="output folder (model.safetensors, config.json)")
    parser.add_argument("--model", default=None, help="registered model name (default: the run config's `model`)")
    add_overrides_arg(parser, "model constructor arguments, e.g. --set img_size=32 depth=2 (values as YAML)")
    parser.add_argument("--ema", action="store_true", help="export the EMA weights instead of the raw model's")
    args = parser.parse_args()
    path = export_weights(args.checkpoint, args.out, args.model, model_args_from_overrides(args.overrides), args.ema)
    print(f"wrote {path} and {path.with_name('config.json')}")
