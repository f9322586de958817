"""The 3D point capsule autoencoder, with dynamic routing or centroid attention forming the latent capsules.

Zhao, Birdal, Deng, Tombari, "3D Point Capsule Networks", CVPR 2019 (arXiv:1812.10775), the reference architecture;
Wu et al., "Centroid Transformers: Learning to Abstract with Attention", arXiv:2102.08606, section 3.3, the
centroid variant. The network, with N input points, P primary capsules of K = 16 dims, M latent capsules of D dims::

    xyz (B, N, 3) -> per-point Conv1d 3 -> 64 -> 128 (BN, ReLU)                                  (B, 128, N)
      -> primary capsules: K = 16 parallel Conv1d(128 -> P) + BN, max over points, stacked       (B, P, K)
         and squashed: squash(s) = |s|^2 / (1 + |s|^2) * s / sqrt(|s|^2 + eps)
      -> latent capsules                                                                        (B, M, D)
           routing:  u_hat[m, p] = W[m, p] s_p, W (M, P, D, K); 3 iterations of b <- b + <v_m, u_hat[m, p]>,
                     c = softmax of b over the M latent capsules, v_m = squash(sum_p c[m, p] u_hat[m, p]);
                     u_hat is detached in every iteration but the last (as in the reference code)
           centroid: primary capsules -> Linear(K -> D) = the inputs; centroids from a learned linear map over
                     the P capsules (attention's "linear" init); T = 3 dense centroid-attention steps + MLP
      -> decoder, H = ceil(N_out / M) grid points per capsule; output point i = h * M + m is grid point h of capsule
         m, and PointCapsNet.point_capsule holds m for every output point:
           heads (the reference, decoder="heads"): H separate heads; head h maps [grid point g[h, m] (2-D);
                     capsule m (D)] with Conv1d (D+2) -> (D+2) -> (D+2)/2 -> (D+2)/4 -> 3 (BN, ReLU, tanh at the
                     end): capsule m's patch is the m-th point of every head
           patch (default, decoder="patch"): one MLP of the same form, shared by all points, maps [g; v_m] to a
                     point: capsule m's patch is the image of the unit square under g -> f([g; v_m]), one continuous
                     surface patch (AtlasNet's patches, with the capsule vector choosing the patch)

Where we deviate from the reference code, and why:

* **The default decoder makes each capsule one patch.** With the reference's heads, nothing ties capsule m's H points
  together in space: each head is its own function, and training makes each *head* cover a region of the shape
  while the capsules' points spread over all of it (a capsule's points spread as widely as the whole shape's and part
  purity stays at chance: ``tools/bench_capsules.py``, docs/benchmarks.md). The patch decoder shares one MLP over all
  points, so a capsule's points are one continuous image of the grid, and the capsules decompose the shape into
  parts. ``decoder="heads"`` keeps the reference.
* **2048 points from 12 capsules.** 2048 is not a multiple of 12 (the reference builds ``int(2048 / 12) = 170``
  heads and emits 2040 points). We build ``H = ceil(N_out / M)`` heads (171) and drop the last ``H * M - N_out``
  points (4), which are the last head's points for the last capsules (8..11). So every output cloud has exactly
  N_out points, the first ``N_out mod M`` capsules get one point more than the others (171 vs 170), and the choice
  is deterministic. With M dividing N_out (64 capsules, 2048 points) nothing is dropped.
* **Grid points.** Training draws a fresh uniform grid point per (sample, head, capsule), as the reference does
  (``decoder_grid="fixed"`` trains on the eval grid instead, an ablation); eval mode uses a fixed grid drawn once from
  a seeded generator (``grid_seed``), so eval outputs are deterministic.
* **Squash epsilon.** The reference divides by ``|s|``, which gives NaN at zero input; we divide by
  ``sqrt(|s|^2 + eps)``.
* **Latent sizes by keyword.** The reference script passes the latent capsule count as the latent vector size and
  builds 12 x 12 latent capsules when asked for 12 x 128; here both are separate keyword arguments.
* **Routing without the batch-expanded W.** The reference computes ``u_hat = matmul(W, x[:, None, ..., None])``,
  which broadcasts W over the batch and saves the expanded ``(B, M, P, D, K)`` copy for backward (50 MB per sample
  at the small size, 268 MB at the base size). ``routing_impl="einsum"`` (default) forms the same ``u_hat`` without it;
  ``"reference"`` keeps the reference's computation, for the memory comparison in ``tools/bench_capsules.py``.
* **Primary capsules without the (B, 16 P, N) tensor.** The max over points of BatchNorm(Conv1d) is computed from
  the arg-max points and the features' mean and covariance (:func:`fused_conv_bn_max`): the same values and
  gradients as Conv1d -> BatchNorm1d -> max (kept as ``primary_backend="torch"`` and tested against it), without
  the network's largest activation (1 GB at B = 8, 2048 points, 1024 x 16 capsules).
* **Batched branches.** The 16 primary branches are one Conv1d(128 -> 16 P) (same weights, the branches are
  channel slices) and the H decoder heads are grouped convolutions (``groups=H``), each group exactly one head's
  PointGenCon; BatchNorm is per channel in both cases, so this is the reference's computation without Python loops
  over 171 modules. ``tests/capsules/test_model.py`` checks the decoder against a per-head loop.
* **Centroid variant.** Primary capsules (K = 16) and latent capsules (D) differ in width, so a linear map lifts
  the primary capsules to D before attention (centroids and inputs of centroid attention share a width). The map is
  per capsule (:class:`CapsuleLift`): primary capsule p is channel p of the branches, not an interchangeable set
  element, and attention, being permutation-invariant, would lose which capsule is which behind a shared map
  (routing keeps it through W[m, p]). Measured with ``tools/bench_capsules.py``'s Chamfer column (synthetic parts,
  60 Adam steps, small size): 0.098 with one shared lift, 0.028 with the per-capsule lift (rank 16, +41 k
  parameters), 0.049 for routing. It speeds training up rather than improving its end point: after 750 steps
  (``train_capsules.py --epochs 30``, two seeds) the shared lift (``lift_rank=0``) ends about 5% lower.
  Latent capsules are not squashed (attention outputs are not length-coded; the decoder starts with BatchNorm).
"""

