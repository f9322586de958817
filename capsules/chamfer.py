"""Chamfer distance between two point clouds, the reconstruction loss of the point capsule autoencoder.

Definition (pinned; training logs and metrics print :data:`CHAMFER_DEFINITION` next to every number):

    Chamfer distance = mean over a of min over b ||a - b||^2 + mean over b of min over a ||b - a||^2 (squared L2, sum
    of the two directional means, no factor 1/2), averaged over the batch

Per cloud pair ``(a_b, b_b)`` with N and M points this is ``cd_b = 1/N sum_i min_j |a_i - b_j|^2 + 1/M sum_j min_i
|b_j - a_i|^2``; the loss is ``1/B sum_b cd_b``. "Mean over both directions" in the design (and in the point capsule
reference code, ``mean(dist1) + mean(dist2)``, and in ``pytorch3d.loss.chamfer_distance``) means each direction is a
mean over its points and the two directions are **added**, not averaged: a Chamfer number printed here is twice the
"average of both directions" convention. Papers also mix squared and unsquared distances and scale factors (the
paper's table is Chamfer x 1e-3): ``squared=False`` replaces ``|.|^2`` with ``|.|`` and the definition string changes
with it (:func:`chamfer_definition`).

Backends (all agree with ``"dense"``, the ground truth, in value and gradient; ``tests/capsules/test_chamfer.py``):

=================  ==================================================================================================
backend            nearest-neighbour search
=================  ==================================================================================================
``dense``          full ``(B, N, M)`` distance matrix, ``min`` over each axis, autograd through it (reference)
``chunked``        :func:`attention.knn_chunked` in the inputs' precision: chunks of at most ``chunk_bytes``, exact
                   ``sum_c (a_c - b_c)^2`` for the final choice (CPU, CUDA)
``knn_torch``      :func:`attention.knn` ``backend="torch"`` (matmul brute force, memory bounded)
``knn_cluster``    :func:`attention.knn` ``backend="cluster"`` (torch-cluster kd-tree on CPU; searches in float32)
``pytorch3d``      ``pytorch3d.ops.knn_points`` with K = 1 (CPU and CUDA kernels; searches in float32), where its
                   extension loads (``attention.backends.HAS_PYTORCH3D``)
=================  ==================================================================================================

Every backend but ``dense`` finds the nearest indices without autograd and then recomputes the distances to the
chosen neighbours with it, ``d_i = |a_i - b_{idx_i}|^2``: the gradient of a min is the gradient at its argmin, so this
is the dense gradient (ties aside) at O((N + M) C) memory for the backward pass instead of O(N M).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import Tensor

from attention import gather, knn, resolve
from attention.checks import check_points
from attention.chunking import chunk_budget
from attention.points import knn_chunked

__all__ = [
    "CHAMFER_BACKENDS",
    "CHAMFER_DEFINITION",
    "ChamferOutput",
    "chamfer_definition",
    "chamfer_distance",
]

CHAMFER_DEFINITION = (
    "Chamfer distance = mean over a of min over b ||a - b||^2 + mean over b of min over a ||b - a||^2 "
    "(squared L2, sum of the two directional means, no factor 1/2), averaged over the batch"
)


_REDUCTIONS = ("mean", "sum", "none")


class ChamferOutput(NamedTuple):
    """What :func:`chamfer_distance` returns when per-point values or indices are requested.

    Shapes:
        loss: ``()`` for ``reduction="mean"|"sum"``, ``(B,)`` for ``"none"``.
        dist_a: ``(B, N)``, each point of a to its nearest point of b (squared unless ``squared=False``), or None.
        dist_b: ``(B, M)``, each point of b to its nearest point of a, or None.
        idx_a: ``(B, N)`` int64 indices into b's M axis, or None.
        idx_b: ``(B, M)`` int64 indices into a's N axis, or None.
    """

    loss: Tensor
    dist_a: Tensor | None
    dist_b: Tensor | None
    idx_a: Tensor | None
    idx_b: Tensor | None


def chamfer_definition(*, squared: bool = True, reduction: str = "mean") -> str:
    """The definition string of a number computed with these options; the defaults give :data:`CHAMFER_DEFINITION`."""
    if reduction not in _REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; choose one of {list(_REDUCTIONS)}")
    text = CHAMFER_DEFINITION
    if not squared:
        text = text.replace("||a - b||^2", "||a - b||").replace("||b - a||^2", "||b - a||")
        text = text.replace("(squared L2,", "(Euclidean L2, not squared,")
    if reduction == "sum":
        text = text.replace("averaged over the batch", "summed over the batch")
    elif reduction == "none":
        text = text.replace("averaged over the batch", "one value per cloud pair")
    return text


# --------------------------------------------------------------------------------------------------------------------
# Nearest-neighbour searches: each returns (dist_a, dist_b, idx_a, idx_b) with squared distances
# --------------------------------------------------------------------------------------------------------------------


def _dense(a: Tensor, b: Tensor, chunk_bytes: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Reference: the full matrix of squared distances, minimized along each axis, autograd straight through."""
    d = (a.unsqueeze(2) - b.unsqueeze(1)).pow(2).sum(-1)  # (B, N, M)
    dist_a, idx_a = d.min(dim=2)  # (B, N): nearest b of every a
    dist_b, idx_b = d.min(dim=1)  # (B, M): nearest a of every b
    return dist_a, dist_b, idx_a, idx_b


