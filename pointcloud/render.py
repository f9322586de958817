"""Headless rendering of coloured point clouds with Open3D: a PNG without a display, a ``.ply``, an interactive window.

Shared by the capsule part-decomposition view (:mod:`capsules.visualize`), the part-segmentation view
(:mod:`pointcloud.partseg.visualize`) and the centroid-neighbourhood view (:mod:`pointcloud.neighbourhoods`):
:func:`render_png` (Open3D's ``OffscreenRenderer``, which needs Debian's
``libvulkan1 mesa-vulkan-drivers`` or a GPU driver; else the legacy ``Visualizer`` with a hidden window, which needs an
X display such as ``xvfb-run``), :func:`write_ply`, :func:`show`, a legend panel drawn with Pillow
(:func:`add_legend`), a palette of distinct colours (:func:`palette`) and the choice of the shapes to show, by index
or by name (:func:`choose_shapes`). Open3D is imported only inside these functions.
"""

from __future__ import annotations

import argparse
import colorsys
import difflib
import logging
import os
from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Any

import numpy as np

from engine import UsageError, add_checkpoint_flags

__all__ = [
    "FIELD_OF_VIEW",
    "GREY",
    "VIEWS",
    "add_legend",
    "add_viewer_flags",
    "choose_shapes",
    "has_display",
    "legend_panel_width",
    "palette",
    "render_image",
    "render_png",
    "render_side_by_side",
    "save_png",
    "show",
    "viewer_kwargs",
    "write_ply",
]

_logger = logging.getLogger(__name__)

GREY = (0.72, 0.72, 0.72)

#: Vertical field of view of the rendered pictures, in degrees.
FIELD_OF_VIEW = 40.0
# Camera direction per up axis (eye offset from the centre) and the up vector; the distance is fitted (_camera).
VIEWS = {
    "z": (np.array([1.6, -4.2, 2.4]), np.array([0.0, 0.0, 1.0])),
    "y": (np.array([1.6, 2.0, 4.2]), np.array([0.0, 1.0, 0.0])),
}


def add_viewer_flags(
    parser: argparse.ArgumentParser,
    trained_by: str,
    shape_example: str = "e.g. table_0053",
    splits: Sequence[str] | None = ("train", "test"),
    split_help: str = "which split's shapes to show",
    output_folder: str = "viz",
    output_aliases: Sequence[str] = (),
    data_root_help: str = "dataset root (default: the checkpoint config's)",
) -> None:
    """The flags of every viewer CLI (``tools/visualize_*.py``): the checkpoint and the shapes to show (by split, index
    and name), where the pictures go, where the data lies, whether to render PNGs even with a display, the picture's
    size and point size, and those of every command that reads a checkpoint (:func:`engine.add_checkpoint_flags`).

    Args:
        parser: The viewer's parser.
        trained_by: The training CLI whose checkpoints the viewer reads (``"tools/train_capsules.py"``).
        shape_example: What a shape name looks like, for ``--shape``'s help.
        splits: The choices of ``--split`` (None: any name, checked by the viewer).
        split_help: ``--split``'s help.
        output_folder: The default output folder inside the checkpoint's folder, for ``--output-dir``'s help.
        output_aliases: Other spellings of ``--output-dir`` (``"--out"``).
        data_root_help: ``--data-root``'s help.
    """
    parser.add_argument("--checkpoint", required=True, help=f"a last.pt / best.pt written by {trained_by}")
    parser.add_argument("--split", default="test", choices=splits, help=split_help)
    parser.add_argument("--index", type=int, nargs="+", default=[], help="shape indices in the split")
    parser.add_argument("--shape", nargs="+", default=[], help=f"shape names in the split ({shape_example})")
    parser.add_argument(
        "--output-dir", *output_aliases, default=None, help=f"default: <checkpoint folder>/{output_folder}"
    )
    parser.add_argument("--data-root", default=None, help=data_root_help)
    parser.add_argument("--headless", action="store_true", help="render PNGs even when a display is present")
    parser.add_argument("--width", type=int, default=960)
    parser.add_argument("--height", type=int, default=480)
    parser.add_argument("--point-size", type=float, default=6.0)
    add_checkpoint_flags(parser)


