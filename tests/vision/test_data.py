"""Tests of vision.data: the synthetic image classes, ImageFolder trees through timm, the Pillow >= 13 posterize fix,
and the recipe's loaders and configs (vision.recipe)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from engine import DistributedContext, load_config
from vision.data import (
    SYNTHETIC_CLASSES,
    SyntheticImages,
    build_dataset,
    find_imagefolder,
    patch_posterize,
    render_synthetic,
)
from vision.recipe import DeiTConfig, build_loaders, build_model, build_transforms
from vision.testing import write_imagefolder

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs" / "vision").glob("*.yaml"))


# --------------------------------------------------------------------------------------------------------------------
# Synthetic images
# --------------------------------------------------------------------------------------------------------------------


def test_synthetic_is_deterministic_balanced_and_split_disjoint():
    a = SyntheticImages("train", num_classes=10, samples_per_class=3, image_size=32, seed=0, cache=False)
    b = SyntheticImages("train", num_classes=10, samples_per_class=3, image_size=32, seed=0)
    assert len(a) == 30 and a.num_classes == 10 and a.classes == list(SYNTHETIC_CLASSES)
    for i in range(len(a)):
        assert np.array_equal(a.render(i), b.render(i))
    assert [a[i][1] for i in range(len(a))] == [i % 10 for i in range(30)]
    assert np.bincount([a[i][1] for i in range(len(a))]).tolist() == [3] * 10
    image, label = a[-1]
    assert isinstance(image, Image.Image) and image.size == (32, 32) and image.mode == "RGB" and label == 9
    val = SyntheticImages("val", num_classes=10, samples_per_class=3, image_size=32, seed=0)
    other_seed = SyntheticImages("train", num_classes=10, samples_per_class=3, image_size=32, seed=1)
    assert not np.array_equal(a.render(0), val.render(0))
    assert not np.array_equal(a.render(0), other_seed.render(0))


def test_synthetic_classes_differ_in_shape_not_colour():
    """Each class puts a foreground object of a class-specific shape on the image; colours vary across samples."""
    coverage = {}
    for label in range(len(SYNTHETIC_CLASSES)):
        images = [render_synthetic(label, np.random.default_rng([7, label, i]), 48) for i in range(6)]
        for img in images:
            assert img.shape == (48, 48, 3) and img.dtype == np.uint8
        # the mean colour of the image varies (random colours), so colour does not give the class away
        means = np.array([img.reshape(-1, 3).mean(0) for img in images])
        assert means.std(0).max() > 10
        coverage[label] = images
    # a nearest-class-mean classifier on raw pixels is far from perfect (the task is not trivial) ...
    flat = {k: np.stack([im.astype(np.float32).ravel() for im in v]) for k, v in coverage.items()}
    centroids = {k: v.mean(0) for k, v in flat.items()}
    hits = sum(
        int(min(centroids, key=lambda c: np.linalg.norm(x - centroids[c])) == k) for k, v in flat.items() for x in v
    )
    assert hits < 0.5 * sum(len(v) for v in flat.values())
    with pytest.raises(ValueError, match="label must be in"):
        render_synthetic(10, np.random.default_rng(0))


def test_synthetic_through_timm_transforms():
    cfg = DeiTConfig(img_size=32, synthetic_image_size=40)
    train_tf, eval_tf = build_transforms(cfg)
    ds = build_dataset("synthetic", "train", transform=train_tf, num_classes=4, samples_per_class=2, image_size=40)
    x, y = ds[3]
    assert x.shape == (3, 32, 32) and x.dtype == torch.float32 and y == 3
    val = build_dataset("synthetic", "val", transform=eval_tf, num_classes=4, samples_per_class=2, image_size=40)
    assert torch.equal(val[0][0], val[0][0])  # eval transform is deterministic
    with pytest.raises(ValueError, match="num_classes"):
        SyntheticImages(num_classes=11)
    with pytest.raises(ValueError, match="unknown dataset"):
        build_dataset("cifar", "train")


def test_posterize_patch_survives_pillow_13_zero_bits():
    """RandAugment's PosterizeIncreasing keeps 0 bits at magnitude 10; Pillow >= 13 raises for 0 bits."""
    from timm.data.auto_augment import rand_augment_transform

    tf = rand_augment_transform("rand-n1-m10-inc1", {"img_mean": (124, 116, 104)})
    tf.ops = [op for op in tf.ops if op.name == "PosterizeIncreasing"]
    tf.ops[0].prob = 1.0
    img = Image.fromarray(render_synthetic(0, np.random.default_rng(0), 32))
    patch_posterize(tf)
    out = tf(img)
    assert np.asarray(out).max() == 0  # Pillow < 13's result for 0 bits: black
    # the patched op keeps Pillow's result for 1..8 bits
    from PIL import ImageOps

    assert np.array_equal(np.asarray(tf.ops[0].aug_fn(img, 2)), np.asarray(ImageOps.posterize(img, 2)))
    # the recipe's train transform is patched
    train_tf, _ = build_transforms(DeiTConfig(auto_augment="rand-m9-mstd0.5-inc1"))
    ops = [op for t in train_tf.transforms for op in getattr(t, "ops", [])]
    assert ops and all(op.aug_fn.__module__ != "timm.data.auto_augment" for op in ops if "Posterize" in op.name)


