"""Capsule datasets: ShapeNet Part in both released layouts, Core13 point files, synthetic parts; errors."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from capsules.data import CloudFolder, ShapeNetCore13, ShapeNetPart, SyntheticParts, build_dataset, resample

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
    with pytest.raises(ValueError, match=rf"{shape_id}\.pts, line 1: not a number in '0 0 zero'; expected 3"):
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


# --------------------------------------------------------------------------------------------------------------------
# ModelNet releases (through pointcloud.data) and plain folders of clouds: unlabelled shapes for the autoencoder
# --------------------------------------------------------------------------------------------------------------------

SAMPLE = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "modelnet40_normal_resampled_sample"


@pytest.mark.skipif(not SAMPLE.is_dir(), reason="the real ModelNet40 sample (../shared/data) is absent")
def test_modelnet40_normal_through_the_classifier_loader() -> None:
    from pointcloud.data import ModelNet40Normal

    train = build_dataset("modelnet40_normal", "train", SAMPLE, num_points=512)
    test = build_dataset("modelnet40_normal", "test", SAMPLE, num_points=512)
    train.check_files()
    assert (len(train), len(test)) == (32, 7) and train.up_axis == "y"
    assert train.names[0] == "airplane_0126" and train.category_names[train.categories[0]] == "airplane"
    points, parts = train[0]
    reference = ModelNet40Normal(SAMPLE, "train", num_points=512).load_points(0)  # the classifier's reading
    centred = reference - reference.mean(0)
    np.testing.assert_allclose(points.numpy(), centred / np.linalg.norm(centred, axis=1).max(), atol=1e-6)
    assert points.shape == (512, 3) and (parts == -1).all()


def test_modelnet40_h5_as_capsule_shapes(tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    folder = tmp_path / "modelnet40_ply_hdf5_2048"
    folder.mkdir()
    (folder / "shape_names.txt").write_text("".join(f"class{i}\n" for i in range(40)))
    rng = np.random.default_rng(0)
    for split in ("train", "test"):
        with h5py.File(folder / f"ply_data_{split}0.h5", "w") as f:
            f["data"] = rng.normal(size=(3, 2048, 3)).astype(np.float32)
            f["label"] = np.array([[1], [5], [5]], dtype=np.uint8)
        (folder / f"{split}_files.txt").write_text(f"data/modelnet40_ply_hdf5_2048/ply_data_{split}0.h5\n")
    shapes = build_dataset("modelnet40_h5", "test", tmp_path, num_points=64)
    assert len(shapes) == 3 and shapes.names == ["class1_0", "class5_1", "class5_2"]
    assert shapes[2][0].shape == (64, 3) and shapes.up_axis == "y"


def test_shapes_sampled_from_the_off_meshes_stand_on_z(tmp_path: Path) -> None:
    """The cache of the raw .off meshes keeps their frame (z up); the viewer turns that axis up, not the releases' y."""
    from pointcloud.data import save_sampled_split

    folder = tmp_path / "modelnet40_sampled"
    save_sampled_split(folder, "test", np.zeros((1, 16, 6), np.float32) + 0.1, np.array([3]), ["chair_0001"])
    (folder / "shape_names.txt").write_text("".join(f"class{i}\n" for i in range(40)))
    shapes = build_dataset("modelnet40_sampled", "test", tmp_path, num_points=16)
    assert shapes.names == ["chair_0001"] and shapes.up_axis == "z"


