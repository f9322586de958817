"""Part segmentation: the models (shapes, gradients, interpolation against brute force, one KNN per point set), the
PointNet++ peer, ShapeNet Part's metric on a hand-computed example, the data in both layouts, the model contract."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.testing import assert_close

import pointcloud.model as point_model
from attention import MixerBlock, interpolate_neighbors, knn
from pointcloud import create_model as create_classifier
from pointcloud.parts import SHAPENET_PART_CLASSES, PartSegmentation, ShapeNetPart, SyntheticParts
from pointcloud.partseg import PartSegMeter, create_model, list_models, shape_ious
from pointcloud.partseg.metrics import category_part_mask, restricted_argmax
from pointcloud.partseg.peers import propagate
from pointcloud.testing import check_model_sweep
from pointcloud.transforms import ShufflePoints

SMALL = {"num_centroids": (32, 16), "num_neighbors": 8, "widths": (16, 32, 32, 64), "fuse_dim": 32,
         "global_dim": 16, "head_dims": (32,)}  # fmt: skip
SMALL_BY_MODEL = {"pointnet2_ssg_partseg": {"mlps": ((16, 32), (32, 64), (64, 128)), "fp_mlps": ((64,), (32,), (32,))}}


def _clouds(seed: int, batch: int = 2, n: int = 64, channels: int = 3) -> torch.Tensor:
    return torch.rand(batch, n, channels, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------------------------------------------------------
# Models
# --------------------------------------------------------------------------------------------------------------------


def test_both_models_are_registered() -> None:
    assert list_models() == ["centroid_transformer_partseg", "pointnet2_ssg_partseg"]


@pytest.mark.parametrize("name", list_models())
def test_registered_model_sweep(name: str) -> None:
    """Per-point logits of the right shape, finite; every parameter gets a gradient; the state dict round-trips."""
    kwargs = {"num_parts": 7, "num_categories": 3, **SMALL_BY_MODEL.get(name, SMALL)}
    torch.manual_seed(0)
    check_model_sweep(create_model, name, kwargs, (_clouds(0, 4, 96), torch.tensor([0, 2, 1, 2])), (4, 96, 7))


@pytest.mark.parametrize("name", list_models())
def test_the_category_changes_the_logits_and_normals_enter(name: str) -> None:
    model = create_model(name, num_parts=5, num_categories=2, in_channels=6, **SMALL_BY_MODEL.get(name, SMALL)).eval()
    points = _clouds(1, 2, 64, 6)
    with torch.no_grad():
        a, b = model(points, torch.tensor([0, 0])), model(points, torch.tensor([1, 1]))
    assert a.shape == (2, 64, 5) and not torch.allclose(a, b)
    with pytest.raises(ValueError, match=r"category must be a \(B,\)"):
        model(points, torch.tensor([[0], [1]]))
    with pytest.raises(ValueError, match="must index the 2 categories"):
        model(points, torch.tensor([0, 2]))


@pytest.mark.parametrize("name", list_models())
def test_head_surface_as_the_classifiers(name: str) -> None:
    """timm's surface (:class:`pointcloud.model.PointModel`): a new head for other parts, or none (the features)."""
    model = create_model(name, num_parts=5, num_categories=2, **SMALL_BY_MODEL.get(name, SMALL)).eval()
    points, category = _clouds(2), torch.tensor([0, 1])
    assert isinstance(model, point_model.PointModel) and model.no_weight_decay() == set()
    model.reset_classifier(3)
    width = model.get_classifier().in_features
    assert model.num_parts == 3 and model.get_classifier().out_features == 3
    with torch.no_grad():
        assert model(points, category).shape == (2, 64, 3)
        model.reset_classifier(0)
        assert isinstance(model.get_classifier(), torch.nn.Identity)
        assert model(points, category).shape == (2, 64, width)


def test_encoder_keywords_reach_the_classifier_network_and_unknown_ones_are_named() -> None:
    """Every keyword but the head's goes on to :class:`pointcloud.CentroidTransformer`, with its defaults."""
    model = create_model("centroid_transformer_partseg", num_parts=4, num_categories=2, num_steps=2, **SMALL)
    assert model.encoder.blocks[1].attn.num_steps == 2 and model.fuse_dim == SMALL["fuse_dim"]
    default = create_model("centroid_transformer_partseg")
    assert default.encoder.num_neighbors == create_classifier("centroid_transformer_modelnet40").num_neighbors
    assert default.encoder.embed_mode == "point"  # the measured encoder: the local one loses absolute position
    assert create_model("centroid_transformer_partseg", embed="local", **SMALL).encoder.embed_mode == "local"
    with pytest.raises(ValueError, match=r"does not take one of the keywords.*num_step"):
        create_model("centroid_transformer_partseg", num_step=2)