def viewer_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments that the flags of :func:`add_viewer_flags` give every viewer's ``visualize_checkpoint``
    (all but the checkpoint itself)."""
    return {
        "indices": args.index,
        "split": args.split,
        "shapes": args.shape,
        "output_dir": args.output_dir,
        "data_root": args.data_root,
        "headless": args.headless,
        "width": args.width,
        "height": args.height,
        "point_size": args.point_size,
        "allow_pickle": args.trust_checkpoint,
    }


def has_display(headless: bool = False) -> bool:
    """Whether a viewer opens a window: an X or Wayland display is present (``$DISPLAY``, ``$WAYLAND_DISPLAY``) and
    ``headless`` is off; else it renders PNGs."""
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) and not headless


def choose_shapes(
    names: Sequence[str], indices: Sequence[int] = (), shapes: Sequence[str] = (), split: str = "test", default: int = 4
) -> list[int]:
    """The indices of the shapes a viewer shows: ``indices``, then the shapes named in ``shapes`` (neither: the first
    ``default`` shapes).

    Args:
        names: The name of every shape of the split (``dataset.names``, e.g. ``table_0053``), in index order.
        indices: Shapes by index in the split.
        shapes: Shapes by name.
        split: The split's name, for the messages.
        default: How many shapes to show when neither ``indices`` nor ``shapes`` is given.

    Raises:
        UsageError: An index is outside the split, or a name is not in it (the message lists the close names, or
            the first few names of the split when none is close).
    """
    bad = [i for i in indices if not 0 <= i < len(names)]
    if bad:
        raise UsageError(f"shape indices {bad} are outside the {split} split's {len(names)} shapes")
    position = {name: i for i, name in enumerate(names)}
    missing = [name for name in shapes if name not in position]
    if missing:
        close = {name: difflib.get_close_matches(name, position, n=3) for name in missing}
        hints = "; ".join(f"{name!r}: close names {found}" if found else repr(name) for name, found in close.items())
        raise UsageError(f"no shape named {hints} in the {split} split ({len(names)} shapes, e.g. {list(names[:3])})")
    chosen = list(indices) + [position[name] for name in shapes]
    return chosen or list(range(min(default, len(names))))


def palette(num_colors: int) -> np.ndarray:
    """``(M, 3)`` distinct saturated colours in [0, 1] (hues spaced by the golden ratio, two brightness levels)."""
    hues = (np.arange(num_colors) * 0.618033988749895) % 1.0
    return np.array(
        [colorsys.hsv_to_rgb(h, 0.85, 0.95 if i % 2 == 0 else 0.7) for i, h in enumerate(hues)], dtype=np.float64
    ).reshape(num_colors, 3)


def add_legend(
    image: np.ndarray, entries: Sequence[tuple[Sequence[float], str]], title: str | None = None, panel: int = 0
) -> np.ndarray:
    """The image with ``panel`` white columns appended on the right holding the legend, and the title on top.

    Args:
        image: ``(H, W, 3)`` uint8 render.
        entries: ``(rgb in [0, 1], text)`` per legend line (e.g. :func:`capsules.visualize.legend_entries`).
        title: drawn in the top-left corner of the image.
        panel: width in pixels of the legend panel.
    """
    from PIL import Image, ImageDraw, ImageFont

    H, W = image.shape[:2]
    canvas = Image.new("RGB", (W + panel, H), "white")
    canvas.paste(Image.fromarray(np.ascontiguousarray(image[..., :3]).astype(np.uint8)), (0, 0))
    draw = ImageDraw.Draw(canvas)
    line = max(8, min(26, (H - 8) // max(len(entries) + 1, 1)))  # every entry fits the height
    font = ImageFont.load_default(size=max(7, int(line * 0.7)))
    if title:
        draw.text((8, 6), title, fill=(0, 0, 0), font=font)
    y = max(4, (H - line * len(entries)) // 2)
    for rgb, text in entries:
        colour = tuple(round(255 * c) for c in rgb)
        box = max(4, int(line * 0.6))
        draw.rectangle([W + 6, y + (line - box) // 2, W + 6 + box, y + (line + box) // 2], fill=colour)
        draw.text((W + 12 + box, y + (line - box) // 2 - 1), text, fill=(0, 0, 0), font=font)
        y += line
    return np.asarray(canvas)


def _point_cloud(xyz: np.ndarray, rgb: np.ndarray):
    import open3d as o3d

    cloud = o3d.geometry.PointCloud(o3d.utility.Vector3dVector(np.asarray(xyz, dtype=np.float64)))
    cloud.colors = o3d.utility.Vector3dVector(np.clip(np.asarray(rgb, dtype=np.float64), 0.0, 1.0))
    return cloud


def write_ply(path: str | PathLike, xyz: np.ndarray, rgb: np.ndarray) -> Path:
    """Write a coloured point cloud (ASCII .ply, readable by Open3D, MeshLab, CloudCompare)."""
    import open3d as o3d

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not o3d.io.write_point_cloud(str(path), _point_cloud(xyz, rgb), write_ascii=True):
        raise OSError(f"Open3D could not write {path}")
    return path


def _camera(
    xyz: np.ndarray, up: str, aspect: float = 2.0, fov: float = FIELD_OF_VIEW, margin: float = 0.05
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Look-at centre, eye and up vector of a pinhole camera (vertical field of view ``fov`` degrees, width / height
    ``aspect``) that sees every point of ``xyz`` with ``margin`` of the picture left free on each side.

    The view direction is fixed per up axis (:data:`VIEWS`); the distance is the smallest at which every point
    projects inside the picture, so shapes long along any axis (tables, cars, sofas) are framed whole.
    """
    offset, up_vec = VIEWS[up]
    centre = (xyz.min(0) + xyz.max(0)) / 2
    back = offset / np.linalg.norm(offset)  # from the centre towards the eye
    right = np.cross(up_vec, back)
    right /= np.linalg.norm(right)
    true_up = np.cross(back, right)
    rel = xyz - centre
    depth = rel @ back  # towards the eye: a point closer to the camera needs more distance
    half_v = np.tan(np.radians(fov) / 2) * (1 - 2 * margin)
    half_h = half_v * aspect
    need = np.maximum(np.abs(rel @ right) / half_h, np.abs(rel @ true_up) / half_v) + depth
    distance = max(float(need.max()), 1e-6)
    return centre, centre + back * distance, up_vec


