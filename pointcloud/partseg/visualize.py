"""Predicted parts beside the ground truth: the view of a trained part-segmentation run (tools/visualize_partseg.py).

Each chosen shape is drawn twice side by side, its ground-truth labels on the left and the model's prediction (the
arg-max over its category's parts, as the metric takes it) on the right, every point in the colour of its part. The
PNGs render the two halves separately from one camera (:func:`pointcloud.render.render_side_by_side`), so a point sits
at the same place in both and only its colour differs; the ``.ply`` (and the window) holds the two copies shifted apart
(:func:`pointcloud.render.palette` over the global part labels, so a part has one colour in every shape). The legend
lists the parts of the shown categories; the title gives each shape's IoU (ShapeNet Part's per-shape IoU).

:func:`visualize_checkpoint` rebuilds the model and the data from the config saved in the checkpoint, as every
command that opens a run does, and writes a ``.ply`` per shape and, without a display, a PNG (Open3D, headless:
:func:`pointcloud.render.render_png`); ``together`` puts all chosen shapes into one picture, one rendered row each
(each row framed on its own shape), with one legend.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from os import PathLike
from pathlib import Path

import numpy as np
import torch

from engine import open_trained

from ..parts import PartSegmentation
from ..render import (
    VIEWS,
    add_legend,
    choose_shapes,
    has_display,
    legend_panel_width,
    palette,
    render_side_by_side,
    save_png,
    show,
    write_ply,
)
from .metrics import category_part_mask, restricted_argmax, shape_ious
from .recipe import PartSegConfig, build_datasets, build_model

__all__ = ["predict", "segmentation_halves", "segmentation_view", "visualize_checkpoint"]

_logger = logging.getLogger(__name__)


def segmentation_halves(
    points: np.ndarray, labels: np.ndarray, pred: np.ndarray, num_parts: int
) -> list[tuple[np.ndarray, np.ndarray]]:
    """Ground truth and prediction of one shape as two coloured clouds: the same centred points, coloured by part, for
    :func:`pointcloud.render.render_side_by_side`.

    Shapes:
        points: ``(N, 3)``; labels, pred: ``(N,)`` global part labels; output: ``[(xyz, rgb) ground truth,
        (xyz, rgb) prediction]``, each ``(N, 3)``.
    """
    points = np.asarray(points, dtype=np.float64)[:, :3]
    labels, pred = np.asarray(labels, dtype=np.int64), np.asarray(pred, dtype=np.int64)
    if labels.shape != (len(points),) or pred.shape != (len(points),):
        raise ValueError(f"labels and pred must be ({len(points)},), one part per point")
    colours = palette(num_parts)
    centred = points - points.mean(0)
    return [(centred, colours[labels]), (centred.copy(), colours[pred])]


def segmentation_view(
    points: np.ndarray, labels: np.ndarray, pred: np.ndarray, num_parts: int, up: str = "z", gap: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """Ground truth (left) and prediction (right) of one shape in one cloud, shifted apart along x: what the ``.ply``
    and the interactive window show (the PNGs render :func:`segmentation_halves` from one camera instead).

    Shapes:
        points: ``(N, 3)``; labels, pred: ``(N,)`` global part labels; output: xyz ``(2N, 3)`` (ground truth first,
        shifted left; prediction shifted right along x) and rgb ``(2N, 3)``.
    """
    if up not in VIEWS:
        raise ValueError(f"up must be one of {sorted(VIEWS)}, got {up!r}")
    (truth, truth_rgb), (_, pred_rgb) = segmentation_halves(points, labels, pred, num_parts)
    shift = np.array([(np.ptp(truth[:, 0]) + gap) / 2, 0.0, 0.0])
    return np.concatenate([truth - shift, truth + shift]), np.concatenate([truth_rgb, pred_rgb])


@torch.no_grad()
def predict(model: torch.nn.Module, dataset: PartSegmentation, index: int) -> tuple[np.ndarray, np.ndarray, float]:
    """The model's restricted prediction of shape ``index``: ``(labels, pred, IoU)``."""
    points, category, labels = dataset[index]
    logits = model(points[None], category[None])
    mask = category_part_mask(dataset.part_classes, logits.shape[-1])
    pred = restricted_argmax(logits, category[None], mask)
    iou = float(shape_ious(pred, labels[None], category[None], mask)[0])
    return labels.numpy(), pred[0].numpy(), iou


