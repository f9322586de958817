"""Part decompositions of the capsule autoencoder, as in the paper's figures: one colour per latent capsule.

The reconstruction is coloured by the latent capsule that decoded each point (its patch); the input cloud beside it
is coloured by the capsule of its nearest decoded point, so the two halves of the picture use the same colours. With
``highlight`` only the chosen capsules keep their colour and the others are grey (the paper's figures colour a few
capsules and grey the rest).

A legend (:func:`legend_entries`: each capsule's colour, the part most of its points lie on and its purity) and a
title (the shape's part purity) are drawn beside the rendered picture with Pillow (:func:`add_legend`).

Output: a coloured ``.ply`` (:func:`write_ply`), a PNG rendered headless (:func:`render_png`: Open3D's
``OffscreenRenderer``, which needs Debian's ``libvulkan1 mesa-vulkan-drivers`` or a GPU driver; else the legacy
``Visualizer`` with a hidden window, which needs an X display such as ``xvfb-run``), or an interactive Open3D window
(:func:`show`). Open3D is imported only inside these functions.

:func:`visualize_checkpoint` does all of it for a trained run (``tools/visualize_capsules.py``): the model and the
data are rebuilt from the config saved in the checkpoint, as every command that opens a run does.
"""

from __future__ import annotations

import colorsys
import difflib
import logging
import os
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

import numpy as np
import torch

from attention import knn
from engine import UsageError, load_checkpoint, load_config, saved_config

from .metrics import capsule_parts, patch_spread, random_patches
from .recipe import CapsulesConfig, build_datasets, build_model

__all__ = [
    "GREY",
    "add_legend",
    "capsule_palette",
    "decomposition",
    "legend_entries",
    "render_png",
    "show",
    "visualize_checkpoint",
    "write_ply",
]

_logger = logging.getLogger(__name__)

GREY = (0.72, 0.72, 0.72)

#: Vertical field of view of the rendered pictures, in degrees.
FIELD_OF_VIEW = 40.0
# Camera direction per up axis (eye offset from the centre) and the up vector; the distance is fitted (_camera).
_VIEWS = {
    "z": (np.array([1.6, -4.2, 2.4]), np.array([0.0, 0.0, 1.0])),
    "y": (np.array([1.6, 2.0, 4.2]), np.array([0.0, 1.0, 0.0])),
}


def capsule_palette(num_capsules: int) -> np.ndarray:
    """``(M, 3)`` distinct saturated colours in [0, 1] (hues spaced by the golden ratio, two brightness levels)."""
    hues = (np.arange(num_capsules) * 0.618033988749895) % 1.0
    return np.array(
        [colorsys.hsv_to_rgb(h, 0.85, 0.95 if i % 2 == 0 else 0.7) for i, h in enumerate(hues)], dtype=np.float64
    ).reshape(num_capsules, 3)


def decomposition(
    points: np.ndarray,
    recon: np.ndarray,
    point_capsule: np.ndarray,
    num_capsules: int,
    highlight: Sequence[int] | None = None,
    up: str = "z",
    gap: float = 0.6,
) -> tuple[np.ndarray, np.ndarray]:
    """Input and reconstruction side by side, coloured by capsule.

    Args:
        points: input cloud.
        recon: reconstruction.
        point_capsule: latent capsule of each reconstructed point.
        num_capsules: M.
        highlight: capsules that keep their colour (others grey); None colours all.
        up: the clouds' up axis, ``"z"`` or ``"y"`` (they are placed side by side along x).
        gap: space between the two clouds.

    Shapes:
        points: ``(N, 3)``; recon: ``(R, 3)``; point_capsule: ``(R,)``;
        output: xyz ``(N + R, 3)`` (input first, shifted left; reconstruction shifted right) and rgb ``(N + R, 3)``.
    """
    if up not in _VIEWS:
        raise ValueError(f"up must be one of {sorted(_VIEWS)}, got {up!r}")
    points, recon = np.asarray(points, dtype=np.float64), np.asarray(recon, dtype=np.float64)
    point_capsule = np.asarray(point_capsule, dtype=np.int64)
    if points.ndim != 2 or points.shape[1] != 3 or recon.ndim != 2 or recon.shape[1] != 3:
        raise ValueError(f"points and recon must be (N, 3) and (R, 3), got {points.shape} and {recon.shape}")
    if point_capsule.shape != (len(recon),):
        raise ValueError(f"point_capsule must be ({len(recon)},), one capsule per reconstructed point")
    palette = capsule_palette(num_capsules)
    if highlight is not None:
        bad = [c for c in highlight if not 0 <= c < num_capsules]
        if bad:
            raise ValueError(f"highlight holds capsules {bad} outside [0, {num_capsules})")
        keep = np.zeros(num_capsules, dtype=bool)
        keep[list(highlight)] = True
        palette = np.where(keep[:, None], palette, np.array(GREY))
    _, idx = knn(torch.from_numpy(points)[None].float(), torch.from_numpy(recon)[None].float(), 1)
    input_capsule = point_capsule[idx[0, :, 0].numpy()]  # capsule of each input point's nearest decoded point
    width = max(np.ptp(points[:, 0]), np.ptp(recon[:, 0]))
    shift = np.array([(width + gap) / 2, 0.0, 0.0])
    xyz = np.concatenate([points - points.mean(0) - shift, recon - recon.mean(0) + shift])
    return xyz, np.concatenate([palette[input_capsule], palette[point_capsule]])


