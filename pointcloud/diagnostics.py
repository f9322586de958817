"""What a centroid transformer's blocks do, measured: per-block gradient norms, attention entropy, the size of the
centroid step's update against its skip, where the attended neighbours lie in xyz, and how well they follow parts.

These are the measurements that compare a model with centroid attention (T >= 1) against its downsampling-only twin
(T = 0), block by block (``tools/diagnose_modelnet.py``):

* **gradient norm** of each block's parameters (and of the embedding, the fusion layer and the head), averaged over
  training batches, in train mode, with the recipe's loss: which parts of the network learn.
* **attention entropy** of every attention layer's first step, divided by log K (1: uniform over the K neighbours;
  0: one neighbour takes all the weight), averaged over heads, queries and clouds; the mean largest weight; the rank
  of the most attended neighbour among the K, nearest first, divided by K - 1 (0: the nearest, 1: the farthest, in
  the space the neighbours were searched in); and for a centroid block that samples its centroids (FPS, random), the
  weight a centroid gives its own input point.
* **update / skip**: ``|u^1 - u^0| / |u^0|`` per centroid, the centroid step's update against the initial centroid it
  is added to (LayerScale included).
* **neighbour distance**: the mean xyz distance from a centroid to the K inputs it attends to, divided by the mean
  distance to its K nearest inputs in xyz (1: the attention reads a local neighbourhood; larger: it reaches across
  the shape), and the same weighted by the attention weights.
* **same-part rate** of the second centroid block's neighbours on part-labelled shapes
  (:func:`pointcloud.neighbourhoods.split_agreement`).

Every measure is read with forward hooks and the layers' own projections
(:meth:`attention.CentroidAttention.attention_weights`): the model is not changed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from os import PathLike
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention import CentroidAttention, CentroidBlock, gather, knn

from .model import CentroidTransformer

__all__ = ["attention_statistics", "diagnose_checkpoint", "gradient_norms"]


def _parts(model: CentroidTransformer) -> dict[str, nn.Module]:
    """The model's parts in forward order, by a short name (``SA1``, ``CA1``, ``SA2``, ``CA2``, ...)."""
    parts: dict[str, nn.Module] = {"embed": model.embedding}
    counts = {"SA": 0, "CA": 0}
    for transition, block in zip(model.transitions, model.blocks):
        kind = "CA" if isinstance(block, CentroidBlock) else "SA"
        counts[kind] += 1
        parts[f"{kind}{counts[kind]}"] = nn.ModuleList([transition, block])
    parts["fuse"] = model.fuse
    parts["head"] = nn.ModuleList([model.head_hidden, model.head])
    return parts


def gradient_norms(
    model: CentroidTransformer, batches: Iterable[tuple[Tensor, Tensor]], loss_fn: Callable[[Tensor, Tensor], Tensor]
) -> dict[str, float]:
    """The L2 norm of the loss gradient of each part's parameters (:func:`_parts`), averaged over ``batches``
    (points, labels), in train mode. The model's ``.grad`` fields are left as they were."""
    parts = _parts(model)
    saved = [p.grad for p in model.parameters()]
    was_training = model.training
    model.train()
    sums = dict.fromkeys(parts, 0.0)
    count = 0
    try:
        for points, labels in batches:
            model.zero_grad(set_to_none=True)
            loss_fn(model(points), labels).backward()
            for name, part in parts.items():
                grads = [p.grad.detach().flatten() for p in part.parameters() if p.grad is not None]
                sums[name] += float(torch.cat(grads).norm()) if grads else 0.0
            count += 1
    finally:
        model.train(was_training)
        for p, g in zip(model.parameters(), saved):
            p.grad = g
    if count == 0:
        raise ValueError("gradient_norms needs at least one batch")
    return {name: total / count for name, total in sums.items()}


