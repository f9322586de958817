"""The point capsule autoencoder: registry sweep, routing math, both decoders against plain loops, errors."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import capsules
from capsules.model import (
    CapsuleDecoder,
    CapsuleLift,
    DynamicRouting,
    PatchDecoder,
    PointCapsNet,
    dynamic_routing,
    squash,
)

# Small versions of each registered model (same code paths, CPU-friendly sizes).
TINY = {"num_primary": 24, "num_latent": 5, "latent_dim": 16, "num_points": 67, "num_heads": 2}


def _tiny(name: str, **overrides) -> nn.Module:
    kwargs = {**TINY, **overrides}
    if "routing" in name:
        kwargs.pop("num_heads")
    return capsules.create_model(name, **kwargs)


def test_registry_lists_the_four_paper_rows() -> None:
    assert capsules.list_models() == [
        "pointcaps_centroid_base",
        "pointcaps_centroid_small",
        "pointcaps_routing_base",
        "pointcaps_routing_small",
    ]
    with pytest.raises(ValueError, match="pointcaps_centroid_small"):
        capsules.create_model("pointcaps_small")


@pytest.mark.parametrize(
    "name, sizes",
    [
        ("pointcaps_routing_small", (512, 16, 12, 128)),
        ("pointcaps_centroid_small", (512, 16, 12, 128)),
        ("pointcaps_routing_base", (1024, 16, 64, 64)),
        ("pointcaps_centroid_base", (1024, 16, 64, 64)),
    ],
)
def test_registered_sizes(name: str, sizes: tuple[int, int, int, int]) -> None:
    """Built on the meta device: the latent capsules are M x D (not the reference's M x M), 2048 output points."""
    with torch.device("meta"):
        model = capsules.create_model(name)
    P, K, M, D = sizes
    assert model.primary.caps_conv.out_channels == P * K
    assert (model.num_latent, model.latent_dim, model.num_points) == (M, D, 2048)
    assert model.decoder.num_heads == math.ceil(2048 / M)
    if "routing" in name:
        assert tuple(model.latent.weight.shape) == (M, P, D, K)


@pytest.mark.parametrize("decoder", ["patch", "heads"])
@pytest.mark.parametrize("name", sorted(capsules.MODELS))
def test_sweep_shapes_gradients_zero_input_and_state_dict(name: str, decoder: str) -> None:
    torch.manual_seed(0)
    model = _tiny(name, decoder=decoder)
    assert model.decoder_type == decoder
    points = torch.rand(3, 41, 3) * 2 - 1
    out = model(points)
    assert out.shape == (3, 67, 3) and torch.isfinite(out).all()
    out.square().mean().backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"no gradient reaches {pname}"
        # A conv bias right before a training-mode BatchNorm cancels out: its true gradient is 0.
        if not re.search(r"(conv\d|caps_conv|convs\.\d)\.bias$", pname):
            assert p.grad.abs().sum() > 0, f"zero gradient at {pname}"
    # zeros: the squash epsilon keeps everything finite, forward and backward
    model.zero_grad()
    zeros = torch.zeros(2, 41, 3, requires_grad=True)
    out = model(zeros)
    out.sum().backward()
    assert torch.isfinite(out).all() and torch.isfinite(zeros.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    # eval is deterministic and survives a state-dict round trip
    model.eval()
    with torch.no_grad():
        a, b = model(points), model(points)
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    clone = _tiny(name, decoder=decoder)
    clone.load_state_dict(model.state_dict())
    clone.eval()
    with torch.no_grad():
        torch.testing.assert_close(clone(points), a, rtol=0, atol=0)


def test_training_grid_is_random_eval_grid_fixed() -> None:
    torch.manual_seed(0)
    model = _tiny("pointcaps_centroid_small")
    points = torch.rand(2, 30, 3)
    torch.manual_seed(1)
    a = model(points)
    b = model(points)
    assert not torch.allclose(a, b)
    other = _tiny("pointcaps_centroid_small")  # different weights, same grid_seed: same eval grid
    torch.testing.assert_close(other.decoder.eval_grid, model.decoder.eval_grid, rtol=0, atol=0)


def test_squash_values_and_zero() -> None:
    s = torch.tensor([[3.0, 4.0], [0.0, 0.0]], requires_grad=True)
    v = squash(s)
    torch.testing.assert_close(v[0], torch.tensor([3.0, 4.0]) / 5 * 25 / 26)
    assert (v[1] == 0).all()
    v.sum().backward()
    assert torch.isfinite(s.grad).all()


def test_single_iteration_routing_is_the_squashed_mean() -> None:
    """One iteration: couplings softmax(0) = 1/M, so v_m = squash(sum_p u_hat[m, p] / M)."""
    torch.manual_seed(0)
    u_hat = torch.randn(2, 5, 7, 3, dtype=torch.float64)
    torch.testing.assert_close(dynamic_routing(u_hat, 1), squash(u_hat.sum(2) / 5))


def _routing_by_hand(u_hat: torch.Tensor, iterations: int) -> torch.Tensor:
    """Plain loops over batch, latent and primary capsules, detach as in the reference code."""
    B, M, P, D = u_hat.shape
    out = []
    for bi in range(B):
        logits = [[torch.zeros((), dtype=u_hat.dtype) for _ in range(P)] for _ in range(M)]
        for it in range(iterations):
            last = it == iterations - 1
            u = u_hat[bi] if last else u_hat[bi].detach()
            vs = []
            for m in range(M):
                s = torch.zeros(D, dtype=u_hat.dtype)
                for p in range(P):
                    c = torch.exp(logits[m][p]) / sum(torch.exp(logits[k][p]) for k in range(M))
                    s = s + c * u[m, p]
                n2 = (s * s).sum()
                vs.append(n2 / (1 + n2) * s / torch.sqrt(n2 + 1e-8))
            if not last:
                for m in range(M):
                    for p in range(P):
                        logits[m][p] = logits[m][p] + (vs[m] * u[m, p]).sum()
        out.append(torch.stack(vs))
    return torch.stack(out)


@pytest.mark.parametrize("iterations", [1, 2, 3])
def test_routing_matches_hand_loops_values_and_gradients(iterations: int) -> None:
    torch.manual_seed(0)
    u1 = torch.randn(2, 3, 5, 4, dtype=torch.float64, requires_grad=True)
    u2 = u1.detach().clone().requires_grad_(True)
    ref = _routing_by_hand(u1, iterations)
    out = dynamic_routing(u2, iterations)
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(ref)
    (ref * w).sum().backward()
    (out * w).sum().backward()
    torch.testing.assert_close(u2.grad, u1.grad)


def test_routing_gradient_skips_the_coupling_updates() -> None:
    """With the detach, d v / d u_hat treats the final couplings as constants."""
    torch.manual_seed(0)
    u_hat = torch.randn(1, 3, 4, 2, dtype=torch.float64, requires_grad=True)
    v = dynamic_routing(u_hat, 3)
    v.sum().backward()
    # same couplings from the detached run, then one differentiable weighted sum
    u = u_hat.detach()
    b = torch.zeros(1, 3, 4, dtype=torch.float64)
    for _ in range(2):
        vv = squash(torch.einsum("bmp,bmpd->bmd", b.softmax(1), u))
        b = b + torch.einsum("bmd,bmpd->bmp", vv, u)
    u2 = u.clone().requires_grad_(True)
    squash(torch.einsum("bmp,bmpd->bmd", b.softmax(1), u2)).sum().backward()
    torch.testing.assert_close(u_hat.grad, u2.grad)


def test_routing_layer_uses_w_like_the_reference() -> None:
    """u_hat = squeeze(matmul(W, x[:, None, :, :, None])) as in the reference's LatentCapsLayer."""
    torch.manual_seed(0)
    layer = DynamicRouting(num_inputs=6, input_dim=4, num_latent=3, latent_dim=5, num_iterations=3).double()
    x = torch.randn(2, 6, 4, dtype=torch.float64)
    u_hat = torch.squeeze(torch.matmul(layer.weight, x[:, None, :, :, None]), dim=-1)
    torch.testing.assert_close(layer(x), dynamic_routing(u_hat, 3))


def test_reference_routing_impl_equals_einsum_values_and_gradients() -> None:
    """impl="reference" (the batch-expanding matmul) and the default einsum: same u_hat, same gradients."""
    torch.manual_seed(0)
    ref = DynamicRouting(num_inputs=7, input_dim=4, num_latent=3, latent_dim=5, impl="reference").double()
    ours = DynamicRouting(num_inputs=7, input_dim=4, num_latent=3, latent_dim=5).double()
    ours.load_state_dict(ref.state_dict())
    x1 = torch.randn(2, 7, 4, dtype=torch.float64, requires_grad=True)
    x2 = x1.detach().clone().requires_grad_(True)
    w = torch.randn(2, 3, 5, dtype=torch.float64)
    (ref(x1) * w).sum().backward()
    (ours(x2) * w).sum().backward()
    torch.testing.assert_close(x1.grad, x2.grad)
    torch.testing.assert_close(ref.weight.grad, ours.weight.grad)
    with pytest.raises(ValueError, match="einsum"):
        DynamicRouting(num_inputs=7, input_dim=4, num_latent=3, latent_dim=5, impl="loop")


def test_capsule_lift_is_one_linear_map_per_capsule() -> None:
    """z_p = W_p x_p + c_p with W_p = sum_r a_pr B_r, c_p = sum_r a_pr c_r; rank 0 = one shared Linear."""
    torch.manual_seed(0)
    P, K, D, R = 6, 4, 5, 3
    lift = CapsuleLift(P, K, D, rank=R).double()
    x = torch.randn(2, P, K, dtype=torch.float64)
    maps = lift.proj.weight.view(D, R, K + 1)  # (D, R, K + 1): B_r = [..., :K], c_r = [..., K]
    expected = torch.stack(
        [
            x[:, p] @ torch.einsum("r,drk->dk", lift.codes[p], maps[..., :K]).T
            + torch.einsum("r,dr->d", lift.codes[p], maps[..., K])
            + lift.proj.bias
            for p in range(P)
        ],
        dim=1,
    )  # (B, P, D)
    torch.testing.assert_close(lift(x), expected)
    # The identity matters: permuting the capsules changes each one's map (a shared lift would just permute).
    perm = torch.randperm(P)
    assert not torch.allclose(lift(x[:, perm]), lift(x)[:, perm])
    shared = CapsuleLift(P, K, D, rank=0).double()
    torch.testing.assert_close(shared(x[:, perm]), shared(x)[:, perm])
    with pytest.raises(ValueError, match="built for 6 capsules"):
        lift(x[:, :5])
    with pytest.raises(ValueError, match="rank must be >= 0"):
        CapsuleLift(P, K, D, rank=-1)


def _point_gen_con(decoder: CapsuleDecoder, h: int, x: torch.Tensor) -> torch.Tensor:
    """Head h as the reference's separate PointGenCon: weights sliced out of the grouped convs."""
    for conv, bn in zip(decoder.convs, decoder.bns, strict=True):
        co = conv.out_channels // decoder.num_heads
        sl = slice(h * co, (h + 1) * co)
        x = F.conv1d(x, conv.weight[sl], conv.bias[sl])
        x = F.relu(F.batch_norm(x, None, None, bn.weight[sl], bn.bias[sl], training=True, eps=bn.eps))
    sl = slice(h * 3, (h + 1) * 3)
    return torch.tanh(F.conv1d(x, decoder.out.weight[sl], decoder.out.bias[sl]))


@pytest.mark.parametrize("num_points", [35, 33])  # 35 = 7 heads x 5 (nothing dropped), 33: 2 points dropped
def test_decoder_equals_a_loop_over_heads(num_points: int) -> None:
    torch.manual_seed(0)
    dec = CapsuleDecoder(num_latent=5, latent_dim=10, num_points=num_points).double().train()
    for bn in dec.bns:  # non-trivial affine parameters
        nn.init.normal_(bn.weight)
        nn.init.normal_(bn.bias)
    caps = torch.randn(3, 5, 10, dtype=torch.float64, requires_grad=True)
    grid = torch.rand(3, dec.num_heads, 2, 5, dtype=torch.float64)
    out = dec(caps, grid)
    caps2 = caps.detach().clone().requires_grad_(True)
    heads = [_point_gen_con(dec, h, torch.cat([grid[:, h], caps2.transpose(1, 2)], 1)) for h in range(dec.num_heads)]
    ref = torch.cat(heads, 2).transpose(1, 2)[:, :num_points]  # reference: torch.cat(outs, 2), head-major
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(ref)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(caps.grad, caps2.grad)
    # capsule of each output point: i % M; the first num_points % M capsules get one extra point
    counts = torch.bincount(dec.point_capsule, minlength=5)
    assert counts.sum() == num_points and counts.max() - counts.min() <= 1
    assert (counts[: num_points % 5] == dec.num_heads).all()


@pytest.mark.parametrize("num_points, width", [(35, 12), (33, 24)])  # 33: 2 points dropped; 12 = D + 2: one head
def test_patch_decoder_is_one_mlp_applied_to_every_point(num_points: int, width: int) -> None:
    """Every output point is the same pointwise MLP of ``[g; v_m]`` (BatchNorm over all points), values and grads."""
    torch.manual_seed(0)
    dec = PatchDecoder(num_latent=5, latent_dim=10, num_points=num_points, width=width).double().train()
    for bn in dec.bns:
        nn.init.normal_(bn.weight)
        nn.init.normal_(bn.bias)
    caps = torch.randn(3, 5, 10, dtype=torch.float64, requires_grad=True)
    grid = torch.rand(3, dec.num_heads, 2, 5, dtype=torch.float64, requires_grad=True)
    out = dec(caps, grid)
    caps2, grid2 = (t.detach().clone().requires_grad_(True) for t in (caps, grid))
    rows = [
        torch.cat([grid2[b, h, :, m], caps2[b, m]]) for b in range(3) for h in range(dec.num_heads) for m in range(5)
    ]
    x = torch.stack(rows)  # (B H M, D + 2): one row per output point, point i = h M + m within each cloud
    for conv, bn in zip(dec.convs, dec.bns, strict=True):
        x = F.linear(x, conv.weight[:, :, 0], conv.bias)
        x = F.relu(F.batch_norm(x, None, None, bn.weight, bn.bias, training=True, eps=bn.eps))
    ref = torch.tanh(F.linear(x, dec.out.weight[:, :, 0], dec.out.bias)).view(3, -1, 3)[:, :num_points]
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(ref)
    (out * w).sum().backward()
    (ref * w).sum().backward()
    torch.testing.assert_close(caps.grad, caps2.grad)
    torch.testing.assert_close(grid.grad, grid2.grad)
    torch.testing.assert_close(dec.point_capsule, torch.arange(num_points) % 5)
    assert sum(p.numel() for p in dec.parameters()) < sum(
        p.numel() for p in CapsuleDecoder(5, 10, num_points).parameters()
    )


@pytest.mark.parametrize("decoder", ["patch", "heads"])
def test_a_capsules_points_are_one_map_of_the_grid_only_with_the_patch_decoder(decoder: str) -> None:
    """Patch: the same grid point of capsule m gives the same point whichever slot h it is in; heads: not."""
    torch.manual_seed(0)
    model = PointCapsNet(num_primary=8, num_latent=4, latent_dim=12, num_points=20, decoder=decoder).eval()
    caps = torch.randn(2, 4, 12)
    grid = torch.rand(2, model.decoder.num_heads, 2, 4)
    grid[:, 1] = grid[:, 0]
    out = model.decode(caps, grid).view(2, model.decoder.num_heads, 4, 3)  # (B, H, M, 3)
    assert torch.allclose(out[:, 0], out[:, 1]) == (decoder == "patch")
    # capsule m's points depend on capsule m only (both decoders)
    caps2 = caps.clone()
    caps2[:, 2] += 1.0
    moved = (model.decode(caps2, grid) - model.decode(caps, grid)).abs().sum(-1) > 0  # (B, N_out)
    assert (moved == (model.point_capsule == 2)).all()


@pytest.mark.parametrize("decoder", ["patch", "heads"])
def test_fixed_grid_trains_on_the_eval_grid(decoder: str) -> None:
    torch.manual_seed(0)
    model = PointCapsNet(num_primary=8, num_latent=4, latent_dim=12, num_points=20, decoder=decoder,
                         decoder_grid="fixed")  # fmt: skip
    grid = model.decoder.sample_grid(3, torch.device("cpu"), torch.float32)
    torch.testing.assert_close(grid, model.decoder.eval_grid.expand(3, -1, -1, -1), rtol=0, atol=0)
    points = torch.rand(3, 30, 3)
    torch.testing.assert_close(model(points), model(points), rtol=0, atol=0)


def test_primary_branches_are_channel_slices() -> None:
    """Branch k of the reference (Conv1d(128 -> P) + BN + max) equals slice k of the single conv."""
    torch.manual_seed(0)
    model = PointCapsNet(num_primary=7, primary_dim=4, num_latent=3, latent_dim=8, num_points=9, latent="routing")
    points = torch.randn(2, 13, 3)
    caps = model.primary(points)
    pr = model.primary
    feat = F.relu(pr.bn2(pr.conv2(F.relu(pr.bn1(pr.conv1(points.transpose(1, 2)))))))
    branches = []
    for k in range(4):
        sl = slice(k * 7, (k + 1) * 7)
        y = F.conv1d(feat, pr.caps_conv.weight[sl], pr.caps_conv.bias[sl])
        y = F.batch_norm(y, None, None, pr.caps_bn.weight[sl], pr.caps_bn.bias[sl], training=True)
        branches.append(y.amax(-1))
    torch.testing.assert_close(caps, squash(torch.stack(branches, dim=2)))


def test_bad_inputs_name_what_was_expected() -> None:
    model = _tiny("pointcaps_centroid_small")
    with pytest.raises(ValueError, match=r"\(B, N, 3\)"):
        model(torch.rand(2, 30, 4))
    with pytest.raises(ValueError, match="NaN"):
        model(torch.full((2, 30, 3), float("nan")))
    with pytest.raises(ValueError, match="routing"):
        PointCapsNet(latent="em")
    with pytest.raises(ValueError, match="num_points"):
        PointCapsNet(num_latent=12, num_points=8)
    with pytest.raises(ValueError, match="centroid' only"):
        PointCapsNet(latent="routing", num_heads=2)
    with pytest.raises(ValueError, match="divisible"):
        PointCapsNet(latent_dim=30, num_heads=4)
    with pytest.raises(ValueError, match="num_heads must be >= 1"):
        PointCapsNet(num_heads=0)
    with pytest.raises(ValueError, match=r"grid must be"):
        model.decode(torch.rand(2, 5, 16), grid=torch.rand(2, 3, 2, 5))
    with pytest.raises(ValueError, match=r"caps must be"):
        model.decode(torch.rand(2, 4, 16))
    with pytest.raises(ValueError, match="num_iterations"):
        dynamic_routing(torch.rand(1, 2, 3, 4), 0)
    with pytest.raises(ValueError, match="unknown decoder 'atlas'; choose one of"):
        PointCapsNet(decoder="atlas")
    with pytest.raises(ValueError, match="decoder='patch' only"):
        PointCapsNet(decoder="heads", decoder_width=64)
    with pytest.raises(ValueError, match="unknown decoder grid"):
        PointCapsNet(decoder_grid="sphere")
    with pytest.raises(ValueError, match="width must be >= 4"):
        PatchDecoder(4, 8, 16, width=3)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("training", [True, False])
def test_fused_primary_capsules_equal_the_reference(dtype: torch.dtype, training: bool) -> None:
    """backend="fused" vs Conv1d -> BatchNorm1d -> amax: outputs, every gradient, BN running stats (odd sizes)."""
    from capsules.model import PrimaryCapsules

    torch.manual_seed(0)
    ref = PrimaryCapsules(num_capsules=13, capsule_dim=5, backend="torch").to(dtype)
    nn.init.normal_(ref.caps_bn.weight)  # both signs of gamma: arg-max and arg-min branches
    nn.init.normal_(ref.caps_bn.bias)
    ref.caps_bn.running_var.uniform_(0.5, 2.0)
    ref.caps_bn.running_mean.normal_()
    fused = PrimaryCapsules(num_capsules=13, capsule_dim=5, backend="fused").to(dtype)
    fused.load_state_dict(ref.state_dict())
    ref.train(training)
    fused.train(training)
    points = torch.randn(3, 63, 3, dtype=dtype)
    p1, p2 = points.clone().requires_grad_(True), points.clone().requires_grad_(True)
    out_ref, out = ref(p1), fused(p2)
    tol = {} if dtype == torch.float64 else {"rtol": 1e-4, "atol": 1e-5}
    torch.testing.assert_close(out, out_ref, **tol)
    w = torch.randn_like(out)
    (out_ref * w).sum().backward()
    (out * w).sum().backward()
    torch.testing.assert_close(p2.grad, p1.grad, **tol)
    for (name, a), b in zip(ref.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, **tol, msg=lambda m, name=name: f"{name}: {m}")
    for (name, a), b in zip(ref.named_buffers(), fused.buffers(), strict=True):
        torch.testing.assert_close(b, a, **tol, msg=lambda m, name=name: f"{name}: {m}")


def test_fused_primary_capsules_tile_the_search() -> None:
    from capsules.model import fused_conv_bn_max

    torch.manual_seed(0)
    conv, bn = nn.Conv1d(6, 11, 1), nn.BatchNorm1d(11)
    x = torch.randn(2, 6, 17)
    whole = fused_conv_bn_max(x, conv, bn)
    tiled = fused_conv_bn_max(x, conv, bn, chunk_bytes=1)  # one channel per tile
    torch.testing.assert_close(tiled, whole)
    bn.eval()
    torch.testing.assert_close(fused_conv_bn_max(x, conv, bn, chunk_bytes=1), bn(conv(x)).amax(-1))


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(capsules.MODELS))
def test_cuda_fused_equals_reference_and_bf16_autocast_is_finite(name: str) -> None:
    torch.manual_seed(0)
    ref = _tiny(name).cuda()
    fused = _tiny(name).cuda()
    ref.primary.backend = "torch"
    fused.load_state_dict(ref.state_dict())
    points = torch.rand(4, 101, 3, device="cuda")
    grid = torch.rand(4, ref.decoder.num_heads, 2, ref.num_latent, device="cuda")
    # cuDNN runs the reference's Conv1d in TF32 by default (10-bit mantissa: beyond the tolerance); the fused path
    # is a float32 einsum. Compare both in full float32.
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        out_ref = ref.decode(ref.encode(points), grid)
        out = fused.decode(fused.encode(points), grid)
        torch.testing.assert_close(out, out_ref, rtol=1e-4, atol=1e-4)
        out.square().sum().backward()
        out_ref.square().sum().backward()
    for (pname, a), b in zip(ref.named_parameters(), fused.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-4, msg=lambda m, pname=pname: f"{pname}: {m}")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = fused(points)
    assert torch.isfinite(out.float()).all()
    out.float().sum().backward()
