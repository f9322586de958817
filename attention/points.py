"""Point ops: farthest point sampling, k nearest neighbours, gather and nearest-neighbour interpolation.

Every op has a plain PyTorch reference (``backend="torch"``), vectorized over the batch, which is the ground truth;
fast backends are optional and tested against it:

=============  ==========================================  ======================================================
backend        FPS                                         KNN
=============  ==========================================  ======================================================
``torch``      loop over M, batched (reference)            chunked brute force, memory bounded (reference)
``cluster``    ``torch_cluster.fps`` (CPU, CUDA; its       ``torch_cluster.knn`` (CPU kd-tree, CUDA brute force)
               rounding differs: explicit only)
``pytorch3d``  ``pytorch3d.ops.sample_farthest_points``    ``pytorch3d.ops.knn_points``
``triton``     ``attention.kernels.fps_triton`` (CUDA,      ``attention.kernels.knn_triton`` (CUDA, k <= 64;
               N <= 65536, C <= 8)                         tiled, a running top-k per query, no distance matrix)
``fpsample``   ``fpsample.fps_sampling`` (CPU; FPS, but its  --
               rounding differs: explicit only)
``fpsample_    ``fpsample.bucket_fps_kdline_sampling``       --
bucket``       (CPU; approximate, explicit only)
``numba``      ``attention.kernels.fps_numba`` (CPU;         --
               exact, kd-tree pruning, any C)
=============  ==========================================  ======================================================

Backends are declared and chosen in :mod:`attention.backends`: ``backend="auto"`` picks, per device and shape, the
fastest *exact* backend that is installed and supports the shape (see ``tools/bench_points.py`` and
``docs/benchmarks.md`` for the measurements behind the order). An explicitly requested backend that is not installed
raises an ``ImportError`` that says what to install; one that cannot take the device or the shape raises a
``ValueError`` (no silent fallback).

``numba`` is exact FPS with spatial pruning (QuickFPS-like): a kd-tree over each cloud skips, per step, every subtree
whose box is provably too far from the new sample to lower any min-distance, and computes the rest with the
reference's float32 arithmetic, so its indices are the reference's bit for bit. ``"auto"`` uses it on CPU for
coordinates (C <= 4), where the pruning pays; its first call with an empty cache compiles (cached on disk
afterwards, ``docs/benchmarks.md`` has the cost).

``fpsample_bucket`` is a documented approximation for large single clouds: fpsample's bucket FPS (kd-tree buckets,
``h`` = :data:`FPSAMPLE_BUCKET_HEIGHT`) returns a well-spread subset but not the exact FPS indices; its coverage
(largest distance from a point to its nearest sample) against exact FPS is measured in ``docs/benchmarks.md``; its
first sample is not ``start``. Under FX or ``torch.export``, ``"auto"`` runs the reference (traceable); under
``torch.compile`` the reference or the Triton kernels, which the compiled graph calls as operators.

Conventions: points and features are ``(B, N, C)``; indices are int64 ``(B, M)`` or ``(B, M, K)`` into the N axis of
their batch element; distances are squared L2. Ragged batches are padded to a common N and described by a boolean
``mask`` (True = real point) or by ``lengths`` (real points first).
"""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor

from .backends import BACKENDS, HAS_FPSAMPLE, HAS_NUMBA, HAS_PYTORCH3D, HAS_TORCH_CLUSTER, HAS_TRITON, resolve
from .checks import check_index, check_mask, check_points, checks_active
from .chunking import chunk_budget, chunk_rows

__all__ = [
    "FPSAMPLE_BUCKET_HEIGHT",
    "HAS_FPSAMPLE",
    "HAS_NUMBA",
    "HAS_PYTORCH3D",
    "HAS_TORCH_CLUSTER",
    "HAS_TRITON",
    "cloud_centres",
    "farthest_point_sample",
    "gather",
    "interpolate",
    "interpolate_neighbors",
    "knn",
    "knn_chunked",
    "knn_search",
    "knn_spare_candidates",
    "lengths_to_mask",
    "nearest_upsample",
]

_logger = logging.getLogger(__name__)


def lengths_to_mask(lengths: Tensor, max_len: int) -> Tensor:
    """Boolean ``(B, max_len)`` mask, True for the first ``lengths[b]`` entries of row b."""
    return torch.arange(max_len, device=lengths.device)[None, :] < lengths[:, None]