def legend_entries(
    part_label: Sequence[int],
    purity: Sequence[float],
    part_names: Sequence[str] | None = None,
    highlight: Sequence[int] | None = None,
) -> list[tuple[tuple[float, float, float], str]]:
    """One ``(colour, text)`` per coloured capsule: ``"capsule m: <part> 0.97"``, ordered by part label (just
    ``"capsule m"`` when no capsule has a labelled point, i.e. data without part labels).

    Args:
        part_label: each capsule's majority part label (:func:`capsules.metrics.capsule_parts`; ``< 0``: none).
        purity: each capsule's purity (NaN: no labelled point).
        part_names: name of each part label (e.g. ``SyntheticParts.part_labels``' part names); None: ``part <l>``.
        highlight: only these capsules (the others are grey in the picture); None: all.
    """
    M = len(part_label)
    palette = capsule_palette(M)
    keep = range(M) if highlight is None else sorted(set(highlight))

    unlabelled = all(int(label) < 0 for label in part_label)  # data without part labels: just the capsules

    def name(label: int) -> str:
        if label < 0:
            return "no labelled point"
        return part_names[label] if part_names is not None and label < len(part_names) else f"part {label}"

    order = sorted(keep, key=lambda m: (int(part_label[m]) < 0, int(part_label[m]), m))  # by part, unlabelled last
    entries = []
    for m in order:
        p = float(purity[m])
        text = (
            f"capsule {m}"
            if unlabelled
            else f"capsule {m}: {name(int(part_label[m]))}" + ("" if np.isnan(p) else f" {p:.2f}")
        )
        entries.append((tuple(float(c) for c in palette[m]), text))
    if highlight is not None and len(keep) < M:
        entries.append((GREY, "other capsules"))
    return entries


def add_legend(
    image: np.ndarray, entries: Sequence[tuple[Sequence[float], str]], title: str | None = None, panel: int = 0
) -> np.ndarray:
    """The image with ``panel`` white columns appended on the right holding the legend, and the title on top.

    Args:
        image: ``(H, W, 3)`` uint8 render.
        entries: ``(rgb in [0, 1], text)`` per legend line (:func:`legend_entries`).
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

    The view direction is fixed per up axis (:data:`_VIEWS`); the distance is the smallest at which every point
    projects inside the picture, so shapes long along any axis (tables, cars, sofas) are framed whole.
    """
    offset, up_vec = _VIEWS[up]
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


def _render_offscreen(xyz: np.ndarray, rgb: np.ndarray, width: int, height: int, up: str, point_size: float):
    import open3d as o3d

    rendering = o3d.visualization.rendering
    renderer = rendering.OffscreenRenderer(width, height)
    material = rendering.MaterialRecord()
    material.shader = "defaultUnlit"
    material.point_size = point_size
    renderer.scene.set_background([1.0, 1.0, 1.0, 1.0])
    renderer.scene.view.set_post_processing(False)  # no tone mapping: the palette's colours as they are
    renderer.scene.add_geometry("capsules", _point_cloud(xyz, rgb), material)
    centre, eye, up_vec = _camera(xyz, up, aspect=width / height)
    renderer.setup_camera(FIELD_OF_VIEW, centre, eye, up_vec)
    return np.asarray(renderer.render_to_image())


