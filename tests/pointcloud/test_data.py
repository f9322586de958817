"""Tests of the point-cloud datasets, the ModelNet preparation script and the transforms.

Real-layout files are written to ``tmp_path`` in exactly the structure of each release; the real
``modelnet40_normal_resampled`` sample in ``../shared/data`` is used when present.
"""

import importlib.util
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.data import data_root
from pointcloud.data import (
    DATASETS,
    ModelNet40H5,
    ModelNet40Normal,
    ModelNet40Sampled,
    SyntheticShapes,
    build_dataset,
    save_sampled_split,
)
from pointcloud.meshes import read_off
from pointcloud.synthetic import SHAPE_CLASSES
from pointcloud.transforms import (
    Compose,
    Jitter,
    NormalizeUnitSphere,
    RandomPointDropout,
    RandomRotateUp,
    RandomScale,
    RandomTranslate,
    ShufflePoints,
    augmentation_rng,
    vote_logits,
)

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / ".." / "shared" / "data" / "modelnet40_normal_resampled_sample"
CLASSES40 = [f"class_{i:02d}" for i in range(40)]
WITH_AIRPLANE = [*CLASSES40[:39], "airplane"]


def _load_prepare_script():
    spec = importlib.util.spec_from_file_location("prepare_modelnet40", REPO / "datasets" / "prepare_modelnet40.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


# ----------------------------------------------------------------------------------------------------------------
# modelnet40_normal_resampled: the real sample


def _real_sample() -> Path:
    if not (SAMPLE / "modelnet40_shape_names.txt").is_file():
        pytest.skip(
            f"real ModelNet40 sample not found at {SAMPLE.resolve()} (only present next to the project checkout)"
        )
    return SAMPLE


def test_normal_real_sample_train_and_test():
    root = _real_sample()
    names = (root / "modelnet40_shape_names.txt").read_text().split()
    for split, expected_len in (("train", 32), ("test", 7)):
        ds = ModelNet40Normal(root, split=split, num_points=1024)
        assert len(ds) == expected_len
        assert ds.num_classes == 40 and ds.classes == names
        ids = (root / f"modelnet40_{split}.txt").read_text().split()
        assert ds.ids == ids
        for i, shape_id in enumerate(ids):
            points, label = ds[i]
            assert points.shape == (1024, 3) and points.dtype == torch.float32
            assert label.dtype == torch.long and label.ndim == 0
            assert int(label) == names.index(shape_id.rsplit("_", 1)[0])
            assert torch.isfinite(points).all()
    # underscore class names resolve to their class
    train = ModelNet40Normal(root, split="train")
    assert train.classes[int(train[train.ids.index("night_stand_0080")][1])] == "night_stand"
    assert train.classes[int(train[train.ids.index("glass_box_0002")][1])] == "glass_box"


def test_normal_real_sample_normals_match_file():
    root = _real_sample()
    ds = ModelNet40Normal(root, split="test", num_points=512, use_normals=True)
    points, _ = ds[0]
    assert points.shape == (512, 6)
    raw = np.loadtxt(ds.files[0], delimiter=",", max_rows=512)
    np.testing.assert_allclose(points.numpy(), raw, rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(raw[:, 3:], axis=1), 1.0, atol=1e-2)
    xyz_only, _ = ModelNet40Normal(root, split="test", num_points=512)[0]
    torch.testing.assert_close(xyz_only, points[:, :3])


def test_normal_cache_dir_roundtrip(tmp_path):
    root = _real_sample()
    first = ModelNet40Normal(root, split="test", num_points=256, use_normals=True, cache_dir=tmp_path, progress=False)
    cache = tmp_path / "modelnet40_normal_test_256.npz"
    assert cache.is_file()
    second = ModelNet40Normal(root, split="test", num_points=256, use_normals=True, cache_dir=tmp_path)
    for i in range(len(first)):
        torch.testing.assert_close(first[i][0], second[i][0])


# ----------------------------------------------------------------------------------------------------------------
# modelnet40_normal_resampled: written layouts and errors


def _write_normal_tree(
    root: Path, ids_by_split: dict[str, list[str]], classes: list[str], prefix="modelnet40", rows=64
):
    folder = root / "modelnet40_normal_resampled"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{prefix}_shape_names.txt").write_text("\n".join(classes) + "\n")
    rng = np.random.default_rng(0)
    for split, ids in ids_by_split.items():
        (folder / f"{prefix}_{split}.txt").write_text("\n".join(ids) + "\n")
        for shape_id in ids:
            cls = shape_id.rsplit("_", 1)[0]
            (folder / cls).mkdir(exist_ok=True)
            xyz = rng.uniform(-1, 1, (rows, 3))
            normals = rng.normal(size=(rows, 3))
            normals /= np.linalg.norm(normals, axis=1, keepdims=True)
            np.savetxt(folder / cls / f"{shape_id}.txt", np.hstack([xyz, normals]), fmt="%.6f", delimiter=",")
    return folder


def test_normal_modelnet10_layout(tmp_path):
    classes = ["bathtub", "bed", "chair", "desk", "dresser", "monitor", "night_stand", "sofa", "table", "toilet"]
    _write_normal_tree(
        tmp_path, {"train": ["night_stand_0001", "bed_0002"], "test": ["toilet_0003"]}, classes, "modelnet10"
    )
    ds = build_dataset("modelnet10_normal", "train", tmp_path, num_points=32, use_normals=True)
    assert ds.num_classes == 10 and len(ds) == 2
    assert [int(ds[i][1]) for i in range(2)] == [6, 1]
    assert ds[0][0].shape == (32, 6)


def _airplane_file(root: Path, rows: int = 64) -> Path:
    """A one-shape train split; returns the shape's file."""
    folder = _write_normal_tree(root, {"train": ["airplane_0001"]}, WITH_AIRPLANE, rows=rows)
    return folder / "airplane" / "airplane_0001.txt"


@pytest.mark.parametrize(
    ("line", "row", "message"),
    [
        (3, "0.1,0.2,0.3,0", "line 3: expected 6 comma-separated numbers, got 4"),  # a row cut short
        (5, "0.1,abc,0.3,0,0,1", "line 5: non-numeric"),
        (7, "0.1,nan,0.3,0,0,1", "line 7: contains NaN or Inf"),
    ],
)
def test_normal_bad_row_names_file_and_line(tmp_path, line, row, message):
    path = _airplane_file(tmp_path)
    lines = path.read_text().splitlines()
    lines[line - 1] = row
    path.write_text("\n".join(lines) + "\n")
    ds = ModelNet40Normal(tmp_path, "train", num_points=16)
    with pytest.raises(ValueError, match=rf"airplane_0001\.txt, {message}"):
        ds[0]


@pytest.mark.parametrize(
    ("line", "row", "message"),
    [
        (5, "0.1,0.2,0.3,0", "line 5: expected 6 comma-separated numbers, got 4"),
        (9, "0.1,abc,0.3,0,0,1", "line 9: non-numeric"),
        (12, "0.1,inf,0.3,0,0,1", "line 12: contains NaN or Inf"),
        (16, "51234.5,0.2,0.3,0,0,1", "line 16: coordinate 5.123e\\+04 is far outside the unit scale"),
    ],
)
def test_normal_check_files_reads_every_used_row_of_every_file(tmp_path, line, row, message):
    """check_files (run before training) finds a bad row past line 1 of a test file: it used to read line 1 only."""
    folder = _write_normal_tree(tmp_path, {"test": ["airplane_0001", "airplane_0002"]}, WITH_AIRPLANE, rows=32)
    path = folder / "airplane" / "airplane_0002.txt"
    lines = path.read_text().splitlines()
    lines[line - 1] = row
    path.write_text("\n".join(lines) + "\n")
    ds = ModelNet40Normal(tmp_path, "test", num_points=16)
    with pytest.raises(ValueError, match=rf"airplane_0002\.txt, {message}"):
        ds.check_files()
    lines[16] = "0.1,abc,0.3,0,0,1"  # past num_points: never read
    lines[line - 1] = "0.1,0.2,0.3,0,0,1"
    path.write_text("\n".join(lines) + "\n")
    ModelNet40Normal(tmp_path, "test", num_points=16).check_files()


def test_normal_check_files_keeps_the_parsed_clouds(tmp_path):
    folder = _write_normal_tree(tmp_path, {"train": ["airplane_0001", "airplane_0002"]}, WITH_AIRPLANE, rows=32)
    ds = ModelNet40Normal(tmp_path, "train", num_points=16, use_normals=True)
    ds.check_files()
    expected = [np.loadtxt(path, delimiter=",", max_rows=16, dtype=np.float32) for path in ds.files]
    for path in ds.files:
        path.unlink()  # training reads what the check parsed, not the files again
    for i in range(len(ds)):
        np.testing.assert_array_equal(ds[i][0].numpy(), expected[i])
    assert not (folder / "airplane" / "airplane_0001.txt").exists()


def test_normal_far_out_of_scale_rows_are_refused_lazily_and_allowed_without_a_limit(tmp_path):
    path = _airplane_file(tmp_path)
    lines = path.read_text().splitlines()
    lines[3] = "0.5,-40000,0.3,0,0,1"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=r"airplane_0001\.txt, line 4: coordinate -4e\+04.*normalize"):
        ModelNet40Normal(tmp_path, "train", num_points=16)[0]
    points, _ = ModelNet40Normal(tmp_path, "train", num_points=16, max_abs_coord=None)[0]
    assert float(points[3, 1]) == -40000