def _brute_force_interpolate(feats: torch.Tensor, query: torch.Tensor, ref: torch.Tensor, k: int) -> torch.Tensor:
    """Inverse-distance weights over the k nearest, from the full distance matrix (float64)."""
    d = ((query[:, :, None].double() - ref[:, None].double()) ** 2).sum(-1)  # (B, N, M)
    dist, idx = d.sort(-1)
    w = 1.0 / (dist[..., :k] + 1e-8)
    w = w / w.sum(-1, keepdim=True)
    nbr = torch.stack([feats[b].double()[idx[b, :, :k]] for b in range(len(feats))])  # (B, N, k, C)
    return (nbr * w[..., None]).sum(2).to(feats.dtype)


def test_interpolate_neighbors_matches_brute_force() -> None:
    query, ref, feats = _clouds(2, 2, 70), _clouds(3, 2, 23), torch.randn(2, 23, 5)
    for k in (1, 3, 5):
        assert_close(interpolate_neighbors(feats, *knn(query, ref, k)), _brute_force_interpolate(feats, query, ref, k))
    assert_close(propagate(feats, ref, query), _brute_force_interpolate(feats, query, ref, 3))


@pytest.mark.parametrize("upsample", ["inverse_distance", "nearest"])
def test_centroid_stages_reach_the_points_by_the_brute_force_interpolation(upsample: str) -> None:
    """The encoder's per-point features are fuse([block outputs carried back to the N points]), each centroid stage
    interpolated from its positions exactly as the brute-force reference does."""
    torch.manual_seed(0)
    model = create_model("centroid_transformer_partseg", num_parts=4, num_categories=2, upsample=upsample,
                         **SMALL).eval()  # fmt: skip
    encoder = model.encoder
    outputs: list = []
    hooks = [b.register_forward_hook(lambda m, i, o: outputs.append(o)) for b in encoder.blocks]
    points = _clouds(4, 2, 80)
    with torch.no_grad():
        features = model.forward_features(points)
    for h in hooks:
        h.remove()
    sa0, (x1, pos1, _), sa2, (x3, pos3, _) = outputs
    k = 3 if upsample == "inverse_distance" else 1
    stages = [sa0, *(_brute_force_interpolate(x, points, p, k) for x, p in ((x1, pos1), (sa2, pos1), (x3, pos3)))]
    with torch.no_grad():
        expected = encoder.fuse(torch.cat(stages, dim=-1))
    assert_close(features[..., :32], expected, rtol=1e-4, atol=1e-5)
    assert torch.equal(features[..., 32:], points)  # the head also reads each point's own input channels


def test_the_head_adds_no_knn_search(monkeypatch: pytest.MonkeyPatch) -> None:
    """One xyz search per SA block and one per centroid point set carried back, the classifier's count: the per-point
    head reuses the encoder's searches."""
    calls: list[tuple[int, int, int]] = []

    def counting_knn(query, ref, k, **kw):
        calls.append((query.shape[1], ref.shape[1], k))
        return knn(query, ref, k, **kw)

    monkeypatch.setattr(point_model, "knn", counting_knn)
    points = _clouds(5, 2, 64)
    seg = create_model("centroid_transformer_partseg", num_parts=4, num_categories=2, **SMALL).eval()
    cls = create_classifier(
        "centroid_transformer_modelnet40", **{k: SMALL[k] for k in ("num_centroids", "num_neighbors")}
    )
    with torch.no_grad():
        seg(points, torch.tensor([0, 1]))
        seg_calls = list(calls)
        calls.clear()
        cls.eval()(points)
    assert seg_calls == [(64, 64, 8), (64, 32, 3), (32, 32, 8), (64, 16, 3)]
    assert [c[:2] for c in calls] == [c[:2] for c in seg_calls]  # the classifier: the same searches, k = 1


