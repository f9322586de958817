"""Chunk budgets: how many bytes of scratch one chunk of a memory-bounded op may hold, per op and device.

Every op that would otherwise build a large temporary (the KNN search's distance matrix, the KNN attention's gathered
keys, FSAT's gathered edge blocks, the Cauchy / Vandermonde mixers' matrix rows, Chamfer's distance tiles) walks its
rows in chunks whose scratch fits a byte budget. The defaults live in one table, :data:`CHUNK_BUDGETS`, read when
an op runs (so a bench or a test may set an entry); each op's ``chunk_bytes`` (or ``chunk``) argument overrides it
per call.

On CUDA the KNN budgets are larger: there a chunk costs its kernel launches (microseconds each), not its bytes, so
fewer, larger chunks make a faster step (``tools/bench_modelnet.py`` counts the ops of a step, ``--chunk-mb`` times
other budgets).
"""

from __future__ import annotations

import torch

__all__ = ["CHUNK_BUDGETS", "chunk_budget", "chunk_rows"]

_MiB = 2**20

# op -> device type -> bytes of one chunk; "default" covers the device types not listed.
CHUNK_BUDGETS: dict[str, dict[str, int]] = {
    # attention.knn (and knn_chunked): one chunk of the brute-force (B, rows, N) distance matrix
    "knn": {"default": 32 * _MiB, "cuda": 256 * _MiB},
    # attention.centroid.knn_centroid_attention: the gathered keys (or values) of one chunk of centroids; the backward
    # pass adds their per-edge gradients as a chunk-sized float32 temporary (twice the budget for bf16 inputs)
    "knn_attention": {"default": 16 * _MiB, "cuda": 256 * _MiB},
    # attention.mixers.fsat.sparse_edge_attention (gather backend): the gathered (rows, E, D) blocks
    "fsat_edges": {"default": 16 * _MiB},
    # attention.mixers.cauchy_mix (chunked path): the (B, H, rows, L, d_group + 2) scratch of one chunk of rows. On
    # CPU a chunk that stays in cache is 3-4x faster than 64 MiB (python tools/bench_mixers.py --mixers cauchy)
    "cauchy_mix": {"default": 8 * _MiB, "cuda": 64 * _MiB},
    # attention.mixers.vandermonde_mix (chunked path): the cosine sums of one chunk of rows and their scratch
    "vandermonde_mix": {"default": 64 * _MiB},
    # capsules.chamfer_distance ("chunked", "knn_torch"): one tile of the distance matrix
    "chamfer": {"default": 32 * _MiB},
}


def chunk_budget(op: str, device: torch.device | str) -> int:
    """The default chunk budget of ``op`` on ``device``, in bytes (read from :data:`CHUNK_BUDGETS` when called)."""
    if op not in CHUNK_BUDGETS:
        raise ValueError(f"unknown op {op!r}; choose one of {sorted(CHUNK_BUDGETS)}")
    per_device = CHUNK_BUDGETS[op]
    return per_device.get(torch.device(device).type, per_device["default"])


def chunk_rows(num_rows: int, row_bytes: int, budget: int) -> int:
    """Rows per chunk: as many rows of ``row_bytes`` as fit ``budget`` (at least one), spread evenly over the chunks
    so that the last chunk is not a small remainder."""
    if num_rows < 1:
        return 1
    rows = max(1, min(num_rows, budget // max(1, row_bytes)))
    chunks = -(-num_rows // rows)
    return -(-num_rows // chunks)