def test_normal_short_file_names_file(tmp_path):
    _airplane_file(tmp_path, rows=8)
    with pytest.raises(ValueError, match=r"airplane_0001\.txt: has 8 rows, fewer than num_points=16"):
        ModelNet40Normal(tmp_path, "train", num_points=16)[0]


def test_normal_unknown_class_id(tmp_path):
    folder = _write_normal_tree(tmp_path, {"train": ["airplane_0001"]}, WITH_AIRPLANE)
    (folder / "modelnet40_train.txt").write_text("airplane_0001\nspaceship_0007\n")
    with pytest.raises(
        ValueError, match=r"modelnet40_train\.txt: shape id 'spaceship_0007'.*known classes: \['class_00'"
    ):
        ModelNet40Normal(tmp_path, "train")


def test_normal_missing_shape_file(tmp_path):
    folder = _write_normal_tree(tmp_path, {"train": ["airplane_0001"]}, WITH_AIRPLANE)
    (folder / "airplane" / "airplane_0001.txt").unlink()
    with pytest.raises(FileNotFoundError, match=r"airplane_0001\.txt does not exist"):
        ModelNet40Normal(tmp_path, "train")


# ----------------------------------------------------------------------------------------------------------------
# modelnet40_ply_hdf5_2048


def _write_h5_tree(root: Path, points_per_cloud: int = 64) -> tuple[Path, dict]:
    import h5py

    folder = root / "modelnet40_ply_hdf5_2048"
    folder.mkdir(parents=True)
    (folder / "shape_names.txt").write_text("\n".join(CLASSES40) + "\n")
    rng = np.random.default_rng(0)
    written = {}
    for split, sizes in (("train", (5, 3)), ("test", (4,))):
        names = []
        for j, n in enumerate(sizes):
            data = rng.uniform(-1, 1, (n, points_per_cloud, 3)).astype(np.float32)
            label = rng.integers(0, 40, (n, 1)).astype(np.uint8)
            with h5py.File(folder / f"ply_data_{split}{j}.h5", "w") as f:
                f.create_dataset("data", data=data)
                f.create_dataset("label", data=label)
            names.append(f"data/modelnet40_ply_hdf5_2048/ply_data_{split}{j}.h5")
            written.setdefault(split, []).append((data, label))
        (folder / f"{split}_files.txt").write_text("\n".join(names) + "\n")
    return folder, written


