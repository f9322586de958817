"""Centroid neighbourhoods of the second centroid block: the layer's own feature-space neighbours, the xyz baseline
against brute force, the part-agreement fractions."""

from __future__ import annotations

import pytest
import torch

from attention.centroid.layer import CentroidAttention
from pointcloud import create_model
from pointcloud.neighbourhoods import centroid_neighbourhoods, part_agreement


def _model(**kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("centroid_transformer_modelnet40", num_centroids=(32, 16), num_neighbors=4, **kwargs).eval()


def test_feature_neighbours_are_the_ones_the_layer_attends_to(monkeypatch: pytest.MonkeyPatch) -> None:
    model = _model()
    points = torch.rand(2, 64, 3, generator=torch.Generator().manual_seed(1))
    used = []
    real = CentroidAttention._feature_neighbors

    def record(self, u, x, mask):
        idx = real(self, u, x, mask)
        if self is model.blocks[3].attn:
            used.append(idx)
        return idx

    monkeypatch.setattr(CentroidAttention, "_feature_neighbors", record)
    nbrs = centroid_neighbourhoods(model, points)
    assert nbrs.centre.shape == (2, 16) and nbrs.feature.shape == nbrs.xyz.shape == (2, 16, 4)
    assert nbrs.stage.shape == (2, 32) and int(nbrs.stage.max()) < 64
    (idx,) = used[-1:]  # the layer's first-step neighbours, as indices into the block's 32 inputs
    assert torch.equal(torch.gather(nbrs.stage, 1, idx.flatten(1)).view_as(idx).sort(-1)[0], nbrs.feature.sort(-1)[0])
    assert (nbrs.feature == nbrs.centre.unsqueeze(-1)).any(-1).all()  # FPS init: a centroid starts as its point
    assert set(nbrs.centre.flatten().tolist()) <= set(nbrs.stage.flatten().tolist())
    assert not model.training


def test_xyz_neighbours_are_the_nearest_stage_points() -> None:
    model = _model()
    points = torch.rand(1, 64, 3, generator=torch.Generator().manual_seed(2))
    nbrs = centroid_neighbourhoods(model, points)
    stage = nbrs.stage[0]
    for m in range(16):
        d = (points[0, stage] - points[0, nbrs.centre[0, m]]).square().sum(-1)  # (32,)
        assert set(stage[d.argsort()[:4]].tolist()) == set(nbrs.xyz[0, m].tolist())


def test_part_agreement_fractions() -> None:
    model = _model()
    points = torch.rand(3, 64, 3, generator=torch.Generator().manual_seed(3))
    nbrs = centroid_neighbourhoods(model, points)
    same = part_agreement(nbrs, torch.zeros(3, 64, dtype=torch.long))
    assert same == {"feature": 1.0, "xyz": 1.0, "random": 1.0}
    halves = (points[..., 0] > 0.5).long()  # two parts split by a plane: xyz neighbours mostly agree
    agree = part_agreement(nbrs, halves)
    assert agree["xyz"] > agree["random"] and 0.0 <= agree["feature"] <= 1.0
    own = torch.gather(halves, 1, nbrs.centre).unsqueeze(-1)
    expected = (torch.gather(halves, 1, nbrs.xyz.flatten(1)).view(3, 16, 4) == own).float().mean()
    assert agree["xyz"] == pytest.approx(float(expected))
    assert part_agreement(nbrs, halves, seed=5)["feature"] == agree["feature"]


def test_models_without_sampled_centroids_are_refused() -> None:
    points = torch.rand(1, 64, 3)
    with pytest.raises(ValueError, match=r"model.blocks\[1\] averages points"):
        centroid_neighbourhoods(_model(init="kmeans"), points)
    with pytest.raises(ValueError, match=r"model.blocks\[2\] must be a centroid block"):
        centroid_neighbourhoods(_model(), points, block=2)
