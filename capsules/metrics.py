"""Part purity: how well the latent capsules' patches follow the ground-truth parts.

The paper shows part decompositions only in pictures (each capsule's patch in its own colour on planes, tables and
cars). Part purity puts a number on them. For one shape and one latent capsule m:

    purity_m = (number of m's decoded points whose nearest input point carries m's majority part label)
               / (number of m's decoded points)

where the majority label is the most frequent label among those nearest input points. The score of a model is the
mean of purity_m over capsules and shapes. 1.0 means every capsule reconstructs a single part; a capsule whose
points spread evenly over k parts scores 1 / k. Capsules whose points have no labelled nearest input (label < 0,
e.g. Core13) are left out; a batch with no labels at all gives NaN.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attention import knn
from attention.checks import check_points

__all__ = ["capsule_purity", "part_purity", "random_patches"]


@torch.no_grad()
def capsule_purity(
    recon: Tensor, point_capsule: Tensor, points: Tensor, parts: Tensor, num_capsules: int | None = None
) -> Tensor:
    """Purity of every latent capsule of every shape (NaN where a capsule has no labelled point).

    Args:
        recon: decoded points.
        point_capsule: the latent capsule of each decoded point (``PointCapsNet.point_capsule``).
        points: input points.
        parts: part label of each input point (``< 0``: unlabelled).
        num_capsules: M; default ``point_capsule.max() + 1``.

    Shapes:
        recon: ``(B, R, 3)``; point_capsule: ``(R,)``; points: ``(B, N, 3)``; parts: ``(B, N)``; output: ``(B, M)``.
    """
    check_points(recon, "recon", channels=3)
    check_points(points, "points", channels=3, like=recon, like_name="recon")
    B, R, _ = recon.shape
    if point_capsule.shape != (R,):
        raise ValueError(
            f"point_capsule must be ({R},), one capsule per decoded point, got {tuple(point_capsule.shape)}"
        )
    if parts.shape != points.shape[:2]:
        raise ValueError(f"parts must be (B, N) = {tuple(points.shape[:2])}, got {tuple(parts.shape)}")
    M = int(point_capsule.max()) + 1 if num_capsules is None else num_capsules
    _, idx = knn(recon.float(), points.float(), 1)  # (B, R, 1): nearest input point of each decoded point
    labels = torch.gather(parts.long(), 1, idx[..., 0])  # (B, R)
    valid = labels >= 0
    L = max(int(labels.max()) + 1, 1)
    cap = point_capsule.to(labels.device).long()[None].expand(B, R)
    flat = cap * L + labels.clamp_min(0)  # (B, R): (capsule, label) bin
    counts = torch.zeros(B, M * L, device=labels.device).scatter_add_(1, flat, valid.float()).view(B, M, L)
    total = counts.sum(-1)
    return torch.where(total > 0, counts.amax(-1) / total.clamp_min(1), torch.full_like(total, float("nan")))


def random_patches(point_capsule: Tensor, seed: int = 0) -> Tensor:
    """The chance level's capsule ids: ``point_capsule`` under a fixed random permutation of the decoded points.

    Scoring a reconstruction with these ids cuts it into random patches of the same sizes as the capsules' patches:
    the purity a decomposition that ignores the parts would reach (``part_purity_chance``).
    """
    perm = torch.randperm(len(point_capsule), generator=torch.Generator().manual_seed(seed))
    return point_capsule[perm.to(point_capsule.device)]


def part_purity(recon: Tensor, point_capsule: Tensor, points: Tensor, parts: Tensor) -> float:
    """Mean of :func:`capsule_purity` over capsules and shapes (NaN entries left out; NaN if all are)."""
    purity = capsule_purity(recon, point_capsule, points, parts)
    keep = ~torch.isnan(purity)
    return float(purity[keep].mean()) if bool(keep.any()) else math.nan
