"""Centroid inits ``u^0 = I(x)``: FPS, random, mean pool, k-means, a learned linear map, a depth-wise conv on a grid.

Wu et al., "Centroid Transformers", arXiv:2102.08606, section 3.1. Every init takes ``(x, pos=None, mask=None)`` and
returns a :class:`CentroidOutput` ``(x, pos, index)``; :data:`CENTROID_INITS` maps names to classes.
:class:`DWConv2dInit` (the vision models' init) is plain tensor code that FX, TorchScript and dynamo follow; its
input validation runs in eager mode only (:func:`attention.checks.checks_active`). Under ``torch.compile`` its conv is
written as k * k shifted multiply-adds, which the compiler fuses with the ops around it; eager mode, FX, TorchScript
and ``torch.export`` keep ``nn.Conv2d``.
"""

import math
from typing import NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checks import checks_active, is_compiling
from ..points import farthest_point_sample, gather, knn

__all__ = [
    "CENTROID_INITS",
    "CentroidOutput",
    "DWConv2dInit",
    "FPSInit",
    "KMeansInit",
    "LinearInit",
    "MeanPoolInit",
    "RandomInit",
    "build_centroid_init",
    "resolve_num_centroids",
]


class CentroidOutput(NamedTuple):
    """What a centroid init or block returns.

    Attributes:
        x: ``(B, M, C)`` centroid features.
        pos: ``(B, M, P)`` centroid positions (selected or averaged from the input positions), or None.
        index: ``(B, M)`` indices of the inputs the centroids were sampled from, or None for averaged inits.
    """

    # typing.Optional, not ``Tensor | None``: TorchScript resolves NamedTuple fields from their annotations.
    x: Tensor
    pos: Optional[Tensor]  # noqa: UP045
    index: Optional[Tensor]  # noqa: UP045


def resolve_num_centroids(spec: int | float, num_inputs: int) -> int:
    """M from an absolute count (int) or a fraction of the N inputs (float in (0, 1]), at least 1."""
    if isinstance(spec, bool) or not isinstance(spec, (int, float)) or spec <= 0:
        raise ValueError(f"num_centroids must be a positive int or a fraction in (0, 1], got {spec!r}")
    if isinstance(spec, float):
        if spec > 1:
            raise ValueError(f"a fractional num_centroids must lie in (0, 1], got {spec}")
        return max(1, round(spec * num_inputs))
    return spec


def _masked_or_plain(mask: Tensor | None, name: str) -> None:
    if mask is not None and checks_active() and not bool(mask.all()):
        raise ValueError(f"the {name!r} centroid init does not support padded inputs (mask has False entries)")


class FPSInit(nn.Module):
    """Centroids = the inputs picked by farthest point sampling, in position or feature space.

    Args:
        num_centroids: M, or a fraction of the N inputs (a float in (0, 1]; also for the random, mean-pool and
            k-means inits).
        space: ``"pos"`` (needs positions, e.g. xyz) or ``"features"``.
        backend: FPS backend (:func:`attention.farthest_point_sample`).
    """

    def __init__(self, num_centroids: int | float, space: str = "pos", backend: str = "auto") -> None:
        super().__init__()
        if space not in ("pos", "features"):
            raise ValueError(f"space must be 'pos' or 'features', got {space!r}")
        self.num_centroids = num_centroids
        self.space = space
        self.backend = backend

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        if self.space == "pos" and pos is None:
            raise ValueError("FPSInit(space='pos') needs input positions: pass pos=(B, N, P)")
        source = pos if self.space == "pos" else x
        start = 0 if mask is None else mask.int().argmax(1)  # the first real input of each cloud
        M = resolve_num_centroids(self.num_centroids, x.shape[1])
        idx = farthest_point_sample(source, M, start=start, mask=mask, backend=self.backend)
        return CentroidOutput(gather(x, idx), None if pos is None else gather(pos, idx), idx)


