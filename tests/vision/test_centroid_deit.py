"""Tests of vision.centroid_deit: the registered sweep, the timm surface, DeiT checkpoint loading, token grids."""

from __future__ import annotations

import pytest
import timm
import torch
from timm.models import create_feature_extractor
from torch.testing import assert_close

import vision
from attention.centroid import CentroidAttention, DWConv2dInit
from vision.centroid_deit import CentroidViT, checkpoint_filter_fn

NAMES = [
    "centroid_deit_tiny_c6_patch16_224",
    "centroid_deit_tiny_c5_overlap_patch16_224",
    "centroid_deit_tiny_c7_overlap_patch16_224",
    "centroid_deit_small_c6_patch16_224",
    "centroid_deit_small_c5_overlap_patch16_224",
    "centroid_deit_small_c7_overlap_patch16_224",
]
IMG = 64  # 4 x 4 tokens (both stems) -> 2 x 2 centroids: fast on CPU


def _model(name: str, seed: int = 0, **kwargs) -> CentroidViT:
    torch.manual_seed(seed)
    return timm.create_model(name, **{"img_size": IMG, "num_classes": 7, **kwargs})


def _images(batch: int = 2, size: int = IMG, seed: int = 1) -> torch.Tensor:
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(seed))


def test_registered_on_import():
    assert vision.CentroidViT is CentroidViT
    assert sorted(timm.list_models("centroid_deit_*")) == sorted(NAMES)
    for name in NAMES:
        assert timm.models.model_entrypoint(name).__module__ == "vision.centroid_deit"
        assert timm.models.get_pretrained_cfg(name).input_size == (3, 224, 224)


# --------------------------------------------------------------------------------------------------------------------
# Sweep over every registered name
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", NAMES)
def test_forward_backward(name):
    model = _model(name).train()
    out = model(_images())
    assert out.shape == (2, 7)
    assert torch.isfinite(out).all()
    out.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.grad is None or not torch.isfinite(p.grad).all()]
    assert not missing, f"parameters without a finite gradient: {missing}"


@pytest.mark.parametrize("name", NAMES)
def test_state_dict_round_trip(name):
    a, b = _model(name, seed=0).eval(), _model(name, seed=1).eval()
    x = _images()
    assert not torch.allclose(a(x), b(x))
    b.load_state_dict(a.state_dict(), strict=True)
    assert_close(b(x), a(x), rtol=0, atol=0)


@pytest.mark.parametrize("name", NAMES)
def test_features_only_matches_feature_info(name):
    ref = _model(name)
    k = ref.centroid_index
    out_indices = (k - 1, k, 11)
    model = _model(name, features_only=True, out_indices=out_indices).eval()
    feats = model(_images())
    assert len(feats) == 3
    stem = 14 if "overlap" in name else 16
    assert model.feature_info.reduction() == [stem, 2 * stem, 2 * stem]
    assert model.feature_info.channels() == [ref.embed_dim] * 3
    for f, c, i in zip(feats, model.feature_info.channels(), out_indices):
        assert f.shape == (2, c, *ref.block_grids[i])
    assert [f.shape[-1] for f in feats] == [4, 2, 2]


@pytest.mark.parametrize("convert", [torch.fx.symbolic_trace, torch.jit.script], ids=["fx", "torchscript"])
@pytest.mark.parametrize("name", NAMES)
def test_fx_trace_and_torchscript_equal_eager(name, convert):
    model = _model(name).eval()
    x = _images()
    assert_close(convert(model)(x), model(x))


@pytest.mark.torch_compat
@pytest.mark.parametrize("name", NAMES)
def test_timm_fx_features_equal_forward_features(name):
    model = _model(name).eval()
    x = _images()
    features = create_feature_extractor(model, return_nodes={"norm": "features"})  # timm's FX tracer
    assert_close(features(x)["features"], model.forward_features(x))


@pytest.mark.torch_compat
def test_timm_fx_feature_extractor():
    model = _model(NAMES[1]).eval()
    k = model.centroid_index
    fx = create_feature_extractor(model, return_nodes={f"blocks.{k - 1}": "before", f"blocks.{k}": "after"})
    out = fx(_images())
    assert out["before"].shape == (2, 1 + 16, model.embed_dim)
    assert out["after"].shape == (2, 1 + 4, model.embed_dim)