def _write_clouds(folder: Path, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """One cloud per format, nested one level (the category) or not."""
    import trimesh

    clouds = {name: rng.normal(size=(50, 3)) for name in ("chair/a", "chair/b", "lamp/c", "d")}
    (folder / "chair").mkdir(parents=True)
    (folder / "lamp").mkdir()
    np.save(folder / "chair" / "a.npy", clouds["chair/a"].astype(np.float32))
    np.savetxt(folder / "chair" / "b.txt", np.hstack([clouds["chair/b"], np.ones((50, 3))]), delimiter=",")
    trimesh.PointCloud(clouds["lamp/c"]).export(folder / "lamp" / "c.ply")
    np.savetxt(folder / "d.xyz", clouds["d"])
    return clouds


@pytest.mark.parametrize("layout", ["split folders", "split files"])
def test_cloud_folder_reads_every_format(tmp_path: Path, layout: str) -> None:
    rng = np.random.default_rng(0)
    if layout == "split folders":
        clouds = _write_clouds(tmp_path / "train", rng)
        _write_clouds(tmp_path / "test", rng)
    else:
        clouds = _write_clouds(tmp_path / "all", rng)
        (tmp_path / "train.txt").write_text("all/chair/a\nall/chair/b.txt\nall/lamp/c.ply\nall/d\n")
        (tmp_path / "test.txt").write_text("all/d.xyz\n")
    train = build_dataset("cloud_folder", "train", tmp_path, num_points=50)
    train.check_files()
    prefix = "" if layout == "split folders" else "all/"
    names = [name.removeprefix(prefix) for name in train.names]
    assert sorted(names) == sorted(clouds)
    for i, name in enumerate(names):
        points, parts = train[i]
        cloud = clouds[name] - clouds[name].mean(0)
        expected = cloud / np.linalg.norm(cloud, axis=1).max()
        got = points.numpy().astype(np.float64)
        # same points up to the order of the resampling (50 of 50: a permutation)
        np.testing.assert_allclose(np.sort(got, axis=0), np.sort(expected, axis=0), atol=1e-5)
        assert (parts == -1).all()
    if layout == "split folders":
        assert train.category_names == ["all", "chair", "lamp"]
    test = build_dataset("cloud_folder", "test", tmp_path, num_points=50)
    assert len(test) == (4 if layout == "split folders" else 1)


def test_cloud_folder_numbers_categories_once_from_the_train_split(tmp_path: Path) -> None:
    """A test split with fewer categories keeps the train split's indices; a category only the test split has is
    refused by name."""
    rng = np.random.default_rng(0)
    for relative in ("train/chair/a", "train/lamp/b", "train/sofa/c", "test/sofa/d"):
        (tmp_path / relative).parent.mkdir(parents=True, exist_ok=True)
        np.save(tmp_path / f"{relative}.npy", rng.normal(size=(20, 3)))
    train = build_dataset("cloud_folder", "train", tmp_path, num_points=20)
    test = build_dataset("cloud_folder", "test", tmp_path, num_points=20)
    assert train.category_names == test.category_names == ["chair", "lamp", "sofa"]
    assert test.categories == [2] == [train.categories[train.names.index("sofa/c")]]
    (tmp_path / "test" / "bench").mkdir()
    np.save(tmp_path / "test" / "bench" / "e.npy", rng.normal(size=(20, 3)))
    with pytest.raises(ValueError, match=r"categories the train split lacks: 'bench' \(e\.g\. 'bench/e'\)"):
        build_dataset("cloud_folder", "test", tmp_path)


def test_cloud_folder_samples_meshes_and_names_bad_files(tmp_path: Path) -> None:
    import trimesh

    (tmp_path / "train").mkdir()
    trimesh.creation.box().export(tmp_path / "train" / "box.ply")
    shapes = build_dataset("cloud_folder", "train", tmp_path, num_points=300)
    points, _ = shapes[0]
    assert points.shape == (300, 3)
    p = points.numpy()
    centre, half = (p.max(0) + p.min(0)) / 2, (p.max(0) - p.min(0)) / 2
    assert len(np.unique(p, axis=0)) > 8  # surface samples, not the mesh's 8 vertices
    assert np.allclose(np.abs((p - centre) / half).max(1), 1.0, atol=1e-4)  # every point on a face of the cube
    (tmp_path / "train" / "bad.txt").write_text("1 2 3\n4 five 6\n")
    with pytest.raises(ValueError, match=r"bad\.txt: not a readable point cloud"):
        build_dataset("cloud_folder", "train", tmp_path, num_points=8).check_files()
    with pytest.raises(FileNotFoundError, match=r"no test split in .*expected a folder .*test or a file .*test\.txt"):
        build_dataset("cloud_folder", "test", tmp_path)
    (tmp_path / "test.txt").write_text("missing_shape\n")
    with pytest.raises(FileNotFoundError, match="lists 'missing_shape'"):
        build_dataset("cloud_folder", "test", tmp_path)


PLY_HEADER = (
    "ply\nformat ascii 1.0\nelement vertex {count}\nproperty float x\nproperty float y\nproperty float z\nend_header\n"
)


@pytest.mark.parametrize("case", ["empty npy", "ascii ply header", "binary ply header"])
def test_cloud_folder_names_an_empty_file_and_a_ply_unlike_its_header(tmp_path: Path, case: str) -> None:
    """A zero-byte .npy raised EOFError without a file name; a PLY whose header claims 450 M vertices over 50 rows was
    read as its 50 rows. Both are one line naming the file (and the counts)."""
    import trimesh

    folder = tmp_path / "train"
    folder.mkdir()
    rows = np.random.default_rng(0).normal(size=(50, 3))
    if case == "empty npy":
        path, message = folder / "a.npy", "the file is empty (0 bytes)"
        path.write_bytes(b"")
    elif case == "ascii ply header":
        path, message = (
            folder / "b.ply",
            "the PLY header declares 450000000 rows (450000000 vertex) but the file holds 50",
        )
        text = PLY_HEADER.format(count=50) + "".join(f"{x} {y} {z}\n" for x, y, z in rows)
        path.write_text(text)
        CloudFolder(tmp_path, "train", num_points=50).check_files()  # as declared: read
        path.write_text(text.replace("vertex 50", "vertex 450000000"))
    else:
        path, message = folder / "c.ply", "declares 450000000 vertex (5400000000 bytes at least) but the file holds 600"
        trimesh.PointCloud(rows).export(path)  # binary: 50 x 3 float32 after the header
        CloudFolder(tmp_path, "train", num_points=50).check_files()
        data = path.read_bytes()
        path.write_bytes(data.replace(b"element vertex 50\n", b"element vertex 450000000\n"))
    with pytest.raises(ValueError) as info:
        CloudFolder(tmp_path, "train", num_points=50).check_files()
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value) and "\n" not in str(info.value)