def test_h5_real_structure(tmp_path):
    folder, written = _write_h5_tree(tmp_path)
    train = ModelNet40H5(tmp_path, split="train", num_points=32)
    assert len(train) == 8 and train.num_classes == 40 and train.classes == CLASSES40
    data = np.concatenate([d for d, _ in written["train"]])
    labels = np.concatenate([y for _, y in written["train"]]).reshape(-1)
    for i in (0, 4, 5, 7):
        points, label = train[i]
        assert points.shape == (32, 3) and label.dtype == torch.long
        np.testing.assert_array_equal(points.numpy(), data[i, :32])
        assert int(label) == labels[i]
    test = ModelNet40H5(folder, split="test", num_points=64)  # the dataset folder itself works as root
    assert len(test) == 4 and test[3][0].shape == (64, 3)


def test_h5_env_var_root_and_factory(tmp_path, monkeypatch):
    _write_h5_tree(tmp_path)
    monkeypatch.setenv("CENTROID_DATA", str(tmp_path))
    assert data_root() == tmp_path
    ds = build_dataset("modelnet40_h5", split="test", num_points=16)
    assert isinstance(ds, ModelNet40H5) and len(ds) == 4
    with pytest.raises(ValueError, match="clouds have 64 points, fewer than num_points=128"):
        build_dataset("modelnet40_h5", split="test", num_points=128)


def test_h5_corrupt_file_names_file(tmp_path):
    folder, _ = _write_h5_tree(tmp_path)
    (folder / "ply_data_train1.h5").write_bytes(b"\x89HDF\r\n garbage, not an hdf5 file")
    with pytest.raises(ValueError, match=r"ply_data_train1\.h5: cannot read HDF5 file.*'data' float32 \(n, 2048, 3\)"):
        ModelNet40H5(tmp_path, split="train", num_points=32)


