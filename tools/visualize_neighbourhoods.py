"""Show which points a trained centroid transformer's second centroid block groups together (paper Fig. 4), and how
often they share a semantic part.

    python tools/visualize_neighbourhoods.py --checkpoint runs/modelnet40/main/latest/best.pt     # test shape 0
    python tools/visualize_neighbourhoods.py --checkpoint best.pt --shape chair_0000 --centroids 0 1 2 3 4 --headless
    python tools/visualize_neighbourhoods.py --checkpoint best.pt --parts shapenet_part --data-root /data --index 7

The checkpoint is a ModelNet classifier of `tools/train_modelnet.py` (a centroid transformer with FPS or random
init). The part-labelled shapes are the embedded synthetic part shapes (table, chair, airplane, lamp, mug; z up) or
ShapeNet Part (`--parts shapenet_part` / `shapenet_part_normal` with `--data-root`), read at the run's point
count. Over the whole split (or `--max-shapes`) the tool measures the fraction of each centroid's K neighbours that
lie on its own point's part: in feature space (the neighbours its attention step uses), in xyz, and for K random
points of the block's inputs. Per chosen shape it writes `<output-dir>/<split>_<index>.ply` and, without a display
or with `--headless`, `<split>_<index>.png`: the shape twice, feature-space neighbours left and xyz neighbours
right, each shown centroid's neighbours in its own colour over pale part colours, the centroid's point marked black.
The numbers go to `<output-dir>/agreement.json` (default output folder: `<checkpoint folder>/neighbourhoods`).
"""

from __future__ import annotations

import argparse

from engine import setup_logging, user_errors
from pointcloud.neighbourhoods import PART_SOURCES, visualize_checkpoint
from pointcloud.render import add_viewer_flags, viewer_kwargs


def main(argv: list[str] | None = None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_viewer_flags(
        parser,
        "tools/train_modelnet.py",
        shape_example="e.g. chair_0000",
        splits=None,
        split_help="which split's shapes (train, test; ShapeNet Part: val too)",
        output_folder="neighbourhoods",
        output_aliases=("--out",),
        data_root_help="ShapeNet Part's root (default: $CENTROID_DATA)",
    )
    parser.add_argument("--parts", default="synthetic", choices=PART_SOURCES, help="the part-labelled shapes")
    parser.add_argument("--centroids", type=int, nargs="+", default=None, help="centroids to show (default: 0 1 2 3)")
    parser.add_argument("--max-shapes", type=int, default=None, help="measure on the first N shapes (default: all)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = parser.parse_args(argv)
    setup_logging(None)
    with user_errors(args.debug):
        return visualize_checkpoint(
            args.checkpoint,
            parts=args.parts,
            centroids=args.centroids,
            max_shapes=args.max_shapes,
            progress=not args.no_progress,
            **viewer_kwargs(args),
        )


if __name__ == "__main__":
    main()