def test_pointnet2_propagation_is_pyg_knn_interpolate(monkeypatch: pytest.MonkeyPatch) -> None:
    """propagate() computes PyG's knn_interpolate (whose own knn needs pyg-lib: replaced by a brute-force one)."""
    import importlib

    pyg_module = importlib.import_module("torch_geometric.nn.unpool.knn_interpolate")  # the module, not the function

    def brute_knn(x, y, k, batch_x=None, batch_y=None, **kw):  # PyG's signature: k nearest x of every y
        rows, cols = [], []
        for i in range(len(y)):
            d = ((x - y[i]) ** 2).sum(-1).masked_fill(batch_x != batch_y[i], float("inf"))
            cols.append(d.argsort()[:k])
            rows.append(torch.full((k,), i))
        return torch.stack([torch.cat(rows), torch.cat(cols)])

    monkeypatch.setattr(pyg_module, "knn", brute_knn)
    ref, query, feats = _clouds(6, 2, 20), _clouds(7, 2, 50), torch.randn(2, 20, 4)
    batch_x, batch_y = torch.arange(2).repeat_interleave(20), torch.arange(2).repeat_interleave(50)
    expected = pyg_module.knn_interpolate(feats.reshape(40, 4), ref.reshape(40, 3), query.reshape(100, 3), batch_x,
                                          batch_y, k=3).view(2, 50, 4)  # fmt: skip
    assert_close(propagate(feats, ref, query), expected, rtol=1e-4, atol=1e-5)


def test_pointnet2_scales_its_centres_with_the_cloud() -> None:
    model = create_model(
        "pointnet2_ssg_partseg", num_parts=3, num_categories=1, **SMALL_BY_MODEL["pointnet2_ssg_partseg"]
    )
    centres: list[int] = []
    for sa in (model.sa1, model.sa2):
        sa.register_forward_hook(lambda m, i, o: centres.append(o[1].shape[1]))
    model.eval()(_clouds(8, 1, 256), torch.tensor([0]))
    assert centres == [64, 16]  # N / 4 and N / 16 (the paper's 512 and 128 at 2048 points)


# --------------------------------------------------------------------------------------------------------------------
# Metric
# --------------------------------------------------------------------------------------------------------------------


def test_shape_iou_and_miou_on_a_hand_computed_example() -> None:
    """Category 0 has parts {0, 1}, category 1 parts {2, 3, 4}.

    shape A (category 0): labels 0 0 1 1, pred 0 1 1 1 -> part 0: 1/2, part 1: 2/3 -> IoU 7/12
    shape B (category 1): labels 2 2 3 3, pred 2 2 3 3 -> parts 2, 3: 1, part 4 absent in both: 1 -> IoU 1
    shape C (category 1): labels 2 2 2 4, pred 3 3 2 4 -> part 2: 1/3, part 3: 0/2, part 4: 1 -> IoU 4/9
    instance mIoU = (7/12 + 1 + 4/9) / 3; class mIoU = (7/12 + (1 + 4/9) / 2) / 2
    """
    mask = category_part_mask([(0, 1), (2, 3, 4)])
    labels = torch.tensor([[0, 0, 1, 1], [2, 2, 3, 3], [2, 2, 2, 4]])
    pred = torch.tensor([[0, 1, 1, 1], [2, 2, 3, 3], [3, 3, 2, 4]])
    category = torch.tensor([0, 1, 1])
    assert_close(shape_ious(pred, labels, category, mask), torch.tensor([7 / 12, 1.0, 4 / 9], dtype=torch.float64))
    meter = PartSegMeter([(0, 1), (2, 3, 4)], ["mug", "lamp"])
    logits = torch.nn.functional.one_hot(pred, 5).float()
    meter.update(logits[:2], labels[:2], category[:2])
    meter.update(logits[2:], labels[2:], category[2:])
    out = meter.compute()
    assert out["instance_miou"] == pytest.approx(100 * (7 / 12 + 1 + 4 / 9) / 3)
    assert out["class_miou"] == pytest.approx(100 * (7 / 12 + (1 + 4 / 9) / 2) / 2)
    assert meter.class_ious() == pytest.approx({"mug": 100 * 7 / 12, "lamp": 100 * (1 + 4 / 9) / 2})


def test_predictions_are_restricted_to_the_category_parts() -> None:
    mask = category_part_mask([(0, 1), (2, 3)])
    logits = torch.tensor([[[0.0, 1.0, 5.0, 0.0]], [[9.0, 0.0, 1.0, 2.0]]])  # the global arg-max lies outside
    assert restricted_argmax(logits, torch.tensor([0, 1]), mask).tolist() == [[1], [3]]


# --------------------------------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------------------------------