def _render_legacy(xyz: np.ndarray, rgb: np.ndarray, width: int, height: int, up: str, point_size: float):
    import open3d as o3d

    vis = o3d.visualization.Visualizer()
    if not vis.create_window(visible=False, width=width, height=height):
        raise RuntimeError("the legacy Open3D Visualizer could not open a window (no X display: use xvfb-run)")
    try:
        vis.add_geometry(_point_cloud(xyz, rgb))
        vis.get_render_option().point_size = point_size
        centre, eye, up_vec = _camera(xyz, up, aspect=width / height)
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
    """Render a coloured cloud to a ``width`` x ``height`` PNG without a display; returns the path.

    Tries Open3D's ``OffscreenRenderer`` (Filament; Vulkan or EGL), then the legacy ``Visualizer`` with a hidden
    window (needs an X display, e.g. ``xvfb-run``). Raises ``RuntimeError`` naming what to install if both fail.
    With ``legend`` (:func:`legend_entries`) the right part of the picture is a legend panel (:func:`add_legend`);
    ``title`` goes in the top-left corner.
    """
    import open3d as o3d

    panel = 0
    if legend:
        panel = min(max(140, int(width * 0.3)), width // 2)
    errors = []
    image = None
    for name, fn in (("OffscreenRenderer", _render_offscreen), ("legacy Visualizer", _render_legacy)):
        try:
            image = fn(xyz, rgb, width - panel, height, up, point_size)
            break
        except Exception as err:
            errors.append(f"{name}: {err}")
            _logger.info("%s failed (%s), trying the next renderer", name, err)
    if image is None:
        raise RuntimeError(
            "no headless Open3D renderer works here (" + "; ".join(errors) + "). Install Debian's libvulkan1 "
            "mesa-vulkan-drivers (OffscreenRenderer) or run under xvfb-run (legacy Visualizer); tools/bootstrap.sh "
            "installs them when run as root"
        )
    if legend or title:
        image = add_legend(image, legend or [], title, panel)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if not o3d.io.write_image(str(path), o3d.geometry.Image(np.ascontiguousarray(image))):
        raise OSError(f"Open3D could not write {path}")
    return path


def show(xyz: np.ndarray, rgb: np.ndarray, title: str = "capsule decomposition", point_size: float = 6.0) -> None:
    """Open an interactive Open3D window (needs a display)."""
    import open3d as o3d

    vis = o3d.visualization.Visualizer()
    vis.create_window(window_name=title)
    vis.add_geometry(_point_cloud(xyz, rgb))
    vis.get_render_option().point_size = point_size
    vis.run()
    vis.destroy_window()


def visualize_checkpoint(
    checkpoint: str | PathLike,
    indices: Sequence[int] = (),
    split: str = "test",
    highlight: Sequence[int] | None = None,
    output_dir: str | PathLike | None = None,
    data_root: str | None = None,
    headless: bool = False,
    width: int = 960,
    height: int = 480,
    point_size: float = 6.0,
    allow_pickle: bool = False,
    shapes: Sequence[str] = (),
) -> list[dict]:
    """Shows (or renders) the part decomposition of shapes of ``split`` by a trained capsule autoencoder.

    Per shape: ``<output_dir>/<split>_<index>.ply`` (input and reconstruction side by side, see :func:`decomposition`)
    and, without a display or with ``headless``, ``<split>_<index>.png`` with a legend (:func:`render_png`); with a
    display an Open3D window (:func:`show`). The model, data and point count come from the checkpoint's config;
    ``data_root`` only says where the data lies. The picture's title gives the shape's part purity where the data has
    part labels, else its patch spread beside that of random patches of the same sizes
    (:func:`capsules.metrics.patch_spread`: capsules that decode regions score well below the random level).

    Args:
        indices: Shapes by index in the split; ``shapes``: by name (``dataset.names``, e.g. ``table_0053``). Neither:
            the first four shapes.

    Returns:
        One dict per shape: ``index``, ``name``, ``part_purity`` (mean over the capsules with labelled points; NaN
        without labels), ``patch_spread``, ``patch_spread_random``, ``ply`` and ``png`` (when rendered).

    Raises:
        UsageError: The checkpoint holds no config, an index is outside the split, or a name is not in it.
    """
    checkpoint = Path(checkpoint)
    state = load_checkpoint(checkpoint, allow_pickle=allow_pickle)
    saved = saved_config(state, checkpoint)
    if not saved:
        raise UsageError(f"{checkpoint} holds no config: expected a checkpoint written by tools/train_capsules.py")
    cfg = load_config(CapsulesConfig, defaults=saved, defaults_source=f"checkpoint {checkpoint}")
    train_set, test_set = build_datasets(cfg, data_root)
    dataset = test_set if split == "test" else train_set
    chosen = _chosen_shapes(dataset, split, list(indices), list(shapes))
    model = build_model(cfg)
    model.load_state_dict(state["model"])
    model.eval()
    out_dir = Path(output_dir) if output_dir is not None else checkpoint.parent / "viz"
    interactive = bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")) and not headless
    up = cfg.up_axis or dataset.up_axis
    labels = getattr(dataset, "part_labels", None)  # synthetic parts: (class, part name) per label
    part_names = [part for _, part in labels] if labels is not None else None
    random_capsule = random_patches(model.point_capsule)
    results = []
    for index in chosen:
        points, parts = dataset[index]
        with torch.no_grad():
            recon = model(points[None])
        label, cap_purity = capsule_parts(recon, model.point_capsule, points[None], parts[None], model.num_latent)
        keep = ~torch.isnan(cap_purity[0])
        purity = float(cap_purity[0][keep].mean()) if bool(keep.any()) else float("nan")
        spread = patch_spread(recon, model.point_capsule)
        spread_random = patch_spread(recon, random_capsule)
        xyz, rgb = decomposition(points.numpy(), recon[0].numpy(), model.point_capsule.numpy(), model.num_latent,
                                 highlight=highlight, up=up)  # fmt: skip
        stem, name = f"{split}_{index}", dataset.names[index]
        ply = write_ply(out_dir / f"{stem}.ply", xyz, rgb)
        row = {"index": index, "name": name, "part_purity": purity, "patch_spread": spread,
               "patch_spread_random": spread_random, "ply": str(ply)}  # fmt: skip
        score = (
            f"part purity {purity:.2f}"
            if bool(keep.any())
            else f"patch spread {spread:.2f} (random patches {spread_random:.2f})"
        )
        if interactive:
            show(xyz, rgb, title=f"{name}: input | reconstruction, {score}", point_size=point_size)
        else:
            legend = legend_entries(label[0].tolist(), cap_purity[0].tolist(), part_names, highlight)
            title = f"{name}: input | reconstruction, {score}"
            png = render_png(out_dir / f"{stem}.png", xyz, rgb, width, height, up, point_size, legend, title)
            row["png"] = str(png)
        _logger.info("%s (%s): %s -> %s", stem, name, score, row.get("png", row["ply"]))
        results.append(row)
    return results


def _chosen_shapes(dataset, split: str, indices: list[int], shapes: list[str]) -> list[int]:
    """The indices of the shapes asked for by index or by name (default: the first four)."""
    bad = [i for i in indices if not 0 <= i < len(dataset)]
    if bad:
        raise UsageError(f"shape indices {bad} are outside the {split} split's {len(dataset)} shapes")
    position = {name: i for i, name in enumerate(dataset.names)}
    missing = [name for name in shapes if name not in position]
    if missing:
        close = {name: difflib.get_close_matches(name, position, n=3) for name in missing}
        hints = "; ".join(f"{name!r}: close names {found}" if found else repr(name) for name, found in close.items())
        raise UsageError(
            f"no shape named {hints} in the {split} split ({len(dataset)} shapes, e.g. {dataset.names[:3]})"
        )
    chosen = indices + [position[name] for name in shapes]
    return chosen or list(range(min(4, len(dataset))))