from __future__ import annotations

import itertools
import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention import CentroidBlock
from attention.centroid import LinearInit
from attention.checks import check_heads, check_points
from engine.registry import ModelRegistry
from pointcloud.model import example_clouds

__all__ = [
    "DECODERS",
    "FUSED_CHUNK_BYTES",
    "GRIDS",
    "LATENT_LAYERS",
    "MODELS",
    "PRIMARY_BACKENDS",
    "ROUTING_IMPLS",
    "CapsuleDecoder",
    "CapsuleLift",
    "CentroidCapsules",
    "DynamicRouting",
    "PatchDecoder",
    "PointCapsNet",
    "PrimaryCapsules",
    "create_model",
    "dynamic_routing",
    "fused_conv_bn_max",
    "list_models",
    "register_model",
    "squash",
]

SQUASH_EPS = 1e-8


def squash(s: Tensor, dim: int = -1, eps: float = SQUASH_EPS) -> Tensor:
    """Capsule non-linearity ``|s|^2 / (1 + |s|^2) * s / sqrt(|s|^2 + eps)`` (Sabour et al. 2017, eq. 1).

    The epsilon keeps the value and the gradient finite at ``s = 0``, where the reference's ``s / |s|`` is NaN.
    """
    sq = (s * s).sum(dim, keepdim=True)
    return sq / (1.0 + sq) * s / torch.sqrt(sq + eps)


def dynamic_routing(u_hat: Tensor, num_iterations: int = 3) -> Tensor:
    """Routing by agreement from predictions ``u_hat`` to latent capsules (reference code's ``LatentCapsLayer``).

    Coupling logits b start at 0; each iteration ``c = softmax_m(b)``, ``v_m = squash(sum_p c[m, p] u_hat[m, p])``
    and, except after the last, ``b += <v_m, u_hat[m, p]>``. All iterations but the last use ``u_hat.detach()``, so
    gradients reach ``u_hat`` only through the last weighted sum (the couplings are treated as constants).

    Shapes:
        u_hat: ``(B, M, P, D)`` predictions of each primary capsule p for each latent capsule m.
        output: ``(B, M, D)``.
    """
    if num_iterations < 1:
        raise ValueError(f"num_iterations must be >= 1, got {num_iterations}")
    B, M, P, D = u_hat.shape
    detached = u_hat.detach()
    b = u_hat.new_zeros(B, M, P)
    v = u_hat.new_zeros(B, M, D)
    for it in range(num_iterations):
        c = torch.softmax(b, dim=1)  # (B, M, P): each primary capsule distributes itself over the latent capsules
        if it == num_iterations - 1:
            v = squash(torch.einsum("bmp,bmpd->bmd", c, u_hat))
        else:
            v = squash(torch.einsum("bmp,bmpd->bmd", c, detached))
            b = b + torch.einsum("bmd,bmpd->bmp", v, detached)
    return v


PRIMARY_BACKENDS = ("fused", "torch")
GRIDS = ("random", "fixed")
ROUTING_IMPLS = ("einsum", "reference")