class RandomInit(nn.Module):
    """Centroids = a uniformly random subset of the (real) inputs.

    In training a fresh subset is drawn from torch's global generator each call; in eval the subset comes from a
    generator seeded with ``eval_seed``, so evaluation is deterministic.
    """

    def __init__(self, num_centroids: int | float, eval_seed: int = 0) -> None:
        super().__init__()
        self.num_centroids = num_centroids
        self.eval_seed = eval_seed

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        B, N, _ = x.shape
        M = resolve_num_centroids(self.num_centroids, N)
        if self.training:
            keys = torch.rand(B, N, device=x.device)
        else:
            g = torch.Generator(device="cpu").manual_seed(self.eval_seed)
            keys = torch.rand(B, N, generator=g).to(x.device)
        if mask is not None:
            if checks_active() and int(mask.sum(1).min()) < M:
                raise ValueError(f"random init needs M={M} real inputs per cloud, got fewer")
            keys = keys.masked_fill(~mask, 2.0)  # padded inputs sort last
        idx = keys.argsort(dim=1)[:, :M]
        return CentroidOutput(gather(x, idx), None if pos is None else gather(pos, idx), idx)


class MeanPoolInit(nn.Module):
    """Centroids = means of M runs of consecutive inputs (adaptive average pooling along N)."""

    def __init__(self, num_centroids: int | float) -> None:
        super().__init__()
        self.num_centroids = num_centroids

    def _pool(self, t: Tensor, w: Tensor | None) -> Tensor:
        M = resolve_num_centroids(self.num_centroids, t.shape[1])
        if w is None:
            return F.adaptive_avg_pool1d(t.transpose(1, 2), M).transpose(1, 2)
        num = F.adaptive_avg_pool1d((t * w).transpose(1, 2), M)
        den = F.adaptive_avg_pool1d(w.transpose(1, 2), M)
        if checks_active() and not bool((den > 0).all()):
            raise ValueError("mean_pool init: a window of consecutive inputs is all padding; put real inputs first")
        return (num / den.clamp_min(1e-12)).transpose(1, 2)

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        w = None if mask is None else mask.unsqueeze(-1).to(x.dtype)
        return CentroidOutput(self._pool(x, w), None if pos is None else self._pool(pos, w), None)


class KMeansInit(nn.Module):
    """Centroids = means of k-means clusters: FPS seeds, then ``num_iters`` Lloyd iterations.

    Assignments use squared L2 in ``space`` (no gradient through them); the returned features and positions are
    the means of each cluster's inputs, differentiable in the inputs. An empty cluster keeps its previous centre.
    """

    def __init__(
        self,
        num_centroids: int | float,
        num_iters: int = 3,
        space: str = "pos",
        fps_backend: str = "auto",
        knn_backend: str = "auto",
    ) -> None:
        super().__init__()
        self.seed = FPSInit(num_centroids, space=space, backend=fps_backend)
        self.num_centroids = num_centroids
        self.num_iters = num_iters
        self.space = space
        self.knn_backend = knn_backend

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        seed = self.seed(x, pos, mask)
        source = pos if self.space == "pos" else x
        centers = gather(source, seed.index).detach()
        assign = None
        with torch.no_grad():
            for _ in range(self.num_iters):
                _, nn_idx = knn(source.detach(), centers, 1, backend=self.knn_backend)
                assign = nn_idx[..., 0]  # (B, N)
                centers = self._means(source.detach(), assign, mask, fallback=centers)
        if assign is None:  # num_iters == 0: plain FPS
            return seed
        feats = self._means(x, assign, mask, fallback=seed.x)
        centre_pos = None if pos is None else self._means(pos, assign, mask, fallback=seed.pos)
        return CentroidOutput(feats, centre_pos, None)

    def _means(self, t: Tensor, assign: Tensor, mask: Tensor | None, fallback: Tensor) -> Tensor:
        B, N, C = t.shape
        M = fallback.shape[1]
        w = torch.ones(B, N, 1, dtype=t.dtype, device=t.device) if mask is None else mask[..., None].to(t.dtype)
        sums = t.new_zeros(B, M, C).scatter_add(1, assign[..., None].expand(-1, -1, C), t * w)
        counts = t.new_zeros(B, M, 1).scatter_add(1, assign[..., None], w)
        return torch.where(counts > 0, sums / counts.clamp_min(1.0), fallback)


