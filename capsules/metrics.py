"""Part purity: how well the latent capsules' patches follow the ground-truth parts.

The paper shows part decompositions only in pictures (each capsule's patch in its own colour on planes, tables and
cars). Part purity puts a number on them. For one shape and one latent capsule m:

    purity_m = (number of m's decoded points whose nearest input point carries m's majority part label)
               / (number of m's decoded points)

where the majority label is the most frequent label among those nearest input points. The score of a model is the
mean of purity_m over capsules and shapes. 1.0 means every capsule reconstructs a single part; a capsule whose
points spread evenly over k parts scores 1 / k. Capsules whose points have no labelled nearest input (label < 0,
e.g. Core13) are left out; a batch with no labels at all gives NaN here, and the training run's logs and metrics
say :data:`NO_PART_LABELS` instead.

Patch spread (:func:`patch_spread`) needs no labels: how far a capsule's points lie from their own mean, relative to
how far the shape's points lie from theirs. About 1 means each capsule's points are scattered over the whole shape
(the speckle); a patch covering a part scores well below 1.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from attention import knn
from attention.checks import check_points

__all__ = ["NO_PART_LABELS", "capsule_parts", "capsule_purity", "part_purity", "patch_spread", "random_patches"]

NO_PART_LABELS = "no part labels"
"""What the run logs and metrics (and the viewer's rows) hold for part purity on data without part labels (ModelNet,
Core13, a cloud folder), instead of a NaN that reads like a failed computation."""


def _label_counts(
    recon: Tensor, point_capsule: Tensor, points: Tensor, parts: Tensor, num_capsules: int | None
) -> Tensor:
    """``(B, M, L)``: how many of capsule m's decoded points have a nearest input point of part label l."""
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
    return torch.zeros(B, M * L, device=labels.device).scatter_add_(1, flat, valid.float()).view(B, M, L)


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
    return capsule_parts(recon, point_capsule, points, parts, num_capsules)[1]


@torch.no_grad()
def capsule_parts(
    recon: Tensor, point_capsule: Tensor, points: Tensor, parts: Tensor, num_capsules: int | None = None
) -> tuple[Tensor, Tensor]:
    """Each capsule's majority part label (``-1`` where it has no labelled point) and its purity (NaN there).

    Arguments as :func:`capsule_purity`. Shapes: both outputs ``(B, M)``.
    """
    counts = _label_counts(recon, point_capsule, points, parts, num_capsules)  # (B, M, L)
    total = counts.sum(-1)
    top, label = counts.max(-1)
    purity = torch.where(total > 0, top / total.clamp_min(1), torch.full_like(total, float("nan")))
    return torch.where(total > 0, label, torch.full_like(label, -1)), purity


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


@torch.no_grad()
def patch_spread(recon: Tensor, point_capsule: Tensor) -> float:
    """Mean distance of a capsule's decoded points to their mean over that of all decoded points to theirs.

    Averaged over capsules (with at least one point), then over shapes. Shapes: recon ``(B, R, 3)``, point_capsule
    ``(R,)``.
    """
    check_points(recon, "recon", channels=3)
    if point_capsule.shape != recon.shape[1:2]:
        raise ValueError(f"point_capsule must be ({recon.shape[1]},), got {tuple(point_capsule.shape)}")
    recon = recon.float()
    whole = (recon - recon.mean(1, keepdim=True)).norm(dim=-1).mean(1)  # (B,)
    per_capsule = []
    for m in point_capsule.unique():
        q = recon[:, point_capsule.to(recon.device) == m]  # (B, R_m, 3)
        per_capsule.append((q - q.mean(1, keepdim=True)).norm(dim=-1).mean(1))  # (B,)
    return float((torch.stack(per_capsule, 1).mean(1) / whole.clamp_min(1e-12)).mean())
