"""Peer models (PointNet, DGCNN, PointNet++ SSG): the edge_index helper, layer equivalence with dense references, the
models."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attention import farthest_point_sample, gather, knn
from pointcloud import create_model, list_models
from pointcloud.peers import DGCNN, PointNet, PointNet2SSG, SetAbstraction, knn_edge_index
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
    "pointnet_modelnet40": {"head_dims": (32, 16)},
    "pointnet_vanilla_modelnet40": {"head_dims": (32, 16)},
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


@pytest.mark.torch_compat
def test_pointnet_sizes_match_its_paper() -> None:
    """PointNet paper, Table 6: 3.5 M params with the transforms, 0.8 M without (its FLOPs are MACs: 440 M, 148 M)."""
    from measure.stats import count_gmacs, count_params

    full, vanilla = create_model("pointnet_modelnet40").eval(), create_model("pointnet_vanilla_modelnet40").eval()
    assert full.input_tnet is not None and full.feature_tnet is not None
    assert vanilla.input_tnet is None and vanilla.feature_tnet is None
    assert count_params(full) / 1e6 == pytest.approx(3.5, rel=0.02)
    assert count_params(vanilla) / 1e6 == pytest.approx(0.8, rel=0.03)
    clouds = torch.rand(1, 1024, 3)
    assert count_gmacs(full, clouds) == pytest.approx(0.44, rel=0.03)
    assert count_gmacs(vanilla, clouds) == pytest.approx(0.148, rel=0.03)


def test_pointnet_with_identity_transforms_is_the_vanilla_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """The transforms multiply xyz (3 x 3) and the 64-d features (64 x 64) from the right; with both at the identity
    the model is the vanilla one with the same shared MLPs and head. They start near the identity."""
    torch.manual_seed(0)
    full = PointNet(num_classes=7, in_channels=6).eval()
    vanilla = PointNet(num_classes=7, in_channels=6, input_transform=False, feature_transform=False).eval()
    vanilla.load_state_dict({k: v for k, v in full.state_dict().items() if "tnet" not in k})
    points = torch.rand(2, 50, 6)
    with torch.no_grad():
        a_in, a_feat = full.input_tnet(points), full.feature_tnet(torch.rand(2, 50, 64))
    assert (a_in - torch.eye(3)).abs().max() < 0.05 and (a_feat - torch.eye(64)).abs().max() < 0.05
    rot = torch.tensor([[0.0, -1.0, 0.0], [1.0, 0.0, 0.0], [0.0, 0.0, 1.0]])
    monkeypatch.setattr(full.input_tnet, "forward", lambda x: rot.expand(x.shape[0], 3, 3))
    monkeypatch.setattr(full.feature_tnet, "forward", lambda x: torch.eye(64).expand(x.shape[0], 64, 64))
    rotated = torch.cat([points[..., :3] @ rot, points[..., 3:]], -1)  # xyz turned, normals left as they are
    assert_close(full(points), vanilla(rotated))


def test_pointnet_orthogonality_loss_and_permutation_invariance() -> None:
    torch.manual_seed(1)
    model = PointNet(num_classes=5).train()
    points = torch.rand(4, 40, 3)
    model(points)
    x = model.mlp1(points.reshape(-1, 3)).view(4, 40, 64)  # the features the feature transform saw (same BN batch)
    a = model.feature_tnet(x)
    expected = 0.001 * (torch.eye(64) - a @ a.transpose(1, 2)).square().sum((1, 2)).mean()
    assert_close(model.aux_loss, expected)
    model.eval()
    assert model(points).shape == (4, 5) and model.aux_loss is None  # no regularizer outside training
    assert_close(model(points[:, torch.randperm(40)]), model(points), rtol=1e-5, atol=1e-5)
    vanilla = create_model("pointnet_vanilla_modelnet40").train()
    vanilla(points)
    assert vanilla.aux_loss is None
    assert create_model("pointnet_modelnet40", num_neighbors=16).input_tnet is not None  # the recipe's K: ignored


def test_the_recipe_adds_the_model_regularizer_to_the_loss() -> None:
    from pointcloud.recipe import ModelNetConfig, ModelNetRecipe

    torch.manual_seed(2)
    recipe = ModelNetRecipe(ModelNetConfig(label_smoothing=0.0), ctx=None)
    model = create_model("pointnet_modelnet40", num_classes=5, drop=0.0).train()
    points, labels = torch.rand(4, 32, 3), torch.tensor([0, 1, 2, 3])
    loss, logs = recipe.loss(model, (points, labels))
    model2 = create_model("pointnet_modelnet40", num_classes=5, drop=0.0).train()
    model2.load_state_dict(model.state_dict())
    ce = torch.nn.functional.cross_entropy(model2(points), labels)
    assert_close(loss, ce + model2.aux_loss) and float(logs["aux_loss"]) > 0


def test_bad_kwargs() -> None:
    with pytest.raises(ValueError, match="not both"):
        create_model("dgcnn_modelnet40", k=8, num_neighbors=8)
    with pytest.raises(ValueError, match="num_centroids and num_neighbors need 2 entries"):
        create_model("pointnet2_ssg_modelnet40", num_centroids=(64, 32, 16))
    with pytest.raises(ValueError, match="in_channels must be >= 3"):
        create_model("pointnet2_ssg_modelnet40", in_channels=2)
    with pytest.raises(ValueError, match="reg_weight must be >= 0"):
        create_model("pointnet_modelnet40", reg_weight=-1.0)
