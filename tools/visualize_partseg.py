"""Show a trained part-segmentation run's predicted parts beside the ground truth, one colour per part.

    python tools/visualize_partseg.py --checkpoint runs/partseg/main/latest/best.pt           # shapes 0..3 of test
    python tools/visualize_partseg.py --checkpoint best.pt --index 0 24 48 --together --headless --output-dir viz/
    python tools/visualize_partseg.py --checkpoint best.pt --shape table_0003 mug_0001         # shapes by name

For every chosen shape the ground truth (left) and the prediction (right: the arg-max over the shape's category's
parts, as the metric takes it) are written to `<output-dir>/<split>_<index>.ply`. With a display (`$DISPLAY` or
`$WAYLAND_DISPLAY`) and without `--headless` an Open3D window opens per shape; otherwise `<split>_<index>.png`
is rendered off screen (Open3D's OffscreenRenderer with Debian's `libvulkan1 mesa-vulkan-drivers`, or the legacy
visualizer under `xvfb-run`), or with `--together` one PNG holding every chosen shape as a row. The legend names
the parts of the shown categories, the title gives each shape's IoU. The model, data and point count come from the
checkpoint's config.
"""

from __future__ import annotations

import argparse

from engine import setup_logging, user_errors
from pointcloud.partseg.visualize import visualize_checkpoint
from pointcloud.render import add_viewer_flags, viewer_kwargs


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_viewer_flags(parser, "tools/train_partseg.py", shape_example="table_0003; ShapeNet Part: <synset>/<id>")
    parser.add_argument("--together", action="store_true", help="one PNG with every chosen shape as a row")
    args = parser.parse_args(argv)
    setup_logging(None)
    with user_errors(args.debug):
        return visualize_checkpoint(args.checkpoint, together=args.together, **viewer_kwargs(args))


if __name__ == "__main__":
    main()
