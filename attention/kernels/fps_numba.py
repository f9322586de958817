"""Exact farthest point sampling on the CPU with kd-tree pruning (numba), QuickFPS-style.

Han et al., "QuickFPS: Architecture and Algorithm Co-Design for Farthest Point Sampling in Large-Scale Point
Clouds" (arXiv:2205.00705): FPS only lowers a point's min-distance when the new sample is nearer than that
min-distance, so a whole spatial bucket whose bounding box lies farther from the new sample than the bucket's largest
min-distance cannot change and is skipped. Unlike fpsample's bucket FPS this returns the reference's indices exactly
(``backend="torch"`` of :func:`attention.farthest_point_sample`): every distance that is computed uses the
reference's float32 arithmetic, ``d = ((x0 - c0)^2 + (x1 - c1)^2) + (x2 - c2)^2`` (each difference, square and sum
rounded to float32, no fused multiply-add: numba compiles without ``fastmath``, and LLVM contracts a multiply and an
add into an FMA only under a ``contract`` flag that numba sets only with ``fastmath``), the skip test is conservative
by a proven margin (see :func:`_can_skip`), and ties go to the lowest index like ``torch.argmax``.

The tree is a complete binary kd-tree in heap layout (node k has children 2k+1 and 2k+2, all leaves at one depth):
every node splits its points at the median of its widest coordinate (quickselect, O(N) per level), leaves hold about
:data:`LEAF_SIZE` points, stored contiguously in leaf order. Every node keeps its bounding box and the largest
min-distance of its points with the lowest original index attaining it; one FPS step walks the tree depth-first,
skips every subtree that cannot change, updates the points of the leaves it reaches, and recomputes the maxima of the
visited nodes bottom-up; the root then holds the next sample.

Compiled with ``cache=True``: the first call with an empty cache compiles (a few seconds, which
``tools/bench_points.py`` reports); later processes load the cached machine code.
"""

from __future__ import annotations

import numba
import numpy as np
import torch
from torch import Tensor

__all__ = ["LEAF_SIZE", "fps_numba", "fps_numba_cloud"]

# Points per kd-tree leaf (about; leaves of one tree differ by at most one point). Not critical: 16 to 64 time alike on
# large clouds (tools/bench_points.py --large).
LEAF_SIZE = 32

_U32 = 2.0**-24  # unit roundoff of float32 (round to nearest)
_U64 = 2.0**-53