def test_h5_truncated_file_names_file(tmp_path):
    folder, _ = _write_h5_tree(tmp_path)
    path = folder / "ply_data_train0.h5"
    path.write_bytes(path.read_bytes()[:3000])
    with pytest.raises(ValueError, match=r"ply_data_train0\.h5"):
        ModelNet40H5(tmp_path, split="train", num_points=32)


def test_h5_nan_and_missing_dataset(tmp_path):
    import h5py

    folder, _ = _write_h5_tree(tmp_path)
    with h5py.File(folder / "ply_data_test0.h5", "r+") as f:
        f["data"][1, 2, 0] = np.nan
    with pytest.raises(ValueError, match=r"ply_data_test0\.h5, sample 1: contains NaN or Inf"):
        ModelNet40H5(tmp_path, split="test", num_points=32)
    with h5py.File(folder / "ply_data_test0.h5", "r+") as f:
        del f["label"]
    with pytest.raises(ValueError, match=r"ply_data_test0\.h5: missing HDF5 datasets \['label'\]"):
        ModelNet40H5(tmp_path, split="test", num_points=32)


def test_h5_far_out_of_scale_clouds_are_refused_and_normalize_fixes_them(tmp_path):
    """Clouds in other units (coordinates near 5e4) used to train without a word."""
    import h5py

    from pointcloud.recipe import ModelNetConfig, build_datasets

    folder, _ = _write_h5_tree(tmp_path)
    with h5py.File(folder / "ply_data_train1.h5", "r+") as f:
        f["data"][2] = f["data"][2] * 5e4 + 1e3
    with pytest.raises(ValueError, match=r"ply_data_train1\.h5, sample 2: coordinate 5\.\d+e\+04 is far outside"):
        ModelNet40H5(tmp_path, split="train", num_points=32)
    assert len(ModelNet40H5(tmp_path, split="train", num_points=32, max_abs_coord=None)) == 8
    cfg = ModelNetConfig(dataset="modelnet40_h5", num_points=32)
    with pytest.raises(ValueError, match="normalize: true"):
        build_datasets(cfg, str(tmp_path))
    train, test = build_datasets(ModelNetConfig(dataset="modelnet40_h5", num_points=32, normalize=True), str(tmp_path))
    for ds in (train, test):
        norms = torch.stack([ds[i][0] for i in range(len(ds))]).norm(dim=-1).amax(-1)
        assert (norms < 2).all(), norms  # unit sphere, then train augmentation (scale <= 1.25, shift <= 0.1)
    torch.testing.assert_close(norms, torch.ones_like(norms))  # test split: normalized, not augmented


def test_sampled_far_out_of_scale_clouds_are_refused(tmp_path):
    folder = tmp_path / "modelnet40_sampled"
    folder.mkdir()
    (folder / "shape_names.txt").write_text("\n".join(CLASSES40) + "\n")
    points = np.random.default_rng(0).uniform(-1, 1, (3, 64, 6)).astype(np.float32)
    points[1, 5, 2] = 300.0
    save_sampled_split(folder, "test", points, np.array([0, 1, 2]), ["a_1", "b_1", "c_1"])
    with pytest.raises(ValueError, match=r"test\.npz, sample 1: coordinate 300"):
        ModelNet40Sampled(tmp_path, "test", num_points=64)
    assert len(ModelNet40Sampled(tmp_path, "test", num_points=64, max_abs_coord=1000)) == 3


def test_h5_listed_file_missing(tmp_path):
    folder, _ = _write_h5_tree(tmp_path)
    (folder / "ply_data_train1.h5").unlink()
    with pytest.raises(
        FileNotFoundError, match=r"train_files\.txt lists 'data/modelnet40_ply_hdf5_2048/ply_data_train1"
    ):
        ModelNet40H5(tmp_path, split="train", num_points=32)


# ----------------------------------------------------------------------------------------------------------------
# missing roots, factory


@pytest.mark.parametrize(
    ("name", "folder"),
    [
        ("modelnet40_h5", "modelnet40_ply_hdf5_2048"),
        ("modelnet40_normal", "modelnet40_normal_resampled"),
        ("modelnet10_normal", "modelnet40_normal_resampled"),
        ("modelnet40_sampled", "modelnet40_sampled"),
        ("modelnet10_sampled", "modelnet10_sampled"),
    ],
)
def test_missing_root_names_path_and_tree(tmp_path, name, folder):
    root = tmp_path / "nowhere"
    with pytest.raises(FileNotFoundError) as info:
        build_dataset(name, "train", root)
    message = str(info.value)
    assert str(root / folder) in message and "CENTROID_DATA" in message
    assert f"<data root>/{folder}/" in message  # the expected tree is printed


