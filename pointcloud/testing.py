"""Helpers shared by the point-cloud tests (like ``torch_geometric.testing``, a module of the package). Nothing in the
library imports this module."""

from __future__ import annotations

__all__ = ["TINY_MODELNET_SETS"]

# A 32-point centroid transformer (16 then 8 centroids, K = 4) on 4 synthetic classes x 4 shapes: the ``--set``
# values of the train_modelnet tests. Peer models take the same items without num_centroids and fuse_dim.
TINY_MODELNET_SETS = (
    "num_points=32",
    "num_centroids=[16,8]",
    "num_neighbors=4",
    "fuse_dim=32",
    "synthetic_classes=4",
    "synthetic_train_per_class=4",
    "synthetic_test_per_class=2",
    "batch_size=8",
    "eval_batch_size=8",
)
