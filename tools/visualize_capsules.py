"""Show how a trained capsule autoencoder decomposes shapes into parts: one colour per latent capsule.

    python tools/visualize_capsules.py --checkpoint runs/capsules/main/latest/best.pt         # shapes 0..3 of test
    python tools/visualize_capsules.py --checkpoint best.pt --index 0 17 --highlight 0 4 7    # 3 capsules coloured
    python tools/visualize_capsules.py --checkpoint best.pt --headless --output-dir viz/      # PNGs, no window

For every chosen shape the input (left, each point coloured by the capsule of its nearest decoded point) and the
reconstruction (right, each capsule's patch in its own colour; with ``--highlight`` the other capsules are grey) are
written to ``<output-dir>/<split>_<index>.ply``. With a display (``$DISPLAY`` or ``$WAYLAND_DISPLAY``) and without
``--headless`` an Open3D window opens per shape; otherwise ``<split>_<index>.png`` is rendered off screen (Open3D's
OffscreenRenderer with Debian's ``libvulkan1 mesa-vulkan-drivers``, or the legacy visualizer under ``xvfb-run``).
The PNG carries a legend (each coloured capsule, the part most of its points lie on and its purity) and the shape's
part purity in its title. The model, data and point count come from the checkpoint's config; the part purity of
each shape is logged.
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
from pathlib import Path

import torch

from capsules.metrics import capsule_parts
from capsules.recipe import CapsulesConfig, build_datasets, build_model
from capsules.visualize import decomposition, legend_entries, render_png, show, write_ply
from engine import load_checkpoint, setup_logging

_logger = logging.getLogger("visualize_capsules")


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoint", required=True, help="a last.pt / best.pt written by tools/train_capsules.py")
    parser.add_argument("--split", default="test", choices=("train", "test"), help="which split's shapes to show")
    parser.add_argument("--index", type=int, nargs="+", default=[0, 1, 2, 3], help="shape indices in the split")
    parser.add_argument("--highlight", type=int, nargs="+", default=None, help="capsules to colour (others grey)")
    parser.add_argument("--output-dir", default=None, help="default: <checkpoint folder>/viz")
    parser.add_argument("--data-root", default=None, help="dataset root (default: the checkpoint config's)")
    parser.add_argument("--headless", action="store_true", help="render PNGs even when a display is present")
    parser.add_argument("--width", type=int, default=960)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--point-size", type=float, default=6.0)
    parser.add_argument(
        "--trust-checkpoint",
        action="store_true",
        help="load a checkpoint that needs pickle (can run arbitrary code: only files you trust)",
    )
    args = parser.parse_args(argv)
    setup_logging(None)

    state = load_checkpoint(args.checkpoint, allow_pickle=args.trust_checkpoint)
    if not state.get("config"):
        raise ValueError(f"{args.checkpoint} holds no config: expected a checkpoint written by tools/train_capsules.py")
    known = {f.name for f in dataclasses.fields(CapsulesConfig)}
    cfg = CapsulesConfig(**{k: v for k, v in state["config"].items() if k in known})
    model = build_model(cfg)
    model.load_state_dict(state["model"])
    model.eval()
    train_set, test_set = build_datasets(cfg, args.data_root)
    dataset = test_set if args.split == "test" else train_set
    out_dir = Path(args.output_dir) if args.output_dir else Path(args.checkpoint).parent / "viz"
    interactive = bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) and not args.headless
    up = "z" if cfg.dataset == "synthetic_parts" else "y"
    labels = getattr(dataset, "part_labels", None)  # synthetic parts: (class, part name) per label
    part_names = [part for _, part in labels] if labels is not None else None
    results = []
    for index in args.index:
        if not 0 <= index < len(dataset):
            raise ValueError(f"--index {index} is outside the {args.split} split's {len(dataset)} shapes")
        points, parts = dataset[index]
        with torch.no_grad():
            recon = model(points[None])
        label, cap_purity = capsule_parts(recon, model.point_capsule, points[None], parts[None], model.num_latent)
        keep = ~torch.isnan(cap_purity[0])
        purity = float(cap_purity[0][keep].mean()) if bool(keep.any()) else float("nan")
        xyz, rgb = decomposition(points.numpy(), recon[0].numpy(), model.point_capsule.numpy(), model.num_latent,
                                 highlight=args.highlight, up=up)  # fmt: skip
        stem = f"{args.split}_{index}"
        row = {"index": index, "name": dataset.names[index], "part_purity": purity,
               "ply": str(write_ply(out_dir / f"{stem}.ply", xyz, rgb))}  # fmt: skip
        if interactive:
            show(xyz, rgb, title=f"{dataset.names[index]}: input | reconstruction", point_size=args.point_size)
        else:
            legend = legend_entries(label[0].tolist(), cap_purity[0].tolist(), part_names, args.highlight)
            title = f"{dataset.names[index]}: input | reconstruction, part purity {purity:.2f}"
            png = render_png(out_dir / f"{stem}.png", xyz, rgb, args.width, args.height, up, args.point_size,
                             legend=legend, title=title)  # fmt: skip
            row["png"] = str(png)
        _logger.info("%s (%s): part purity %.3f -> %s", stem, dataset.names[index], purity, row.get("png", row["ply"]))
        results.append(row)
    return results


if __name__ == "__main__":
    main()