def _search_chunked(a: Tensor, b: Tensor, chunk_bytes: int) -> tuple[Tensor, Tensor]:
    idx_a = knn_chunked(a, b, 1, chunk_bytes=chunk_bytes)[1].squeeze(-1)
    idx_b = knn_chunked(b, a, 1, chunk_bytes=chunk_bytes)[1].squeeze(-1)
    return idx_a, idx_b


def _search_knn(backend: str):
    def search(a: Tensor, b: Tensor, chunk_bytes: int) -> tuple[Tensor, Tensor]:
        idx_a = knn(a.detach(), b.detach(), 1, backend=backend, chunk_bytes=chunk_bytes)[1].squeeze(-1)
        idx_b = knn(b.detach(), a.detach(), 1, backend=backend, chunk_bytes=chunk_bytes)[1].squeeze(-1)
        return idx_a, idx_b

    return search


def _search_pytorch3d(a: Tensor, b: Tensor, chunk_bytes: int) -> tuple[Tensor, Tensor]:
    from pytorch3d.ops import knn_points

    a_, b_ = a.detach().float(), b.detach().float()  # its CPU kernel takes float32 only
    idx_a = knn_points(a_, b_, K=1, return_nn=False).idx.squeeze(-1)
    idx_b = knn_points(b_, a_, K=1, return_nn=False).idx.squeeze(-1)
    return idx_a, idx_b


