"""Show how a trained capsule autoencoder decomposes shapes into parts: one colour per latent capsule.

    python tools/visualize_capsules.py --checkpoint runs/capsules/main/latest/best.pt         # shapes 0..3 of test
    python tools/visualize_capsules.py --checkpoint best.pt --index 0 17 --highlight 0 4 7    # 3 capsules coloured
    python tools/visualize_capsules.py --checkpoint best.pt --headless --output-dir viz/      # PNGs, no window
    python tools/visualize_capsules.py --checkpoint best.pt --shape table_0053 sofa_0690      # shapes by name

For every chosen shape the input (left, each point coloured by the capsule of its nearest decoded point) and the
reconstruction (right, each capsule's patch in its own colour; with `--highlight` the other capsules are grey) are
written to `<output-dir>/<split>_<index>.ply`. With a display (`$DISPLAY` or `$WAYLAND_DISPLAY`) and without
`--headless` an Open3D window opens per shape; otherwise `<split>_<index>.png` is rendered off screen (Open3D's
OffscreenRenderer with Debian's `libvulkan1 mesa-vulkan-drivers`, or the legacy visualizer under `xvfb-run`).
The PNG carries a legend (each coloured capsule, the part most of its points lie on and its purity) and, in its title,
the shape's part purity, or on data without part labels its patch spread beside that of random patches of the same
sizes. The camera frames the whole shape whatever its extent. The model, data and point count come from the
checkpoint's config (the up axis too: the config's `up_axis`, else the dataset's); each shape's numbers are logged.
"""

from __future__ import annotations

import argparse

from capsules.visualize import visualize_checkpoint
from engine import setup_logging, user_errors
from pointcloud.render import add_viewer_flags, viewer_kwargs


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_viewer_flags(parser, "tools/train_capsules.py")
    parser.add_argument("--highlight", type=int, nargs="+", default=None, help="capsules to colour (others grey)")
    args = parser.parse_args(argv)
    setup_logging(None)
    with user_errors(args.debug):
        return visualize_checkpoint(args.checkpoint, highlight=args.highlight, **viewer_kwargs(args))


if __name__ == "__main__":
    main()