def _point_mask(
    x: Tensor, mask: Tensor | None, lengths: Tensor | None, name: str = "x", nonempty: str = ""
) -> Tensor | None:
    """Normalizes ``mask`` / ``lengths`` to a boolean ``(B, N)`` mask (or None when all points are real); a given
    mask is checked by :func:`attention.checks.check_mask` (``nonempty``: no all-False row)."""
    B, N, _ = x.shape
    if mask is not None and lengths is not None:
        raise ValueError("pass either mask or lengths, not both")
    if lengths is not None:
        lengths = torch.as_tensor(lengths, device=x.device)
        if lengths.shape != (B,) or lengths.is_floating_point():
            raise ValueError(f"lengths must be an integer tensor of shape ({B},), got {tuple(lengths.shape)}")
        if checks_active() and bool(((lengths < 1) | (lengths > N)).any()):
            raise ValueError(f"lengths must lie in [1, {N}] (empty clouds are not allowed), got {lengths.tolist()}")
        return lengths_to_mask(lengths, N)
    check_mask(mask, "mask", batch=B, length=N, device=x.device, like_name=name, nonempty=nonempty)
    return mask


# --------------------------------------------------------------------------------------------------------------------
# Farthest point sampling
# --------------------------------------------------------------------------------------------------------------------


def _fps_torch(x: Tensor, num_samples: int, start: Tensor, mask: Tensor | None) -> Tensor:
    """Reference FPS: M sequential steps, each one batched over B and N.

    Keeps, for every point, its squared distance to the nearest already-chosen sample and picks the argmax; ties go
    to the lowest index (``torch.argmax``'s first maximum). Padded points carry distance -1 and are never picked.
    """
    B, N, C = x.shape
    # Channels first: each step's distance is C fused passes over contiguous (B, N) rows, not a (B, N, C) temporary.
    xt = x.detach().float().permute(2, 0, 1).contiguous()  # (C, B, N)
    dist = xt.new_full((B, N), math.inf)
    if mask is not None:
        dist.masked_fill_(~mask, -1.0)
    out = torch.empty(num_samples, B, dtype=torch.long, device=x.device)
    rows = torch.arange(B, device=x.device)
    flat = xt.view(C, B * N)
    offsets = rows * N
    far = start
    d = torch.empty_like(dist)
    tmp = torch.empty_like(dist)
    for i in range(num_samples):
        out[i] = far
        chosen = flat[:, offsets + far]  # (C, B): coordinates of the newest sample of each cloud
        torch.sub(xt[0], chosen[0, :, None], out=d)
        d.mul_(d)
        for c in range(1, C):
            # Square, then add (no fused multiply-add): the same rounding as sum((x - c)^2) in torch_cluster.
            torch.sub(xt[c], chosen[c, :, None], out=tmp)
            d.add_(tmp.mul_(tmp))
        torch.minimum(dist, d, out=dist)
        far = dist.argmax(dim=1)
    return out.t().contiguous()


def _roll_to_start(x: Tensor, start: Tensor) -> Tensor:
    """Rotates each cloud so that its start point comes first (backends whose FPS always starts at index 0)."""
    B, N, _ = x.shape
    order = (torch.arange(N, device=x.device)[None, :] + start[:, None]) % N  # (B, N)
    return torch.gather(x, 1, order[..., None].expand(-1, -1, x.shape[-1]))


def _fps_cluster(x: Tensor, num_samples: int, start: Tensor, mask: Tensor | None) -> Tensor:
    import torch_cluster

    B, N, C = x.shape
    if mask is not None:
        return _fps_ragged_via_flat(x, num_samples, start, mask, torch_cluster.fps)
    rolled = _roll_to_start(x.detach(), start).reshape(B * N, C)
    batch = torch.arange(B, device=x.device).repeat_interleave(N)
    # torch_cluster samples ceil(ratio * N) points; (M - 0.5) / N makes that exactly M whatever the rounding.
    idx = torch_cluster.fps(rolled, batch, ratio=(num_samples - 0.5) / N, random_start=False)
    idx = idx.view(B, num_samples) - (torch.arange(B, device=x.device) * N)[:, None]
    return (idx + start[:, None]) % N