Camera = tuple[np.ndarray, np.ndarray, np.ndarray]  # look-at centre, eye, up vector (_camera)


def _render_offscreen(xyz: np.ndarray, rgb: np.ndarray, width: int, height: int, camera: Camera, point_size: float):
    import open3d as o3d

    rendering = o3d.visualization.rendering
    renderer = rendering.OffscreenRenderer(width, height)
    material = rendering.MaterialRecord()
    material.shader = "defaultUnlit"
    material.point_size = point_size
    renderer.scene.set_background([1.0, 1.0, 1.0, 1.0])
    renderer.scene.view.set_post_processing(False)  # no tone mapping: the palette's colours as they are
    renderer.scene.add_geometry("points", _point_cloud(xyz, rgb), material)
    centre, eye, up_vec = camera
    renderer.setup_camera(FIELD_OF_VIEW, centre, eye, up_vec)
    return np.asarray(renderer.render_to_image())


def _render_legacy(xyz: np.ndarray, rgb: np.ndarray, width: int, height: int, camera: Camera, point_size: float):
    import open3d as o3d

    vis = o3d.visualization.Visualizer()
    if not vis.create_window(visible=False, width=width, height=height):
        raise RuntimeError("the legacy Open3D Visualizer could not open a window (no X display: use xvfb-run)")
    try:
        vis.add_geometry(_point_cloud(xyz, rgb))
        vis.get_render_option().point_size = point_size
        centre, eye, up_vec = camera
        ctrl = vis.get_view_control()
        ctrl.set_lookat(centre)
        ctrl.set_front((eye - centre) / np.linalg.norm(eye - centre))
        ctrl.set_up(up_vec)
        vis.poll_events()
        vis.update_renderer()
        image = np.asarray(vis.capture_screen_float_buffer(do_render=True))
        return (image * 255).astype(np.uint8)
    finally:
        vis.destroy_window()


