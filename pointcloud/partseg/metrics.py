"""ShapeNet Part's evaluation protocol: predictions restricted to the category's parts, per-shape IoU, instance and
class mIoU.

As PointNet++, DGCNN, Point Transformer and PointNeXt evaluate it (PointNet's ``test_segmentation.py``):

* a point's prediction is the arg-max over the parts of the shape's category only (the category is known);
* a shape's IoU is the mean, over the parts of its category, of ``|pred = p and label = p| / |pred = p or label = p|``,
  where a part absent from both the prediction and the label counts as IoU 1;
* **instance mIoU** is the mean of the shape IoUs over all test shapes, **class mIoU** the mean over categories of
  the mean shape IoU of each category's shapes (categories without a test shape left out).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

__all__ = ["PartSegMeter", "category_part_mask", "restricted_argmax", "shape_ious"]


def category_part_mask(part_classes: Sequence[Sequence[int]], num_parts: int | None = None) -> Tensor:
    """``(num_categories, num_parts)`` bool: which global part labels belong to each category."""
    num_parts = num_parts if num_parts is not None else 1 + max((max(c) for c in part_classes if c), default=-1)
    mask = torch.zeros(len(part_classes), num_parts, dtype=torch.bool)
    for c, labels in enumerate(part_classes):
        mask[c, list(labels)] = True
    return mask


def restricted_argmax(logits: Tensor, category: Tensor, mask: Tensor) -> Tensor:
    """Per-point arg-max of ``logits`` over the parts of each shape's category.

    Shapes:
        logits: ``(B, N, P)``; category: ``(B,)``; mask: ``(num_categories, P)`` from :func:`category_part_mask`;
        output ``(B, N)`` int64 global part labels.
    """
    allowed = mask.to(logits.device)[category]  # (B, P)
    return logits.masked_fill(~allowed[:, None, :], float("-inf")).argmax(-1)


def shape_ious(pred: Tensor, labels: Tensor, category: Tensor, mask: Tensor) -> Tensor:
    """The IoU of every shape, averaged over the parts of its category (a part in neither counts as 1).

    Shapes:
        pred, labels: ``(B, N)`` global part labels; category: ``(B,)``; mask: ``(num_categories, P)``;
        output ``(B,)`` float64.
    """
    if pred.shape != labels.shape or pred.dim() != 2 or category.shape != pred.shape[:1]:
        raise ValueError(
            f"pred and labels must be (B, N) and category (B,), got {tuple(pred.shape)}, {tuple(labels.shape)} and "
            f"{tuple(category.shape)}"
        )
    P = mask.shape[1]
    parts = torch.arange(P, device=pred.device)
    p = pred[..., None] == parts  # (B, N, P)
    g = labels[..., None] == parts  # (B, N, P)
    inter = (p & g).sum(1).double()  # (B, P)
    union = (p | g).sum(1).double()  # (B, P)
    iou = torch.where(union > 0, inter / union.clamp_min(1), torch.ones_like(union))
    own = mask.to(pred.device)[category].double()  # (B, P): the category's parts
    return (iou * own).sum(-1) / own.sum(-1)


class PartSegMeter:
    """Collects shape IoUs batch by batch and reports instance and class mIoU (in %).

    Args:
        part_classes: Category index -> its global part labels.
        category_names: Names for :meth:`class_ious` (default ``"0"``, ``"1"``, ...).
    """

    def __init__(self, part_classes: Sequence[Sequence[int]], category_names: Sequence[str] | None = None) -> None:
        self.mask = category_part_mask(part_classes)
        self.category_names = list(category_names) if category_names is not None else None
        self.ious: list[Tensor] = []
        self.cats: list[Tensor] = []

    def update(self, logits: Tensor, labels: Tensor, category: Tensor) -> Tensor:
        """Adds a batch of ``(B, N, P)`` logits; returns its ``(B, N)`` restricted predictions."""
        pred = restricted_argmax(logits, category, self.mask)
        self.ious.append(shape_ious(pred, labels, category, self.mask).cpu())
        self.cats.append(category.cpu())
        return pred

    def class_ious(self) -> dict[str, float]:
        """Mean shape IoU (%) of each category that has a shape, by name."""
        ious, cats = torch.cat(self.ious), torch.cat(self.cats)
        names = self.category_names or [str(c) for c in range(self.mask.shape[0])]
        return {names[c]: 100.0 * float(ious[cats == c].mean()) for c in sorted(set(cats.tolist()))}

    def compute(self) -> dict[str, float]:
        """``instance_miou`` (mean over shapes) and ``class_miou`` (mean over categories), in %."""
        if not self.ious:
            return {"instance_miou": float("nan"), "class_miou": float("nan")}
        per_class = self.class_ious()
        return {
            "instance_miou": 100.0 * float(torch.cat(self.ious).mean()),
            "class_miou": sum(per_class.values()) / len(per_class),
        }