def _fps_ragged_via_flat(x: Tensor, num_samples: int, start: Tensor, mask: Tensor, fps_fn) -> Tensor:
    """Runs a flat (concatenated) FPS on the real points of a padded batch and maps indices back."""
    B, N, C = x.shape
    # Put the start point first and keep the other real points in cyclic order, like _roll_to_start.
    ar = torch.arange(N, device=x.device)
    order = ((ar[None, :] + start[:, None]) % N).expand(B, N)  # (B, N)
    rolled_mask = torch.gather(mask, 1, order)
    keep = rolled_mask.reshape(-1)
    flat_pos = order.reshape(-1)[keep]  # original index of each kept point
    flat_x = _roll_to_start(x.detach(), start).reshape(B * N, C)[keep]
    counts = rolled_mask.sum(1)
    batch = torch.repeat_interleave(torch.arange(B, device=x.device), counts)
    ratio = (num_samples - 0.5) / counts.to(torch.float64)
    idx = fps_fn(flat_x, batch, ratio=ratio.to(x.device, torch.float32), random_start=False)
    return flat_pos[idx].view(B, num_samples)


def _fps_pytorch3d(x: Tensor, num_samples: int, start: Tensor, mask: Tensor | None) -> Tensor:
    from pytorch3d.ops import sample_farthest_points

    B, N, _ = x.shape
    pts = x.detach().float()  # the reference's precision (pytorch3d would search float64 in float64)
    if mask is None:
        lengths = torch.full((B,), N, device=x.device, dtype=torch.long)
        rolled = _roll_to_start(pts, start)
    else:
        # Move each cloud's real points to the front (start first), padding after them, as pytorch3d expects.
        ar = torch.arange(N, device=x.device)
        order = (ar[None, :] + start[:, None]) % N
        key = (~torch.gather(mask, 1, order)).long() * N + ar  # real points first, cyclic order kept
        perm = torch.gather(order, 1, key.argsort(1))
        rolled = torch.gather(pts, 1, perm[..., None].expand(-1, -1, x.shape[-1]))
        lengths = mask.sum(1)
    _, idx = sample_farthest_points(rolled, lengths=lengths, K=num_samples, random_start_point=False)
    if mask is None:
        return (idx + start[:, None]) % N
    return torch.gather(perm, 1, idx)


# Height of fpsample's kd-line buckets (its docs suggest 3-9 for large clouds); a larger height is faster and
# coarser.
FPSAMPLE_BUCKET_HEIGHT = 7


def _fps_fpsample(x: Tensor, num_samples: int, start: Tensor, mask: Tensor | None, bucket: bool = False) -> Tensor:
    """fpsample (Rust, CPU, one cloud at a time): exact FPS, or its bucket approximation when ``bucket``.

    A padded cloud runs on its real points only (the start point mapped to its rank among them) and maps back.
    """
    import fpsample
    import numpy as np

    pts = x.detach().float().cpu().numpy()
    starts = start.tolist()
    keep = None if mask is None else mask.cpu().numpy()
    out = np.empty((x.shape[0], num_samples), dtype=np.int64)
    for b in range(x.shape[0]):
        cloud, first, real = pts[b], starts[b], None
        if keep is not None:
            real = np.flatnonzero(keep[b])  # original index of each real point
            cloud, first = cloud[real], int(np.searchsorted(real, first))
        if bucket:
            idx = fpsample.bucket_fps_kdline_sampling(cloud, num_samples, FPSAMPLE_BUCKET_HEIGHT, start_idx=first)
        else:
            idx = fpsample.fps_sampling(cloud, num_samples, start_idx=first)
        out[b] = idx if real is None else real[idx]
    return torch.from_numpy(out).to(x.device)


def _fps_fpsample_bucket(x: Tensor, num_samples: int, start: Tensor, mask: Tensor | None) -> Tensor:
    return _fps_fpsample(x, num_samples, start, mask, bucket=True)