def legend_panel_width(width: int) -> int:
    """Width in pixels of the legend panel of a ``width``-pixel picture (:func:`render_png`)."""
    return min(max(140, int(width * 0.3)), width // 2)


def render_image(
    xyz: np.ndarray,
    rgb: np.ndarray,
    width: int = 960,
    height: int = 480,
    up: str = "z",
    point_size: float = 6.0,
    frame: np.ndarray | None = None,
) -> np.ndarray:
    """Render a coloured cloud without a display: ``(height, width, 3)`` uint8.

    The camera looks from the fixed direction of ``up`` (:data:`VIEWS`) and is placed so that every point of ``frame``
    (default: ``xyz``) is in the picture: pictures rendered with the same ``frame`` and size share one camera.
    Tries Open3D's ``OffscreenRenderer`` (Filament; Vulkan or EGL), then the legacy ``Visualizer`` with a hidden
    window (needs an X display, e.g. ``xvfb-run``). Raises ``RuntimeError`` naming what to install if both fail.
    """
    camera = _camera(np.asarray(xyz if frame is None else frame, dtype=np.float64), up, aspect=width / height)
    errors = []
    for name, fn in (("OffscreenRenderer", _render_offscreen), ("legacy Visualizer", _render_legacy)):
        try:
            return np.asarray(fn(xyz, rgb, width, height, camera, point_size))[..., :3].astype(np.uint8)
        except Exception as err:
            errors.append(f"{name}: {err}")
            _logger.info("%s failed (%s), trying the next renderer", name, err)
    raise RuntimeError(
        "no headless Open3D renderer works here (" + "; ".join(errors) + "). Install Debian's libvulkan1 "
        "mesa-vulkan-drivers (OffscreenRenderer) or run under xvfb-run (legacy Visualizer); tools/bootstrap.sh "
        "installs them when run as root"
    )


def render_side_by_side(
    views: Sequence[tuple[np.ndarray, np.ndarray]],
    width: int = 960,
    height: int = 480,
    up: str = "z",
    point_size: float = 6.0,
) -> np.ndarray:
    """Several coloured clouds side by side, each rendered on its own and all from one camera: ``(height, width, 3)``.

    For comparisons of one shape (ground truth | prediction): shifting copies of a cloud sideways in one perspective
    picture shows each copy from another angle, so the same point lands at different places in the two halves. Here
    each ``(xyz, rgb)`` of ``views`` gets ``width // len(views)`` pixels (what is left over stays white, at the right)
    and the one camera that frames all of their points (:func:`render_image`'s ``frame``), so equal clouds give equal
    pictures.
    """
    if not views or width < len(views):
        raise ValueError(f"need at least one view and one pixel of width per view, got {len(views)} in {width}")
    each = width // len(views)
    frame = np.concatenate([np.asarray(xyz, dtype=np.float64)[:, :3] for xyz, _ in views])
    images = [render_image(xyz, rgb, each, height, up, point_size, frame=frame) for xyz, rgb in views]
    images.append(np.full((height, width - each * len(views), 3), 255, dtype=np.uint8))
    return np.concatenate(images, axis=1)


def save_png(path: str | PathLike, image: np.ndarray) -> Path:
    """Write an ``(H, W, 3)`` uint8 image as a PNG (folders created); returns the path."""
    import open3d as o3d

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not o3d.io.write_image(str(path), o3d.geometry.Image(np.ascontiguousarray(image))):
        raise OSError(f"Open3D could not write {path}")
    return path


def render_png(
    path: str | PathLike,
    xyz: np.ndarray,
    rgb: np.ndarray,
    width: int = 960,
    height: int = 480,
    up: str = "z",
    point_size: float = 6.0,
    legend: Sequence[tuple[Sequence[float], str]] | None = None,
    title: str | None = None,
) -> Path:
    """Render a coloured cloud to a ``width`` x ``height`` PNG without a display (:func:`render_image`); returns the
    path. With ``legend`` (``(rgb, text)`` lines) the right part of the picture is a legend panel
    (:func:`add_legend`); ``title`` goes in the top-left corner.
    """
    panel = legend_panel_width(width) if legend else 0
    image = render_image(xyz, rgb, width - panel, height, up, point_size)
    if legend or title:
        image = add_legend(image, legend or [], title, panel)
    return save_png(path, image)


def show(xyz: np.ndarray, rgb: np.ndarray, title: str = "point cloud", point_size: float = 6.0) -> None:
    """Open an interactive Open3D window (needs a display)."""
    import open3d as o3d

    vis = o3d.visualization.Visualizer()
    vis.create_window(window_name=title)
    vis.add_geometry(_point_cloud(xyz, rgb))
    vis.get_render_option().point_size = point_size
    vis.run()
    vis.destroy_window()