@numba.njit(cache=True)
def _select(order, key, lo, hi, kth):
    """Partially sorts ``order[lo:hi]`` by ``key`` so that position ``kth`` holds its rank (quickselect)."""
    while hi - lo > 1:
        pivot = key[order[(lo + hi) // 2]]
        i = lo
        j = hi - 1
        while i <= j:
            while key[order[i]] < pivot:
                i += 1
            while key[order[j]] > pivot:
                j -= 1
            if i <= j:
                t = order[i]
                order[i] = order[j]
                order[j] = t
                i += 1
                j -= 1
        # now order[lo:j+1] <= pivot <= order[i:hi], and everything between equals the pivot
        if kth <= j:
            hi = j + 1
        elif kth >= i:
            lo = i
        else:
            return


@numba.njit(cache=True)
def _build(pts, real, depth):
    """kd-tree over the points ``real`` (original indices) of ``pts`` (N, C): leaf order and node ranges."""
    n = real.shape[0]
    C = pts.shape[1]
    n_nodes = 2 ** (depth + 1) - 1
    start = np.empty(n_nodes, np.int64)
    stop = np.empty(n_nodes, np.int64)
    start[0] = 0
    stop[0] = n
    order = real.copy()
    key = np.empty(pts.shape[0], np.float32)
    first_leaf = 2**depth - 1
    for k in range(first_leaf):
        s = start[k]
        e = stop[k]
        mid = s + (e - s) // 2
        if e - s > 1:
            best = 0
            width = -1.0
            for c in range(C):
                lo = pts[order[s], c]
                hi = lo
                for j in range(s + 1, e):
                    v = pts[order[j], c]
                    lo = min(lo, v)
                    hi = max(hi, v)
                if np.float64(hi) - np.float64(lo) > width:
                    width = np.float64(hi) - np.float64(lo)
                    best = c
            for j in range(s, e):
                key[order[j]] = pts[order[j], best]
            _select(order, key, s, e, mid)
        start[2 * k + 1] = s
        stop[2 * k + 1] = mid
        start[2 * k + 2] = mid
        stop[2 * k + 2] = e
    return order, start, stop


@numba.njit(cache=True)
def _can_skip(lower, node_max, slack):
    """Whether no point of a node can get a smaller min-distance from a sample at squared distance >= ``lower``.

    Proof that skipping never changes a result. Let p be a point of the node and D = sum_c (p_c - s_c)^2 its exact
    squared distance to the new sample s. ``lower`` is the squared distance from s to the node's box, computed in
    float64 from float32 bounds: each gap and square and the C-term sum carry a relative error of at most u64 = 2^-53
    per operation and all terms are non-negative, so lower <= D (1 + u64)^(2C+1) (D >= the exact box distance).
    The reference computes d = fl32(...) with, per term, one rounded difference, one rounded square and (C - 1)
    rounded additions of non-negative numbers: d >= D (1 - u32)^(C+2) - C * 2^-149 (relative error with round to
    nearest, u32 = 2^-24; gradual underflow adds at most half an ulp of the smallest subnormal, 2^-150, per rounding,
    bounded by 2^-149 per term after scaling by factors < 2). Hence
        d >= lower (1 - u32)^(C+2) / (1 + u64)^(2C+1) - C 2^-149 >= lower (1 - slack) - 1e-30
    for slack = 2 (C + 2) u32 + 4 (C + 1) u64 (a generous bound on both products, C < 10^6). If
    lower (1 - slack) - 1e-30 > node_max >= dist(p), then d > dist(p): min(dist(p), d) = dist(p) for every point of the
    node, bit for bit, so its maximum and the lowest index attaining it stay too. An infinite lower bound (overflow)
    still implies d = inf > node_max unless node_max is inf, when nothing is skipped.
    """
    return lower * (1.0 - slack) - 1e-30 > node_max


@numba.njit(cache=True)
def _fps_cloud(pts, real, first, num_samples, leaf_size):
    C = pts.shape[1]
    n = real.shape[0]
    depth = 0
    while (n >> depth) > 2 * leaf_size:
        depth += 1
    order, start, stop = _build(pts, real, depth)
    n_nodes = start.shape[0]
    first_leaf = 2**depth - 1
    # Points in leaf order, channels first (contiguous per leaf), and their min-distances.
    xs = np.empty((C, n), np.float32)
    for j in range(n):
        for c in range(C):
            xs[c, j] = pts[order[j], c]
    dist = np.full(n, np.inf, np.float32)
    lo = np.empty((n_nodes, C), np.float64)
    hi = np.empty((n_nodes, C), np.float64)
    node_max = np.full(n_nodes, np.inf, np.float32)
    node_arg = np.empty(n_nodes, np.int64)
    for k in range(n_nodes - 1, -1, -1):
        if k >= first_leaf:
            for c in range(C):
                lo[k, c] = np.inf
                hi[k, c] = -np.inf
            for j in range(start[k], stop[k]):
                for c in range(C):
                    lo[k, c] = min(lo[k, c], np.float64(xs[c, j]))
                    hi[k, c] = max(hi[k, c], np.float64(xs[c, j]))
            node_arg[k] = n  # no point yet; replaced at the first visit (dist starts at inf everywhere)
        else:
            for c in range(C):
                lo[k, c] = min(lo[2 * k + 1, c], lo[2 * k + 2, c])
                hi[k, c] = max(hi[2 * k + 1, c], hi[2 * k + 2, c])
            node_arg[k] = n
    slack = 2.0 * (C + 2) * _U32 + 4.0 * (C + 1) * _U64
    out = np.empty(num_samples, np.int64)
    s = np.empty(C, np.float32)
    stack = np.empty(depth + 2, np.int64)
    visited = np.empty(n_nodes, np.int64)
    far = first
    for i in range(num_samples):
        out[i] = far
        if i == num_samples - 1:
            break
        for c in range(C):
            s[c] = pts[far, c]
        top = 0
        stack[0] = 0
        n_visited = 0
        while top >= 0:
            k = stack[top]
            top -= 1
            lower = 0.0
            for c in range(C):
                sc = np.float64(s[c])
                gap = max(lo[k, c] - sc, sc - hi[k, c], 0.0)
                lower += gap * gap
            if _can_skip(lower, np.float64(node_max[k]), slack):
                continue
            if k >= first_leaf:
                best = np.float32(-np.inf)
                arg = n
                for j in range(start[k], stop[k]):
                    t = xs[0, j] - s[0]
                    d = t * t
                    for c in range(1, C):
                        t = xs[c, j] - s[c]
                        d = d + t * t  # float32 square, then float32 add: the reference's rounding
                    if d < dist[j]:
                        dist[j] = d
                    dj = dist[j]
                    if dj > best or (dj == best and order[j] < arg):
                        best = dj
                        arg = order[j]
                node_max[k] = best
                node_arg[k] = arg
            else:
                visited[n_visited] = k
                n_visited += 1
                top += 1
                stack[top] = 2 * k + 2
                top += 1
                stack[top] = 2 * k + 1
        # Parents come before their children in the depth-first visit: refresh the maxima in reverse.
        for v in range(n_visited - 1, -1, -1):
            k = visited[v]
            a = 2 * k + 1
            b = 2 * k + 2
            if node_max[a] > node_max[b] or (node_max[a] == node_max[b] and node_arg[a] < node_arg[b]):
                node_max[k] = node_max[a]
                node_arg[k] = node_arg[a]
            else:
                node_max[k] = node_max[b]
                node_arg[k] = node_arg[b]
        far = node_arg[0]
    return out


def fps_numba_cloud(pts: np.ndarray, real: np.ndarray, first: int, num_samples: int) -> np.ndarray:
    """Exact FPS of one cloud: the reference's indices for float32 ``pts`` ``(N, C)``.

    Args:
        pts: ``(N, C)`` float32 coordinates (C-contiguous).
        real: int64 original indices of the real points (all of ``arange(N)`` without a mask), ascending.
        first: original index of the first sample (a real point).
        num_samples: M, at most ``len(real)``.

    Returns:
        ``(M,)`` int64 original indices.
    """
    return _fps_cloud(pts, real, first, num_samples, LEAF_SIZE)


def fps_numba(x: Tensor, num_samples: int, start: Tensor, mask: Tensor | None) -> Tensor:
    """FPS indices ``(B, M)`` of ``x`` ``(B, N, C)`` from ``start`` ``(B,)``, one cloud at a time; the reference's
    contract (``backend="numba"`` of :func:`attention.farthest_point_sample`)."""
    pts = x.detach().float().cpu().numpy()
    starts = start.tolist()
    keep = None if mask is None else mask.cpu().numpy()
    every = np.arange(x.shape[1], dtype=np.int64)
    out = np.empty((x.shape[0], num_samples), dtype=np.int64)
    for b in range(x.shape[0]):
        real = every if keep is None else np.flatnonzero(keep[b]).astype(np.int64)
        out[b] = fps_numba_cloud(np.ascontiguousarray(pts[b]), real, int(starts[b]), num_samples)
    return torch.from_numpy(out).to(x.device)
