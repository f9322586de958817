"""The mixer= keyword of the vision models and the registered <mixer>_deit_* variants."""

from __future__ import annotations

import pytest
import timm
import torch

import vision  # noqa: F401  (registers the models)
from attention.mixers import MatrixMixer
from attention.mixers.fsat import FourierSparseAttention
from vision.centroid_deit import GridCentroidBlock
from vision.mixer_deit import MIXER_VARIANTS

IMG = 64  # 4 x 4 patch tokens + the class token
NAMES = [f"{m}_deit_{s}_patch16_224" for m in MIXER_VARIANTS for s in ("tiny", "small")]


def test_variants_are_registered() -> None:
    for name in NAMES:
        assert name in timm.list_models(), name
        assert timm.models.model_entrypoint(name).__module__ == "vision.mixer_deit"


@pytest.mark.parametrize("mixer", MIXER_VARIANTS)
def test_tiny_variants_forward_backward(mixer: str) -> None:
    torch.manual_seed(0)
    model = timm.create_model(f"{mixer}_deit_tiny_patch16_224", img_size=IMG, num_classes=5, depth=3).train()
    assert model.centroid_index is None
    out = model(torch.randn(2, 3, IMG, IMG))
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    out.square().mean().backward()
    bad = [n for n, p in model.named_parameters() if p.grad is not None and not torch.isfinite(p.grad).all()]
    assert not bad
    assert all(not isinstance(b.attn, timm.layers.Attention) for b in model.blocks)


def test_centroid_deit_with_a_mixer_keeps_its_centroid_block() -> None:
    torch.manual_seed(0)
    model = timm.create_model("centroid_deit_tiny_c6_patch16_224", mixer="fsat", img_size=IMG, num_classes=5)
    for i, blk in enumerate(model.blocks):
        if i == model.centroid_index:
            assert isinstance(blk, GridCentroidBlock)
        else:
            assert isinstance(blk.attn, FourierSparseAttention)
            assert blk.attn.max_len == 1 + (16 if i < model.centroid_index else 4)
    model.eval()
    x = torch.randn(1, 3, IMG, IMG)
    assert torch.equal(model(x), model(x))
    cauchy = timm.create_model("centroid_deit_tiny_c6_patch16_224", mixer="cauchy", img_size=IMG)
    assert isinstance(cauchy.blocks[0].attn, MatrixMixer) and cauchy.blocks[0].attn.matrix_name == "cauchy"
    assert cauchy(x).shape == (1, 1000)


def test_unknown_mixer_lists_the_choices() -> None:
    with pytest.raises(ValueError, match=r"unknown mixer 'nope'; choose one of \["):
        timm.create_model("centroid_deit_tiny_c6_patch16_224", mixer="nope", img_size=IMG)
    with pytest.raises(ValueError, match=r"unknown mixer \[1\]; choose one of \["):  # from a config: not a TypeError
        timm.create_model("centroid_deit_tiny_c6_patch16_224", mixer=[1], img_size=IMG)