# --------------------------------------------------------------------------------------------------------------------
# ImageFolder (ImageNet layout) through timm.data.create_dataset
# --------------------------------------------------------------------------------------------------------------------


def test_imagefolder_layout(tmp_path: Path):
    root = write_imagefolder(tmp_path / "imagenet")
    assert find_imagefolder(root) == (root, "val")
    assert find_imagefolder(tmp_path) == (root, "val")  # a data root holding imagenet/
    _, eval_tf = build_transforms(DeiTConfig(img_size=32))
    train = build_dataset("imagefolder", "train", root=root, transform=eval_tf)
    val = build_dataset("imagefolder", "val", root=root, transform=eval_tf)
    assert train.classes == val.classes == ["n01", "n02", "n03"] and train.num_classes == 3
    assert len(train) == 12 and len(val) == 6
    x, y = val[5]
    assert x.shape == (3, 32, 32) and y == 2
    assert sorted(val[i][1] for i in range(len(val))) == [0, 0, 1, 1, 2, 2]


def test_imagefolder_val_uses_train_labels(tmp_path: Path):
    root = write_imagefolder(tmp_path / "data", classes=("a", "b", "c"))
    (root / "val" / "a").rename(tmp_path / "moved")  # val lacks class a: labels must still follow train's map
    val = build_dataset("imagefolder", "val", root=root)
    assert sorted({val[i][1] for i in range(len(val))}) == [1, 2]
    (root / "val" / "zzz").mkdir()
    (tmp_path / "moved").rename(root / "val" / "zzz" / "sub")
    with pytest.raises(ValueError, match="zzz"):
        build_dataset("imagefolder", "val", root=root)


def test_missing_imagefolder_names_the_tree(tmp_path: Path):
    (tmp_path / "train" / "n01").mkdir(parents=True)
    (tmp_path / "holdout").mkdir()
    pattern = r"(?s)needs class folders in train/ and val/ or test/ or validation/; its subfolders: holdout/, train/"
    with pytest.raises(FileNotFoundError, match=pattern + r".*train_folder / eval_folder.*train/<class>/<image>"):
        find_imagefolder(tmp_path)


@pytest.mark.parametrize("held_out", ["test", "holdout"])
def test_imagefolder_with_test_or_a_named_held_out_split(tmp_path: Path, held_out: str):
    """train/ + test/ is found by itself; any other name is the config key eval_folder (train_folder likewise)."""
    root = write_imagefolder(tmp_path / "data")
    (root / "val").rename(root / held_out)
    eval_folder = None if held_out == "test" else held_out
    assert find_imagefolder(root, eval_folder=eval_folder) == (root, held_out)
    held = build_dataset("imagefolder", "val", root=root, eval_folder=eval_folder)
    assert len(held) == 6 and held.classes == ["n01", "n02", "n03"]
    (root / "train").rename(root / "training")
    assert len(build_dataset("imagefolder", "train", root=root, train_folder="training", eval_folder=eval_folder)) == 12


# --------------------------------------------------------------------------------------------------------------------
# Recipe: loaders under DDP, configs
# --------------------------------------------------------------------------------------------------------------------

TINY = dict(synthetic_classes=4, synthetic_train_per_class=8, synthetic_val_per_class=5, synthetic_image_size=32,
            img_size=32, batch_size=8, eval_batch_size=4)  # fmt: skip


