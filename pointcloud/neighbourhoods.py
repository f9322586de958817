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
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attention import gather, knn

from .model import CentroidTransformer

__all__ = ["Neighbourhoods", "centroid_neighbourhoods", "part_agreement"]


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