def test_build_dataset_unknown_name_and_split():
    assert set(DATASETS) == {
        "synthetic",
        "modelnet40_h5",
        "modelnet40_normal",
        "modelnet10_normal",
        "modelnet40_sampled",
        "modelnet10_sampled",
    }
    with pytest.raises(ValueError, match=r"unknown dataset 'shapenet'; choices: \['modelnet10_normal'"):
        build_dataset("shapenet")
    with pytest.raises(ValueError, match=r"split must be one of \('train', 'test'\), got 'val'"):
        build_dataset("synthetic", split="val")


# ----------------------------------------------------------------------------------------------------------------
# raw .off meshes -> prepare_modelnet40.py -> ModelNet40Sampled


def _write_off_tree(root: Path, classes: list[str], populated: dict[str, int]) -> Path:
    import trimesh

    src = root / "ModelNet40"
    meshes = [trimesh.creation.box(extents=(1.0, 2.0, 0.5)), trimesh.creation.icosphere(1), trimesh.creation.cone(1, 2)]
    for c, cls in enumerate(classes):
        for split in ("train", "test"):
            (src / cls / split).mkdir(parents=True)
        for k in range(populated.get(cls, 0)):
            split = "test" if k == 0 else "train"
            mesh = meshes[(c + k) % len(meshes)].copy()
            mesh.apply_scale(10.0 + k)  # raw ModelNet meshes are far from unit size
            text = trimesh.exchange.off.export_off(mesh)
            if k == 1:  # the malformed ModelNet header: keyword fused with the counts
                text = text.replace("OFF\n", "OFF", 1)
            (src / cls / split / f"{cls}_{k + 1:04d}.off").write_text(text)
    return src


def test_read_off_fused_header_and_polygons(tmp_path):
    path = tmp_path / "quad.off"
    path.write_text("OFF4 1 0\n0 0 0\n1 0 0\n1 1 0\n0 1 0\n4 0 1 2 3\n")
    vertices, faces = read_off(path)
    assert vertices.shape == (4, 3)
    np.testing.assert_array_equal(faces, [[0, 1, 2], [0, 2, 3]])
    path.write_text("OFF\n4 1 0\n0 0 0\n1 0 0\n")
    with pytest.raises(ValueError, match=r"quad\.off: truncated OFF file"):
        read_off(path)
    path.write_text("PLY\n")
    with pytest.raises(ValueError, match=r"quad\.off: expected an OFF header"):
        read_off(path)


def test_prepare_script_to_loader(tmp_path, caplog):
    prep = _load_prepare_script()
    populated = {"class_00": 3, "class_07": 2, "class_39": 2}
    src = _write_off_tree(tmp_path, CLASSES40, populated)
    out = prep.prepare(src, tmp_path / "modelnet40_sampled", num_points=256, seed=3, workers=0, progress=False)
    assert (out / "meta.json").is_file()

    train = build_dataset("modelnet40_sampled", "train", tmp_path, num_points=128, use_normals=True)
    test = ModelNet40Sampled(tmp_path, "test", num_points=256)
    assert train.classes == CLASSES40 and len(train) == 4 and len(test) == 3
    assert sorted(train.ids) == ["class_00_0002", "class_00_0003", "class_07_0002", "class_39_0002"]
    assert [train.classes[int(train[i][1])] for i in range(len(train))] == [i.rsplit("_", 1)[0] for i in train.ids]
    points, _ = train[0]
    assert points.shape == (128, 6) and torch.isfinite(points).all()
    stored = torch.from_numpy(np.load(out / "train.npz")["points"])  # (4, 256, 6)
    torch.testing.assert_close(stored[..., :3].mean(dim=1), torch.zeros(4, 3), atol=1e-5, rtol=0)
    torch.testing.assert_close(stored[..., :3].norm(dim=-1).amax(dim=1), torch.ones(4))
    torch.testing.assert_close(torch.from_numpy(train.points), stored[:, :128], rtol=0, atol=0)  # the prefix
    torch.testing.assert_close(points[:, 3:].norm(dim=-1), torch.ones(128))
    assert test[0][0].shape == (256, 3)

    # deterministic, idempotent, and protective of a cache with other settings
    stamp = (out / "train.npz").stat().st_mtime_ns
    prep.prepare(src, out, num_points=256, seed=3, progress=False)
    assert (out / "train.npz").stat().st_mtime_ns == stamp
    with pytest.raises(FileExistsError, match="--force"):
        prep.prepare(src, out, num_points=256, seed=4, progress=False)
    again = prep.prepare(src, tmp_path / "again", num_points=256, seed=3, progress=False)
    np.testing.assert_array_equal(np.load(again / "train.npz")["points"], np.load(out / "train.npz")["points"])
    prep.prepare(src, out, num_points=256, seed=4, force=True, progress=False)
    assert not np.array_equal(np.load(again / "train.npz")["points"], np.load(out / "train.npz")["points"])