class LinearInit(nn.Module):
    """Centroids = a learned linear map over the input axis, ``u_m = sum_n W[m, n] x_n + b_m`` (fixed N).

    Used by the capsule network, where the N primary capsules have a fixed order. W starts as an averaging map
    (each centroid the mean of a run of consecutive inputs) plus small noise.
    """

    def __init__(self, num_inputs: int, num_centroids: int) -> None:
        super().__init__()
        self.num_inputs = num_inputs
        self.num_centroids = num_centroids
        weight = F.adaptive_avg_pool1d(torch.eye(num_inputs)[None], num_centroids)[0].t()  # (M, N) averaging
        self.weight = nn.Parameter(weight + 0.01 * torch.randn(num_centroids, num_inputs) / math.sqrt(num_inputs))
        self.bias = nn.Parameter(torch.zeros(num_centroids, 1))

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        if not torch.jit.is_scripting() and checks_active():
            if x.dim() != 3 or x.shape[1] != self.num_inputs:
                raise ValueError(
                    f"LinearInit was built for N={self.num_inputs} inputs, got x of shape {tuple(x.shape)}"
                )
            _masked_or_plain(mask, "linear")
        u = torch.einsum("mn,bnc->bmc", self.weight, x) + self.bias
        p = None if pos is None else torch.einsum("mn,bnp->bmp", self.weight, pos)
        return CentroidOutput(u, p, None)


def _depthwise_conv_taps(
    x: Tensor, weight: Tensor, bias: Tensor | None, grid_size: tuple[int, int], stride: int
) -> Tensor:
    """``Conv2d(C, C, k, stride, padding=k // 2, groups=C)`` on row-major grid tokens, as k * k strided slices.

    Under autocast the operands are cast to autocast's dtype, as the conv's are, so the result has the conv's dtype.

    Shapes:
        x: ``(B, H * W, C)``; weight: ``(C, 1, k, k)``; bias: ``(C,)``; output: ``(B, M, C)`` with
        ``M = ((H - 1) // stride + 1) * ((W - 1) // stride + 1)``, the conv's output grid in row-major order.
    """
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight = x.to(dtype), weight.to(dtype)
        bias = None if bias is None else bias.to(dtype)
    elif x.dtype != weight.dtype:
        raise ValueError(f"DWConv2dInit: tokens are {x.dtype} but the conv's weight is {weight.dtype}")
    B, _, C = x.shape
    gh, gw = grid_size
    k = weight.shape[-1]
    p = k // 2
    oh, ow = (gh - 1) // stride + 1, (gw - 1) // stride + 1
    g = F.pad(x.reshape(B, gh, gw, C), (0, 0, p, p, p, p))  # (B, H + 2p, W + 2p, C), zeros around the grid
    w = weight.reshape(C, k * k)
    u = g[:, 0 : stride * (oh - 1) + 1 : stride, 0 : stride * (ow - 1) + 1 : stride] * w[:, 0]
    for t in range(1, k * k):
        i, j = divmod(t, k)
        u = u + g[:, i : i + stride * (oh - 1) + 1 : stride, j : j + stride * (ow - 1) + 1 : stride] * w[:, t]
    if bias is not None:
        u = u + bias
    return u.reshape(B, oh * ow, C)


