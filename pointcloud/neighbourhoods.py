"""The feature-space neighbourhoods of a trained centroid transformer's second centroid block (paper Fig. 4), and how
well they follow semantic parts.

Wu et al., "Centroid Transformers", arXiv:2102.08606, Fig. 4: the K nearest inputs of a centroid in *feature* space,
found by the second centroid block's first attention step, group points of the same semantic part, where K nearest
inputs in xyz mix parts that touch. :func:`centroid_neighbourhoods` recovers, for a batch of clouds, every centroid of
that block with its K feature-space neighbours as indices into the input cloud (the block's inputs are the first
block's centroids, each one an input point with the FPS and random inits; k-means averages points, so a model with it
is refused); :func:`part_agreement`
measures the fraction of a centroid's neighbours that share its own point's part label, beside the same fraction for
its K nearest points in xyz and for K random points of the same stage.

The neighbours are recomputed from the block's inputs as the layer computes them (:func:`attention.knn` between the
block's initial centroids and its inputs, both in the block's feature space, before the first step), read with
forward hooks: the model is not changed.

The figure and the number for a trained run (``tools/visualize_neighbourhoods.py``): :func:`split_agreement` averages
:func:`part_agreement` over the shapes of a part-labelled split (:mod:`pointcloud.parts`: the synthetic part shapes or
ShapeNet Part), :func:`neighbourhood_view` draws a few centroids of one shape with their feature-space neighbours
beside their xyz neighbours (:mod:`pointcloud.render`), and :func:`visualize_checkpoint` does both for a checkpoint of
``tools/train_modelnet.py``, rebuilding the model from what the checkpoint records.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from os import PathLike
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

from attention import gather, knn
from engine import UsageError, load_checkpoint, load_config, saved_config, unwrap_state_dict

from .model import CentroidTransformer, create_model
from .parts import PartDataset, ShapeNetPart, SyntheticParts
from .render import GREY, VIEWS, choose_shapes, has_display, palette, render_png, show, write_ply

__all__ = [
    "PART_SOURCES",
    "Neighbourhoods",
    "centroid_neighbourhoods",
    "neighbourhood_view",
    "part_agreement",
    "part_dataset",
    "split_agreement",
    "visualize_checkpoint",
]

_logger = logging.getLogger(__name__)

#: The part-labelled sources :func:`part_dataset` reads: the embedded synthetic shapes and ShapeNet Part's layouts.
PART_SOURCES = ("synthetic", "shapenet_part", "shapenet_part_normal")


class Neighbourhoods(NamedTuple):
    """The second centroid block's neighbourhoods of a batch, as indices into each input cloud of N points.

    Attributes:
        centre: ``(B, M)`` the input point each centroid was initialized from.
        feature: ``(B, M, K)`` its K nearest block inputs in feature space (the attention's neighbours).
        xyz: ``(B, M, K)`` its K nearest block inputs in xyz (the baseline).
        stage: ``(B, N1)`` the block's inputs (the first block's centroids), as input points.
    """

    centre: Tensor
    feature: Tensor
    xyz: Tensor
    stage: Tensor


@torch.no_grad()
def centroid_neighbourhoods(model: CentroidTransformer, points: Tensor, block: int = 3) -> Neighbourhoods:
    """Runs ``model`` (in eval mode) on ``points`` and returns the neighbourhoods of its centroid block ``block``.

    Args:
        model: a trained :class:`~pointcloud.model.CentroidTransformer` whose centroid blocks sample input points
            (FPS or random init: the ``index`` of their outputs is set) and attend over K neighbours.
        points: ``(B, N, C)`` clouds (xyz first).
        block: index in ``model.blocks`` of the centroid block (3: the second one, as in the paper's figure).

    Raises:
        ValueError: the block is not a centroid block with K neighbours, or a centroid block before it averages
            points instead of sampling them (its centroids are no input point).
    """
    blocks = list(model.blocks)
    target = blocks[block] if 0 <= block < len(blocks) else None
    attn = getattr(target, "attn", None)
    if not hasattr(target, "init") or attn is None or getattr(attn, "num_neighbors", None) is None:
        raise ValueError(f"model.blocks[{block}] must be a centroid block with an attention step over K neighbours")
    seen: dict[int, tuple] = {}

    def keep(i: int):
        def hook(module, args, output) -> None:
            seen[i] = (args, output)

        return hook

    handles = [b.register_forward_hook(keep(i)) for i, b in enumerate(blocks) if i <= block and hasattr(b, "init")]
    handles.append(attn.register_forward_pre_hook(lambda module, args: seen.__setitem__("attn", args)))
    was_training = model.training
    model.eval()
    try:
        model(points)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    B, N = points.shape[:2]
    to_input = torch.arange(N, device=points.device).expand(B, N)  # (B, n): each stage point as an input point
    for i in sorted(k for k in seen if isinstance(k, int) and k < block):
        index = seen[i][1].index
        if index is None:
            raise ValueError(f"model.blocks[{i}] averages points (no index): its centroids are no input point")
        to_input = torch.gather(to_input, 1, index)  # (B, M_i)
    x, u = seen["attn"][:2]  # the block's inputs (B, N1, C) and initial centroids (B, M, C)
    out = seen[block][1]
    if out.index is None or out.pos is None:
        raise ValueError(f"model.blocks[{block}] averages points (no index): its centroids are no input point")
    K = attn.num_neighbors
    _, feature = knn(u, x, K)  # (B, M, K): the first step's neighbours
    stage_pos = gather(points[..., :3].contiguous(), to_input)  # (B, N1, 3)
    _, xyz = knn(out.pos[..., :3].contiguous(), stage_pos, K)  # (B, M, K)
    centre = torch.gather(to_input, 1, out.index)  # (B, M)
    return Neighbourhoods(centre, torch.gather(to_input, 1, feature.flatten(1)).view_as(feature),
                          torch.gather(to_input, 1, xyz.flatten(1)).view_as(xyz), to_input)  # fmt: skip


def part_agreement(nbrs: Neighbourhoods, part: Tensor, seed: int = 0) -> dict[str, float]:
    """The fraction of a centroid's K neighbours whose part label equals its own point's, averaged over centroids and
    clouds: in feature space, in xyz, and for K points drawn at random (without replacement) from the block's inputs.

    Args:
        nbrs: from :func:`centroid_neighbourhoods`.
        part: ``(B, N)`` int part label of every input point.
        seed: seed of the random baseline.

    Returns:
        ``{"feature": ..., "xyz": ..., "random": ...}`` fractions in [0, 1].
    """
    B, M, K = nbrs.feature.shape
    N1 = nbrs.stage.shape[1]
    own = torch.gather(part, 1, nbrs.centre).unsqueeze(-1)  # (B, M, 1)

    def share(idx: Tensor) -> float:
        labels = torch.gather(part, 1, idx.flatten(1)).view(B, M, -1)
        return float((labels == own).float().mean())

    gen = torch.Generator().manual_seed(seed)
    pick = torch.rand(B, M, N1, generator=gen).argsort(-1)[..., :K].to(nbrs.stage.device)  # (B, M, K) distinct
    random = torch.gather(nbrs.stage, 1, pick.flatten(1)).view(B, M, K)
    return {"feature": share(nbrs.feature), "xyz": share(nbrs.xyz), "random": share(random)}


def part_dataset(
    source: str = "synthetic", split: str = "test", num_points: int = 2048, root: str | None = None, seed: int = 0
) -> PartDataset:
    """A part-labelled split of :data:`PART_SOURCES`: the embedded synthetic part shapes (table, chair, airplane, lamp,
    mug) or ShapeNet Part (``v0`` or ``_normal`` layout, under ``root``)."""
    if source == "synthetic":
        return SyntheticParts(split, num_points, seed=seed)
    if source in ("shapenet_part", "shapenet_part_normal"):
        layout = "normal" if source == "shapenet_part_normal" else "v0"
        return ShapeNetPart(root, split, num_points, layout=layout, seed=seed)
    raise ValueError(f"part source must be one of {PART_SOURCES}, got {source!r}")


def _shape(dataset: PartDataset, index: int, normals: bool) -> tuple[np.ndarray, np.ndarray]:
    """Shape ``index`` as the model reads it and its part labels in the dataset's global label space."""
    points, parts = dataset.sample(index, normals=normals)
    return points, dataset.global_parts(index, parts)


def _one(nbrs: Neighbourhoods, b: int) -> Neighbourhoods:
    return Neighbourhoods(*(t[b : b + 1] for t in nbrs))


@torch.no_grad()
def split_agreement(
    model: CentroidTransformer,
    dataset: PartDataset,
    batch_size: int = 16,
    max_shapes: int | None = None,
    block: int = 3,
    seed: int = 0,
    progress: bool = False,
) -> dict[str, Any]:
    """:func:`part_agreement` averaged over the shapes of a part-labelled split (each shape weighs the same).

    Args:
        model: a trained centroid transformer (see :func:`centroid_neighbourhoods`); its ``in_channels`` say whether
            the shapes are read with normals.
        dataset: the shapes and their part labels (:func:`part_dataset`).
        batch_size: shapes per forward pass.
        max_shapes: only the first ``max_shapes`` shapes (None: all).
        block: the centroid block (3: the second one).
        seed: seed of the random baseline; shape ``i`` draws with ``seed + i``, whatever the batch size.
        progress: show a tqdm bar.

    Returns:
        ``feature``, ``xyz``, ``random``: the mean fractions over the shapes; ``shapes``: how many;
        ``num_centroids`` and ``num_neighbors`` (M and K of the block); ``by_category``: the same three means and
        the count per category.
    """
    from tqdm import tqdm

    normals = model.in_channels > 3
    count = len(dataset) if max_shapes is None else min(max_shapes, len(dataset))
    if count < 1:
        raise ValueError(f"no shape to measure: the split has {len(dataset)} shapes, max_shapes is {max_shapes}")
    rows: list[tuple[int, dict[str, float]]] = []
    M = K = 0
    for start in tqdm(range(0, count, batch_size), desc="part agreement", disable=not progress):
        indices = range(start, min(start + batch_size, count))
        clouds, labels = zip(*(_shape(dataset, i, normals) for i in indices), strict=True)
        nbrs = centroid_neighbourhoods(model, torch.from_numpy(np.stack(clouds)), block)
        part = torch.from_numpy(np.stack(labels))
        M, K = nbrs.feature.shape[1:]
        for b, i in enumerate(indices):
            rows.append((dataset.categories[i], part_agreement(_one(nbrs, b), part[b : b + 1], seed=seed + i)))

    def means(chosen: list[dict[str, float]]) -> dict[str, Any]:
        return {key: float(np.mean([r[key] for r in chosen])) for key in ("feature", "xyz", "random")}

    by_category = {}
    for c, name in enumerate(dataset.category_names):
        chosen = [r for category, r in rows if category == c]
        if chosen:
            by_category[name] = {**means(chosen), "shapes": len(chosen)}
    return {**means([r for _, r in rows]), "shapes": len(rows), "num_centroids": M, "num_neighbors": K,
            "by_category": by_category}  # fmt: skip


def neighbourhood_view(
    points: np.ndarray,
    nbrs: Neighbourhoods,
    centroids: Sequence[int],
    parts: np.ndarray | None = None,
    num_parts: int = 0,
    up: str = "z",
    gap: float = 0.5,
    marker: float = 0.025,
) -> tuple[np.ndarray, np.ndarray]:
    """A few centroids of one shape with their K neighbours in feature space (left) and in xyz (right).

    The shape is drawn twice side by side. In both copies the neighbours of ``centroids[j]`` take colour ``j`` of
    :func:`pointcloud.render.palette` (a point in two neighbourhoods keeps the later one's), every other point is
    pale: its part's colour mixed with white (grey without ``parts``), so one sees whether a neighbourhood stays
    on one part. A small black cross of extra points marks each centroid's own point.

    Args:
        points: the shape, xyz first.
        nbrs: its neighbourhoods (a batch of one, from :func:`centroid_neighbourhoods`).
        centroids: which of the block's M centroids to show.
        parts: the part label of every point; ``num_parts``: how many labels the palette covers.
        up: the shape's up axis, ``"z"`` or ``"y"`` (the copies are placed along x).
        gap: space between the two copies.
        marker: half-length of the marker's arms, as a fraction of the shape's extent.

    Shapes:
        points: ``(N, C)``; parts: ``(N,)``; output: xyz ``(2N + 2 * 13 * len(centroids), 3)`` (the feature-space copy
        first, shifted left; the xyz copy shifted right; then the markers) and rgb of the same shape.
    """
    if up not in VIEWS:
        raise ValueError(f"up must be one of {sorted(VIEWS)}, got {up!r}")
    points = np.asarray(points, dtype=np.float64)[:, :3]
    N, M = len(points), nbrs.centre.shape[1]
    if nbrs.centre.shape[0] != 1 or int(nbrs.stage.max()) >= N:
        raise ValueError(f"nbrs must be the neighbourhoods of this one shape of {N} points (a batch of one)")
    bad = [m for m in centroids if not 0 <= m < M]
    if bad:
        raise ValueError(f"centroids {bad} are outside the block's {M} centroids")
    if parts is not None:
        parts = np.asarray(parts, dtype=np.int64)
        if parts.shape != (N,) or int(parts.max()) >= num_parts:
            raise ValueError(f"parts must be ({N},) labels below num_parts={num_parts}, got {parts.shape}")
        base = 0.35 * palette(num_parts)[parts] + 0.65  # pale part colours
    else:
        base = np.tile(np.array(GREY), (N, 1))
    colours = palette(len(centroids))
    centred = points - points.mean(0)
    shift = np.array([(np.ptp(points[:, 0]) + gap) / 2, 0.0, 0.0])
    arm = marker * float(np.ptp(points, axis=0).max()) * np.linspace(-1.0, 1.0, 5)[[0, 1, 3, 4]]
    cross = np.concatenate([np.zeros((1, 3)), *(np.eye(3)[a] * arm[:, None] for a in range(3))])  # (13, 3)
    xyz, rgb, marks = [], [], []
    for side, found in ((-shift, nbrs.feature[0]), (shift, nbrs.xyz[0])):
        rgb_side = base.copy()
        for j, m in enumerate(centroids):
            rgb_side[found[m].numpy()] = colours[j]
            marks.append(centred[int(nbrs.centre[0, m])] + side + cross)
        xyz.append(centred + side)
        rgb.append(rgb_side)
    marks_xyz = np.concatenate(marks) if marks else np.zeros((0, 3))
    return np.concatenate([*xyz, marks_xyz]), np.concatenate([*rgb, np.zeros_like(marks_xyz)])


def _load_classifier(checkpoint: Path, allow_pickle: bool) -> tuple[CentroidTransformer, Any]:
    """The trained classifier of a ``tools/train_modelnet.py`` checkpoint (eval mode) and its run config."""
    from .recipe import ModelNetConfig, build_model

    state = load_checkpoint(checkpoint, allow_pickle=allow_pickle)
    saved = saved_config(state, checkpoint)
    if not saved:
        raise UsageError(f"{checkpoint} holds no config: expected a checkpoint written by tools/train_modelnet.py")
    cfg = load_config(ModelNetConfig, defaults=saved, defaults_source=f"checkpoint {checkpoint}")
    weights = unwrap_state_dict(state["model"])
    spec = state.get("model_spec")
    if isinstance(spec, dict):  # the name and keywords the run built the model with
        model = create_model(spec["name"], **dict(spec.get("kwargs") or {}))
    else:
        head = weights.get("head.weight")
        model = build_model(cfg, head.shape[0] if head is not None else 40)
    if not isinstance(model, CentroidTransformer):
        raise UsageError(
            f"{checkpoint} holds a {type(model).__name__} ({cfg.model}), not a centroid transformer: the view needs "
            "its centroid blocks (train one with tools/train_modelnet.py --set model=centroid_transformer_modelnet40)"
        )
    model.load_state_dict(weights)
    return model.eval(), cfg


def visualize_checkpoint(
    checkpoint: str | PathLike,
    indices: Sequence[int] = (),
    split: str = "test",
    shapes: Sequence[str] = (),
    parts: str = "synthetic",
    data_root: str | None = None,
    output_dir: str | PathLike | None = None,
    centroids: Sequence[int] | None = None,
    max_shapes: int | None = None,
    headless: bool = False,
    width: int = 960,
    height: int = 480,
    point_size: float = 6.0,
    allow_pickle: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """The paper's Fig. 4 for a trained ModelNet classifier: part agreement over a split and a picture per shape.

    Reads the part-labelled shapes of ``parts`` (:func:`part_dataset`) at the run's point count, measures
    :func:`split_agreement` over the split and, per chosen shape, writes ``<output_dir>/<split>_<index>.ply``
    (:func:`neighbourhood_view`) and, without a display or with ``headless``, ``<split>_<index>.png`` with a legend:
    each shown centroid's part and how many of its K neighbours share it, in feature space and in xyz. The split's
    numbers go to ``<output_dir>/agreement.json``. The model comes from the checkpoint (its recorded name and
    keywords); ``data_root`` only says where ShapeNet Part lies.

    Args:
        indices: shapes by index in the split; ``shapes``: by name (``chair_0003``; ShapeNet Part ``<synset>/<id>``).
            Neither: the first shape.
        centroids: which of the second centroid block's centroids to show (None: the first four, which FPS spreads
            over the shape).
        max_shapes: measure the agreement on the first ``max_shapes`` shapes only (None: the whole split).

    Returns:
        ``agreement`` (:func:`split_agreement`), ``shapes`` (per shown shape: ``index``, ``name``, ``category``,
        its own ``feature`` / ``xyz`` / ``random`` fractions, ``ply`` and ``png`` when rendered) and ``json``.

    Raises:
        UsageError: the checkpoint holds no config or no centroid transformer, or a shape is not in the split.
    """
    checkpoint = Path(checkpoint)
    model, cfg = _load_classifier(checkpoint, allow_pickle)
    dataset = part_dataset(parts, split, cfg.num_points, data_root, cfg.seed)
    chosen = choose_shapes(dataset.names, indices, shapes, split, default=1)
    agreement = split_agreement(model, dataset, max_shapes=max_shapes, seed=cfg.seed, progress=progress)
    _logger.info(
        "same part over %d %s shapes (K = %d): feature space %.3f, xyz %.3f, random %.3f",
        agreement["shapes"],
        split,
        agreement["num_neighbors"],
        agreement["feature"],
        agreement["xyz"],
        agreement["random"],
    )
    out_dir = Path(output_dir) if output_dir is not None else checkpoint.parent / "neighbourhoods"
    interactive = has_display(headless)
    names = dataset.part_names
    rows = []
    for index in chosen:
        points, labels = _shape(dataset, index, model.in_channels > 3)
        nbrs = centroid_neighbourhoods(model, torch.from_numpy(points)[None])
        M, K = nbrs.feature.shape[1:]
        shown = list(range(min(4, M))) if centroids is None else list(centroids)
        xyz, rgb = neighbourhood_view(points, nbrs, shown, labels, len(names), dataset.up_axis)
        own = part_agreement(nbrs, torch.from_numpy(labels)[None], seed=cfg.seed + index)
        stem, name = f"{split}_{index}", dataset.names[index]
        row = {"index": index, "name": name, "category": dataset.category_names[dataset.categories[index]], **own,
               "ply": str(write_ply(out_dir / f"{stem}.ply", xyz, rgb))}  # fmt: skip
        score = f"feature {own['feature']:.2f}, xyz {own['xyz']:.2f}, random {own['random']:.2f}"
        title = f"{name}: the K = {K} nearest in feature space (left) | in xyz (right)\non the centroid's part: {score}"
        if interactive:
            show(xyz, rgb, title=title.replace("\n", "; "), point_size=point_size)
        else:
            legend = _legend(nbrs, shown, labels, names)
            row["png"] = str(render_png(out_dir / f"{stem}.png", xyz, rgb, width, height, dataset.up_axis, point_size,
                                        legend, title))  # fmt: skip
        _logger.info("%s (%s): same part: feature %.2f, xyz %.2f, random %.2f -> %s", stem, name, own["feature"],
                     own["xyz"], own["random"], row.get("png", row["ply"]))  # fmt: skip
        rows.append(row)
    report = {"checkpoint": str(checkpoint), "parts": parts, "split": split, "agreement": agreement, "shapes": rows}
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "agreement.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    return {**report, "json": str(path)}


def _legend(nbrs: Neighbourhoods, shown: Sequence[int], labels: np.ndarray, names: Sequence[str]) -> list:
    """Per shown centroid its colour, its point's part and how many of its K neighbours share it in feature space and
    in xyz (``c0, chair back: 16 | 11``); then the pale parts and the marker."""
    entries = []
    for j, m in enumerate(shown):
        own = labels[int(nbrs.centre[0, m])]
        same = [int((labels[found[0, m].numpy()] == own).sum()) for found in (nbrs.feature, nbrs.xyz)]
        text = f"c{m}, {names[own]}: {same[0]} | {same[1]}"
        entries.append((tuple(float(c) for c in palette(len(shown))[j]), text))
    colours = 0.35 * palette(len(names)) + 0.65
    entries += [(tuple(float(c) for c in colours[p]), names[p]) for p in sorted(set(labels.tolist()))]
    return [*entries, ((0.0, 0.0, 0.0), "a centroid's point")]
