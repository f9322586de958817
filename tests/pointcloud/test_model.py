"""Point-cloud models: a sweep over the registry (shape, finiteness, gradients, state-dict round trip)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from pointcloud.model import create_model, list_models
from pointcloud.testing import check_registered_model

REPO = Path(__file__).resolve().parents[2]

SMALL = {"num_centroids": (64, 32), "num_neighbors": 8}
# Peer models take only the knobs that mean something to them (DGCNN has no centroids).
SMALL_BY_MODEL = {"dgcnn_modelnet40": {"k": 8}, "pointnet_modelnet40": {}, "pointnet_vanilla_modelnet40": {}}


@pytest.mark.parametrize("name", list_models())
def test_registered_model_sweep(name: str) -> None:
    check_registered_model(name, **SMALL_BY_MODEL.get(name, SMALL))


@pytest.mark.parametrize("name", ["centroid_transformer_modelnet40", "pointnet2_ssg_modelnet40", "dgcnn_modelnet40"])
def test_every_classifier_takes_xyz_first(name: str) -> None:
    """PointClassifier checks in_channels and keeps the classes and channels for every model built on it."""
    model = create_model(name, num_classes=7, in_channels=6, **SMALL_BY_MODEL.get(name, SMALL))
    assert (model.num_classes, model.in_channels) == (7, 6)
    with pytest.raises(ValueError, match=r"in_channels must be >= 3 \(xyz first\), got 2"):
        create_model(name, in_channels=2)


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_num_steps_kwarg(steps: int) -> None:
    model = create_model("centroid_transformer_modelnet40", num_steps=steps, **SMALL).eval()
    assert model.blocks[1].attn.num_steps == steps
    assert model(torch.rand(1, 100, 3)).shape == (1, 40)


@pytest.mark.parametrize(
    "levers",
    [
        {"sa_pos_encoding": True},
        {"ca_pos_encoding": True, "layer_scale": 0.1},
        {"ca_neighbors": "xyz", "ca_normalize": "centroids", "num_steps": 2},
        {"ca_num_neighbors": 12},
        {"ca_num_heads": 16, "num_steps": 2},
        {"ca_aggregation": "vector", "ca_num_heads": 16, "ca_pos_encoding": True},
        {"ca_aggregation": "max", "ca_pos_encoding": True, "ca_neighbors": "xyz", "num_steps": 2},
        {"sa_aggregation": "vector", "sa_num_heads": 8, "num_steps": 0},
        {"sa_pos_encoding": True, "ca_pos_encoding": True, "ca_neighbors": "xyz", "num_steps": 0},
        {"embed": "local"},
        {"embed": "local", "num_steps": 0, "ca_neighbors": "xyz"},
    ],
)
def test_lever_knobs_sweep(levers: dict) -> None:
    check_registered_model("centroid_transformer_modelnet40", **SMALL, **levers)


def test_lever_knobs_reach_the_blocks_and_bad_values_are_refused() -> None:
    model = create_model("centroid_transformer_modelnet40", sa_pos_encoding=True, ca_pos_encoding=True,
                         ca_neighbors="xyz", ca_normalize="centroids", layer_scale=0.0, **SMALL)  # fmt: skip
    sa, ca = model.blocks[0].attn, model.blocks[1].attn
    assert sa.pos_enc is not None and ca.pos_enc is not None and model.blocks[1].neighbor_space == "pos"
    assert ca.normalize == "centroids" and sa.normalize == "inputs" and float(ca.layer_scale.gamma.abs().sum()) == 0
    wide = create_model("centroid_transformer_modelnet40", ca_num_neighbors=12, **SMALL)
    assert wide.blocks[3].attn.num_neighbors == 12 and wide.blocks[2].attn.num_neighbors == 8
    heads = create_model("centroid_transformer_modelnet40", ca_num_heads=16, **SMALL)
    assert [heads.blocks[i].attn.num_heads for i in range(4)] == [4, 16, 4, 16]
    vector = create_model("centroid_transformer_modelnet40", ca_aggregation="vector", **SMALL)
    assert [vector.blocks[i].attn.aggregation for i in range(4)] == ["dot", "vector", "dot", "vector"]
    with pytest.raises(ValueError, match="aggregation must be one of"):
        create_model("centroid_transformer_modelnet40", ca_aggregation="mean")
    vsa = create_model("centroid_transformer_modelnet40", sa_aggregation="vector", sa_num_heads=8, **SMALL)
    assert [(b.attn.aggregation, b.attn.num_heads) for b in vsa.blocks] == [
        ("vector", 8),
        ("dot", 4),
        ("vector", 8),
        ("dot", 4),
    ]
    with pytest.raises(ValueError, match="sa_aggregation applies to the KNN SA blocks"):
        create_model("centroid_transformer_modelnet40", sa_aggregation="vector", mixer="softmax")
    with pytest.raises(ValueError, match="divisible"):
        create_model("centroid_transformer_modelnet40", ca_num_heads=7, **SMALL)
    with pytest.raises(ValueError, match="ca_num_neighbors K=70 exceeds the N1=64 inputs"):
        create_model("centroid_transformer_modelnet40", ca_num_neighbors=70, **SMALL).eval()(torch.rand(1, 64, 3))
    with pytest.raises(ValueError, match="ca_neighbors must be one of"):
        create_model("centroid_transformer_modelnet40", ca_neighbors="feature_space")
    with pytest.raises(ValueError, match="sa_pos_encoding applies to the KNN SA blocks"):
        create_model("centroid_transformer_modelnet40", sa_pos_encoding=True, mixer="softmax")
    with pytest.raises(ValueError, match="normalize must be one of"):
        create_model("centroid_transformer_modelnet40", ca_normalize="points")


def test_local_embedding_is_pointnet2s_first_layer_and_translation_invariant() -> None:
    """embed="local": each point's feature is the channel-wise max over its K nearest points in xyz (itself included)
    of the embedding MLP applied to their offsets p_j - p_i and their normals (PointNet++'s set abstraction, with
    every point a centre). Checked against a plain loop, then the whole model's translation invariance, which the
    point embedding (absolute xyz) does not have."""
    torch.manual_seed(0)
    model = create_model("centroid_transformer_modelnet40", embed="local", in_channels=6, **SMALL).double().eval()
    points = torch.rand(2, 96, 6, dtype=torch.float64)
    got = model._embed(points, points[..., :3].contiguous())
    for b in range(2):
        for i in (0, 17, 95):
            dist = (points[b, :, :3] - points[b, i, :3]).norm(dim=-1)
            nbrs = dist.argsort()[:8]
            edges = torch.cat([points[b, nbrs, :3] - points[b, i, :3], points[b, nbrs, 3:]], dim=-1)
            want = model.local_embed(edges.unsqueeze(0)).amax(dim=1)[0]
            torch.testing.assert_close(got[b, i], want)
    shift = torch.tensor([0.3, -1.2, 2.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    torch.testing.assert_close(model(points + shift), model(points))
    point = create_model("centroid_transformer_modelnet40", embed="point", in_channels=6, **SMALL).double().eval()
    assert not torch.allclose(point(points + shift), point(points))
    twin = create_model("centroid_transformer_modelnet40_fps", embed="local", **SMALL)
    assert twin.embed_mode == "local"  # the twins share the embedding
    with pytest.raises(RuntimeError, match="local_embed"):  # same shapes, another function: never loaded silently
        twin.load_state_dict(create_model("centroid_transformer_modelnet40_fps", embed="point", **SMALL).state_dict())
    with pytest.raises(ValueError, match=r"embed must be one of \['point', 'local', 'edge'\], got 'offsets'"):
        create_model("centroid_transformer_modelnet40", embed="offsets")


def test_edge_embedding_is_pyg_edgeconv_over_the_xyz_neighbours() -> None:
    """embed="edge": max over the K nearest points in xyz of the MLP of [x_i, x_j - x_i], equal to PyTorch Geometric's
    EdgeConv (DGCNN's layer, max aggregation) with the same MLP on the same KNN graph; not translation-invariant (x_i
    holds absolute xyz), and its weights never load into another embedding."""
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(0)
    model = create_model("centroid_transformer_modelnet40", embed="edge", in_channels=6, **SMALL).double().eval()
    points = torch.rand(2, 96, 6, dtype=torch.float64)
    pos = points[..., :3].contiguous()
    got = model._embed(points, pos)
    nbr = torch.cdist(pos, pos).topk(SMALL["num_neighbors"], largest=False).indices  # (B, N, K), self included
    src = (nbr + 96 * torch.arange(2).view(2, 1, 1)).reshape(-1)  # neighbour j -> point i, batch offsets
    dst = torch.arange(2 * 96).repeat_interleave(SMALL["num_neighbors"])
    conv = pyg.EdgeConv(lambda e: model.embedding(e.unsqueeze(0))[0], aggr="max")  # PointBatchNorm takes (B, N, C)
    want = conv(points.reshape(-1, 6), torch.stack([src, dst])).view(2, 96, -1)
    torch.testing.assert_close(got, want)
    shift = torch.tensor([0.3, -1.2, 2.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    assert not torch.allclose(model(points + shift), model(points))
    with pytest.raises(RuntimeError, match="edge_embed"):
        model.load_state_dict(create_model("centroid_transformer_modelnet40", in_channels=6, **SMALL).state_dict())


def test_default_is_the_measured_design_and_the_paper_reading_is_a_config() -> None:
    from attention import RelativePositionEncoding
    from engine import load_config
    from pointcloud.recipe import ModelNetConfig, build_model

    def encodes(block: torch.nn.Module) -> bool:
        return any(isinstance(m, RelativePositionEncoding) for m in block.modules())

    model = create_model("centroid_transformer_modelnet40", **SMALL)
    twin = create_model("centroid_transformer_modelnet40_fps", **SMALL)
    assert encodes(model.blocks[0]) and encodes(twin.blocks[2])  # the twins share the SA blocks
    assert float(model.blocks[1].attn.layer_scale.gamma.abs().sum()) == 0  # the update starts at 0
    assert model.embed_mode == twin.embed_mode == "local"  # the twins share the embedding too
    mixed = create_model("centroid_transformer_modelnet40", mixer="softmax", **SMALL)  # no neighbours to encode
    assert not encodes(mixed.blocks[0]) and not encodes(mixed.blocks[2])
    path = REPO / "configs/pointcloud/modelnet40_centroid_t1_paper.yaml"
    paper = build_model(load_config(ModelNetConfig, path), num_classes=40)
    assert not encodes(paper.blocks[0]) and isinstance(paper.blocks[1].attn.layer_scale, torch.nn.Identity)
    assert paper.embed_mode == "point"


def test_normals_and_classifier_reset() -> None:
    model = create_model("centroid_transformer_modelnet40", in_channels=6, **SMALL)
    model.reset_classifier(10)
    assert model(torch.rand(2, 96, 6)).shape == (2, 10)
    assert model.forward_head(model.forward_features(torch.rand(2, 96, 6)), pre_logits=True).shape == (2, 256)


def test_bad_input() -> None:
    model = create_model("centroid_transformer_modelnet40", **SMALL)
    with pytest.raises(ValueError, match=r"\(B, N, 3\)"):
        model(torch.rand(2, 128, 4))
    with pytest.raises(ValueError, match="need N >= N1 >= N2"):
        model(torch.rand(2, 40, 3))
    with pytest.raises(ValueError, match="need K <= N1"):
        create_model("centroid_transformer_modelnet40", num_neighbors=16)(torch.rand(2, 20, 3))
    with pytest.raises(ValueError, match="unknown model"):
        create_model("pointnet_but_better")


def test_fractional_centroid_counts_follow_the_input_size() -> None:
    model = create_model("centroid_transformer_modelnet40", num_neighbors=4).eval()  # default (0.5, 0.5)
    assert model.stage_sizes(1024) == (512, 256) and model.stage_sizes(256) == (128, 64)
    assert model.stage_sizes(102) == (51, 26) and model.stage_sizes(2) == (1, 1)  # rounded, at least 1
    assert model(torch.rand(1, 100, 3)).shape == (1, 40)
    assert model.blocks[1].init.num_centroids == 0.5


def test_masked_knn_attention_gives_the_same_model() -> None:
    """attn_backend="masked" (dense products under the neighbour mask) computes the default model: outputs and
    gradients in float64, the same weights loaded (eval: no dropout draws, FPS from the first point)."""
    torch.manual_seed(0)
    models = {
        name: create_model("centroid_transformer_modelnet40", attn_backend=name).double()
        for name in ("gather", "masked")
    }
    models["masked"].load_state_dict(models["gather"].state_dict())
    for m in models.values():
        m.eval()
    x = torch.rand(2, 256, 3, dtype=torch.float64)
    outs = {name: m(x) for name, m in models.items()}
    torch.testing.assert_close(outs["masked"], outs["gather"])
    for out in outs.values():
        out.square().sum().backward()
    for (name, a), b in zip(models["gather"].named_parameters(), models["masked"].parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, msg=lambda m, name=name: f"{name}: {m}")
    with pytest.raises(ValueError, match="unknown attn_backend"):
        create_model("centroid_transformer_modelnet40", attn_backend="sparse")


@pytest.mark.torch_compat
@pytest.mark.parametrize("attn_backend", ["gather", "masked"])
def test_train_step_reads_nothing_back_but_its_input_check(attn_backend: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path's host syncs, counted on CPU: one train step of the centroid transformer reads one value back,
    the input check's NaN test, and none with input checks off. (On CPU, xyz KNN uses torch-cluster, which must read
    edge counts back; the CUDA path is plain torch, so the test takes that path here.)"""
    from attention import backends, input_checks
    from engine.testing import host_syncs

    monkeypatch.setattr(backends, "KNN_CLUSTER_AUTO_MAX_DIM", 0)  # KNN in xyz by plain torch, as on CUDA
    model = create_model("centroid_transformer_modelnet40", attn_backend=attn_backend, **SMALL)
    points, labels = torch.rand(4, 128, 3), torch.randint(0, 40, (4,))

    def step() -> None:
        torch.nn.functional.cross_entropy(model(points), labels).backward()

    syncs = host_syncs(step)
    assert list(syncs.values()) == [1] and next(iter(syncs)).startswith("_local_scalar_dense at attention/checks.py")
    with input_checks(False):
        assert host_syncs(step) == {}