# --------------------------------------------------------------------------------------------------------------------
# Token grids at 224 px
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "grid", "stride"),
    [("centroid_deit_tiny_c6_patch16_224", (14, 14), 16), ("centroid_deit_tiny_c5_overlap_patch16_224", (16, 16), 14)],
)
def test_token_counts_at_224(name, grid, stride):
    torch.manual_seed(0)
    model = timm.create_model(name).eval()
    assert tuple(model.patch_embed.grid_size) == grid
    assert model.pos_embed.shape == (1, 1 + grid[0] * grid[1], 192)
    x = _images(1, 224)
    n, m = grid[0] * grid[1], grid[0] * grid[1] // 4  # 196 -> 49, 256 -> 64
    k = model.centroid_index
    with torch.no_grad():
        tokens = model.forward_intermediates(x, output_fmt="NLC", intermediates_only=True, return_prefix_tokens=True)
        maps = model.forward_intermediates(x, intermediates_only=True)
        assert model.forward_features(x).shape == (1, 1 + m, 192)
    for i, (patches, prefix) in enumerate(tokens):
        assert prefix.shape == (1, 1, 192)
        assert patches.shape == (1, n if i < k else m, 192)
    half = (grid[0] // 2, grid[1] // 2)
    for i, f in enumerate(maps):
        assert f.shape == (1, 192, *(grid if i < k else half))
        assert model.feature_info[i]["reduction"] == (stride if i < k else 2 * stride)
        assert model.feature_info[i]["module"] == f"blocks.{i}"
        assert 224 // model.feature_info[i]["reduction"] == f.shape[-1]


# --------------------------------------------------------------------------------------------------------------------
# DeiT checkpoints
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def deit_tiny():
    torch.manual_seed(0)
    return timm.create_model("deit_tiny_patch16_224").eval()


def test_checkpoint_filter_matches_deit(deit_tiny):
    torch.manual_seed(1)
    model = timm.create_model("centroid_deit_tiny_c6_patch16_224").eval()
    k = model.centroid_index
    sd = checkpoint_filter_fn(deit_tiny.state_dict(), model)
    # Everything but the depth-wise conv comes from DeiT; the conv keeps its averaging init.
    from_model = {key for key in sd if key.startswith(f"blocks.{k}.init.")}
    assert from_model == {f"blocks.{k}.init.conv.weight", f"blocks.{k}.init.conv.bias"}
    assert_close(sd[f"blocks.{k}.init.conv.weight"], torch.full_like(sd[f"blocks.{k}.init.conv.weight"], 1 / 9))
    missing, unexpected = model.load_state_dict(sd, strict=True)
    assert not missing and not unexpected
    plain = model.state_dict()
    # A plain state dict without the conv keys: exactly those are missing (what strict=False would report).
    sd_no_conv = {key: v for key, v in sd.items() if key not in from_model}
    result = model.load_state_dict(sd_no_conv, strict=False)
    assert sorted(result.missing_keys) == sorted(from_model) and not result.unexpected_keys
    assert all(torch.equal(plain[key], model.state_dict()[key]) for key in plain)

    x = _images(2, 224)
    with torch.no_grad():
        ours = model.forward_intermediates(x, indices=list(range(k + 1)), output_fmt="NLC", intermediates_only=True,
                                           return_prefix_tokens=True)  # fmt: skip
        theirs = deit_tiny.forward_intermediates(x, indices=list(range(k + 1)), output_fmt="NLC",
                                                 intermediates_only=True, return_prefix_tokens=True)  # fmt: skip
    for i in range(k):  # the full-resolution blocks are DeiT's
        assert_close(ours[i][0], theirs[i][0], rtol=0, atol=0)
        assert_close(ours[i][1], theirs[i][1], rtol=0, atol=0)
    # At the centroid block the class token gets exactly DeiT block k's update (query over all tokens, same weights).
    assert_close(ours[k][1], theirs[k][1], rtol=1e-5, atol=1e-5)
    assert ours[k][0].shape == (2, 49, 192)


def test_checkpoint_filter_overlap_and_img_size(deit_tiny):
    for name, size, grid in [
        ("centroid_deit_tiny_c5_overlap_patch16_224", 224, (16, 16)),
        ("centroid_deit_tiny_c7_overlap_patch16_224", 96, (6, 6)),
        ("centroid_deit_tiny_c6_patch16_224", 96, (6, 6)),
    ]:
        model = timm.create_model(name, img_size=size).eval()
        sd = checkpoint_filter_fn({"model": deit_tiny.state_dict()}, model)
        assert sd["pos_embed"].shape == (1, 1 + grid[0] * grid[1], 192)
        assert_close(sd["pos_embed"][:, 0], deit_tiny.pos_embed[:, 0])  # class token position kept
        assert torch.equal(sd["patch_embed.proj.weight"], deit_tiny.patch_embed.proj.weight)  # kernel 16 unchanged
        model.load_state_dict(sd, strict=True)
        assert torch.isfinite(model(_images(1, size))).all()


def test_pretrained_file_goes_through_filter(deit_tiny, tmp_path):
    path = tmp_path / "deit_tiny.pth"
    torch.save(deit_tiny.state_dict(), path)
    model = timm.create_model(
        "centroid_deit_tiny_c5_overlap_patch16_224", pretrained=True, pretrained_cfg_overlay=dict(file=str(path))
    )
    k = model.centroid_index
    assert_close(model.blocks[k].attn.q.weight, deit_tiny.blocks[k].attn.qkv.weight[:192])
    assert_close(model.blocks[k].attn.kv.weight, deit_tiny.blocks[k].attn.qkv.weight[192:])
    assert_close(model.blocks[k].attn.norm_kv.weight, deit_tiny.blocks[k].norm1.weight)
    assert_close(model.blocks[0].attn.qkv.weight, deit_tiny.blocks[0].attn.qkv.weight)


def test_distilled_checkpoint_layout(deit_tiny):
    sd = dict(deit_tiny.state_dict())
    pe = sd["pos_embed"]
    sd["pos_embed"] = torch.cat([pe[:, :1], torch.zeros_like(pe[:, :1]), pe[:, 1:]], 1)
    sd["dist_token"] = torch.zeros(1, 1, 192)
    sd["head_dist.weight"], sd["head_dist.bias"] = torch.zeros(1000, 192), torch.zeros(1000)
    model = timm.create_model("centroid_deit_tiny_c6_patch16_224")
    out = checkpoint_filter_fn(sd, model)
    model.load_state_dict(out, strict=True)
    assert_close(model.pos_embed, pe)


# --------------------------------------------------------------------------------------------------------------------
# Layers and the rest of the timm surface
# --------------------------------------------------------------------------------------------------------------------


def test_centroid_block_is_the_core_layer():
    """Vision holds no copy of the core: the centroid block runs attention.CentroidAttention and DWConv2dInit."""
    import inspect

    import vision

    model = _model(NAMES[0])
    blk = model.blocks[model.centroid_index]
    assert type(blk.attn) is CentroidAttention and type(blk.init) is DWConv2dInit
    for module in (vision.centroid_deit, vision.baselines, vision.mixer_deit):
        for _, cls in inspect.getmembers(module, inspect.isclass):
            assert not (cls is not CentroidAttention and issubclass(cls, CentroidAttention)), cls
            assert not (cls is not DWConv2dInit and issubclass(cls, DWConv2dInit)), cls


def test_model_surface():
    model = _model(NAMES[0])
    assert model.no_weight_decay() == {"pos_embed", "cls_token"}
    groups = timm.models.group_parameters(model, model.group_matcher())
    assert sum(len(v) for v in groups.values()) == len(list(model.parameters()))
    assert model.get_classifier() is model.head
    x = _images()
    model.eval()
    feats = model.forward_features(x)
    assert feats.shape == (2, 1 + 4, 192)
    assert model.forward_head(feats, pre_logits=True).shape == (2, 192)
    model.reset_classifier(3, global_pool="avg")
    assert model(x).shape == (2, 3) and model.global_pool == "avg"
    model.reset_classifier(0)
    assert model(x).shape == (2, 192)
    final, inter = model.forward_intermediates(x, indices=2, norm=True)
    assert_close(final, feats)
    assert [t.shape[-1] for t in inter] == [2, 2]
    assert len(model.forward_intermediates(x, indices=[1], stop_early=True, intermediates_only=True)) == 1


@pytest.mark.torch_compat
def test_grad_checkpointing_same_output():
    model = _model(NAMES[1]).train()
    x = _images()
    torch.manual_seed(0)
    ref = model(x)
    model.set_grad_checkpointing(True)
    torch.manual_seed(0)
    out = model(x)
    assert_close(out, ref)
    out.sum().backward()
    assert model.blocks[model.centroid_index].init.conv.weight.grad is not None


def test_odd_grid_and_kwargs():
    model = _model(NAMES[0], img_size=80, drop_path_rate=0.1).eval()  # 5 x 5 -> 3 x 3
    assert model.block_grids[model.centroid_index] == (3, 3)
    assert model.forward_features(_images(1, 80)).shape == (1, 1 + 9, 192)
    with pytest.raises(ValueError, match="unknown mixer 'nope'"):
        _model(NAMES[0], mixer="nope")
    with pytest.raises(ValueError, match="centroid_index"):
        _model(NAMES[0], centroid_index=12)


# --------------------------------------------------------------------------------------------------------------------
# Baselines (vision/baselines.py)
# --------------------------------------------------------------------------------------------------------------------

BASELINES = [
    "settrans_deit_tiny_patch16_224",
    "settrans_deit_small_patch16_224",
    "linformer_deit_tiny_patch16_224",
    "linformer_deit_small_patch16_224",
]


@pytest.mark.torch_compat
@pytest.mark.parametrize("name", BASELINES)
def test_baseline_sweep(name):
    model = _model(name).train()
    x = _images()
    out = model(x)
    assert out.shape == (2, 7) and torch.isfinite(out).all()
    out.square().mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    model.eval()
    other = _model(name, seed=1).eval()
    other.load_state_dict(model.state_dict(), strict=True)
    assert_close(other(x), model(x), rtol=0, atol=0)
    assert_close(torch.fx.symbolic_trace(model)(x), model(x))
    assert_close(torch.jit.script(model)(x), model(x))
    feats = _model(name, features_only=True, out_indices=(0, 11))(x)
    assert [f.shape for f in feats] == [(2, model.embed_dim, 4, 4)] * 2
    assert model.feature_info[11]["reduction"] == 16


@pytest.mark.parametrize("name", ["settrans_deit_tiny_patch16_224", "linformer_deit_tiny_patch16_224"])
def test_baseline_checkpoint_filter_loads_shared_deit_keys(name, deit_tiny, tmp_path, caplog):
    from vision.baselines import checkpoint_filter_fn as baseline_filter

    torch.manual_seed(2)
    model = timm.create_model(name).eval()
    init = {k: v.clone() for k, v in model.state_dict().items()}
    with caplog.at_level("INFO", logger="vision.baselines"):
        sd = baseline_filter(deit_tiny.state_dict(), model)
    model.load_state_dict(sd, strict=True)
    theirs = deit_tiny.state_dict()
    own = {"inducing", "norm_h", "proj_k", "proj_v"}
    for key, value in model.state_dict().items():
        if any(f".attn.{o}" in key for o in own):
            assert torch.equal(value, init[key]), key  # not in DeiT: kept at the model's init
        else:
            assert torch.equal(value, theirs[key]), key  # patch embed, pos embed, norms, qkv / proj, MLPs, head
    expected = "blocks.*.attn.inducing (x12)" if "settrans" in name else "blocks.*.attn.proj_k.weight (x12)"
    assert expected in caplog.text and "kept at init" in caplog.text
    # Through timm's pretrained path, at another size and class count (head and grid differ from DeiT's)
    path = tmp_path / "deit_tiny.pth"
    torch.save(deit_tiny.state_dict(), path)
    with caplog.at_level("INFO"):
        other = timm.create_model(
            name, pretrained=True, img_size=96, num_classes=7, pretrained_cfg_overlay=dict(file=str(path))
        )
    assert_close(other.blocks[3].mlp.fc1.weight, deit_tiny.blocks[3].mlp.fc1.weight)
    assert other.pos_embed.shape == (1, 1 + 36, 192) and other.head.out_features == 7
    assert torch.isfinite(other(_images(1, 96))).all()


def test_the_model_validates_no_activations(monkeypatch):
    """Like timm's models, a centroid DeiT checks nothing past the image: a NaN/Inf check on an activation is a
    reduction plus a host sync (a device-to-host copy) in every forward, which stalls the GPU's queue."""

    def fail(*args, **kwargs):
        raise AssertionError("CentroidAttention.check_inputs ran inside the model")

    monkeypatch.setattr(CentroidAttention, "check_inputs", fail)
    model = _model("centroid_deit_tiny_c6_patch16_224").eval()
    with torch.no_grad():
        assert torch.isfinite(model(_images())).all()
    assert not any(m.validate_inputs for m in model.modules() if isinstance(m, CentroidAttention))


@pytest.mark.gpu
def test_cuda_forward_has_no_host_sync():
    model = _model("centroid_deit_tiny_c6_patch16_224").cuda().eval()
    images = _images().cuda()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
            model(images)
    finally:
        torch.cuda.set_sync_debug_mode("default")