def test_synthetic_parts_as_segmentation_samples() -> None:
    parts = SyntheticParts("train", num_points=128, classes=("table", "lamp"), samples_per_class=2, seed=1)
    plain = PartSegmentation(parts)
    assert plain.num_categories == 2 and plain.num_parts == 5 and plain.part_classes == [(0, 1), (2, 3, 4)]
    points, category, labels = plain[2]  # a lamp
    assert points.shape == (128, 3) and int(category) == 1 and set(labels.tolist()) <= {2, 3, 4}
    with_normals = PartSegmentation(parts, use_normals=True)
    assert_close(with_normals[2][0][:, :3], points)
    assert_close(with_normals[2][0][:, 3:].norm(dim=-1), torch.ones(128))  # unit face normals
    shuffled = PartSegmentation(parts, use_normals=True, transform=ShufflePoints(), seed=3)
    p, _, lab = shuffled[2]
    assert not torch.equal(p, with_normals[2][0])
    order = [int(np.argmin(((with_normals[2][0] - q).abs().sum(-1)).numpy())) for q in p]  # where each point came from
    assert torch.equal(lab, labels[order])  # each label travelled with its point
    shuffled.set_epoch(1)
    assert not torch.equal(shuffled[2][0], p)


def _write_shapenet(root: Path, layout: str, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """A two-category release (Airplane: 4 parts, Chair: 4 parts) with one shape per split; returns stored labels."""
    folder = root / ShapeNetPart.FOLDERS[layout]
    synsets = {"Airplane": "02691156", "Chair": "03001627"}
    (folder / "train_test_split").mkdir(parents=True)
    (folder / "synsetoffset2category.txt").write_text("".join(f"{n}\t{s}\n" for n, s in synsets.items()))
    stored = {}
    for i, split in enumerate(("train", "val", "test")):
        synset = list(synsets.values())[i % 2]
        shape_id = f"shape{i}"
        (folder / "train_test_split" / f"shuffled_{split}_file_list.json").write_text(
            json.dumps([f"shape_data/{synset}/{shape_id}"])
        )
        xyz, normals = rng.normal(size=(300, 3)), rng.normal(size=(300, 3))
        first = SHAPENET_PART_CLASSES["Airplane" if i % 2 == 0 else "Chair"][0]
        local = rng.integers(1, 5, 300)  # 1..4 within the category
        if layout == "v0":
            (folder / synset / "points").mkdir(parents=True, exist_ok=True)
            (folder / synset / "points_label").mkdir(parents=True, exist_ok=True)
            np.savetxt(folder / synset / "points" / f"{shape_id}.pts", xyz, fmt="%.5f")
            np.savetxt(folder / synset / "points_label" / f"{shape_id}.seg", local, fmt="%d")
        else:
            (folder / synset).mkdir(parents=True, exist_ok=True)
            table = np.hstack([xyz, normals, (first + local - 1)[:, None]])
            np.savetxt(folder / synset / f"{shape_id}.txt", table, fmt="%.6f")
        stored[split] = first + local - 1
    return stored


@pytest.mark.parametrize("layout", ["v0", "normal"])
def test_shapenet_part_gives_the_protocol_labels_in_both_layouts(tmp_path: Path, layout: str) -> None:
    stored = _write_shapenet(tmp_path, layout, np.random.default_rng(0))
    train = PartSegmentation(ShapeNetPart(tmp_path, "train", num_points=300, layout=layout))
    assert train.num_parts == 16 and train.part_classes == [(0, 1, 2, 3), (12, 13, 14, 15)]
    points, category, labels = train[0]
    assert points.shape == (300, 3) and int(category) == 0
    assert sorted(labels.tolist()) == sorted(stored["train"].tolist())  # resampled: the same points, reordered
    trainval = ShapeNetPart(tmp_path, "trainval", num_points=300, layout=layout)
    assert len(trainval) == 2 and trainval.categories == [0, 1]
    if layout == "normal":
        assert PartSegmentation(ShapeNetPart(tmp_path, "test", num_points=64, layout=layout), True)[0][0].shape == (
            64,
            6,
        )
    else:
        with pytest.raises(ValueError, match="shapenet_part_normal"):
            PartSegmentation(ShapeNetPart(tmp_path, "test", layout=layout), use_normals=True)


@pytest.mark.parametrize("layout", ["v0", "normal"])
def test_checked_shapenet_part_files_are_kept_and_give_the_same_samples(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """check_files reads every line once and keeps the samples: later samples equal those read from the files."""
    _write_shapenet(tmp_path, layout, np.random.default_rng(0))
    fresh = ShapeNetPart(tmp_path, "trainval", num_points=64, layout=layout)
    checked = ShapeNetPart(tmp_path, "trainval", num_points=64, layout=layout)
    checked.check_files()
    monkeypatch.setattr(checked, "load", lambda index: pytest.fail("a checked file was parsed again"))
    for index in range(len(fresh)):
        for normals in (False, True) if layout == "normal" else (False,):
            for got, want in zip(checked.sample(index, normals), fresh.sample(index, normals)):
                assert got.dtype == want.dtype and np.array_equal(got, want)
        checked.sample(index)[0][:] = 0  # callers get copies
    assert np.array_equal(checked.sample(0)[0], fresh.sample(0)[0])


def test_shapenet_part_refuses_labels_outside_the_category(tmp_path: Path) -> None:
    _write_shapenet(tmp_path, "v0", np.random.default_rng(0))
    seg = tmp_path / ShapeNetPart.FOLDERS["v0"] / "02691156" / "points_label" / "shape0.seg"
    seg.write_text("5\n" * 300)  # Airplane has 4 parts
    with pytest.raises(ValueError, match=r"shape0\.seg: part label 5 outside 1\.\.4, the Airplane parts"):
        PartSegmentation(ShapeNetPart(tmp_path, "train", num_points=300))[0]


# --------------------------------------------------------------------------------------------------------------------
# Contract (as tests/pointcloud/test_contract.py for the classifier)
# --------------------------------------------------------------------------------------------------------------------


def _contract_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model("centroid_transformer_partseg", num_parts=6, num_categories=3, num_neighbors=4,
                        widths=(16, 32, 32, 64), fuse_dim=32, global_dim=16, head_dims=(16,)).eval()  # fmt: skip


@pytest.mark.torch_compat
@pytest.mark.slow
def test_partseg_model_compiles_without_graph_breaks() -> None:
    model = _contract_model()
    torch._dynamo.reset()
    with torch.no_grad():
        explanation = torch._dynamo.explain(model)(_clouds(0), torch.tensor([0, 2]))
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]


@pytest.mark.torch_compat
@pytest.mark.slow
def test_partseg_model_torch_export_equals_eager() -> None:
    model = _contract_model()
    exported = torch.export.export(model, (_clouds(0), torch.tensor([0, 2]))).module()
    with torch.no_grad():
        for seed, category in ((0, [0, 2]), (1, [1, 1])):
            args = (_clouds(seed), torch.tensor(category))
            assert_close(exported(*args), model(*args), rtol=1e-4, atol=1e-4)


def test_a_mixer_reaches_the_encoder() -> None:
    """``mixer=`` (through ``model_kwargs`` in a config) replaces the SA blocks' KNN attention, as in the classifier."""
    model = create_model("centroid_transformer_partseg", num_parts=4, num_categories=2, mixer="softmax", **SMALL)
    assert isinstance(model.encoder.blocks[0], MixerBlock) and isinstance(model.encoder.blocks[2], MixerBlock)
    assert model.eval()(_clouds(9), torch.tensor([0, 1])).shape == (2, 64, 4)


@pytest.mark.parametrize("which", ["modelnet", "partseg"])
def test_both_point_recipes_refuse_the_shared_fields_by_name(which: str) -> None:
    """:func:`pointcloud.recipe.point_checks`: each recipe with its own least number of points."""
    from engine.errors import UsageError
    from pointcloud.partseg.recipe import PartSegConfig, PartSegRecipe
    from pointcloud.recipe import ModelNetConfig, ModelNetRecipe

    recipe, config, least = {
        "modelnet": (ModelNetRecipe, ModelNetConfig, 1),
        "partseg": (PartSegRecipe, PartSegConfig, 2),
    }[which]
    recipe.validate(config())
    problems = rf"num_points must be >= {least}, got {least - 1}.*num_neighbors \(K\).*votes must be >= 1.*scale_lo"
    with pytest.raises(UsageError, match=problems):
        recipe.validate(config(num_points=least - 1, votes=0, scale_lo=2.0, scale_hi=1.0))
    # the upper limits: a cloud of 10**11 points asked for 745 GiB, a billion votes ran after training, and a mixer
    # that is a list ended in "unhashable type" when the model was built
    problems = (
        r"num_points must be <= 65536, got 100000000000.*votes must be <= 1000, got 1000000000.*"
        r"model_kwargs.mixer must be null \(KNN attention\) or one of \['cauchy', .*'vandermonde_static'\], got \[1\]$"
    )
    with pytest.raises(UsageError, match=problems):
        recipe.validate(config(num_points=10**11, votes=10**9, model_kwargs={"mixer": [1]}))
    recipe.validate(config(num_points=65536, num_neighbors=16, votes=1000, model_kwargs={"mixer": "hydra"}))
