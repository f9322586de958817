"""tools/visualize_capsules.py: a non-blank headless PNG and a coloured .ply that reads back; the colouring."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import engine
from capsules.recipe import CapsulesRecipe
from capsules.testing import TINY_CAPSULES_SETS
from capsules.visualize import (
    GREY,
    add_legend,
    capsule_palette,
    decomposition,
    legend_entries,
    render_png,
    visualize_checkpoint,
)
from engine.testing import REPO, run_tool


def _open3d():
    try:
        import open3d
    except (ImportError, OSError) as err:  # missing Debian libraries (libusb, libGL): tools/bootstrap.sh installs them
        pytest.skip(f"open3d does not import here: {err}")
    return open3d


def test_writes_a_non_blank_png_and_a_ply_that_reads_back(tmp_path: Path) -> None:
    o3d = _open3d()
    engine.main(CapsulesRecipe, ["--no-progress", "--device", "cpu", "--epochs", "1", "--output-dir",
                                 str(tmp_path / "run"), "--set", *TINY_CAPSULES_SETS, "num_points=64"])  # fmt: skip
    out = tmp_path / "viz"
    proc = run_tool("visualize_capsules", ["--checkpoint", str(tmp_path / "run" / "best.pt"), "--index", "0", "2",
                                           "--headless", "--output-dir", str(out), "--width", "320", "--height",
                                           "200", "--highlight", "0", "3"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    # one log line per shape: "<split>_<index> (<name>): part purity <p> -> <png>"
    logged = re.findall(r"(test_\d+) \(.*?\): part purity ([\d.]+) -> (\S+)", proc.stderr)
    assert [(stem, Path(png)) for stem, _, png in logged] == [(f"test_{i}", out / f"test_{i}.png") for i in (0, 2)]
    assert all(0 < float(purity) <= 1 for _, purity, _ in logged)
    image = np.asarray(o3d.io.read_image(str(out / "test_0.png"))).astype(np.float64)
    assert image.shape[:2] == (200, 320)
    assert image.std() > 5.0, f"the PNG is blank (pixel std {image.std():.2f})"
    # the legend panel on the right shows the highlighted capsules' colours
    panel = image[:, -140:, :3].reshape(-1, 3)
    for c in (0, 3):
        assert (np.abs(panel - 255 * capsule_palette(12)[c]).max(-1) < 3).sum() > 10, f"capsule {c} not in the legend"
    assert (image < 200).any(axis=-1).mean() > 0.002, "almost no coloured pixels"
    cloud = o3d.io.read_point_cloud(str(out / "test_2.ply"))
    colors = np.asarray(cloud.colors)
    assert len(cloud.points) == 128 and colors.shape == (128, 3)  # input + reconstruction, 64 points each
    palette = capsule_palette(12)
    grey = np.all(np.isclose(colors, GREY, atol=1e-2), axis=1)
    kept = [np.all(np.isclose(colors, palette[c], atol=1e-2), axis=1) for c in (0, 3)]
    assert (grey | kept[0] | kept[1]).all()  # highlighted capsules keep their colour, the rest is grey


def test_decomposition_colours_by_capsule_and_places_side_by_side() -> None:
    rng = np.random.default_rng(0)
    points = rng.normal(size=(20, 3))
    recon = points[:12] + 0.001
    cap = np.arange(12) % 3
    xyz, rgb = decomposition(points, recon, cap, num_capsules=3)
    palette = capsule_palette(3)
    np.testing.assert_allclose(rgb[20:], palette[cap])
    np.testing.assert_allclose(rgb[:12], palette[cap])  # each input point takes its nearest decoded point's capsule
    assert xyz[:20, 0].mean() < xyz[20:, 0].mean()
    with pytest.raises(ValueError, match="outside"):
        decomposition(points, recon, cap, num_capsules=3, highlight=[5])
    with pytest.raises(ValueError, match="point_capsule"):
        decomposition(points, recon, cap[:5], num_capsules=3)


def test_legend_names_each_capsules_part_and_purity() -> None:
    entries = legend_entries([1, 0, -1, 1], [0.5, 1.0, float("nan"), 0.875], part_names=["top", "leg"])
    palette = capsule_palette(4)
    # grouped by part name, then capsule
    assert [t for _, t in entries] == ["capsule 1: top 1.00", "capsule 0: leg 0.50", "capsule 3: leg 0.88",
                                       "capsule 2: no labelled point"]  # fmt: skip
    np.testing.assert_allclose(entries[0][0], palette[1])
    assert [t for _, t in legend_entries([1, 0, 0, 1], [1.0] * 4, highlight=[3])] == [
        "capsule 3: part 1 1.00",
        "other capsules",
    ]
    image = np.zeros((60, 50, 3), dtype=np.uint8)
    out = add_legend(image, entries, title="t", panel=70)
    assert out.shape == (60, 120, 3) and (out[:, :50] == 0).mean() > 0.9  # the render is kept
    swatch = np.abs(out[:, 50:].reshape(-1, 3).astype(float) - 255 * palette[1]).max(-1) < 3
    assert swatch.sum() > 4
    assert [t for _, t in legend_entries([-1, -1], [float("nan")] * 2)] == ["capsule 0", "capsule 1"]  # no labels


SAMPLE = REPO.parent / "shared" / "data" / "modelnet40_normal_resampled_sample"


@pytest.mark.slow
@pytest.mark.skipif(not SAMPLE.is_dir(), reason="the real ModelNet40 sample (../shared/data) is absent")
def test_every_modelnet40_sample_shape_is_framed_whole(tmp_path: Path) -> None:
    """Tables, cars and sofas are long along one axis: the camera distance is fitted so no point leaves the picture."""
    _open3d()
    from capsules.data import build_dataset

    width, height = 320, 160
    shapes = [build_dataset("modelnet40_normal", split, SAMPLE, num_points=512) for split in ("train", "test")]
    for dataset in shapes:
        for i, name in enumerate(dataset.names):
            points = dataset[i][0].numpy()
            xyz, rgb = decomposition(points, points, np.arange(512) % 12, 12, up=dataset.up_axis)
            png = render_png(tmp_path / f"{name}.png", xyz, rgb, width, height, dataset.up_axis, point_size=3.0)
            image = np.asarray(Image.open(png).convert("RGB")).astype(np.int16)
            ink = np.argwhere((image < 235).any(-1))  # non-white pixels
            assert len(ink) > 100, f"{name}: almost nothing rendered"
            (top, left), (bottom, right) = ink.min(0), ink.max(0)
            assert top > 0 and left > 0 and bottom < height - 1 and right < width - 1, (
                f"{name} touches the border: rows {top}..{bottom} of {height}, columns {left}..{right} of {width}"
            )
            assert right - left > width * 0.5 or bottom - top > height * 0.5, f"{name} is framed too small"


def test_shapes_are_chosen_by_name(tmp_path: Path) -> None:
    _open3d()
    engine.main(CapsulesRecipe, ["--no-progress", "--device", "cpu", "--epochs", "1", "--output-dir",
                                 str(tmp_path / "run"), "--set", *TINY_CAPSULES_SETS])  # fmt: skip
    rows = visualize_checkpoint(tmp_path / "run" / "best.pt", shapes=["airplane_0001", "table_0000"], headless=True,
                                width=200, height=100)  # fmt: skip
    assert [(r["index"], r["name"]) for r in rows] == [(3, "airplane_0001"), (0, "table_0000")]
    assert all(0 < r["part_purity"] <= 1 and 0 < r["patch_spread"] for r in rows)
    with pytest.raises(engine.UsageError, match=r"no shape named 'airplane_01': close names \['airplane_0001'"):
        visualize_checkpoint(tmp_path / "run" / "best.pt", shapes=["airplane_01"])
