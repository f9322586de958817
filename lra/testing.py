"""Helpers shared by the LRA tests (like ``torch_geometric.testing``, a module of the package). Nothing in the library
imports this module."""

from __future__ import annotations

__all__ = ["TINY_LISTOPS_SETS"]

# 64 + 32 expressions of at most 24 tokens (depth 3) and a width-16 classifier: the ``--set`` values of the ListOps
# tests.
TINY_LISTOPS_SETS = (
    "train_size=64",
    "test_size=32",
    "max_length=24",
    "seq_len=24",
    "max_depth=3",
    "width=16",
    "batch_size=16",
)
