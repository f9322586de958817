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
(:func:`show`). Those are :mod:`pointcloud.render`'s, shared with the part-segmentation view and re-exported here.

:func:`visualize_checkpoint` does all of it for a trained run (``tools/visualize_capsules.py``): the model and the
data are rebuilt from the config saved in the checkpoint, as every command that opens a run does.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

import numpy as np
import torch

from attention import knn
from engine import open_trained
from pointcloud.render import GREY, VIEWS, add_legend, choose_shapes, has_display, palette, render_png, show, write_ply

from .metrics import NO_PART_LABELS, capsule_parts, patch_spread, random_patches
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


def capsule_palette(num_capsules: int) -> np.ndarray:
    """``(M, 3)`` distinct saturated colours in [0, 1], one per capsule (:func:`pointcloud.render.palette`)."""
    return palette(num_capsules)


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
    if up not in VIEWS:
        raise ValueError(f"up must be one of {sorted(VIEWS)}, got {up!r}")
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
        text = f"capsule {m}: {name(int(part_label[m]))}" + ("" if np.isnan(p) else f" {p:.2f}")
        if unlabelled:
            text = f"capsule {m}"
        entries.append((tuple(float(c) for c in palette[m]), text))
    if highlight is not None and len(keep) < M:
        entries.append((GREY, "other capsules"))
    return entries


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
        One dict per shape: ``index``, ``name``, ``part_purity`` (mean over the capsules with labelled points;
        :data:`~capsules.metrics.NO_PART_LABELS` without labels), ``patch_spread``, ``patch_spread_random``, ``ply``
        and ``png`` (when rendered).

    Raises:
        UsageError: The checkpoint holds no config, an index is outside the split, or a name is not in it.
    """
    checkpoint = Path(checkpoint)
    state, cfg = open_trained(checkpoint, CapsulesConfig, "tools/train_capsules.py", allow_pickle)
    train_set, test_set = build_datasets(cfg, data_root)
    dataset = test_set if split == "test" else train_set
    chosen = choose_shapes(dataset.names, indices, shapes, split)
    model = build_model(cfg)
    model.load_state_dict(state["model"])
    model.eval()
    out_dir = Path(output_dir) if output_dir is not None else checkpoint.parent / "viz"
    interactive = has_display(headless)
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
        purity = float(cap_purity[0][keep].mean()) if bool(keep.any()) else NO_PART_LABELS
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
