"""The k-nearest-neighbour search of :func:`attention.knn` as a tiled Triton kernel with a running top-k per query:
the ``(B, M, N)`` distance matrix is never built, not even a chunk of it in memory.

A program owns ``BLOCK_M`` queries of one batch element and walks the N reference points in tiles of ``BLOCK_K``
columns (``BLOCK_K`` list slots, at least 16). For each tile it computes the squared distances and merges the tile
into the sorted list of the ``BLOCK_K`` nearest points so far, all in registers::

    key   = (float32 bits of d) << 32 | n       (d >= 0, so the bits order like the distances; ties by lower index)
    best  = bitonic_merge(min(best, sort_descending(tile)))

The elementwise minimum of an ascending and a descending list holds the ``BLOCK_K`` smallest keys of both (the first
half-cleaner of a bitonic merge) in a sequence that rises then falls, which the rest of a bitonic merge (log2 BLOCK_K
compare-and-swap steps, a third of a sort's at 32 slots) puts in order: one sort and one merge per tile keep the list
exact, and a tile none of whose keys beats any query's current last entry is skipped. Masked reference points get
``d = inf`` and the columns past N a key above every distance, so a query whose cloud has fewer than k real points
gets ``inf`` in its last slots with indices of padded points, as the reference (:func:`attention.knn`,
``backend="torch"``) returns them.

The distances of a tile come in one of two forms, the choice of :func:`_blocks`:

* **exact** (coordinates and other narrow points, C < 16, and the k whose spare candidates would need a longer list,
  e.g. 16, 32, 64): ``sum_c (q_c - r_c)^2`` in float32 (channels in chunks of ``BLOCK_C``, square then add without
  fused multiply-adds, as the reference's final distances are computed), on CUDA cores;
* **expanded** (features, C >= 16, e.g. k = 24): the reference's own two steps (:func:`attention.points.knn_chunked`).
  Candidates come from ``max(|q|^2 + |r|^2 - 2 q.r, 0)`` with both sets centred on the reference cloud's mean, the
  product ``q.r`` a ``tl.dot`` on tensor cores (``"tf32x3"``: three TF32 products, about float32's precision); the
  list's ``BLOCK_K`` slots hold at least the reference's spare candidates (``k + max(4, k // 4)``,
  :func:`attention.points.knn_spare_candidates`), whose distances are then computed exactly as ``sum_c (q_c - r_c)^2``
  on the inputs and re-sorted. The products spend C multiply-adds a pair on tensor cores where the exact form spends
  them on CUDA cores in a 3-d tile.

The exact form's neighbour sets equal the reference's up to the order of exactly equal distances (their float32 sums
over channels may round differently in the last bit, so near-ties too may resolve differently). The expanded form is
exact up to the expansion's rounding, about 1e-7 of ``|q - centre|^2 + |r - centre|^2``, as the reference is: where
that exceeds the gap between the k-th neighbour and the last spare candidate, both may miss a neighbour (this search
keeps at least as many candidates).

Where the query blocks alone give fewer programs than a GPU keeps busy (a single cloud of a few hundred queries, or
a batch of small clouds: :func:`auto_splits`), the N reference points are split into S parts: program
``(block, b, s)`` keeps the list of its part's nearest points, and a second kernel merges the S sorted lists of each
query the same way, tile by tile. The keys carry the indices, so in the exact form the merged list is the one a single
program would have kept, ties included; in the expanded form each part keeps its own spare candidates, a superset of
those one program would rescore.

Limits (:mod:`attention.kernels.limits`): k <= 64. Tests: ``tests/attention/test_knn_triton.py`` (under Triton's
interpreter on CPU against the reference, compiled on CUDA, and an ahead-of-time compile for sm_90).
"""

from __future__ import annotations

import contextlib
import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from ..points import cloud_centres, knn_spare_candidates
from ._triton_compat import loop_bound
from .limits import KNN_TRITON_MAX_NEIGHBORS as MAX_NEIGHBORS

__all__ = ["MAX_NEIGHBORS", "auto_splits", "knn_triton"]

# a key above every real one: the float32 bits of a NaN above +inf's 0x7f800000, and the largest index
_PAST_END: tl.constexpr = tl.constexpr(0x7FFFFFFF_FFFFFFFF)
_LOW32: tl.constexpr = tl.constexpr(0xFFFFFFFF)