@torch.no_grad()
def attention_statistics(model: CentroidTransformer, points: Tensor) -> dict[str, dict[str, float]]:
    """Per attention block (``SA1``, ``CA1``, ``SA2``, ``CA2``), in eval mode on ``(B, N, C)`` clouds: the first
    step's normalized attention entropy, and for the centroid blocks the update / skip ratio and the attended
    neighbours' xyz distance against the K nearest in xyz (plain and attention-weighted). A centroid block without an
    attention step (the twins) reports nothing but ``"attention": 0``."""
    names = [n for n in _parts(model) if n[:2] in ("SA", "CA")]
    seen: dict[str, tuple] = {}
    handles = []
    outputs: dict[str, Any] = {}
    for name, block in zip(names, model.blocks):
        attn = getattr(block, "attn", None)
        if isinstance(attn, CentroidAttention):
            handles.append(attn.register_forward_hook(_keep(seen, name), with_kwargs=True))
        if isinstance(block, CentroidBlock):
            handles.append(block.register_forward_hook(_keep_output(outputs, name)))
    was_training = model.training
    model.eval()
    try:
        model(points)
    finally:
        model.train(was_training)
        for h in handles:
            h.remove()
    out: dict[str, dict[str, float]] = {}
    for name, block in zip(names, model.blocks):
        if name not in seen:
            out[name] = {"attention": 0}
            continue
        layer, args, kwargs, result = seen[name]
        x, u = args[:2]
        pos, upos = kwargs.get("pos"), kwargs.get("centroid_pos")
        attn, idx = layer.attention_weights(x, u, kwargs.get("mask"), kwargs.get("neighbor_idx"), pos, upos)
        K = attn.shape[-1]
        entropy = -(attn * attn.clamp_min(1e-30).log()).sum(-1)  # (B, H, M)
        stats = {"attention": 1, "entropy": float(entropy.mean()) / math.log(K) if K > 1 else 0.0,
                 "max_weight": float(attn.amax(-1).mean())}  # fmt: skip
        if idx is not None and K > 1:  # neighbours come nearest first (in the space they were searched in)
            stats["top_rank"] = float(attn.argmax(-1).float().mean()) / (K - 1)
        if isinstance(block, CentroidBlock):
            stats["update_ratio"] = float(((result - u).norm(dim=-1) / u.norm(dim=-1).clamp_min(1e-12)).mean())
            index = outputs[name].index  # (B, M): the input each centroid was sampled from (None: an average)
            if idx is not None and index is not None:
                own = (idx == index.unsqueeze(-1)).to(attn.dtype)  # (B, M, K)
                stats["self_weight"] = float((attn * own.unsqueeze(1)).sum(-1).mean())
            if idx is not None and pos is not None and upos is not None:
                d = (gather(pos, idx) - upos.unsqueeze(2)).norm(dim=-1)  # (B, M, K) to the attended inputs
                d_knn = knn(upos, pos, K)[0].clamp_min(0).sqrt()  # (B, M, K) to the K nearest in xyz
                stats["nbr_dist"] = float(d.mean())
                stats["knn_dist"] = float(d_knn.mean())
                stats["nbr_dist_ratio"] = float(d.mean() / d_knn.mean().clamp_min(1e-12))
                stats["weighted_dist_ratio"] = float((attn.mean(1) * d).sum(-1).mean() / d_knn.mean().clamp_min(1e-12))
        out[name] = stats
    return out


def _keep_output(outputs: dict[str, Any], name: str):
    def hook(module: nn.Module, args: tuple, output: Any) -> None:  # returns None: the output stays as it is
        outputs.setdefault(name, output)

    return hook


def _keep(seen: dict[str, tuple], name: str):
    def hook(module: nn.Module, args: tuple, kwargs: dict[str, Any], output: Tensor) -> None:
        if isinstance(module, CentroidAttention):
            seen.setdefault(name, (module, args, kwargs, output))  # the block's call (one per forward)

    return hook


def _batches(dataset, batch_size: int, count: int, seed: int) -> list[tuple[Tensor, Tensor]]:
    torch.manual_seed(seed)  # the augmentation draws from the global generator: the same batches every call
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed)
    )
    out = []
    for points, labels in loader:
        out.append((points, labels))
        if len(out) == count:
            break
    return out


def diagnose_checkpoint(
    checkpoint: str | PathLike,
    batches: int = 4,
    batch_size: int = 32,
    parts: str | None = "synthetic",
    max_shapes: int | None = 40,
    initial: bool = False,
    allow_pickle: bool = False,
) -> dict[str, Any]:
    """Every measure of this module for a ``tools/train_modelnet.py`` checkpoint, on its own run's data.

    Args:
        checkpoint: a checkpoint of a centroid transformer (with or without attention steps).
        batches: training batches (augmented, as in training) for the gradient norms; the first test batches of
            ``batch_size`` clouds give the attention statistics.
        batch_size: clouds per batch.
        parts: part-labelled shapes for the same-part rate of the second centroid block (:data:`PART_SOURCES`; None:
            skip; skipped too for a model whose second centroid block has no attention step or averages points).
        max_shapes: part shapes to measure (None: the whole test split).
        initial: measure the same model at a fresh initialization (seeded by the run's seed) instead of the trained
            weights: what the first steps of training start from.
        allow_pickle: read a checkpoint that is not weights-only (trusted files only).

    Returns:
        ``{"checkpoint", "model", "weights", "gradient_norms", "attention", "part_agreement"}``.
    """
    from .neighbourhoods import _load_classifier, part_dataset, split_agreement
    from .recipe import build_datasets

    model, cfg = _load_classifier(Path(checkpoint), allow_pickle)
    if initial:
        torch.manual_seed(cfg.seed)
        for module in model.modules():
            if module is not model and hasattr(module, "reset_parameters"):
                module.reset_parameters()
    train_set, test_set = build_datasets(cfg)
    smoothing = cfg.label_smoothing

    def loss_fn(logits: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(logits.float(), labels, label_smoothing=smoothing)

    grads = gradient_norms(model, _batches(train_set, batch_size, batches, cfg.seed), loss_fn)
    points = _batches(test_set, batch_size, 1, cfg.seed)[0][0]
    stats = attention_statistics(model, points)
    agreement = None
    ca2 = model.blocks[3]
    if parts is not None and getattr(ca2, "attn", None) is not None and ca2.attn.num_neighbors is not None:
        dataset = part_dataset(parts, "test", cfg.num_points, seed=0)
        agreement = split_agreement(model, dataset, max_shapes=max_shapes)
        agreement.pop("by_category", None)
    return {"checkpoint": str(checkpoint), "model": cfg.model, "weights": "initial" if initial else "trained",
            "gradient_norms": grads, "attention": stats, "part_agreement": agreement}  # fmt: skip
