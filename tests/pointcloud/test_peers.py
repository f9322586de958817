"""Peer models (DGCNN, PointNet++ SSG): the edge_index helper, layer equivalence with dense references, the models."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attention import farthest_point_sample, gather, knn
from pointcloud import create_model, list_models
from pointcloud.peers import DGCNN, PointNet2SSG, SetAbstraction, knn_edge_index
from pointcloud.testing import check_registered_model

# Small enough for a 2-core CPU: every test below runs in well under a second.
SMALL = {
    "dgcnn_modelnet40": {"k": 8, "conv_dims": (16, 16, 32, 32), "emb_dim": 64, "head_dims": (32, 16)},
    "pointnet2_ssg_modelnet40": {
        "num_centroids": (32, 8),
        "num_neighbors": (8, 8),
        "mlps": ((16, 16), (32, 32), (32, 64)),
        "head_dims": (32, 16),
    },
}
PEERS = sorted(SMALL)


def test_knn_edge_index_hand_example() -> None:
    # B = 2 clouds of N = 3 reference points, M = 2 centres with K = 2 neighbours each.
    idx = torch.tensor([[[0, 2], [1, 0]], [[2, 1], [0, 0]]])
    edge_index = knn_edge_index(idx, num_ref=3)
    # Cloud 1's sources are offset by N = 3 and its targets by M = 2.
    expected = torch.tensor([[0, 2, 1, 0, 5, 4, 3, 3], [0, 0, 1, 1, 2, 2, 3, 3]])
    assert_close(edge_index, expected)
    keep = torch.tensor([[[True, False], [True, True]], [[True, True], [True, False]]])
    assert_close(knn_edge_index(idx, 3, keep), torch.tensor([[0, 1, 0, 5, 4, 3], [0, 1, 1, 2, 2, 3]]))


def test_knn_edge_index_errors() -> None:
    with pytest.raises(ValueError, match=r"\(B, M, K\)"):
        knn_edge_index(torch.zeros(2, 3, dtype=torch.long), 3)
    with pytest.raises(ValueError, match=r"\[0, num_ref=3\)"):
        knn_edge_index(torch.tensor([[[0, 3]]]), 3)
    with pytest.raises(ValueError, match="keep must be a bool tensor of shape"):
        knn_edge_index(torch.zeros(1, 2, 2, dtype=torch.long), 3, keep=torch.ones(1, 2, 3, dtype=torch.bool))


def test_edge_conv_matches_dense_reference() -> None:
    model = DGCNN(**SMALL["dgcnn_modelnet40"]).eval()
    conv = model.convs[0]
    x = torch.rand(2, 20, 3)
    _, idx = knn(x, x, 5)  # (B, N, K)
    out = conv(x.reshape(40, 3), knn_edge_index(idx, 20)).view(2, 20, -1)
    nbrs = gather(x, idx)  # (B, N, K, C)
    centre = x.unsqueeze(2).expand_as(nbrs)
    dense = conv.nn(torch.cat([centre, nbrs - centre], -1).reshape(-1, 6)).view(2, 20, 5, -1).amax(2)
    assert_close(out, dense)


@pytest.mark.parametrize("radius", [None, 0.3])
def test_set_abstraction_matches_dense_reference(radius: float | None) -> None:
    sa = SetAbstraction(2, (8, 16), num_centroids=6, num_neighbors=5, radius=radius).eval()
    x, pos = torch.rand(2, 20, 2), torch.rand(2, 20, 3)
    out, centres = sa(x, pos)
    assert out.shape == (2, 6, 16) and centres.shape == (2, 6, 3)
    assert_close(centres, gather(pos, farthest_point_sample(pos, 6)))
    dist, idx = knn(centres, pos, 5)
    msg = torch.cat([gather(x, idx), gather(pos, idx) - centres.unsqueeze(2)], -1)  # (B, M, K, C + 3)
    h = sa.conv.local_nn(msg.reshape(-1, 5)).view(2, 6, 5, 16)
    if radius is not None:
        assert bool((dist > radius**2).any()), "the radius should drop some neighbours in this example"
        h = h.masked_fill((dist > radius**2).unsqueeze(-1), -torch.inf)
    assert_close(out, h.amax(2))


def test_peers_registered() -> None:
    assert {"dgcnn_modelnet40", "pointnet2_ssg_modelnet40"} <= set(list_models())
    dgcnn = create_model("dgcnn_modelnet40", num_neighbors=7)  # the recipe's knob name for k
    assert isinstance(dgcnn, DGCNN) and dgcnn.k == 7
    assert isinstance(create_model("pointnet2_ssg_modelnet40", num_centroids=[128, 32]), PointNet2SSG)


@pytest.mark.parametrize("name", PEERS)
def test_peer_sweep(name: str) -> None:
    check_registered_model(name, **SMALL[name])


@pytest.mark.parametrize("name", PEERS)
def test_batch_of_one_and_bf16_autocast(name: str) -> None:
    model = create_model(name, **SMALL[name])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.rand(2, 64, 3))
        logits.float().logsumexp(-1).sum().backward()
    assert logits.shape == (2, 40) and bool(torch.isfinite(logits).all())
    model.eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        one = model(torch.rand(1, 64, 3))
    assert one.shape == (1, 40) and bool(torch.isfinite(one).all())


@pytest.mark.parametrize("name", PEERS)
def test_normals_and_classifier_reset(name: str) -> None:
    model = create_model(name, in_channels=6, **SMALL[name])
    model.reset_classifier(10)
    points = torch.rand(2, 64, 6)
    assert model(points).shape == (2, 10)
    assert model.get_classifier().out_features == 10
    assert model.forward_head(model.forward_features(points), pre_logits=True).shape == (2, 16)


@pytest.mark.parametrize("name", PEERS)
def test_small_clouds_clamp_centres_and_neighbours(name: str) -> None:
    # Paper defaults (k = 20; 512 / 128 centres, 32 / 64 neighbours) on a 24-point cloud: everything is clamped.
    model = create_model(name).eval()
    assert model(torch.rand(2, 24, 3)).shape == (2, 40)


@pytest.mark.parametrize("name", PEERS)
def test_bad_input(name: str) -> None:
    model = create_model(name, **SMALL[name])
    with pytest.raises(ValueError, match=r"\(B, N, 3\)"):
        model(torch.rand(2, 64, 4))
    with pytest.raises(ValueError, match=r"\(B, N, 3\), got a 2-d tensor"):
        model(torch.rand(64, 3))


def test_bad_kwargs() -> None:
    with pytest.raises(ValueError, match="not both"):
        create_model("dgcnn_modelnet40", k=8, num_neighbors=8)
    with pytest.raises(ValueError, match="num_centroids and num_neighbors need 2 entries"):
        create_model("pointnet2_ssg_modelnet40", num_centroids=(64, 32, 16))
    with pytest.raises(ValueError, match="in_channels must be >= 3"):
        create_model("pointnet2_ssg_modelnet40", in_channels=2)
