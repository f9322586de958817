"""Capsule datasets: ShapeNet Part in both released layouts, Core13 point files, synthetic parts; errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from capsules.data import ShapeNetCore13, ShapeNetPart, SyntheticParts, build_dataset, resample

SYNSETS = {"Airplane": "02691156", "Chair": "03001627"}
IDS = {
    "train": ["1021a0914a7207aff927ed529ad90a11", "10155655850468db78d106ce0a280f87"],
    "val": ["1a04e3eab45ca15dd86060f189eb133"],
    "test": ["1a6f615e8b1b5ae4dbbc9440457e303e"],
}


def _write_split_files(folder: Path) -> dict[str, list[tuple[str, str]]]:
    """synsetoffset2category.txt and train_test_split/*.json exactly as released; returns split -> (synset, id)."""
    folder.mkdir(parents=True)
    (folder / "synsetoffset2category.txt").write_text("".join(f"{n}\t{s}\n" for n, s in SYNSETS.items()))
    (folder / "train_test_split").mkdir()
    shapes = {}
    for split, ids in IDS.items():
        shapes[split] = [(list(SYNSETS.values())[i % 2], shape_id) for i, shape_id in enumerate(ids)]
        entries = [f"shape_data/{s}/{i}" for s, i in shapes[split]]
        (folder / "train_test_split" / f"shuffled_{split}_file_list.json").write_text(json.dumps(entries))
    return shapes


def _cloud(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray]:
    return rng.normal(size=(n, 3)) * [0.3, 0.1, 0.2], rng.integers(1, 4, n)


def test_shapenet_part_v0_layout(tmp_path: Path) -> None:
    folder = tmp_path / "shapenetcore_partanno_segmentation_benchmark_v0"
    shapes = _write_split_files(folder)
    rng = np.random.default_rng(0)
    stored = {}
    for split in shapes:
        for k, (synset, shape_id) in enumerate(shapes[split]):
            xyz, seg = _cloud(rng, 2500 if k == 0 else 1000)  # more and fewer points than 2048
            (folder / synset / "points").mkdir(parents=True, exist_ok=True)
            (folder / synset / "points_label").mkdir(parents=True, exist_ok=True)
            np.savetxt(folder / synset / "points" / f"{shape_id}.pts", xyz, fmt="%.5f")
            np.savetxt(folder / synset / "points_label" / f"{shape_id}.seg", seg, fmt="%d")
            stored[f"{synset}/{shape_id}"] = (xyz, seg)
    ds = ShapeNetPart(tmp_path, "train", num_points=2048, layout="v0")  # the data root
    assert len(ds) == 2 and ds.category_names == ["Airplane", "Chair"] and ds.categories == [0, 1]
    for i in range(2):
        points, parts = ds[i]
        assert points.shape == (2048, 3) and parts.shape == (2048,) and points.dtype == torch.float32
        assert abs(float(points.norm(dim=1).max()) - 1.0) < 1e-5 and float(points.mean(0).abs().max()) < 1e-5
        xyz, seg = stored[ds.names[i]]
        assert set(parts.tolist()) <= set(seg.tolist())
        # each returned point is a stored point (normalized) with its own label
        centred = xyz - xyz.mean(0)
        first = int(np.argmin(np.abs(centred / np.linalg.norm(centred, axis=1).max() - points[0].numpy()).sum(1)))
        assert seg[first] == int(parts[0])
    a, b = ds[0], ShapeNetPart(folder, "train", num_points=2048)[0]  # the dataset folder itself; same resampling
    torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert len(ShapeNetPart(tmp_path, "val")) == 1 and len(ShapeNetPart(tmp_path, "test", categories=["Chair"])) == 0
    assert len(ShapeNetPart(tmp_path, "train", categories=["02691156"])) == 1


def test_shapenet_part_normal_layout(tmp_path: Path) -> None:
    folder = tmp_path / "shapenetcore_partanno_segmentation_benchmark_v0_normal"
    shapes = _write_split_files(folder)
    rng = np.random.default_rng(1)
    for split in shapes:
        for synset, shape_id in shapes[split]:
            xyz, _ = _cloud(rng, 2100)
            normals = rng.normal(size=(2100, 3))
            part = rng.integers(0, 50, (2100, 1)).astype(float)
            (folder / synset).mkdir(exist_ok=True)
            np.savetxt(folder / synset / f"{shape_id}.txt", np.hstack([xyz, normals, part]), fmt="%.6f")
    ds = build_dataset("shapenet_part_normal", "test", tmp_path, num_points=512)
    points, parts = ds[0]
    assert points.shape == (512, 3) and 0 <= int(parts.min()) and int(parts.max()) < 50
    with pytest.raises(FileNotFoundError, match="shapenetcore_partanno_segmentation_benchmark_v0/"):
        build_dataset("shapenet_part", "train", tmp_path)  # the other layout is absent: names its tree


def test_shapenet_part_errors_name_the_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"synsetoffset2category\.txt.*Expected tree"):
        ShapeNetPart(tmp_path, "train")
    folder = tmp_path / "shapenetcore_partanno_segmentation_benchmark_v0"
    shapes = _write_split_files(folder)
    synset, shape_id = shapes["train"][0]
    with pytest.raises(FileNotFoundError, match=rf"{shape_id}\.pts: listed in"):
        ShapeNetPart(tmp_path, "train")
    for s, i in shapes["train"]:
        (folder / s / "points").mkdir(parents=True, exist_ok=True)
        (folder / s / "points_label").mkdir(parents=True, exist_ok=True)
        (folder / s / "points" / f"{i}.pts").write_text("0 0 0\n1 1 1\n")
        (folder / s / "points_label" / f"{i}.seg").write_text("1\n")
    with pytest.raises(ValueError, match=r"1 labels for the 2 points"):
        ShapeNetPart(tmp_path, "train")[0]
    (folder / synset / "points" / f"{shape_id}.pts").write_text("0 0 zero\n")
    with pytest.raises(ValueError, match=rf"{shape_id}\.pts: not a table of numbers"):
        ShapeNetPart(tmp_path, "train")[0]
    (folder / "train_test_split" / "shuffled_train_file_list.json").write_text('["shape_data/99999999/x"]')
    with pytest.raises(ValueError, match="bad entry"):
        ShapeNetPart(tmp_path, "train")
    with pytest.raises(ValueError, match="split must be"):
        ShapeNetPart(tmp_path, "validation")


def test_core13_points(tmp_path: Path) -> None:
    folder = tmp_path / "shapenet_core13_points"
    rng = np.random.default_rng(0)
    for split, entries in (("train", ["02691156/a", "04379243/b"]), ("test", ["04379243/c"])):
        (folder).mkdir(exist_ok=True)
        (folder / f"{split}.txt").write_text("\n".join(entries) + "\n")
        for e in entries:
            (folder / e).parent.mkdir(parents=True, exist_ok=True)
            np.save(folder / f"{e}.npy", rng.normal(size=(3000, 6)).astype(np.float32))
    ds = build_dataset("shapenet_core13", "train", tmp_path, num_points=2048)
    points, parts = ds[1]
    assert points.shape == (2048, 3) and (parts == -1).all() and ds.category_names == ["02691156", "04379243"]
    np.save(folder / "04379243" / "c.npy", np.zeros((5, 4), dtype=np.float32))
    with pytest.raises(ValueError, match=r"c\.npy: expected an \(n, 3\) or \(n, 6\) array"):
        ShapeNetCore13(tmp_path, "test")[0]
    (folder / "test.txt").write_text("04379243/missing\n")
    with pytest.raises(FileNotFoundError, match=r"missing\.npy: listed in"):
        ShapeNetCore13(tmp_path, "test")
    with pytest.raises(FileNotFoundError, match="shapenet_core13_points"):
        ShapeNetCore13(tmp_path / "nowhere", "train")


def test_synthetic_parts_are_deterministic_labelled_and_split() -> None:
    a = SyntheticParts("train", num_points=300, classes=("table", "airplane"), samples_per_class=2, seed=3)
    b = SyntheticParts("train", num_points=300, classes=("table", "airplane"), samples_per_class=2, seed=3)
    test = SyntheticParts("test", num_points=300, classes=("table", "airplane"), samples_per_class=2, seed=3)
    assert a.part_labels == [("table", "top"), ("table", "leg"), ("airplane", "fuselage"), ("airplane", "wing"),
                             ("airplane", "tail")]  # fmt: skip
    for i in range(len(a)):
        torch.testing.assert_close(a[i], b[i], rtol=0, atol=0)
        assert not torch.equal(a[i][0], test[i][0])
    points, parts = a[0]  # a table: top above the legs (z up)
    assert set(parts.tolist()) == {0, 1}
    assert points[parts == 0, 2].mean() > points[parts == 1, 2].mean() + 0.3
    assert set(a[2][1].tolist()) == {2, 3, 4}
    with pytest.raises(ValueError, match="sphere"):
        SyntheticParts(classes=("sphere",))


def test_resample_is_a_subset_or_all_plus_repeats() -> None:
    rng = np.random.default_rng(0)
    idx = resample(10, 4, rng)
    assert len(set(idx.tolist())) == 4
    idx = resample(3, 7, rng)
    assert idx[:3].tolist() == [0, 1, 2] and len(idx) == 7 and idx.max() < 3