@pytest.mark.gpu
def test_cuda_train_step_without_input_checks_has_no_host_sync() -> None:
    from attention import input_checks

    model = create_model("centroid_transformer_modelnet40", **SMALL).cuda()
    points, labels = torch.rand(4, 128, 3, device="cuda"), torch.randint(0, 40, (4,), device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):  # warm-up: Triton compiles, autotuning
        torch.nn.functional.cross_entropy(model(points).float(), labels).backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        with input_checks(False):
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = torch.nn.functional.cross_entropy(model(points).float(), labels)
            loss.backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.torch_compat
@pytest.mark.slow
def test_compiled_centroid_transformer_equals_eager() -> None:
    """torch.compile (inductor on CPU) of the centroid transformer: the train-mode output and every parameter's
    gradient equal eager's, in float64 so that fused rounding cannot flip a neighbour (no dropout: inductor draws
    other random numbers). Under compile the switchboard's "auto" takes the traceable reference forms
    (attention.backends)."""
    torch.manual_seed(0)
    # 32 points: dynamo unrolls FPS's N1 + N2 steps, and the graph's size (tracing, kernels to build) follows them
    tiny = {**SMALL, "num_centroids": (16, 8)}
    eager = create_model("centroid_transformer_modelnet40", num_classes=5, drop=0.0, **tiny).double()
    twin = create_model("centroid_transformer_modelnet40", num_classes=5, drop=0.0, **tiny).double()
    twin.load_state_dict(eager.state_dict())
    compiled = torch.compile(twin)
    points, labels = torch.rand(2, 32, 3, dtype=torch.float64), torch.tensor([1, 3])
    outs = []
    for model in (eager, compiled):
        logits = model(points)
        torch.nn.functional.cross_entropy(logits, labels).backward()
        outs.append(logits.detach())
    torch.testing.assert_close(outs[1], outs[0])
    for (name, a), b in zip(eager.named_parameters(), twin.parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, msg=lambda m, name=name: f"{name}: {m}")