@triton.jit
def _merge(best, key):
    """``best`` with the ``(BLOCK_M, BLOCK_K)`` candidate keys merged in, sorted; unchanged where no query's list can
    change (no key below its current last, largest, entry)."""
    if tl.sum((tl.min(key, axis=1) < tl.max(best, axis=1)).to(tl.int32), axis=0) > 0:
        # the minimum of an ascending and a descending list rises then falls: a bitonic merge sorts it
        best = tl.bitonic_merge(tl.minimum(best, tl.sort(key, dim=1, descending=True)), dim=1)
    return best


@triton.jit
def _store(best, dist_ptr, idx_ptr, b, offs_m, offs_t, in_m, M, k):
    """The first k slots of each query's sorted list as squared distances and indices, ``(B, M, k)``."""
    dist = (best >> 32).to(tl.int32).to(tl.float32, bitcast=True)
    idx = best & _LOW32
    out = (b * M + offs_m[:, None]) * k + offs_t[None, :]
    keep = in_m[:, None] & (offs_t[None, :] < k)
    tl.store(dist_ptr + out, dist, mask=keep)
    tl.store(idx_ptr + out, idx, mask=keep)


@triton.jit
def _rows(base, offs, in_rows, c0, offs_c, C):
    """Channels ``c0 + offs_c`` of the rows ``offs`` of a ``(rows, C)`` block, zero past C and for rows not
    ``in_rows`` (int64 offsets: N C may pass 2^31 in a large cloud)."""
    in_c = c0 + offs_c < C
    return tl.load(base + offs[:, None].to(tl.int64) * C + (c0 + offs_c)[None, :],
                   mask=in_rows[:, None] & in_c[None, :], other=0.0)  # fmt: skip


@triton.jit
def _exact_tile(q_base, r_base, offs_m, offs_n, in_m, in_n, C, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                BLOCK_C: tl.constexpr):  # fmt: skip
    """``sum_c (q_c - r_c)^2`` of every query with every column of a tile, ``(BLOCK_M, BLOCK_K)`` float32."""
    offs_c = tl.arange(0, BLOCK_C)
    d = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    for c0 in range(0, loop_bound(C), BLOCK_C):
        qc = _rows(q_base, offs_m, in_m, c0, offs_c, C)
        rc = _rows(r_base, offs_n, in_n, c0, offs_c, C)
        diff = qc[:, None, :] - rc[None, :, :]  # (BLOCK_M, BLOCK_K, BLOCK_C)
        d += tl.sum(diff * diff, axis=2)
    return d