# Tile budget of the arg-max search in fused_conv_bn_max, in bytes.
FUSED_CHUNK_BYTES = 32 * 2**20


def fused_conv_bn_max(x: Tensor, conv: nn.Conv1d, bn: nn.BatchNorm1d, chunk_bytes: int = FUSED_CHUNK_BYTES) -> Tensor:
    """``bn(conv(x)).amax(-1)`` for a kernel-1 Conv1d, without keeping the ``(B, C, N)`` output for backward.

    BatchNorm is a per-channel affine map ``a_c y + b_c`` with ``a_c = gamma_c / sqrt(var_c + eps)``, so its max over
    the points is taken at the arg-max of ``y_c`` where ``a_c >= 0`` and at the arg-min where ``a_c < 0``. The batch
    statistics of ``y = W f + w0`` follow from those of the features f: ``mean = W mu_f + w0``,
    ``var = diag(W Sigma_f W^T)`` (biased, as BatchNorm normalizes with). So: (1) mu_f and Sigma_f (Cin x Cin),
    differentiable; (2) the arg-max/min over N of ``sign(a_c) (W f)_c`` without autograd, in channel tiles of at most
    ``chunk_bytes``; (3) ``y`` recomputed with autograd at the selected points only, ``(B, C, Cin)`` gathered
    features. Running statistics are updated as ``nn.BatchNorm1d`` does (unbiased variance). Gradients equal the
    reference's: the gradient of a max flows to its arg-max (ties aside).

    Shapes:
        x: ``(B, Cin, N)``; output: ``(B, C)``.
    """
    if torch.is_autocast_enabled(x.device.type):
        # BatchNorm statistics need float32 (autocast runs batch_norm in float32 too); a bf16 covariance would not do.
        with torch.autocast(x.device.type, enabled=False):
            return fused_conv_bn_max(x.float(), conv, bn, chunk_bytes)
    B, Cin, N = x.shape
    weight, bias = conv.weight[:, :, 0], conv.bias  # (C, Cin), (C,)
    C = weight.shape[0]
    if bn.training or not bn.track_running_stats:
        flat = x.transpose(1, 2).reshape(B * N, Cin)  # (B N, Cin)
        mu = flat.mean(0)
        centred = flat - mu
        cov = centred.T @ centred / (B * N)  # (Cin, Cin)
        mean = weight @ mu + bias
        var = ((weight @ cov) * weight).sum(1).clamp_min(0.0)  # (C,) biased
        if bn.training and bn.track_running_stats:
            with torch.no_grad():
                bn.num_batches_tracked.add_(1)
                momentum = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
                n = B * N
                bn.running_mean.lerp_(mean.detach().to(bn.running_mean.dtype), momentum)
                unbiased = var.detach() * (n / max(n - 1, 1))
                bn.running_var.lerp_(unbiased.to(bn.running_var.dtype), momentum)
    else:
        mean, var = bn.running_mean, bn.running_var
    scale = bn.weight / torch.sqrt(var + bn.eps)  # (C,)
    with torch.no_grad():
        signed = torch.where(bn.weight >= 0, 1.0, -1.0).to(weight.dtype)[:, None] * weight  # (C, Cin)
        xd = x.detach().to(weight.dtype)
        step = max(1, chunk_bytes // max(1, B * N * xd.element_size()))
        tiles = [torch.einsum("ci,bin->bcn", signed[c : c + step], xd).argmax(-1) for c in range(0, C, step)]
        idx = torch.cat(tiles, 1)  # (B, C): the point where each channel's BatchNorm output is largest
    picked = torch.gather(x.transpose(1, 2), 1, idx[..., None].expand(B, C, Cin))  # (B, C, Cin)
    y = (picked * weight).sum(-1) + bias  # (B, C): conv output at the selected points (a bmm of 1-row mats is slow)
    return (y - mean) * scale + bn.bias


# --------------------------------------------------------------------------------------------------------------------
# Layers
# --------------------------------------------------------------------------------------------------------------------


class PrimaryCapsules(nn.Module):
    """Per-point encoder and primary capsules: Conv1d 3 -> 64 -> 128 (BN, ReLU), K branches Conv1d(128 -> P) + BN.

    Branch k's Conv1d is the channel slice ``[k P, (k + 1) P)`` of one Conv1d(128 -> K P). The branches' output
    ``(B, K P, N)`` is the largest tensor of the whole network (1 GB at the base size, B = 8, N = 2048), and only its
    max over the points is used. ``backend="fused"`` never keeps it (see :func:`fused_conv_bn_max`); ``"torch"`` is
    the plain Conv1d -> BatchNorm1d -> amax reference. Both give the same values, gradients and BN running stats.

    Shapes:
        points: ``(B, N, 3)``; output: ``(B, P, K)`` squashed capsules.
    """

    def __init__(
        self, num_capsules: int = 512, capsule_dim: int = 16, in_channels: int = 3, backend: str = "fused"
    ) -> None:
        super().__init__()
        if backend not in PRIMARY_BACKENDS:
            raise ValueError(f"unknown primary-capsule backend {backend!r}; choose one of {PRIMARY_BACKENDS}")
        self.num_capsules, self.capsule_dim, self.backend = num_capsules, capsule_dim, backend
        self.conv1 = nn.Conv1d(in_channels, 64, 1)
        self.bn1 = nn.BatchNorm1d(64)
        self.conv2 = nn.Conv1d(64, 128, 1)
        self.bn2 = nn.BatchNorm1d(128)
        self.caps_conv = nn.Conv1d(128, capsule_dim * num_capsules, 1)
        self.caps_bn = nn.BatchNorm1d(capsule_dim * num_capsules)

    def forward(self, points: Tensor) -> Tensor:
        B, N, _ = points.shape
        x = F.relu(self.bn1(self.conv1(points.transpose(1, 2))))  # (B, 64, N)
        x = F.relu(self.bn2(self.conv2(x)))  # (B, 128, N)
        if self.backend == "fused":
            x = fused_conv_bn_max(x, self.caps_conv, self.caps_bn)  # (B, K * P)
        else:
            x = self.caps_bn(self.caps_conv(x)).amax(-1)  # (B, K * P): max over points
        x = x.view(B, self.capsule_dim, self.num_capsules).transpose(1, 2)  # (B, P, K)
        return squash(x)


class DynamicRouting(nn.Module):
    """Latent capsules by dynamic routing: ``u_hat = W s`` with W ``(M, P, D, K)``, then :func:`dynamic_routing`.

    ``impl="einsum"`` forms ``u_hat`` directly; ``"reference"`` as the reference code does, through a matmul that
    materializes W expanded over the batch (same values; kept to measure what that costs).

    Shapes:
        x: ``(B, P, K)`` primary capsules; output: ``(B, M, D)``.
    """

    def __init__(
        self,
        num_inputs: int,
        input_dim: int,
        num_latent: int,
        latent_dim: int,
        num_iterations: int = 3,
        impl: str = "einsum",
    ) -> None:
        super().__init__()
        if num_iterations < 1:
            raise ValueError(f"num_iterations must be >= 1, got {num_iterations}")
        if impl not in ROUTING_IMPLS:
            raise ValueError(f"unknown routing impl {impl!r}; choose one of {ROUTING_IMPLS}")
        self.num_iterations, self.impl = num_iterations, impl
        # Reference init: 0.01 * randn.
        self.weight = nn.Parameter(0.01 * torch.randn(num_latent, num_inputs, latent_dim, input_dim))

    def forward(self, x: Tensor) -> Tensor:
        if self.impl == "reference":
            # The reference's broadcast matmul: (M, P, D, K) @ (B, 1, P, K, 1) expands W to (B, M, P, D, K).
            u_hat = torch.matmul(self.weight, x[:, None, :, :, None]).squeeze(-1)  # (B, M, P, D)
        else:
            u_hat = torch.einsum("mpdk,bpk->bmpd", self.weight, x)  # (B, M, P, D)
        return dynamic_routing(u_hat, self.num_iterations)


class CapsuleLift(nn.Module):
    """Per-capsule linear maps ``R^K -> R^D``, factorized through R shared maps: ``z_p = sum_r a_pr (B_r x_p + c_r)``.

    Primary capsule p is not an interchangeable set element: it is channel p of each of the K branches, so its
    vector means something different for every p. Dynamic routing keeps that through W[m, p]; attention is
    permutation-invariant over its inputs, so a lift shared by all capsules would throw the identity away (the
    attention could not tell capsule 3 from capsule 300). Here capsule p has its own map
    ``W_p = sum_r a_pr B_r`` and bias ``sum_r a_pr c_r``, computed as one shared Linear(R (K + 1) -> D) of the
    outer product ``a_p (x) [x_p; 1]``: ``P R + R (K + 1) D + D`` parameters (41 k at P = 512, K = 16, R = 16, D = 128)
    instead of the ``P K D`` (1 M) of independent maps. ``rank=0`` is the shared Linear(K -> D) (the ablation).

    Shapes:
        x: ``(B, P, K)``; output: ``(B, P, D)``.
    """

    def __init__(self, num_inputs: int, input_dim: int, dim: int, rank: int = 16) -> None:
        super().__init__()
        if rank < 0:
            raise ValueError(f"rank must be >= 0 (0 = one lift shared by all capsules), got {rank}")
        self.num_inputs, self.rank = num_inputs, rank
        self.codes = nn.Parameter(torch.randn(num_inputs, rank)) if rank else None  # a_pr ~ N(0, 1)
        self.proj = nn.Linear(rank * (input_dim + 1) if rank else input_dim, dim)

    def forward(self, x: Tensor) -> Tensor:
        if self.codes is None:
            return self.proj(x)
        B, P, K = x.shape
        if P != self.num_inputs:
            raise ValueError(f"CapsuleLift was built for {self.num_inputs} capsules, got x of shape {tuple(x.shape)}")
        x1 = torch.cat([x, x.new_ones(B, P, 1)], dim=-1)  # (B, P, K + 1): the 1 carries the per-capsule bias
        z = self.codes[None, :, :, None] * x1[:, :, None, :]  # (B, P, R, K + 1)
        return self.proj(z.reshape(B, P, self.rank * (K + 1)))  # (B, P, D)


class CentroidCapsules(nn.Module):
    """Latent capsules by centroid attention: inputs = lifted primary capsules, centroids = latent capsules.

    ``x -> CapsuleLift(K -> D)`` (per-capsule maps, see :class:`CapsuleLift`); centroids ``u^0 = W x + b``
    (:class:`attention.centroid.LinearInit`, W ``(M, P)``); T dense centroid-attention steps (softmax over the P
    inputs, shared weights), then an MLP with a residual (:class:`attention.CentroidBlock`).

    Args:
        lift_rank: R of :class:`CapsuleLift`; 0 lifts every capsule with one shared Linear(K -> D).

    Shapes:
        x: ``(B, P, K)`` primary capsules; output: ``(B, M, D)``.
    """

    def __init__(
        self,
        num_inputs: int,
        input_dim: int,
        num_latent: int,
        latent_dim: int,
        num_iterations: int = 3,
        num_heads: int = 4,
        mlp_ratio: float = 4.0,
        lift_rank: int = 16,
    ) -> None:
        super().__init__()
        check_heads(latent_dim, num_heads, "latent_dim")
        self.lift = CapsuleLift(num_inputs, input_dim, latent_dim, rank=lift_rank)
        self.block = CentroidBlock(
            latent_dim,
            init=LinearInit(num_inputs=num_inputs, num_centroids=num_latent),
            num_heads=num_heads,
            num_neighbors=None,
            num_steps=num_iterations,
            mlp_ratio=mlp_ratio,
        )

    def forward(self, x: Tensor) -> Tensor:
        return self.block(self.lift(x)).x  # (B, M, D)


LATENT_LAYERS: dict[str, type[nn.Module]] = {"routing": DynamicRouting, "centroid": CentroidCapsules}
"""How the latent capsules are formed from the primary capsules."""


class _GridDecoder(nn.Module):
    """What both decoders share: ``H = ceil(N_out / M)`` grid points per capsule, the output layout, the eval grid.

    Output point ``i = h * M + m`` is grid sample h of capsule m (the last ``H * M - N_out`` points are dropped), so
    :attr:`point_capsule` (``i % M``) is the same for both decoders and a checkpoint's patches can be compared.
    """

    def __init__(
        self, num_latent: int, latent_dim: int, num_points: int, grid_seed: int = 0, grid: str = "random"
    ) -> None:
        super().__init__()
        if grid not in GRIDS:
            raise ValueError(f"unknown decoder grid {grid!r}; choose one of {GRIDS}")
        if num_points < num_latent:
            raise ValueError(f"num_points={num_points} must be >= num_latent={num_latent} (one point per capsule)")
        self.num_latent, self.latent_dim, self.num_points, self.grid = num_latent, latent_dim, num_points, grid
        self.num_heads = math.ceil(num_points / num_latent)
        gen = torch.Generator().manual_seed(grid_seed)
        self.register_buffer("eval_grid", torch.rand(self.num_heads, 2, num_latent, generator=gen), persistent=False)
        self.register_buffer("point_capsule", torch.arange(num_points) % num_latent, persistent=False)

    def sample_grid(self, batch: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """Grid points ``(B, H, 2, M)`` in [0, 1]^2: the fixed seeded grid in eval (and always with ``grid="fixed"``),
        fresh uniform samples in training with ``grid="random"`` (the reference's sampling)."""
        if self.training and self.grid == "random":
            return torch.rand(batch, self.num_heads, 2, self.num_latent, device=device, dtype=dtype)
        return self.eval_grid.to(dtype)[None].expand(batch, -1, -1, -1)

    def _inputs(self, caps: Tensor, grid: Tensor | None) -> Tensor:
        """Checks the shapes; returns ``[g[h, m]; v_m]`` as ``(B, H, D + 2, M)``."""
        B, M, D = caps.shape
        H = self.num_heads
        if (M, D) != (self.num_latent, self.latent_dim):
            raise ValueError(f"caps must be (B, {self.num_latent}, {self.latent_dim}), got {tuple(caps.shape)}")
        if grid is None:
            grid = self.sample_grid(B, caps.device, caps.dtype)
        elif grid.shape != (B, H, 2, M):
            raise ValueError(f"grid must be (B, H, 2, M) = ({B}, {H}, 2, {M}), got {tuple(grid.shape)}")
        v = caps.transpose(1, 2)[:, None].expand(B, H, D, M)  # (B, H, D, M)
        return torch.cat([grid, v], dim=2)  # (B, H, D + 2, M)


class CapsuleDecoder(_GridDecoder):
    """The reference decoder (``decoder="heads"``): H heads, each maps (grid point, capsule) to one point per capsule.

    Head h is the reference's ``PointGenCon(D + 2)``: Conv1d (D+2) -> (D+2) -> (D+2)//2 -> (D+2)//4 -> 3 with BN and
    ReLU between and tanh at the end, applied to the M columns ``[g[h, m]; v_m]``. All heads run as one grouped
    convolution (group h = head h). See the module docstring for how ``H * M`` points are cut to ``num_points``.
    Capsule m's patch is the m-th point of each of H separately parameterized heads: nothing ties its points together
    in space, and in training each head learns a region of the shape instead (``tools/bench_capsules.py``,
    docs/benchmarks.md).

    Shapes:
        caps: ``(B, M, D)``; grid: ``(B, H, 2, M)`` or None (random in training, fixed in eval);
        output: ``(B, num_points, 3)``, point ``i`` from head ``i // M`` and capsule ``i % M``.
    """

    def __init__(
        self, num_latent: int, latent_dim: int, num_points: int, grid_seed: int = 0, grid: str = "random"
    ) -> None:
        super().__init__(num_latent, latent_dim, num_points, grid_seed, grid)
        H = self.num_heads
        c0 = latent_dim + 2
        widths = [c0, c0, c0 // 2, c0 // 4]
        if widths[-1] < 1:
            raise ValueError(f"latent_dim={latent_dim} is too small: the last hidden width (D + 2) // 4 must be >= 1")
        self.convs = nn.ModuleList(
            nn.Conv1d(H * cin, H * cout, 1, groups=H) for cin, cout in itertools.pairwise(widths)
        )
        self.bns = nn.ModuleList(nn.BatchNorm1d(H * c) for c in widths[1:])
        self.out = nn.Conv1d(H * widths[-1], H * 3, 1, groups=H)

    def forward(self, caps: Tensor, grid: Tensor | None = None) -> Tensor:
        B, M, D = caps.shape
        H = self.num_heads
        x = self._inputs(caps, grid).reshape(B, H * (D + 2), M)  # (B, H * (D + 2), M)
        for conv, bn in zip(self.convs, self.bns, strict=True):
            x = F.relu(bn(conv(x)))
        x = torch.tanh(self.out(x)).view(B, H, 3, M)  # (B, H, 3, M)
        return x.permute(0, 1, 3, 2).reshape(B, H * M, 3)[:, : self.num_points]  # (B, N_out, 3)


class PatchDecoder(_GridDecoder):
    """Per-capsule patches in the AtlasNet manner (``decoder="patch"``): one shared MLP ``f([g; v_m])`` for all points.

    Capsule m's patch is the image of the unit square under ``g -> f([g; v_m])``, a continuous map: its points form one
    surface patch whose place and shape the capsule vector decides (AtlasNet, Groueix et al. 2018, with the capsule
    vector in place of the per-patch MLP). MLP: pointwise Conv1d (D+2) -> W -> W//2 -> W//4 -> 3 with BN and ReLU
    between and tanh at the end (W = ``width``, default 256; ``width = D + 2`` is exactly one reference head shared
    by all points).
    Same grid sampling and output layout as :class:`CapsuleDecoder` (point ``i = h * M + m``).

    Shapes:
        caps: ``(B, M, D)``; grid: ``(B, H, 2, M)`` or None (random in training, fixed in eval);
        output: ``(B, num_points, 3)``, point ``i`` from grid sample ``i // M`` of capsule ``i % M``.
    """

    def __init__(
        self,
        num_latent: int,
        latent_dim: int,
        num_points: int,
        grid_seed: int = 0,
        grid: str = "random",
        width: int = 256,
    ) -> None:
        super().__init__(num_latent, latent_dim, num_points, grid_seed, grid)
        c0 = latent_dim + 2
        widths = [c0, width, width // 2, width // 4]
        if widths[-1] < 1:
            raise ValueError(f"the decoder width must be >= 4 (its last hidden layer is width // 4), got {width}")
        self.convs = nn.ModuleList(nn.Conv1d(cin, cout, 1) for cin, cout in itertools.pairwise(widths))
        self.bns = nn.ModuleList(nn.BatchNorm1d(c) for c in widths[1:])
        self.out = nn.Conv1d(widths[-1], 3, 1)

    def forward(self, caps: Tensor, grid: Tensor | None = None) -> Tensor:
        B, M, D = caps.shape
        H = self.num_heads
        x = self._inputs(caps, grid).permute(0, 2, 1, 3).reshape(B, D + 2, H * M)  # (B, D + 2, H * M), point-major
        for conv, bn in zip(self.convs, self.bns, strict=True):
            x = F.relu(bn(conv(x)))
        x = torch.tanh(self.out(x))  # (B, 3, H * M)
        return x.transpose(1, 2)[:, : self.num_points]  # (B, N_out, 3)


DECODERS: dict[str, type[nn.Module]] = {"patch": PatchDecoder, "heads": CapsuleDecoder}
"""How capsules become points: ``"patch"`` (one shared MLP, each capsule a continuous patch) or ``"heads"`` (the
reference's H separate heads, capsule m's patch = the m-th point of every head)."""


# --------------------------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------------------------


class PointCapsNet(nn.Module):
    """The point capsule autoencoder (see the module docstring).

    Args:
        num_primary: P, primary capsules (channels of each primary branch).
        primary_dim: K, dims of a primary capsule (number of parallel branches); 16 in the paper.
        num_latent: M, latent capsules.
        latent_dim: D, dims of a latent capsule.
        num_points: points of the reconstruction (N_out).
        latent: ``"routing"`` or ``"centroid"`` (:data:`LATENT_LAYERS`).
        num_iterations: routing iterations, or centroid-attention steps T.
        num_heads: attention heads (centroid only; default 4).
        mlp_ratio: MLP width of the centroid block (centroid only; default 4).
        grid_seed: seed of the fixed eval-mode decoder grid.
        primary_backend: ``"fused"`` (memory-lean) or ``"torch"`` (reference) primary capsules
            (:class:`PrimaryCapsules`); same values and gradients.
        lift_rank: rank of the centroid variant's per-capsule lift (:class:`CapsuleLift`; centroid only; default 16,
            0 = one shared lift).
        routing_impl: ``"einsum"`` or ``"reference"`` (:class:`DynamicRouting`; routing only; default einsum).
        decoder: ``"patch"`` (:class:`PatchDecoder`, default: each capsule decodes one continuous patch) or
            ``"heads"`` (:class:`CapsuleDecoder`, the reference code's decoder) (:data:`DECODERS`).
        decoder_width: hidden width W of the patch decoder's MLP (patch only; default 256).
        decoder_grid: ``"random"`` (fresh grid points every training step, as the reference) or ``"fixed"`` (the
            seeded eval grid in training too) (:data:`GRIDS`).

    Shapes:
        points: ``(B, N, 3)`` (any N >= 1); output: ``(B, num_points, 3)``; :meth:`encode`: ``(B, M, D)``;
        :attr:`point_capsule`: ``(num_points,)`` the latent capsule of each output point.
    """

    def __init__(
        self,
        num_primary: int = 512,
        primary_dim: int = 16,
        num_latent: int = 12,
        latent_dim: int = 128,
        num_points: int = 2048,
        latent: str = "centroid",
        num_iterations: int = 3,
        num_heads: int | None = None,
        mlp_ratio: float | None = None,
        grid_seed: int = 0,
        primary_backend: str = "fused",
        lift_rank: int | None = None,
        routing_impl: str | None = None,
        decoder: str = "patch",
        decoder_width: int | None = None,
        decoder_grid: str = "random",
    ) -> None:
        super().__init__()
        if decoder not in DECODERS:
            raise ValueError(f"unknown decoder {decoder!r}; choose one of {sorted(DECODERS)}")
        if decoder == "heads" and decoder_width is not None:
            raise ValueError("decoder_width applies to decoder='patch' only; leave it None for 'heads'")
        if latent not in LATENT_LAYERS:
            raise ValueError(f"unknown latent layer {latent!r}; choose one of {sorted(LATENT_LAYERS)}")
        if latent == "routing" and (num_heads is not None or mlp_ratio is not None or lift_rank is not None):
            raise ValueError(
                "num_heads, mlp_ratio and lift_rank apply to latent='centroid' only; leave them None for routing"
            )
        if latent == "centroid" and routing_impl is not None:
            raise ValueError("routing_impl applies to latent='routing' only; leave it None for centroid")
        for name, value in (("num_primary", num_primary), ("primary_dim", primary_dim), ("num_latent", num_latent),
                            ("latent_dim", latent_dim), ("num_points", num_points)):  # fmt: skip
            if value < 1:
                raise ValueError(f"{name} must be a positive int, got {value}")
        self.latent_type = latent
        self.num_latent, self.latent_dim, self.num_points = num_latent, latent_dim, num_points
        self.primary = PrimaryCapsules(num_primary, primary_dim, backend=primary_backend)
        common = {"num_inputs": num_primary, "input_dim": primary_dim, "num_latent": num_latent,
                  "latent_dim": latent_dim, "num_iterations": num_iterations}  # fmt: skip
        if latent == "centroid":
            self.latent = CentroidCapsules(
                **common,
                num_heads=4 if num_heads is None else num_heads,
                mlp_ratio=mlp_ratio or 4.0,
                lift_rank=16 if lift_rank is None else lift_rank,
            )
        else:
            self.latent = DynamicRouting(**common, impl=routing_impl or "einsum")
        self.decoder_type = decoder
        if decoder == "patch":
            width = 256 if decoder_width is None else decoder_width
            self.decoder = PatchDecoder(
                num_latent, latent_dim, num_points, grid_seed=grid_seed, grid=decoder_grid, width=width
            )
        else:
            self.decoder = CapsuleDecoder(num_latent, latent_dim, num_points, grid_seed=grid_seed, grid=decoder_grid)

    @property
    def point_capsule(self) -> Tensor:
        """``(num_points,)`` long: the latent capsule each output point was decoded from."""
        return self.decoder.point_capsule

    def encode(self, points: Tensor) -> Tensor:
        """Latent capsules ``(B, M, D)`` of ``(B, N, 3)`` points."""
        check_points(points, "points", channels=3)
        return self.latent(self.primary(points))

    forward_features = encode

    def decode(self, caps: Tensor, grid: Tensor | None = None) -> Tensor:
        """Reconstruction ``(B, num_points, 3)`` from latent capsules ``(B, M, D)``."""
        return self.decoder(caps, grid)

    def forward(self, points: Tensor) -> Tensor:
        return self.decode(self.encode(points))

    def no_weight_decay(self) -> set[str]:
        return set()


# --------------------------------------------------------------------------------------------------------------------
# Registry
# --------------------------------------------------------------------------------------------------------------------

# create_model: kwargs override a model's defaults (e.g. ``num_points=1024``)
MODELS, register_model, list_models, create_model = ModelRegistry(
    "point capsule", example_inputs=lambda model, config: (example_clouds(model, config, default_points=2048),)
).exports()

_SMALL = {"num_primary": 512, "primary_dim": 16, "num_latent": 12, "latent_dim": 128, "num_points": 2048}
_BASE = {"num_primary": 1024, "primary_dim": 16, "num_latent": 64, "latent_dim": 64, "num_points": 2048}


@register_model
def pointcaps_routing_small(**kwargs) -> PointCapsNet:
    """Paper's 12-capsule row, dynamic routing: 512 x 16 primary -> 12 x 128 latent, 2048 points (ShapeNet Part)."""
    return PointCapsNet(**{**_SMALL, "latent": "routing", **kwargs})


@register_model
def pointcaps_centroid_small(**kwargs) -> PointCapsNet:
    """Paper's 12-capsule row, centroid attention (linear init, T = 3): 512 x 16 -> 12 x 128, 2048 points."""
    return PointCapsNet(**{**_SMALL, "latent": "centroid", **kwargs})


@register_model
def pointcaps_routing_base(**kwargs) -> PointCapsNet:
    """Paper's 64-capsule row, dynamic routing: 1024 x 16 primary -> 64 x 64 latent, 2048 points (Core13)."""
    return PointCapsNet(**{**_BASE, "latent": "routing", **kwargs})


@register_model
def pointcaps_centroid_base(**kwargs) -> PointCapsNet:
    """Paper's 64-capsule row, centroid attention (linear init, T = 3): 1024 x 16 -> 64 x 64, 2048 points."""
    return PointCapsNet(**{**_BASE, "latent": "centroid", **kwargs})