def test_prepare_modelnet10_from_modelnet40_tree(tmp_path):
    prep = _load_prepare_script()
    classes = sorted([*prep.MODELNET10_CLASSES, "airplane", "xbox"])
    src = _write_off_tree(tmp_path, classes, {"night_stand": 2, "airplane": 2})
    prep.main(["--src", str(src), "--out", str(tmp_path / "modelnet10_sampled"), "--modelnet10", "--num-points", "64"])
    ds = build_dataset("modelnet10_sampled", "train", tmp_path, num_points=64)
    assert ds.classes == prep.MODELNET10_CLASSES and len(ds) == 1
    assert ds.classes[int(ds[0][1])] == "night_stand"


def test_prepare_reports_bad_mesh(tmp_path):
    prep = _load_prepare_script()
    src = _write_off_tree(tmp_path, CLASSES40, {"class_03": 2})
    (src / "class_03" / "train" / "class_03_0002.off").write_text("OFF\n3 1 0\n0 0 0\n1 0 0\n")
    with pytest.raises(ValueError, match=r"class_03_0002\.off: truncated OFF file"):
        prep.prepare(src, tmp_path / "out", num_points=16, progress=False)
    with pytest.raises(FileNotFoundError, match=r"mesh folder .*missing.* not found"):
        prep.prepare(tmp_path / "missing", tmp_path / "out", progress=False)


@pytest.mark.slow
def test_prepare_workers_give_identical_cache(tmp_path):
    prep = _load_prepare_script()
    src = _write_off_tree(tmp_path, CLASSES40, {c: 3 for c in CLASSES40[:6]})
    a = prep.prepare(src, tmp_path / "a", num_points=128, workers=0, progress=False)
    b = prep.prepare(src, tmp_path / "b", num_points=128, workers=2, progress=False)
    for split in ("train", "test"):
        np.testing.assert_array_equal(np.load(a / f"{split}.npz")["points"], np.load(b / f"{split}.npz")["points"])


# ----------------------------------------------------------------------------------------------------------------
# synthetic shapes


def test_synthetic_deterministic_and_seed_dependent():
    a = SyntheticShapes("train", num_points=256, samples_per_class=2, seed=0)
    b = SyntheticShapes("train", num_points=256, samples_per_class=2, seed=0, precompute=False)
    c = SyntheticShapes("train", num_points=256, samples_per_class=2, seed=1)
    for i in range(len(a)):
        torch.testing.assert_close(a[i][0], b[i][0], rtol=0, atol=0)
        assert not torch.equal(a[i][0], c[i][0])


def test_synthetic_classes_balance_and_sizes():
    train = SyntheticShapes("train", num_points=64, precompute=False)
    test = SyntheticShapes("test", num_points=64, precompute=False)
    assert train.num_classes == 10 and train.classes == SHAPE_CLASSES[:10] and len(SHAPE_CLASSES) >= 10
    assert len(train) == 1000 and len(test) == 300
    assert np.bincount(train.labels).tolist() == [100] * 10
    assert np.bincount(test.labels).tolist() == [30] * 10
    full = SyntheticShapes("train", num_points=64, num_classes=len(SHAPE_CLASSES), samples_per_class=3)
    labels = [int(full[i][1]) for i in range(len(full))]
    assert np.bincount(labels).tolist() == [3] * len(SHAPE_CLASSES)
    with pytest.raises(ValueError, match=r"num_classes must be in \[2, 13\]"):
        SyntheticShapes(num_classes=99)


