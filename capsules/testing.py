"""Helpers shared by the capsule tests (like ``torch_geometric.testing``, a module of the package). Nothing in the
library imports this module."""

from __future__ import annotations

__all__ = ["TINY_CAPSULES_SETS"]

# 32-point clouds of two synthetic part shapes, 4 + 2 of each: the ``--set`` values of the train_capsules tests.
TINY_CAPSULES_SETS = (
    "num_points=32",
    "synthetic_classes=[table,airplane]",
    "synthetic_train_per_class=4",
    "synthetic_test_per_class=2",
    "batch_size=4",
    "eval_batch_size=8",
)
