"""Point-cloud augmentations and test-time voting.

Conventions shared by every transform here:

* A transform is a callable ``t(points, rng=None)`` on one cloud of shape ``(N, C)``, ``C >= 3``. Columns 0:3 are
  x, y, z; when ``C >= 6`` columns 3:6 are unit normals and are transformed consistently (rotated, or multiplied by
  the inverse scale and renormalized); any further columns are carried along untouched.
* ``points`` may be a NumPy array or a torch tensor; the result has the same type, dtype and device. The math runs
  in NumPy so that both inputs give identical numbers for the same generator.
* All randomness comes from ``rng``: a ``numpy.random.Generator`` (or an int seed, turned into one). The same
  generator state gives the same output. ``rng=None`` draws from fresh OS entropy (not reproducible); the datasets in
  :mod:`pointcloud.data` never do that: they pass ``augmentation_rng(seed, epoch, index)``.

Per-sample determinism: a training loop that wants augmentation to be a function of ``(seed, epoch, index)`` only
(so that a killed run resumes bit-for-bit, whatever the number of DataLoader workers) calls
``dataset.set_epoch(epoch)`` before iterating each epoch; the dataset then feeds ``augmentation_rng(seed, epoch,
index)`` to its transform for sample ``index``. The same helper can be used for batch-level augmentation outside a
dataset.

Test-time voting (:func:`vote_logits`) follows the common ModelNet40 practice (PointNet++, DGCNN, PAConv): average
the logits over several randomly scaled copies of each test cloud.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

__all__ = [
    "Compose",
    "EpochAugmented",
    "Jitter",
    "NormalizeUnitSphere",
    "PointTransform",
    "RandomPointDropout",
    "RandomRotateUp",
    "RandomScale",
    "RandomTranslate",
    "ShufflePoints",
    "augmentation_rng",
    "normalize_unit_sphere",
    "rotation_about_axis",
    "vote_logits",
]

_logger = logging.getLogger(__name__)

ArrayT = TypeVar("ArrayT", np.ndarray, Tensor)
RngLike = np.random.Generator | int | None

_AXES = {"x": 0, "y": 1, "z": 2}


def augmentation_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The generator that drives the augmentation of sample ``index`` in ``epoch``.

    ``np.random.default_rng((seed, epoch, index))``: independent streams for every triple, and no dependence on
    global state, worker id or the order in which samples are drawn.

    Args:
        seed: The run's augmentation seed (non-negative).
        epoch: The epoch number (non-negative).
        index: The dataset index of the sample (non-negative).
    """
    if min(seed, epoch, index) < 0:
        raise ValueError(f"seed, epoch and index must be non-negative, got seed={seed}, epoch={epoch}, index={index}")
    return np.random.default_rng((seed, epoch, index))


class EpochAugmented:
    """The epoch of a dataset whose augmentation is :func:`augmentation_rng` of ``(seed, epoch, index)``.

    It lives in a shared-memory tensor, so ``set_epoch`` in the main process reaches (persistent) DataLoader workers
    too. Subclasses call :meth:`_init_epoch` in their ``__init__``.
    """

    _epoch: Tensor

    def _init_epoch(self) -> None:
        self._epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    @property
    def epoch(self) -> int:
        return int(self._epoch.item())

    def set_epoch(self, epoch: int) -> None:
        """Select the augmentation stream of ``epoch``; call before ``iter(loader)`` of that epoch."""
        if epoch < 0:
            raise ValueError(f"epoch must be non-negative, got {epoch}")
        self._epoch.fill_(int(epoch))


def _as_rng(rng: RngLike) -> np.random.Generator:
    if isinstance(rng, np.random.Generator):
        return rng
    if rng is None or isinstance(rng, int | np.integer):
        return np.random.default_rng(rng)
    raise TypeError(f"rng must be a numpy.random.Generator, an int seed or None, got {type(rng).__name__}")


def normalize_unit_sphere(xyz: np.ndarray) -> np.ndarray:
    """Center ``(N, 3)`` points at their centroid and scale the largest norm to 1 (a single point stays at 0)."""
    xyz = xyz - xyz.mean(axis=0, keepdims=True)
    radius = float(np.sqrt((xyz**2).sum(axis=1)).max()) if len(xyz) else 0.0
    return xyz / radius if radius > 0 else xyz