def test_synthetic_train_test_disjoint_and_normalized():
    train = SyntheticShapes("train", num_points=128, samples_per_class=4, use_normals=True)
    test = SyntheticShapes("test", num_points=128, samples_per_class=4, use_normals=True)
    train_clouds = [train[i][0] for i in range(len(train))]
    for j in range(len(test)):
        assert not any(torch.allclose(test[j][0], x) for x in train_clouds)
    for points in train_clouds:
        assert points.shape == (128, 6) and torch.isfinite(points).all()
        xyz = points[:, :3]
        torch.testing.assert_close(xyz.mean(0), torch.zeros(3), atol=1e-5, rtol=0)
        torch.testing.assert_close(xyz.norm(dim=1).max(), torch.tensor(1.0))
        torch.testing.assert_close(points[:, 3:].norm(dim=1), torch.ones(128), atol=1e-5, rtol=0)
    raw = SyntheticShapes("train", num_points=128, samples_per_class=1, normalize=False)
    assert any(not torch.isclose(raw[i][0].norm(dim=1).max(), torch.tensor(1.0)) for i in range(len(raw)))


def test_synthetic_sample_independent_of_num_classes():
    small = SyntheticShapes("test", num_points=64, num_classes=3, samples_per_class=2)
    large = SyntheticShapes("test", num_points=64, num_classes=12, samples_per_class=2)
    for i in range(len(small)):
        torch.testing.assert_close(small[i][0], large[i][0], rtol=0, atol=0)


def test_synthetic_generation_speed():
    start = time.perf_counter()
    ds = SyntheticShapes("train", num_points=1024, num_classes=13, samples_per_class=10)
    elapsed = time.perf_counter() - start
    assert len(ds) == 130
    assert elapsed < 10.0, f"generating 130 clouds took {elapsed:.1f} s (expected about 0.3 s)"


# ----------------------------------------------------------------------------------------------------------------
# transforms


def _cloud(n=200, normals=True, seed=0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    xyz = rng.uniform(-1, 1, (n, 3))
    if not normals:
        return xyz.astype(np.float32)
    nrm = rng.normal(size=(n, 3))
    return np.hstack([xyz, nrm / np.linalg.norm(nrm, axis=1, keepdims=True)]).astype(np.float32)


ALL_TRANSFORMS = [
    RandomScale(),
    RandomScale(0.5, 2.0, anisotropic=False),
    RandomTranslate(0.1),
    Jitter(),
    RandomRotateUp("z"),
    RandomRotateUp("y"),
    RandomPointDropout(),
    ShufflePoints(),
    NormalizeUnitSphere(),
    Compose([RandomScale(), RandomRotateUp("z"), RandomTranslate(), Jitter(), RandomPointDropout()]),
]


@pytest.mark.parametrize("transform", ALL_TRANSFORMS, ids=lambda t: type(t).__name__)
@pytest.mark.parametrize("channels", [3, 6])
def test_transform_shape_dtype_determinism(transform, channels):
    points = _cloud(normals=channels == 6)
    out = transform(points, np.random.default_rng(5))
    assert out.shape == points.shape and out.dtype == np.float32
    np.testing.assert_array_equal(out, transform(points, np.random.default_rng(5)))
    np.testing.assert_array_equal(out, transform(points, 5))  # an int seed is the same generator
    np.testing.assert_array_equal(points, _cloud(normals=channels == 6))  # input untouched
    tensor_out = transform(torch.from_numpy(points), np.random.default_rng(5))
    assert isinstance(tensor_out, torch.Tensor) and tensor_out.dtype == torch.float32
    np.testing.assert_allclose(tensor_out.numpy(), out, rtol=0, atol=1e-6)
    if channels == 6 and not isinstance(transform, RandomPointDropout | ShufflePoints):
        np.testing.assert_allclose(np.linalg.norm(out[:, 3:], axis=1), 1.0, atol=1e-5)


def test_transforms_random_ones_differ_across_generators():
    points = _cloud()
    for transform in ALL_TRANSFORMS:
        if isinstance(transform, NormalizeUnitSphere):
            continue
        a, b = transform(points, np.random.default_rng(1)), transform(points, np.random.default_rng(2))
        assert not np.array_equal(a, b), transform


def test_normalize_unit_sphere():
    points = _cloud(normals=False) * 7.0 + np.array([3.0, -2.0, 5.0], dtype=np.float32)
    out = NormalizeUnitSphere()(points)
    np.testing.assert_allclose(out.mean(axis=0), 0.0, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1).max(), 1.0, atol=1e-6)


def test_rotate_up_preserves_up_coordinate_and_norms():
    points = _cloud(normals=False)
    out = RandomRotateUp("z")(points, 0)
    np.testing.assert_allclose(out[:, 2], points[:, 2], atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(out, axis=1), np.linalg.norm(points, axis=1), atol=1e-5)
    out_y = RandomRotateUp(1)(points, 0)
    np.testing.assert_allclose(out_y[:, 1], points[:, 1], atol=1e-6)
    with pytest.raises(ValueError, match="axis must be one of"):
        RandomRotateUp("w")


