"""Centroid neighbourhoods of the second centroid block: the layer's own feature-space neighbours, the xyz baseline
against brute force, the part-agreement fractions (by hand, and over a split), the picture's colours."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from attention.centroid.layer import CentroidAttention
from pointcloud import create_model
from pointcloud.neighbourhoods import (
    Neighbourhoods,
    centroid_neighbourhoods,
    neighbourhood_view,
    part_agreement,
    part_dataset,
    split_agreement,
)
from pointcloud.parts import SyntheticParts
from pointcloud.render import GREY, palette


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


def test_part_agreement_by_hand() -> None:
    """Six points, parts 0 0 0 1 1 1; two centroids (points 0 and 3) with K = 2; the stage is points 1 and 4."""
    part = torch.tensor([[0, 0, 0, 1, 1, 1]])
    nbrs = Neighbourhoods(
        centre=torch.tensor([[0, 3]]),
        feature=torch.tensor([[[0, 1], [3, 0]]]),  # 2 of 2 on part 0, then 1 of 2 on part 1: 3 / 4
        xyz=torch.tensor([[[0, 3], [4, 5]]]),  # 1 of 2, then 2 of 2: 3 / 4
        stage=torch.tensor([[1, 4]]),  # K = 2 random points of 2 are both, one per part: 1 / 2 for each centroid
    )
    assert part_agreement(nbrs, part) == {"feature": 0.75, "xyz": 0.75, "random": 0.5}
    nbrs = nbrs._replace(xyz=torch.tensor([[[5, 4], [0, 1]]]))  # every xyz neighbour on the other part
    assert part_agreement(nbrs, part)["xyz"] == 0.0


def test_split_agreement_is_the_mean_over_shapes_whatever_the_batch() -> None:
    model = _model()
    dataset = SyntheticParts("test", num_points=64, classes=("table", "mug"), samples_per_class=3)
    whole = split_agreement(model, dataset, batch_size=4)
    assert whole == split_agreement(model, dataset, batch_size=1)
    assert (whole["shapes"], whole["num_centroids"], whole["num_neighbors"]) == (6, 16, 4)
    rows = []
    for i in range(6):
        points, parts = dataset[i]
        rows.append(part_agreement(centroid_neighbourhoods(model, points[None]), parts[None], seed=i))
    for key in ("feature", "xyz", "random"):
        assert whole[key] == pytest.approx(np.mean([r[key] for r in rows]))
        assert whole["by_category"]["mug"][key] == pytest.approx(np.mean([r[key] for r in rows[3:]]))
    assert whole["by_category"]["table"]["shapes"] == 3
    assert split_agreement(model, dataset, max_shapes=3)["by_category"].keys() == {"table"}
    with pytest.raises(ValueError, match="part source must be one of"):
        part_dataset("modelnet40", "test", 64)


def test_neighbourhood_view_colours_each_centroids_neighbours() -> None:
    model = _model()
    dataset = SyntheticParts("test", num_points=64, classes=("table",), samples_per_class=1)
    points, parts = (t.numpy() for t in dataset[0])
    nbrs = centroid_neighbourhoods(model, torch.from_numpy(points)[None])
    xyz, rgb = neighbourhood_view(points, nbrs, [0, 5], parts, num_parts=2)
    assert xyz.shape == rgb.shape == (2 * 64 + 2 * 2 * 13, 3)
    assert xyz[:64, 0].mean() < xyz[64:128, 0].mean()  # feature space left, xyz right
    colours = palette(2)
    for side, found in ((slice(0, 64), nbrs.feature[0]), (slice(64, 128), nbrs.xyz[0])):
        np.testing.assert_allclose(rgb[side][found[5].numpy()], np.tile(colours[1], (4, 1)))
        others = np.setdiff1d(np.arange(64), found[[0, 5]].flatten().numpy())
        np.testing.assert_allclose(rgb[side][others], 0.35 * palette(2)[parts[others]] + 0.65)  # pale parts
    assert (rgb[128:] == 0).all()  # the markers are black, centred on the centroids' points
    np.testing.assert_allclose(xyz[128], xyz[int(nbrs.centre[0, 0])])
    _, plain = neighbourhood_view(points, nbrs, [0])
    assert (plain[:64][np.isin(np.arange(64), nbrs.feature[0, 0].numpy(), invert=True)] == GREY).all()
    with pytest.raises(ValueError, match=r"centroids \[16\] are outside the block's 16 centroids"):
        neighbourhood_view(points, nbrs, [16])
