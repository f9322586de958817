"""Tests for engine.registry: timm's surface (register_model, create_model, list_models(pattern)) for our models."""

from __future__ import annotations

import pytest
from torch import nn

import capsules
import pointcloud
from engine import ModelRegistry


def test_register_create_and_list_with_a_pattern():
    registry = ModelRegistry("toy")

    @registry.register_model
    def toy_small(width: int = 4, **kwargs) -> nn.Module:
        return nn.Linear(width, width, **kwargs)

    @registry.register_model
    def toy_large(width: int = 16) -> nn.Module:
        return nn.Linear(width, width)

    assert registry.list_models() == ["toy_large", "toy_small"] and registry.list_models("*_small") == ["toy_small"]
    assert registry.create_model("toy_small", width=8).in_features == 8
    with pytest.raises(ValueError, match=r"does not take one of the keywords \['depth'\]"):
        registry.create_model("toy_large", depth=3)
    with pytest.raises(ValueError, match=r"unknown model 'toy_huge'; the toy models are \['toy_large', 'toy_small'\]"):
        registry.create_model("toy_huge")
    registry.register_model(toy_small)  # the same function again: fine
    models, register_model, list_models, create_model = registry.exports()
    assert models is registry.models and list_models("*_large") == ["toy_large"]
    assert create_model("toy_small").in_features == 4 and register_model(toy_small) is toy_small

    def toy_small() -> nn.Module:  # another function under a taken name
        return nn.Identity()

    with pytest.raises(ValueError, match="already registered"):
        registry.register_model(toy_small)


def test_point_and_capsule_models_share_the_surface():
    for module, pattern, expected in (
        (pointcloud.model, "centroid_transformer_*", "centroid_transformer_modelnet40"),
        (capsules.model, "pointcaps_*_small", "pointcaps_centroid_small"),
    ):
        names = module.list_models(pattern)
        assert expected in names and all(n in module.list_models() for n in names)
    with pytest.raises(ValueError, match="num_steps"):
        capsules.create_model("pointcaps_routing_small", num_steps=2)