def test_point_dropout_replaces_with_first_point():
    points = _cloud(n=1000)
    out = RandomPointDropout(0.875)(points, np.random.default_rng(3))
    changed = ~(out == points).all(axis=1)
    assert changed.any()
    np.testing.assert_array_equal(out[changed], np.broadcast_to(points[0], out[changed].shape))


def test_transform_rejects_bad_shape():
    with pytest.raises(ValueError, match=r"expects one cloud of shape \(N, C\) with C >= 3, got \(2, 10, 3\)"):
        Jitter()(np.zeros((2, 10, 3), dtype=np.float32), 0)


# ----------------------------------------------------------------------------------------------------------------
# augmentation determinism per (seed, epoch, index), voting


def _augmented_dataset(seed=0):
    transform = Compose([RandomScale(), RandomRotateUp("z"), Jitter(), RandomPointDropout()])
    return SyntheticShapes("train", num_points=128, num_classes=10, samples_per_class=2, seed=seed, transform=transform)


def test_dataset_augmentation_is_function_of_seed_epoch_index():
    ds = _augmented_dataset()
    first = ds[3][0]
    torch.testing.assert_close(ds[3][0], first, rtol=0, atol=0)  # no hidden state between calls
    ds[0], ds[7]  # other samples in between change nothing
    torch.testing.assert_close(ds[3][0], first, rtol=0, atol=0)
    ds.set_epoch(1)
    assert ds.epoch == 1 and not torch.equal(ds[3][0], first)
    ds.set_epoch(0)
    torch.testing.assert_close(ds[3][0], first, rtol=0, atol=0)
    fresh = _augmented_dataset()  # a restarted process: same seed -> same augmentation
    torch.testing.assert_close(fresh[3][0], first, rtol=0, atol=0)
    expected = ds.transform(ds.load_points(3), augmentation_rng(0, 0, 3))
    np.testing.assert_array_equal(first.numpy(), expected)
    assert not torch.equal(_augmented_dataset(seed=1)[3][0], SyntheticShapes("train", 128, 10, 2, seed=1)[3][0])


def _epoch_batches(ds, loader, epochs):
    out = []
    for epoch in epochs:
        ds.set_epoch(epoch)
        out.append(torch.cat([x for x, _ in loader]))
    return out


def test_dataloader_workers_match_single_process():
    ds = _augmented_dataset()
    reference = _epoch_batches(ds, torch.utils.data.DataLoader(ds, batch_size=8), [0, 1, 2])
    assert not torch.equal(reference[0], reference[1])
    loader = torch.utils.data.DataLoader(ds, batch_size=8, num_workers=2, persistent_workers=True)
    for got, want in zip(_epoch_batches(ds, loader, [0, 1, 2]), reference, strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_vote_logits():
    torch.manual_seed(0)
    weight = torch.randn(6, 5)

    def model_fn(points):
        features = torch.cat([points.abs().amax(dim=1), points.mean(dim=1)], dim=-1)  # (B, 6)
        return features @ weight

    points = torch.from_numpy(np.stack([_cloud(n=64, normals=False, seed=s) for s in range(4)]))
    torch.testing.assert_close(vote_logits(model_fn, points, num_votes=1), model_fn(points))
    voted = vote_logits(model_fn, points, num_votes=5, seed=1)
    assert voted.shape == (4, 5)
    torch.testing.assert_close(vote_logits(model_fn, points, num_votes=5, seed=1), voted, rtol=0, atol=0)
    assert not torch.allclose(vote_logits(model_fn, points, num_votes=5, seed=2), voted)
    with_normals = torch.from_numpy(np.stack([_cloud(n=64, seed=s) for s in range(2)]))
    assert vote_logits(lambda p: p[..., 3:].norm(dim=-1).mean(1, keepdim=True), with_normals, 4).allclose(
        torch.ones(2, 1)
    )
    with pytest.raises(ValueError, match=r"points must be \(B, N, C\)"):
        vote_logits(model_fn, points[0], num_votes=2)


def test_env_default_root(monkeypatch):
    monkeypatch.delenv("CENTROID_DATA", raising=False)
    assert data_root() == Path("datasets")
    monkeypatch.setenv("CENTROID_DATA", os.fspath(Path("/tmp/x")))
    assert data_root() == Path("/tmp/x")
    assert data_root("elsewhere") == Path("elsewhere")