@pytest.mark.parametrize("aug_repeats", [0, 3])
def test_loaders_shard_over_ranks(aug_repeats: int):
    from timm.data.distributed_sampler import RepeatAugSampler
    from torch.utils.data import DistributedSampler

    cfg = replace(DeiTConfig(), aug_repeats=aug_repeats, **TINY)
    val_indices = []
    for rank in range(2):
        ctx = DistributedContext(rank=rank, world_size=2)
        train_loader, val_loader, num_classes = build_loaders(cfg, ctx)
        assert num_classes == 4 and train_loader.batch_size == 4 and train_loader.drop_last
        sampler = train_loader.sampler
        assert isinstance(sampler, RepeatAugSampler if aug_repeats else DistributedSampler)
        val_indices += list(val_loader.dataset.indices)
    assert sorted(val_indices) == list(range(20))  # every val image once, no padding
    with pytest.raises(ValueError, match="divide evenly"):
        build_loaders(replace(cfg, batch_size=7), DistributedContext(rank=0, world_size=2))
    with pytest.raises(ValueError, match="even batch"):
        build_loaders(replace(cfg, batch_size=6, mixup=0.8), DistributedContext(rank=0, world_size=2))


def test_every_config_loads_and_builds():
    names = {p.stem for p in CONFIGS}
    rows = {f"deit_{size}_centroid_{c}_300e" for size in ("tiny", "small") for c in ("c6", "c5_overlap", "c7_overlap")}
    assert rows <= names and "synthetic_centroid_tiny" in names and "deit_imagenet_base" in names
    for path in CONFIGS:
        cfg = load_config(DeiTConfig, path)
        if path.stem == "synthetic_centroid_tiny":
            assert cfg == DeiTConfig(), "the synthetic config must spell out the dataclass defaults (the main job)"
            continue
        if path.stem == "small_images":  # the main job at 32 px without ImageNet's flip and eval crop
            assert (cfg.dataset, cfg.img_size, cfg.patch_size, cfg.hflip, cfg.crop_pct) == ("imagefolder", 32, 4, 0, 1)
            assert build_model(cfg, num_classes=5)(torch.randn(1, 3, 32, 32)).shape == (1, 5)
            continue
        # DeiT's recipe
        assert (cfg.dataset, cfg.img_size, cfg.epochs, cfg.batch_size, cfg.lr, cfg.lr_base_size) == (
            "imagefolder", 224, 300, 1024, 5e-4, 512,
        )  # fmt: skip
        assert (cfg.weight_decay, cfg.warmup_epochs, cfg.min_lr, cfg.sched, cfg.smoothing) == (
            0.05, 5, 1e-5, "cosine", 0.1,
        )  # fmt: skip
        assert (cfg.auto_augment, cfg.mixup, cfg.cutmix, cfg.reprob, cfg.drop_path) == (
            "rand-m9-mstd0.5-inc1", 0.8, 1.0, 0.25, 0.1,
        )  # fmt: skip
        assert cfg.model_ema and cfg.model_ema_decay == 0.99996 and cfg.opt == "adamw"
        if path.stem == "deit_imagenet_base":
            continue
        model = build_model(replace(cfg, img_size=32), num_classes=5).eval()
        with torch.no_grad():
            assert model(torch.randn(1, 3, 32, 32)).shape == (1, 5), path.stem
        if "centroid" in path.stem:
            assert model.centroid_index == int(path.stem.split("_c")[2][0]), path.stem


def test_foreign_model_knob_is_named():
    cfg = replace(DeiTConfig(), model="deit_tiny_patch16_224", img_size=32)
    with pytest.raises(ValueError, match="centroid_index"):
        build_model(cfg, num_classes=3)
    assert build_model(replace(cfg, centroid_index=None, patch_size=None), num_classes=3).num_classes == 3
    with pytest.raises(ValueError, match="Unknown model"):
        build_model(replace(cfg, model="centroid_deit_huge"), num_classes=3)


def test_imagefolder_files_are_checked_cheaply(tmp_path: Path):
    """check_files() (run by engine.run before step 1) names an empty image and one whose bytes are not its format."""
    root = write_imagefolder(tmp_path / "data")
    val = build_dataset("imagefolder", "val", root=root)
    val.check_files()
    jpeg = next((root / "val").rglob("*.JPEG"))
    jpeg.write_bytes(b"<html>404</html>")
    with pytest.raises(ValueError, match=rf"{jpeg.name}: not a JPEG file"):
        val.check_files()
    jpeg.write_bytes(b"")
    with pytest.raises(ValueError, match="empty image file"):
        val.check_files()