def farthest_point_sample(
    x: Tensor,
    num_samples: int,
    start: int | Tensor | None = 0,
    *,
    mask: Tensor | None = None,
    lengths: Tensor | None = None,
    backend: str = "auto",
    generator: torch.Generator | None = None,
) -> Tensor:
    """Farthest point sampling: M indices per cloud, each the point farthest from those already chosen.

    Args:
        x: ``(B, N, C)`` coordinates or features; distances are squared L2 over C, computed in float32.
        num_samples: M, at most the number of real points of every cloud.
        start: index of the first sample: an int for every cloud, a ``(B,)`` integer tensor, or None for a random
            real point per cloud (drawn from ``generator``). Given ``start`` the result is deterministic.
        mask: optional ``(B, N)`` bool, True for real points of a padded (ragged) batch.
        lengths: optional ``(B,)`` number of real points per cloud (real points first); exclusive with ``mask``.
        backend: ``"auto"`` or a backend of ``attention.backend_names("fps")`` (see the module docstring);
            ``"fpsample_bucket"`` is approximate; ``"numba"`` is exact and pruned (auto's CPU choice for C <= 4).
        generator: random generator for ``start=None``.

    Returns:
        ``(B, M)`` int64 indices into the N axis; never a padded point. A cloud with fewer distinct points than M
        repeats an already chosen index once all distances are zero.
    """
    check_points(x, "x")
    B, N, _ = x.shape
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
        raise ValueError(f"num_samples must be a positive int, got {num_samples!r}")
    mask = _point_mask(x, mask, lengths)
    n_real = mask.sum(1) if mask is not None else None
    if num_samples > N or (n_real is not None and checks_active() and num_samples > int(n_real.min())):
        have = N if n_real is None else int(n_real.min())
        raise ValueError(f"cannot sample M={num_samples} points from a cloud of N={have} (real) points: need M <= N")
    if start is None:
        gen_device = generator.device if generator is not None else "cpu"
        u = torch.rand(B, generator=generator, device=gen_device).to(x.device)
        count = n_real if n_real is not None else torch.full((B,), N, device=x.device)
        rank = (u * count).long().clamp_max(count - 1)  # the rank-th real point
        if mask is None:
            start = rank
        else:
            start = (mask.long().cumsum(1) == (rank + 1)[:, None]).long().argmax(1)
    elif isinstance(start, int) and not isinstance(start, bool):
        if not 0 <= start < N:
            raise ValueError(f"start must lie in [0, {N}), got {start}")
        start = torch.full((B,), start, dtype=torch.long, device=x.device)
    elif isinstance(start, Tensor):
        check_index(start, "start", batch=B, device=x.device)
        if start.shape != (B,):
            raise ValueError(f"start must be an int, None or a ({B},) tensor, got shape {tuple(start.shape)}")
        start = start.long()
        if checks_active() and bool(((start < 0) | (start >= N)).any()):
            raise ValueError(f"start indices must lie in [0, {N}), got {start.tolist()}")
    else:
        raise TypeError(f"start must be an int, None or a (B,) tensor, got {type(start).__name__}")
    if mask is not None and checks_active() and not bool(mask.gather(1, start[:, None]).all()):
        raise ValueError("start points at a padded point (mask is False there)")
    shape = {"B": B, "N": N, "C": x.shape[-1], "M": num_samples, "masked": mask is not None}
    name = resolve("fps", backend, x.device, shape)  # traceable choices while tracing (attention.backends)
    return BACKENDS["fps"][name].load()(x, num_samples, start, mask)


# --------------------------------------------------------------------------------------------------------------------
# K nearest neighbours
# --------------------------------------------------------------------------------------------------------------------


def _exact_sq_dist(
    query: Tensor, ref: Tensor, idx: Tensor, *, nbrs: Tensor | None = None, out: Tensor | None = None
) -> Tensor:
    """Squared distances of each query to its selected neighbours, ``(B, M, K)``, computed as sum((q - r)^2).

    ``query`` and ``ref`` carry no gradient: the gathered ``(B, M, K, C)`` block is the only temporary of that size
    (it is turned into the squared differences in place; (r - q)^2 rounds exactly as (q - r)^2). It is gathered as
    whole rows of the flattened ``(B * N, C)`` reference, one index per row; :func:`gather` reads an index per
    element, which made it the largest gather of a training step on GPU. ``nbrs`` (contiguous ``(B * M * K, C)``)
    and ``out`` (contiguous ``(B, M, K)``) are a chunked caller's buffers for that block and the result."""
    B, N, C = ref.shape
    rows = (idx + (torch.arange(B, device=idx.device) * N).view(-1, *([1] * (idx.dim() - 1)))).reshape(-1)
    flat = ref.reshape(B * N, C)
    block = flat.index_select(0, rows) if nbrs is None else torch.index_select(flat, 0, rows, out=nbrs)
    nbrs = block.view(*idx.shape, C)  # (B, M, K, C)
    return torch.sum(nbrs.sub_(query.unsqueeze(2)).square_(), -1, out=out)