def _recompute(search):
    """Wraps an index search: distances to the chosen neighbours are recomputed with autograd."""

    def run(a: Tensor, b: Tensor, chunk_bytes: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        idx_a, idx_b = search(a, b, chunk_bytes)
        dist_a = (a - gather(b, idx_a)).pow(2).sum(-1)  # (B, N)
        dist_b = (b - gather(a, idx_b)).pow(2).sum(-1)  # (B, M)
        return dist_a, dist_b, idx_a, idx_b

    return run


CHAMFER_BACKENDS = {
    "dense": _dense,
    "chunked": _recompute(_search_chunked),
    "knn_torch": _recompute(_search_knn("torch")),
    "knn_cluster": _recompute(_search_knn("cluster")),
    "pytorch3d": _recompute(_search_pytorch3d),
}


def _resolve_backend(backend: str, a: Tensor, b: Tensor) -> str:
    """The backend for these clouds: :func:`attention.backends.resolve` (the one switchboard) given their sizes."""
    B, N, C = a.shape
    shape = {"B": B, "N": N, "M": b.shape[1], "C": C, "itemsize": a.element_size()}
    return resolve("chamfer", backend, a.device, shape, a.dtype)


def _safe_sqrt(x: Tensor) -> Tensor:
    """``sqrt(x)`` for ``x >= 0`` whose gradient at 0 is 0 instead of inf (coincident points, a perfect fit)."""
    pos = x > 0
    return torch.where(pos, torch.where(pos, x, torch.ones_like(x)).sqrt(), torch.zeros_like(x))


def chamfer_distance(
    a: Tensor,
    b: Tensor,
    *,
    reduction: str = "mean",
    squared: bool = True,
    return_per_point: bool = False,
    return_indices: bool = False,
    backend: str = "auto",
    chunk_bytes: int | None = None,
) -> Tensor | ChamferOutput:
    """Chamfer distance between the clouds ``a`` and ``b`` of every batch element.

    Chamfer distance = mean over a of min over b ||a - b||^2 + mean over b of min over a ||b - a||^2 (squared L2, sum
    of the two directional means, no factor 1/2), averaged over the batch

    That sentence is :data:`CHAMFER_DEFINITION`, the default (``reduction="mean"``, ``squared=True``); print it (or
    :func:`chamfer_definition` for other options) next to every reported number. Points are always averaged within
    each direction; ``reduction`` only acts on the batch axis.

    Args:
        a: ``(B, N, C)`` points (C = 3 for coordinates; any C works), floating point, finite.
        b: ``(B, M, C)`` points with the same B, C, dtype and device; N and M may differ.
        reduction: ``"mean"`` (over the batch, a scalar), ``"sum"`` (over the batch, a scalar) or ``"none"`` (the
            ``(B,)`` per-cloud-pair values ``mean_i d(a_i) + mean_j d(b_j)``).
        squared: True for squared L2 (the pinned definition); False for the Euclidean distance ``sqrt`` of it, whose
            gradient is taken as 0 at coincident points (finite, no NaN).
        return_per_point: also return the per-point distances ``dist_a (B, N)`` and ``dist_b (B, M)`` (same
            ``squared`` convention as the loss, differentiable).
        return_indices: also return the nearest indices ``idx_a (B, N)`` into b and ``idx_b (B, M)`` into a.
        backend: ``"auto"``, ``"dense"``, ``"chunked"``, ``"knn_torch"``, ``"knn_cluster"`` or ``"pytorch3d"`` (see
            the module docstring). ``"auto"``: chunked on CUDA; on CPU the dense reference for small inputs,
            knn_cluster for C <= 4 (not float64) when installed, else chunked (``attention.backends.AUTO_ORDER``).
        chunk_bytes: memory budget of one tile of the distance matrix for ``"chunked"`` (and ``"knn_torch"``); default
            ``attention.chunking.chunk_budget("chamfer", device)`` (32 MiB).

    Returns:
        The loss alone when neither ``return_per_point`` nor ``return_indices`` is set; otherwise a
        :class:`ChamferOutput` ``(loss, dist_a, dist_b, idx_a, idx_b)`` with None in the fields not requested.
    """
    check_points(a, "a")
    check_points(b, "b", like=a, like_name="a")
    if a.dtype != b.dtype:
        raise TypeError(f"a and b must have the same dtype, got {a.dtype} and {b.dtype}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"unknown reduction {reduction!r}; choose one of {list(_REDUCTIONS)}")
    if chunk_bytes is None:
        chunk_bytes = chunk_budget("chamfer", a.device)
    if isinstance(chunk_bytes, bool) or not isinstance(chunk_bytes, int) or chunk_bytes < 1:
        raise ValueError(f"chunk_bytes must be a positive int, got {chunk_bytes!r}")
    name = _resolve_backend(backend, a, b)
    dist_a, dist_b, idx_a, idx_b = CHAMFER_BACKENDS[name](a, b, chunk_bytes)
    if not squared:
        dist_a, dist_b = _safe_sqrt(dist_a), _safe_sqrt(dist_b)
    loss = dist_a.mean(1) + dist_b.mean(1)  # (B,): sum of the two directional means
    if reduction == "mean":
        loss = loss.mean()
    elif reduction == "sum":
        loss = loss.sum()
    if not (return_per_point or return_indices):
        return loss
    return ChamferOutput(
        loss,
        dist_a if return_per_point else None,
        dist_b if return_per_point else None,
        idx_a if return_indices else None,
        idx_b if return_indices else None,
    )