class DWConv2dInit(nn.Module):
    """Centroids from a token grid: a depth-wise conv (kernel 3, stride 2, padding 1) on the ``(H, W)`` grid.

    N = H * W tokens in row-major order become ``ceil(H / 2) * ceil(W / 2)`` centroids (N / 4 for even sides).
    The conv starts as an averaging filter (``avg_init=True``), so a pretrained model's tokens pass through it
    as local means.
    """

    def __init__(
        self, dim: int, grid_size: tuple[int, int], kernel_size: int = 3, stride: int = 2, avg_init: bool = True
    ) -> None:
        super().__init__()
        if kernel_size % 2 != 1:
            raise ValueError(
                f"kernel_size must be odd (padding kernel_size // 2 keeps the grid aligned), got {kernel_size}"
            )
        self.grid_size = (int(grid_size[0]), int(grid_size[1]))
        self.kernel_size, self.stride = kernel_size, stride
        self.conv = nn.Conv2d(dim, dim, kernel_size, stride=stride, padding=kernel_size // 2, groups=dim)
        gh, gw = self.grid_size
        self.out_grid_size = ((gh - 1) // stride + 1, (gw - 1) // stride + 1)  # the conv's output size, odd kernel
        self.num_centroids = self.out_grid_size[0] * self.out_grid_size[1]
        if avg_init:
            nn.init.constant_(self.conv.weight, 1.0 / kernel_size**2)
            nn.init.zeros_(self.conv.bias)

    @torch.jit.unused
    def check_inputs(self, x: Tensor, mask: Tensor | None = None) -> None:
        """Raises a ``ValueError`` unless ``x`` holds the ``grid_size`` tokens and ``mask`` (if any) is all True."""
        gh, gw = self.grid_size
        if x.dim() != 3 or x.shape[1] != gh * gw:
            raise ValueError(f"DWConv2dInit expects N = {gh} x {gw} = {gh * gw} grid tokens, got x {tuple(x.shape)}")
        _masked_or_plain(mask, "dwconv2d")

    def _conv_tokens(self, x: Tensor) -> Tensor:
        """The conv on ``(B, N, C)`` grid tokens, returned as ``(B, M, C)`` tokens."""
        if not torch.jit.is_scripting():  # nested: TorchScript skips the whole branch, condition included
            if is_compiling():
                # The same conv as k * k shifted multiply-adds, which inductor fuses into the kernel that reads the
                # tokens. The library conv needs its own launch and first a copy of the (B, N, C) slice into an image
                # layout: a third of the centroid block's GPU time at batch 512 (tools/bench_vision.py --profile).
                return _depthwise_conv_taps(x, self.conv.weight, self.conv.bias, self.grid_size, self.stride)
        B, N, C = x.shape
        grid = x.transpose(1, 2).reshape(B, C, self.grid_size[0], self.grid_size[1])  # (B, C, H, W)
        return self.conv(grid).flatten(2).transpose(1, 2)

    def forward(self, x: Tensor, pos: Tensor | None = None, mask: Tensor | None = None) -> CentroidOutput:
        if not torch.jit.is_scripting():  # nested: TorchScript skips the whole branch, condition included
            if checks_active():
                self.check_inputs(x, mask)
        B, N, C = x.shape
        gh, gw = self.grid_size
        u = self._conv_tokens(x)  # (B, M, C)
        p: Tensor | None = None
        if pos is not None:
            P = pos.shape[-1]
            k, st = self.kernel_size, self.stride
            p = F.avg_pool2d(pos.transpose(1, 2).reshape(B, P, gh, gw), k, st, k // 2, count_include_pad=False)
            p = p.flatten(2).transpose(1, 2)
        return CentroidOutput(u, p, None)


CENTROID_INITS: dict[str, type[nn.Module]] = {
    "fps": FPSInit,
    "random": RandomInit,
    "mean_pool": MeanPoolInit,
    "kmeans": KMeansInit,
    "linear": LinearInit,
    "dwconv2d": DWConv2dInit,
}


def build_centroid_init(name: str, **kwargs) -> nn.Module:
    """Builds a centroid init from :data:`CENTROID_INITS` by name, passing ``kwargs`` to its constructor."""
    if name not in CENTROID_INITS:
        raise ValueError(f"unknown centroid init {name!r}; choose one of {sorted(CENTROID_INITS)}")
    return CENTROID_INITS[name](**kwargs)