def cloud_centres(ref: Tensor, mask: Tensor | None) -> Tensor:
    """Each cloud's mean over its real points, ``(B, 1, C)``: the centre of :func:`knn_chunked`'s expanded distances
    (and of the Triton search's). Padded rows may hold anything, NaN included."""
    if mask is None:
        return ref.mean(1, keepdim=True)
    real = torch.where(mask.unsqueeze(-1), ref, 0.0).sum(1, keepdim=True)
    return real / mask.sum(1).clamp_min(1).to(ref.dtype).view(-1, 1, 1)


def knn_spare_candidates(k: int) -> int:
    """The candidates :func:`knn_chunked` keeps per query from the expanded distances before computing their exact
    distances, ``k + max(4, k // 4)`` (the Triton search keeps at least as many:
    :mod:`attention.kernels.knn_triton`)."""
    return k + max(4, k // 4)


def knn_chunked(
    query: Tensor, ref: Tensor, k: int, *, mask: Tensor | None = None, chunk_bytes: int | None = None
) -> tuple[Tensor, Tensor]:
    """The exact chunked nearest-neighbour search: :func:`knn`'s reference, and the search of the Chamfer distance.

    Brute force over chunks of queries (and, for very large clouds, of reference points), so that at most
    ``chunk_bytes`` of distances exist at once. The candidate set comes from ``|q|^2 + |r|^2 - 2 q.r`` (a matmul) on
    both sets centred on the reference cloud's mean (the expansion's rounding error, ~1e-7 of ``|q|^2 + |r|^2`` in
    float32, grows with the norms: clouds far from the origin would otherwise get wrong neighbours). Each query keeps
    a few spare candidates, whose distances are then computed exactly as ``sum_c (q_c - r_c)^2`` on the inputs (the
    arithmetic of a dense distance matrix, so near-equal neighbours resolve as there), and the k nearest are kept (in
    no particular order among exactly equal distances). No input validation: :func:`knn` and
    ``capsules.chamfer_distance`` validate theirs.

    Args:
        query: ``(B, M, C)``; searched in its precision, float32 at least (float64 stays float64).
        ref: ``(B, N, C)`` with the same dtype, ``k <= N``.
        k: neighbours per query.
        mask: optional ``(B, N)`` bool, True for real reference points; a query whose cloud has fewer than k real
            points gets distance ``inf`` in its last slots.
        chunk_bytes: memory budget of one chunk of distances (default ``attention.chunking.chunk_budget("knn", ...)``).

    Returns:
        ``(dist, idx)``: ``(B, M, k)`` squared distances in ascending order (no gradient) and int64 indices.
    """
    B, M, C = query.shape
    N = ref.shape[1]
    work = torch.promote_types(query.dtype, torch.float32)
    q0, r0 = query.detach().to(work), ref.detach().to(work)
    centre = cloud_centres(r0, mask)
    q, r = q0 - centre, r0 - centre
    r_sq = r.pow(2).sum(-1)  # (B, N)
    if mask is not None:
        r_sq = r_sq.masked_fill(~mask, math.inf)  # padded points are infinitely far
    kc = min(N, knn_spare_candidates(k))
    budget = chunk_budget("knn", query.device) if chunk_bytes is None else chunk_bytes
    item = torch.finfo(work).bits // 8
    # A chunk holds either its (B, rows, cols) distances or its (B, rows, kc, C) candidates, never both; all N columns
    # at once unless a single query row would not fit.
    cols = N if B * max(N, kc * C) * item <= budget else max(1, budget // (B * item))
    rows = chunk_rows(M, B * max(cols, kc * C) * item, budget)
    rt = r.transpose(1, 2)  # (B, C, N)
    dev = query.device

    def buffer(width: int, dtype: torch.dtype = work) -> Tensor:
        return torch.empty(B * rows * width, dtype=dtype, device=dev)

    # One workspace for every chunk, allocated here for a full one; a smaller chunk or column tile takes a contiguous
    # prefix of each buffer (the layout a new tensor of that shape would have, so the arithmetic is the same), and
    # each chunk writes its rows into the preallocated results: nothing allocated inside a chunk outlives it. Results
    # kept per chunk sat between the freed distance blocks, and the allocator's heap grew with every chunk (peak
    # resident set: tools/bench_points.py --knn-memory).
    tk = min(kc, cols)  # candidates of one column tile
    d_buf = buffer(cols)  # the expanded distances of one column tile
    tile_buf = buffer(tk), buffer(tk, torch.long)  # its tk nearest
    if cols < N:  # the running kc nearest; those followed by a tile's (the merge's input)
        run_buf = buffer(kc), buffer(kc, torch.long), buffer(kc, torch.long)
        both_buf = buffer(kc + tk), buffer(kc + tk, torch.long)
    nbrs_buf, exact_buf = buffer(kc * C), buffer(kc)  # the candidates' coordinates and exact distances
    top_buf = buffer(k), buffer(k, torch.long), buffer(k, torch.long)  # the k nearest: distances, order, indices
    dist = torch.empty(B, M, k, dtype=work, device=dev)
    idx = torch.empty(B, M, k, dtype=torch.long, device=dev)
    for s in range(0, M, rows):
        m = min(rows, M - s)
        qc = q[:, s : s + m]  # (B, m, C)
        cand_d = cand = None  # the running candidates of these queries
        for t in range(0, N, cols):
            w = min(cols, N - t)
            d = _prefix(d_buf, B, m, w)
            torch.baddbmm(r_sq[:, None, t : t + w], qc, rt[:, :, t : t + w], alpha=-2.0, out=d)  # minus |q|^2
            n = min(tk, w)
            if cand is not None:  # the running candidates move to the merge's input before tile_buf is reused
                width = cand.shape[-1]
                both_d, both_i = (_prefix(b, B, m, width + n) for b in both_buf)
                both_d[..., :width] = cand_d
                both_i[..., :width] = cand
            tile_d, tile_i = (_prefix(b, B, m, n) for b in tile_buf)  # (B, m, n)
            torch.topk(d, n, dim=-1, largest=False, sorted=False, out=(tile_d, tile_i))
            tile_i.add_(t)
            if cand is None:
                cand_d, cand = tile_d, tile_i
            else:  # keep the kc nearest of the running candidates and this column tile's
                both_d[..., width:] = tile_d
                both_i[..., width:] = tile_i
                cand_d, keep, cand = (_prefix(b, B, m, min(kc, width + n)) for b in run_buf)
                torch.topk(both_d, cand.shape[-1], dim=-1, largest=False, sorted=False, out=(cand_d, keep))
                torch.gather(both_i, -1, keep, out=cand)
        exact = _prefix(exact_buf, *cand.shape)  # (B, m, kc)
        nbrs = _prefix(nbrs_buf, cand.numel(), C)
        _exact_sq_dist(q0[:, s : s + m], r0, cand, nbrs=nbrs, out=exact)
        if mask is not None:
            exact.masked_fill_(~gather(mask, cand), math.inf)
        top_d, order, top_i = (_prefix(b, B, m, k) for b in top_buf)
        torch.topk(exact, k, dim=-1, largest=False, sorted=True, out=(top_d, order))
        torch.gather(cand, -1, order, out=top_i)
        dist[:, s : s + m] = top_d
        idx[:, s : s + m] = top_i
    return dist, idx


def _prefix(flat: Tensor, *shape: int) -> Tensor:
    """The first ``prod(shape)`` elements of the 1-D ``flat``, as a contiguous tensor of ``shape``."""
    return flat[: math.prod(shape)].view(shape)


def _knn_torch(
    query: Tensor, ref: Tensor, k: int, mask: Tensor | None, chunk_bytes: int | None
) -> tuple[Tensor, Tensor]:
    """The reference of :func:`knn`: :func:`knn_chunked` in float32."""
    return knn_chunked(query.detach().float(), ref.detach().float(), k, mask=mask, chunk_bytes=chunk_bytes)


def _knn_cluster(query: Tensor, ref: Tensor, k: int, mask: Tensor | None, chunk_bytes: int) -> tuple[Tensor, Tensor]:
    import torch_cluster

    B, M, C = query.shape
    N = ref.shape[1]
    q = query.detach().float().reshape(B * M, C)
    r = ref.detach().float()
    ar = torch.arange(B, device=query.device)
    batch_q = ar.repeat_interleave(M)
    if mask is None:
        flat_r = r.reshape(B * N, C)
        pos = torch.arange(B * N, device=query.device)
        batch_r = ar.repeat_interleave(N)
    else:
        keep = mask.reshape(-1)
        flat_r = r.reshape(B * N, C)[keep]
        pos = torch.arange(B * N, device=query.device)[keep]
        batch_r = ar.repeat_interleave(mask.sum(1))
    row, col = torch_cluster.knn(flat_r, q, k, batch_r, batch_q)
    if row.numel() != B * M * k:
        raise ValueError(f"torch_cluster.knn found fewer than k={k} neighbours for some query (too few real points)")
    # Edges come grouped by query; sort them by query, then by exact distance below.
    order = torch.argsort(row * (B * N) + col, stable=True)
    idx = (pos[col[order]] % N).view(B, M, k)
    dist = _exact_sq_dist(query.detach().float(), r, idx)
    dist, o = dist.sort(dim=-1, stable=True)
    return dist, idx.gather(-1, o)


def _knn_pytorch3d(query: Tensor, ref: Tensor, k: int, mask: Tensor | None, chunk_bytes: int) -> tuple[Tensor, Tensor]:
    from pytorch3d.ops import knn_points

    B, M, _ = query.shape
    if mask is None:
        lengths2 = None
        r = ref.detach().float()
        perm = None
    else:
        perm = (~mask).long().argsort(dim=1, stable=True)  # real points first
        r = torch.gather(ref.detach().float(), 1, perm[..., None].expand(-1, -1, ref.shape[-1]))
        lengths2 = mask.sum(1)
    dist, idx, _ = knn_points(query.detach().float(), r, lengths2=lengths2, K=k, return_sorted=True)
    if perm is not None:
        idx = torch.gather(perm, 1, idx.view(B, -1)).view(B, M, k)
    return dist, idx


def knn(
    query: Tensor,
    ref: Tensor,
    k: int,
    *,
    mask: Tensor | None = None,
    backend: str = "auto",
    chunk_bytes: int | None = None,
) -> tuple[Tensor, Tensor]:
    """The k nearest reference points of every query point (squared L2, ascending).

    Args:
        query: ``(B, M, C)`` query points or features.
        ref: ``(B, N, C)`` reference points or features.
        k: neighbours per query, ``1 <= k <= N``.
        mask: optional ``(B, N)`` bool, True for real reference points. A query whose cloud has fewer than k real
            points gets distance ``inf`` in its last slots (their indices point at padded points: mask them); the
            reference and ``"triton"`` pad so, ``"auto"`` then skips the others, and an explicit other backend raises
            ``ValueError``.
        backend: ``"auto"``, ``"torch"``, ``"cluster"``, ``"pytorch3d"`` or ``"triton"``.
        chunk_bytes: memory budget of one chunk of the reference's distance matrix; the full ``(B, M, N)`` matrix
            is never built when it would exceed this (default ``attention.chunking.chunk_budget("knn", device)``:
            32 MiB, 256 MiB on CUDA).

    Returns:
        ``(dist, idx)``: float32 ``(B, M, k)`` squared distances in ascending order and int64 ``(B, M, k)`` indices.
    """
    check_points(ref, "ref")
    check_points(query, "query", like=ref, like_name="ref")
    mask = _point_mask(ref, mask, None, "ref", nonempty="cloud of ref")
    return knn_search(query, ref, k, mask, backend, chunk_bytes)


def knn_search(
    query: Tensor, ref: Tensor, k: int, mask: Tensor | None, backend: str = "auto", chunk_bytes: int | None = None
) -> tuple[Tensor, Tensor]:
    """:func:`knn` for tensors its caller has validated: the backend's search without the tensor checks, whose NaN/Inf
    scans are a host sync each on CUDA (:class:`attention.CentroidAttention` checks its inputs once, then searches
    here). ``k`` is checked (``1 <= k <= N``); shapes, devices and a ``(B, N)`` bool ``mask`` (or None) with a real
    point in every cloud are the caller's to ensure."""
    N = ref.shape[1]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be a positive int, got {k!r}")
    if k > N:
        raise ValueError(f"k={k} neighbours requested but ref has only N={N} points: need k <= N")
    # the real points of the smallest cloud, counted (a host sync on CUDA) only by a backend that must know them
    fewest = None if mask is None else (lambda: int(mask.sum(1).min()))
    shape = {"N": N, "C": ref.shape[-1], "k": k, "min_real": fewest}
    name = resolve("knn", backend, query.device, shape)  # traceable choices while tracing (attention.backends)
    return BACKENDS["knn"][name].load()(query, ref, k, mask, chunk_bytes)


# --------------------------------------------------------------------------------------------------------------------
# Gather and interpolation
# --------------------------------------------------------------------------------------------------------------------


def gather(x: Tensor, idx: Tensor) -> Tensor:
    """Per-batch gather along the point axis: ``out[b, i..., :] = x[b, idx[b, i...], :]``.

    Args:
        x: ``(B, N, C)`` (or ``(B, N)``, treated as C = 1 and returned without the channel dim).
        idx: ``(B, *S)`` integer indices into N, any number of trailing dims.

    Returns:
        ``(B, *S, C)`` (or ``(B, *S)``); differentiable in ``x`` (the backward pass is a scatter-add).
    """
    if not isinstance(x, Tensor) or x.dim() not in (2, 3):
        shape = tuple(x.shape) if isinstance(x, Tensor) else type(x).__name__
        raise ValueError(f"x must be (B, N, C) or (B, N), got {shape}")
    check_index(idx, "idx", batch=x.shape[0], device=x.device)
    B = x.shape[0]
    flat = idx.reshape(B, -1).long()
    if x.dim() == 2:
        return torch.gather(x, 1, flat).view(idx.shape)
    C = x.shape[-1]
    out = torch.gather(x, 1, flat.unsqueeze(-1).expand(-1, -1, C))
    return out.view(*idx.shape, C)


def interpolate(
    query_pos: Tensor,
    ref_pos: Tensor,
    ref_feats: Tensor,
    k: int = 3,
    *,
    eps: float = 1e-8,
    backend: str = "auto",
) -> Tensor:
    """Features of N query points from M reference points by inverse-distance weighting of the k nearest.

    PointNet++'s feature propagation: ``f(q) = sum_j w_j f(r_j) / sum_j w_j`` with ``w_j = 1 / (|q - r_j|^2 + eps)``
    over the k nearest references (in ``pos`` space, usually 3-D). ``k = 1`` is nearest-neighbour upsampling.

    Args:
        query_pos: ``(B, N, P)`` positions of the points that receive features.
        ref_pos: ``(B, M, P)`` positions of the points that carry features.
        ref_feats: ``(B, M, C)`` features of the reference points.
        k: neighbours used.
        eps: added to the squared distances, so coincident points do not divide by zero.
        backend: the KNN backend.

    Returns:
        ``(B, N, C)``, differentiable in ``ref_feats``.
    """
    check_points(ref_feats, "ref_feats")
    if ref_feats.shape[:2] != ref_pos.shape[:2]:
        raise ValueError(
            f"ref_feats must be (B, M, C) with the (B, M) of ref_pos {tuple(ref_pos.shape[:2])}, "
            f"got {tuple(ref_feats.shape)}"
        )
    dist, idx = knn(query_pos, ref_pos, k, backend=backend)
    return interpolate_neighbors(ref_feats, dist, idx, eps=eps)


def interpolate_neighbors(ref_feats: Tensor, dist: Tensor, idx: Tensor, *, eps: float = 1e-8) -> Tensor:
    """:func:`interpolate` from neighbours found already (e.g. by a model's own :func:`knn`, which it then reuses).

    Args:
        ref_feats: ``(B, M, C)`` features of the reference points.
        dist: ``(B, N, k)`` squared distances of each query point to its k references (as :func:`knn` returns them).
        idx: ``(B, N, k)`` indices of those references into M.
        eps: added to the squared distances, so coincident points do not divide by zero.

    Returns:
        ``(B, N, C)``: ``sum_j w_j f(r_j) / sum_j w_j`` with ``w_j = 1 / (dist_j + eps)``; the nearest reference's
        features when k = 1.
    """
    nbr = gather(ref_feats, idx)  # (B, N, k, C)
    if idx.shape[-1] == 1:
        return nbr.squeeze(2)
    w = 1.0 / (dist + eps)
    w = (w / w.sum(-1, keepdim=True)).to(ref_feats.dtype)
    return (nbr * w.unsqueeze(-1)).sum(2)


def nearest_upsample(query_pos: Tensor, ref_pos: Tensor, ref_feats: Tensor, *, backend: str = "auto") -> Tensor:
    """Each query point takes the features of its nearest reference point: ``(B, M, C)`` -> ``(B, N, C)``."""
    return interpolate(query_pos, ref_pos, ref_feats, k=1, backend=backend)