@triton.jit
def _expanded_tile(q_base, r_base, centre_base, q_sq, offs_m, offs_n, in_m, in_n, C, BLOCK_M: tl.constexpr,
                   BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    """``max(|q|^2 + |r|^2 - 2 q.r, 0)`` of the centred points, ``(BLOCK_M, BLOCK_K)``: the candidates' ranking
    (``q_sq``: the queries' centred squared norms)."""
    offs_c = tl.arange(0, BLOCK_C)
    qr = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    r_sq = tl.zeros([BLOCK_K], tl.float32)
    for c0 in range(0, loop_bound(C), BLOCK_C):
        in_c = c0 + offs_c < C
        centre = tl.load(centre_base + c0 + offs_c, mask=in_c, other=0.0)  # channels past C: 0 - 0
        qc = _rows(q_base, offs_m, in_m, c0, offs_c, C) - centre[None, :]
        rc = (
            tl.load(
                r_base + offs_n[None, :].to(tl.int64) * C + (c0 + offs_c)[:, None],
                mask=in_n[None, :] & in_c[:, None],
                other=0.0,
            )
            - centre[:, None]
        )  # (BLOCK_C, BLOCK_K)
        qr = tl.dot(qc, rc, qr, input_precision="tf32x3")
        r_sq += tl.sum(rc * rc, axis=0)
    return tl.maximum(q_sq[:, None] + r_sq[None, :] - 2.0 * qr, 0.0)


@triton.jit
def _centred_sq_norms(q_base, centre_base, offs_m, in_m, C, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """``|q - centre|^2`` of each query, ``(BLOCK_M,)``."""
    offs_c = tl.arange(0, BLOCK_C)
    q_sq = tl.zeros([BLOCK_M], tl.float32)
    for c0 in range(0, loop_bound(C), BLOCK_C):
        centre = tl.load(centre_base + c0 + offs_c, mask=c0 + offs_c < C, other=0.0)
        qc = _rows(q_base, offs_m, in_m, c0, offs_c, C) - centre[None, :]
        q_sq += tl.sum(qc * qc, axis=1)
    return q_sq


@triton.jit
def _rescore(best, q_base, r_base, mask_ptr, b, offs_m, in_m, N, C, HAS_MASK: tl.constexpr, BLOCK_M: tl.constexpr,
             BLOCK_K: tl.constexpr, BLOCK_C: tl.constexpr):  # fmt: skip
    """The list's candidates keyed by their exact ``sum_c (q_c - r_c)^2`` on the inputs (inf for masked points; empty
    slots stay last), sorted."""
    idx = best & _LOW32
    filled = best != _PAST_END
    offs_c = tl.arange(0, BLOCK_C)
    d = tl.zeros([BLOCK_M, BLOCK_K], tl.float32)
    for c0 in range(0, loop_bound(C), BLOCK_C):
        in_c = c0 + offs_c < C
        qc = _rows(q_base, offs_m, in_m, c0, offs_c, C)
        rc = tl.load(r_base + idx[:, :, None] * C + (c0 + offs_c)[None, None, :],
                     mask=filled[:, :, None] & in_c[None, None, :], other=0.0)  # fmt: skip
        diff = qc[:, None, :] - rc  # (BLOCK_M, BLOCK_K, BLOCK_C)
        d += tl.sum(diff * diff, axis=2)
    if HAS_MASK:
        real = tl.load(mask_ptr + b * N + idx, mask=filled, other=0) != 0
        d = tl.where(real, d, float("inf"))
    bits = d.to(tl.int32, bitcast=True).to(tl.int64)
    return tl.sort(tl.where(filled, (bits << 32) | idx, _PAST_END), dim=1)


@triton.jit
def _knn_kernel(
    q_ptr,  # (B, M, C) float32, contiguous
    r_ptr,  # (B, N, C) float32, contiguous
    centre_ptr,  # (B, C) float32: each reference cloud's mean (unused without EXPANDED)
    mask_ptr,  # (B, N) uint8 (unused without HAS_MASK)
    dist_ptr,  # (B, M, k) float32 (unused with SPLIT)
    idx_ptr,  # (B, M, k) int64 (unused with SPLIT)
    part_ptr,  # (B, M, S, BLOCK_K) int64: each split's sorted keys (unused without SPLIT)
    M, N, C, k,
    S,  # splits of the N reference points, program_id(2)
    tiles,  # tiles of BLOCK_K columns a split walks
    HAS_MASK: tl.constexpr,
    SPLIT: tl.constexpr,
    EXPANDED: tl.constexpr,  # candidates from the expanded form, then rescored exactly (the module's docstring)
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_C: tl.constexpr,  # channels a step: of the exact tiles (and the rescoring), or of the products
    RESCORE_C: tl.constexpr,  # channels a step of the rescoring's gathered (BLOCK_M, BLOCK_K, RESCORE_C) tile
):  # fmt: skip
    b = tl.program_id(1).to(tl.int64)
    s = tl.program_id(2)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_t = tl.arange(0, BLOCK_K)  # column within a tile, and slot of the running list
    in_m = offs_m < M
    q_base, r_base, centre_base = q_ptr + b * M * C, r_ptr + b * N * C, centre_ptr + b * C
    if EXPANDED:
        q_sq = _centred_sq_norms(q_base, centre_base, offs_m, in_m, C, BLOCK_M, BLOCK_C)
    best = tl.full([BLOCK_M, BLOCK_K], _PAST_END, tl.int64)
    for t in range(0, loop_bound(tiles)):
        offs_n = (s * tiles + t) * BLOCK_K + offs_t
        in_n = offs_n < N
        if EXPANDED:
            d = _expanded_tile(q_base, r_base, centre_base, q_sq, offs_m, offs_n, in_m, in_n, C, BLOCK_M, BLOCK_K,
                               BLOCK_C)  # fmt: skip
        else:
            d = _exact_tile(q_base, r_base, offs_m, offs_n, in_m, in_n, C, BLOCK_M, BLOCK_K, BLOCK_C)
        if HAS_MASK:
            real = tl.load(mask_ptr + b * N + offs_n, mask=in_n, other=0) != 0
            d = tl.where(real[None, :], d, float("inf"))
        bits = d.to(tl.int32, bitcast=True).to(tl.int64)
        key = tl.where(in_n[None, :], (bits << 32) | offs_n[None, :].to(tl.int64), _PAST_END)
        best = _merge(best, key)
    if EXPANDED:
        best = _rescore(best, q_base, r_base, mask_ptr, b, offs_m, in_m, N, C, HAS_MASK, BLOCK_M, BLOCK_K, RESCORE_C)
    if SPLIT:
        part = ((b * M + offs_m[:, None]) * S + s) * BLOCK_K + offs_t[None, :]
        tl.store(part_ptr + part, best, mask=in_m[:, None])
    else:
        _store(best, dist_ptr, idx_ptr, b, offs_m, offs_t, in_m, M, k)


@triton.jit
def _knn_merge_kernel(
    part_ptr,  # (B, M, S, BLOCK_K) int64, each split's sorted keys
    dist_ptr,  # (B, M, k) float32
    idx_ptr,  # (B, M, k) int64
    M, k, S,
    BLOCK_M: tl.constexpr,
    BLOCK_K: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_t = tl.arange(0, BLOCK_K)
    in_m = offs_m < M
    best = tl.full([BLOCK_M, BLOCK_K], _PAST_END, tl.int64)
    for s in range(0, loop_bound(S)):
        part = ((b * M + offs_m[:, None]) * S + s) * BLOCK_K + offs_t[None, :]
        best = _merge(best, tl.load(part_ptr + part, mask=in_m[:, None], other=_PAST_END))
    _store(best, dist_ptr, idx_ptr, b, offs_m, offs_t, in_m, M, k)


# The expanded form (the module's docstring) from this many channels: below it the exact tile is cheap, and a product
# needs 16 channels (tl.dot's smallest tile) where coordinates have 3.
_EXPANDED_MIN_CHANNELS = 16


def _blocks(k: int, C: int) -> tuple[bool, int, int, int, int, int]:
    """``(expanded, BLOCK_M, BLOCK_K, BLOCK_C, RESCORE_C, warps)``: the distances' form, queries per program, list
    slots (= tile columns), channels per step and the warps.

    The expanded form is taken where the points have ``_EXPANDED_MIN_CHANNELS`` channels and the reference's spare
    candidates fit in the slots the exact form takes (``next_pow2(k)``, at least 16: k = 24 has 30, in 32 slots);
    twice the slots cost the sorts more than the products save (k = 32 on an H100, docs/changelog.md 2026-11-27). It
    takes 16 channels a product with 4 warps, which ran faster than 32 channels or 8 warps there; its list, kept in
    the products' layout, and the tile take about as many registers as a thread has (ptxas for sm_90,
    tests/attention/test_knn_triton.py). The exact form's ``(BLOCK_M, BLOCK_K, BLOCK_C)`` difference tile (and the
    rescoring's) stays at 4096 values."""
    bk = max(16, triton.next_power_of_2(k))
    expanded = C >= _EXPANDED_MIN_CHANNELS and knn_spare_candidates(k) <= bk
    bm = 32 if bk <= 32 else 16
    exact_c = max(1, min(triton.next_power_of_2(C), 4096 // (bm * bk)))
    if expanded:
        return True, bm, bk, 16, exact_c, 4
    return False, bm, bk, exact_c, exact_c, 8 if bk >= 64 else 4  # 8 warps at k = 64: with 4, twice the registers


# Splitting the N reference points among programs (each keeps its own list, a second kernel merges the lists) fills a
# GPU that one program per BLOCK_M queries would leave idle, e.g. the 8 programs of a single cloud's M = 256 queries
# (or the 256 of 32 such clouds, on a GPU of 132 SMs).
# A split walks at least _MIN_TILES tiles, so the merge (one list a split) stays small beside the search, and the
# splits stop once the grid has _PROGRAMS_PER_SM programs for every SM: at k = 32 a program's 4 warps take 96
# registers a thread in the exact form (the sm_90 cubin, tests/attention/test_knn_triton.py), room for 5 resident
# programs an SM; the expanded form fits two, and the extra programs queue.
# Neither is tuned: tools/bench_points.py --device cuda --batch 1 32 times the search split this way against one part
# (rows "triton-split" and "triton-1split").
_MIN_TILES = 4
_PROGRAMS_PER_SM = 4
_MAX_SPLITS = 65535  # the splits are the grid's third axis, which CUDA caps at 65535 programs


@functools.cache
def _multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def auto_splits(programs: int, N: int, block_k: int, multiprocessors: int) -> int:
    """How many parts the N reference points are split into for a grid of ``programs`` query blocks (1: no split)."""
    wanted = triton.cdiv(_PROGRAMS_PER_SM * multiprocessors, programs)
    return max(1, min(wanted, N // (_MIN_TILES * block_k)))


def _plan(N: int, block_k: int, splits: int) -> tuple[int, int]:
    """``(S, tiles)``: the splits that get columns when each walks ``tiles`` whole tiles (S <= ``splits``)."""
    tiles = triton.cdiv(triton.cdiv(N, block_k), splits)
    return triton.cdiv(N, tiles * block_k), tiles


def _device(t: Tensor) -> contextlib.AbstractContextManager:
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()  # launch on the tensors' GPU


def knn_triton(
    query: Tensor,
    ref: Tensor,
    k: int,
    mask: Tensor | None = None,
    chunk_bytes: int | None = None,
    splits: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The k nearest reference points of every query, :func:`attention.knn`'s contract (``backend="triton"``).

    Args:
        query: ``(B, M, C)`` (searched in float32, without gradient).
        ref: ``(B, N, C)``, ``k <= N``.
        k: neighbours per query, ``k <= MAX_NEIGHBORS``.
        mask: ``(B, N)`` bool, True for real reference points, or None.
        chunk_bytes: unused (the kernel holds no distance matrix); the backends share one signature.
        splits: at most this many parts of the reference points (fewer where some would get no whole tile, and at
            most 65535), each searched by its own programs, the lists merged by a second kernel; None:
            :func:`auto_splits` on CUDA (enough programs for the GPU), 1 elsewhere.

    Returns:
        ``(dist, idx)``: ``(B, M, k)`` float32 squared distances in ascending order and int64 indices.
    """
    B, M, C = query.shape
    N = ref.shape[1]
    if k > MAX_NEIGHBORS:  # attention.backends refuses these before they get here
        raise ValueError(f"knn_triton supports k <= {MAX_NEIGHBORS}, got k={k}")
    if splits is not None and splits < 1:
        raise ValueError(f"knn_triton: splits must be >= 1, got {splits}")
    q = query.detach().float().contiguous()
    r = ref.detach().float().contiguous()
    m8 = mask.contiguous().view(torch.uint8) if mask is not None else q  # any pointer when unused
    dist = torch.empty(B, M, k, dtype=torch.float32, device=q.device)
    idx = torch.empty(B, M, k, dtype=torch.int64, device=q.device)
    expanded, bm, bk, bc, rc, warps = _blocks(k, C)
    centre = cloud_centres(r, mask).squeeze(1).contiguous() if expanded else q  # any pointer when unused
    blocks = triton.cdiv(M, bm)
    if splits is None:
        splits = auto_splits(blocks * B, N, bk, _multiprocessors(q.device.index)) if q.is_cuda else 1
    splits = min(splits, _MAX_SPLITS)
    S, tiles = _plan(N, bk, splits)
    part = torch.empty(B, M, S, bk, dtype=torch.int64, device=q.device) if S > 1 else idx  # unused without a split
    with _device(q):
        _knn_kernel[(blocks, B, S)](
            q, r, centre, m8, dist, idx, part, M, N, C, k, S, tiles,
            HAS_MASK=mask is not None, SPLIT=S > 1, EXPANDED=expanded, BLOCK_M=bm, BLOCK_K=bk, BLOCK_C=bc,
            RESCORE_C=rc, num_warps=warps,
            enable_fp_fusion=False,  # square, then add: the reference's rounding of each term
        )  # fmt: skip
        if S > 1:
            _knn_merge_kernel[(blocks, B)](part, dist, idx, M, k, S, BLOCK_M=bm, BLOCK_K=bk, num_warps=warps)
    return dist, idx