def visualize_checkpoint(
    checkpoint: str | PathLike,
    indices: Sequence[int] = (),
    split: str = "test",
    output_dir: str | PathLike | None = None,
    data_root: str | None = None,
    headless: bool = False,
    together: bool = False,
    width: int = 960,
    height: int = 480,
    point_size: float = 6.0,
    allow_pickle: bool = False,
    shapes: Sequence[str] = (),
) -> list[dict]:
    """Shows (or renders) ground truth and prediction of shapes of ``split`` for a trained run.

    Per shape ``<output_dir>/<split>_<index>.ply`` and, without a display or with ``headless``, ``<split>_<index>.png``
    with a legend; with ``together`` one ``<split>_<i>-<j>-....png`` holding every shape as a row. The model, data
    and point count come from the checkpoint's config; ``data_root`` only says where the data lies.

    Args:
        indices: Shapes by index in the split; ``shapes``: by name (``dataset.names``: ``table_0003`` for the
            synthetic shapes, ``<synset>/<id>`` for ShapeNet Part). Neither: the first four shapes.

    Returns:
        One dict per shape: ``index``, ``name``, ``category``, ``iou``, ``ply`` and ``png`` (when rendered).

    Raises:
        UsageError: The checkpoint holds no config, an index is outside the split, or a name is not in it.
    """
    checkpoint = Path(checkpoint)
    state, cfg = open_trained(checkpoint, PartSegConfig, "tools/train_partseg.py", allow_pickle)
    train_set, test_set = build_datasets(cfg, data_root)
    dataset = test_set if split == "test" else PartSegmentation(train_set.parts, cfg.use_normals)  # no augmentation
    chosen = choose_shapes(dataset.names, indices, shapes, split)
    model = build_model(cfg, dataset.num_parts, dataset.num_categories)
    model.load_state_dict(state["model"])
    model.eval()
    out_dir = Path(output_dir) if output_dir is not None else checkpoint.parent / "viz"
    interactive = has_display(headless)
    up = "z" if cfg.dataset == "synthetic_parts" else "y"
    names = dataset.part_names
    rows, clouds = [], []
    for index in chosen:
        labels, pred, iou = predict(model, dataset, index)
        points = dataset[index][0].numpy()
        xyz, rgb = segmentation_view(points, labels, pred, dataset.num_parts, up)
        halves = segmentation_halves(points, labels, pred, dataset.num_parts)
        category = dataset.category_names[dataset.parts.categories[index]]
        stem = f"{split}_{index}"
        result = {"index": index, "name": dataset.names[index], "category": category, "iou": iou,
                  "ply": str(write_ply(out_dir / f"{stem}.ply", xyz, rgb))}  # fmt: skip
        _logger.info("%s (%s, %s): IoU %.3f", stem, result["name"], category, iou)
        clouds.append((halves, dataset.parts.categories[index], f"{category} {iou:.2f}"))
        if interactive:
            show(xyz, rgb, title=f"{result['name']}: ground truth | prediction", point_size=point_size)
        elif not together:
            title = f"{result['name']} ({category}): ground truth | prediction, IoU {iou:.2f}"
            legend = _legend(dataset, [clouds[-1][1]], names)
            result["png"] = str(_render_png(out_dir / f"{stem}.png", [halves], width, height, up, point_size,
                                            legend, title))  # fmt: skip
        rows.append(result)
    if together and not interactive:
        title = "ground truth | prediction; IoU: " + ", ".join(c[2] for c in clouds)
        legend = _legend(dataset, [c[1] for c in clouds], names)
        path = out_dir / f"{split}_{'-'.join(str(i) for i in chosen)}.png"
        png = str(_render_png(path, [c[0] for c in clouds], width, height, up, point_size, legend, title))
        for result in rows:
            result["png"] = png
    return rows


def _render_png(
    path: Path,
    shapes: Sequence[list[tuple[np.ndarray, np.ndarray]]],
    width: int,
    height: int,
    up: str,
    point_size: float,
    legend: list,
    title: str,
) -> Path:
    """One row per shape, its two halves side by side from one camera (:func:`render_side_by_side`; each row framed on
    its own shape), a legend panel on the right and ``title`` on top."""
    panel = legend_panel_width(width)
    row_height = max(height // len(shapes), 1)
    image = np.concatenate(
        [render_side_by_side(halves, width - panel, row_height, up, point_size) for halves in shapes]
    )
    return save_png(path, add_legend(image, legend, title, panel))


def _legend(dataset: PartSegmentation, categories: Sequence[int], names: Sequence[str]) -> list:
    """``(colour, part name)`` for every part of the shown categories, in label order."""
    colours = palette(dataset.num_parts)
    labels = sorted({p for c in categories for p in dataset.part_classes[c]})
    return [(tuple(float(v) for v in colours[p]), names[p] if p < len(names) else f"part {p}") for p in labels]
