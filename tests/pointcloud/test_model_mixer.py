"""CentroidTransformer(mixer=...): the SA blocks become global sequence mixers; the CA blocks stay."""

from __future__ import annotations

import pytest
import torch

from attention import CentroidBlock, FourierSparseAttention, MatrixMixer, MixerBlock, SelfAttentionBlock
from pointcloud.model import create_model


@pytest.mark.parametrize("mixer", ["hydra", "fsat"])
def test_sa_blocks_use_the_mixer(mixer: str) -> None:
    torch.manual_seed(0)
    kw = {"mixer_kwargs": {"max_len": 64}} if mixer == "fsat" else {}
    model = create_model("centroid_transformer_modelnet40", num_classes=5, num_neighbors=8, mixer=mixer, **kw)
    kinds = [type(b) for b in model.blocks]
    assert kinds == [MixerBlock, CentroidBlock, MixerBlock, CentroidBlock]
    expected = FourierSparseAttention if mixer == "fsat" else MatrixMixer
    assert all(isinstance(model.blocks[i].mixer, expected) for i in (0, 2))
    out = model(torch.randn(2, 64, 3))
    assert out.shape == (2, 5) and torch.isfinite(out).all()
    out.sum().backward()
    assert model.blocks[0].mixer.proj.weight.grad is not None


def test_default_keeps_knn_attention_and_bad_names_are_named() -> None:
    model = create_model("centroid_transformer_modelnet40", num_classes=5)
    assert isinstance(model.blocks[0], SelfAttentionBlock)
    with pytest.raises(ValueError, match="unknown mixer 'nope'"):
        create_model("centroid_transformer_modelnet40", mixer="nope")
    with pytest.raises(ValueError, match="needs max_len"):
        create_model("centroid_transformer_modelnet40", mixer="fsat")