class PointTransform:
    """Base class: converts torch <-> NumPy, checks the shape, and hands ``apply`` a float NumPy array + generator.

    Subclasses implement ``apply(points, rng) -> points`` on a NumPy array of shape ``(N, C)``.
    """

    def __call__(self, points: ArrayT, rng: RngLike = None) -> ArrayT:
        if points.ndim != 2 or points.shape[1] < 3:
            raise ValueError(
                f"{type(self).__name__} expects one cloud of shape (N, C) with C >= 3, got {tuple(points.shape)}"
            )
        generator = _as_rng(rng)
        if isinstance(points, Tensor):
            out = self.apply(points.detach().cpu().numpy(), generator)
            return torch.from_numpy(np.ascontiguousarray(out)).to(device=points.device, dtype=points.dtype)
        out = self.apply(np.asarray(points), generator)
        return out.astype(points.dtype, copy=False)

    def apply(self, points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        """Transform ``points`` ``(N, C)``; must not modify the input in place."""
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({args})"


class Compose(PointTransform):
    """Apply transforms in order, all drawing from the same generator.

    Args:
        transforms: Callables ``t(points, rng)``; a plain ``t(points)`` without an ``rng`` parameter is not accepted
            (it would hide unseeded randomness).
    """

    def __init__(self, transforms: Sequence[Callable]) -> None:
        self.transforms = list(transforms)

    def __call__(self, points: ArrayT, rng: RngLike = None) -> ArrayT:
        generator = _as_rng(rng)
        for t in self.transforms:
            points = t(points, generator)
        return points

    def __repr__(self) -> str:
        inner = ",\n    ".join(repr(t) for t in self.transforms)
        return f"Compose([\n    {inner}\n])"


class RandomScale(PointTransform):
    """Multiply the coordinates by a factor drawn uniformly from ``[lo, hi]``.

    Args:
        lo: Smallest factor.
        hi: Largest factor.
        anisotropic: One factor per axis (as in PointNet++ / DGCNN training) instead of one for all axes. Normals are
            multiplied by the inverse factors and renormalized, which keeps them perpendicular to the scaled surface.
    """

    def __init__(self, lo: float = 0.8, hi: float = 1.25, anisotropic: bool = True) -> None:
        if not 0 < lo <= hi:
            raise ValueError(f"RandomScale needs 0 < lo <= hi, got lo={lo}, hi={hi}")
        self.lo, self.hi, self.anisotropic = lo, hi, anisotropic

    def apply(self, points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        scale = rng.uniform(self.lo, self.hi, size=3 if self.anisotropic else 1)
        return _scale_points(points, np.broadcast_to(scale, (3,)))


def _scale_points(points: np.ndarray, scale: np.ndarray) -> np.ndarray:
    out = points.copy()
    out[:, :3] = points[:, :3] * scale
    if points.shape[1] >= 6:
        normals = points[:, 3:6] / scale
        norm = np.linalg.norm(normals, axis=1, keepdims=True)
        out[:, 3:6] = np.where(norm > 0, normals / np.maximum(norm, 1e-12), 0.0)
    return out


class RandomTranslate(PointTransform):
    """Add one offset drawn uniformly from ``[-shift, shift]`` per axis to every point (normals unchanged).

    Args:
        shift: Largest offset per axis.
    """

    def __init__(self, shift: float = 0.1) -> None:
        if shift < 0:
            raise ValueError(f"RandomTranslate needs shift >= 0, got {shift}")
        self.shift = shift

    def apply(self, points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = points.copy()
        out[:, :3] = points[:, :3] + rng.uniform(-self.shift, self.shift, size=3)
        return out


class Jitter(PointTransform):
    """Add clipped Gaussian noise to every coordinate (PointNet's ``jitter_point_cloud``; normals unchanged).

    Args:
        sigma: Standard deviation of the noise.
        clip: Noise is clipped to ``[-clip, clip]``.
    """

    def __init__(self, sigma: float = 0.01, clip: float = 0.05) -> None:
        if sigma < 0 or clip < 0:
            raise ValueError(f"Jitter needs sigma >= 0 and clip >= 0, got sigma={sigma}, clip={clip}")
        self.sigma, self.clip = sigma, clip

    def apply(self, points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = points.copy()
        noise = np.clip(self.sigma * rng.standard_normal((len(points), 3)), -self.clip, self.clip)
        out[:, :3] = points[:, :3] + noise
        return out


class RandomRotateUp(PointTransform):
    """Rotate about the up axis by an angle drawn uniformly from ``[-max_angle, max_angle]``.

    Args:
        axis: The up axis, ``"x"``, ``"y"`` or ``"z"`` (or 0, 1, 2). ModelNet40's HDF5 and normal-resampled releases
            are y-up; the raw ``.off`` meshes and :class:`pointcloud.data.SyntheticShapes` are z-up.
        max_angle: Largest rotation in radians; the default is a full turn.
    """

    def __init__(self, axis: str | int = "y", max_angle: float = math.pi) -> None:
        if isinstance(axis, str):
            if axis not in _AXES:
                raise ValueError(f"axis must be one of 'x', 'y', 'z' or 0, 1, 2, got {axis!r}")
            axis = _AXES[axis]
        if axis not in (0, 1, 2):
            raise ValueError(f"axis must be one of 'x', 'y', 'z' or 0, 1, 2, got {axis!r}")
        self.axis, self.max_angle = axis, max_angle

    def apply(self, points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        angle = rng.uniform(-self.max_angle, self.max_angle)
        rot = rotation_about_axis(self.axis, angle)
        out = points.copy()
        out[:, :3] = points[:, :3] @ rot.T
        if points.shape[1] >= 6:
            out[:, 3:6] = points[:, 3:6] @ rot.T
        return out


def rotation_about_axis(axis: int, angle: float) -> np.ndarray:
    """The ``(3, 3)`` right-handed rotation matrix about coordinate ``axis`` (0, 1, 2) by ``angle`` radians."""
    c, s = math.cos(angle), math.sin(angle)
    i, j = [a for a in range(3) if a != axis]
    if axis == 1:  # keep the rotation right-handed: about y the plane is (z, x), not (x, z)
        i, j = j, i
    rot = np.eye(3)
    rot[i, i], rot[i, j], rot[j, i], rot[j, j] = c, -s, s, c
    return rot


class RandomPointDropout(PointTransform):
    """PointNet++'s ``random_point_dropout``: drop a random fraction of points, keeping the shape ``(N, C)``.

    A ratio ``r`` is drawn from ``[0, max_ratio)``; each point is dropped with probability ``r`` and replaced by a copy
    of the first point, so batches keep a fixed size and max-pooling is unaffected by the duplicates.

    Args:
        max_ratio: Largest dropout ratio.
    """

    def __init__(self, max_ratio: float = 0.875) -> None:
        if not 0 <= max_ratio < 1:
            raise ValueError(f"RandomPointDropout needs 0 <= max_ratio < 1, got {max_ratio}")
        self.max_ratio = max_ratio

    def apply(self, points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        ratio = rng.random() * self.max_ratio
        drop = rng.random(len(points)) <= ratio
        out = points.copy()
        out[drop] = points[0]
        return out


class ShufflePoints(PointTransform):
    """Randomly permute the order of the points (DGCNN shuffles in training; FPS-initialized models see a new start)."""

    def apply(self, points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        return points[rng.permutation(len(points))]


class NormalizeUnitSphere(PointTransform):
    """Center the coordinates at their centroid and scale the largest norm to 1 (deterministic; normals unchanged)."""

    def apply(self, points: np.ndarray, rng: np.random.Generator) -> np.ndarray:
        out = points.copy()
        out[:, :3] = normalize_unit_sphere(points[:, :3].astype(np.float64))
        return out

    def __call__(self, points: ArrayT, rng: RngLike = None) -> ArrayT:
        # No randomness: skip creating an OS-entropy generator when none is given.
        return super().__call__(points, 0 if rng is None else rng)


@torch.no_grad()
def vote_logits(
    model_fn: Callable[[Tensor], Tensor],
    points: Tensor,
    num_votes: int = 10,
    seed: int = 0,
    scale_range: tuple[float, float] = (0.8, 1.25),
    anisotropic: bool = True,
) -> Tensor:
    """Test-time voting: the mean of the logits over ``num_votes`` randomly scaled copies of the batch.

    Vote 0 is the unscaled batch, so ``num_votes=1`` is plain evaluation. Votes 1.. multiply each cloud's coordinates
    by its own factors drawn uniformly from ``scale_range`` (one per axis if ``anisotropic``), the augmentation most
    ModelNet40 code votes over; normals (columns 3:6), if present, get the inverse scale and are renormalized. The
    factors come from ``numpy.random.default_rng(seed)`` and are drawn for the whole batch at once, so the result
    depends on ``seed``, ``num_votes`` and the batch composition, never on global random state. Runs under
    ``torch.no_grad``; put the model in eval mode first.

    Args:
        model_fn: Maps points ``(B, N, C)`` to logits ``(B, num_classes)``.
        points: ``(B, N, C)`` clouds, ``C >= 3``.
        num_votes: Number of copies to average (>= 1).
        seed: Seed of the scale factors.
        scale_range: ``(lo, hi)`` of the uniform scale factors.
        anisotropic: One factor per axis instead of one per cloud.

    Returns:
        ``(B, num_classes)`` mean logits.
    """
    if points.ndim != 3 or points.shape[-1] < 3:
        raise ValueError(f"points must be (B, N, C) with C >= 3, got {tuple(points.shape)}")
    if num_votes < 1:
        raise ValueError(f"num_votes must be >= 1, got {num_votes}")
    B, _, C = points.shape
    lo, hi = scale_range
    rng = np.random.default_rng(seed)
    factors = rng.uniform(lo, hi, size=(num_votes - 1, B, 3 if anisotropic else 1))
    factors = torch.from_numpy(np.broadcast_to(factors, (num_votes - 1, B, 3)).copy()).to(points)  # (V-1, B, 3)
    total = model_fn(points).float()
    for v in range(num_votes - 1):
        scale = factors[v][:, None, :]  # (B, 1, 3)
        scaled = points.clone()
        scaled[..., :3] = points[..., :3] * scale
        if C >= 6:
            scaled[..., 3:6] = torch.nn.functional.normalize(points[..., 3:6] / scale, dim=-1)
        total = total + model_fn(scaled).float()
    return total / num_votes
