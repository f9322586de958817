"""tools/visualize_partseg.py: ground truth beside the prediction, one colour per part, headless PNG and .ply."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

import engine
from engine.testing import run_tool
from pointcloud.partseg.recipe import PartSegRecipe
from pointcloud.partseg.visualize import segmentation_view, visualize_checkpoint
from pointcloud.render import palette
from pointcloud.testing import TINY_PARTSEG_SETS


def _open3d():
    try:
        import open3d
    except (ImportError, OSError) as err:  # missing Debian libraries (libusb, libGL): tools/bootstrap.sh installs them
        pytest.skip(f"open3d does not import here: {err}")
    return open3d


@pytest.fixture(autouse=True)
def keep_threads():
    """The recipe sets torch's thread count (``threads``); later tests get theirs back."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One tiny trained run that every viewer test reads (none writes into it), trained before keep_threads looks."""
    _open3d()
    run = tmp_path_factory.mktemp("partseg") / "run"
    threads = torch.get_num_threads()
    try:
        engine.main(PartSegRecipe, ["--no-progress", "--device", "cpu", "--epochs", "1", "--output-dir", str(run),
                                    "--set", *TINY_PARTSEG_SETS])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return run


def test_segmentation_view_colours_by_part_side_by_side() -> None:
    points = np.random.default_rng(0).normal(size=(10, 3))
    labels, pred = np.arange(10) % 3, np.arange(10) % 2
    xyz, rgb = segmentation_view(points, labels, pred, num_parts=4)
    colours = palette(4)
    np.testing.assert_allclose(rgb[:10], colours[labels])  # ground truth left
    np.testing.assert_allclose(rgb[10:], colours[pred])  # prediction right
    assert xyz[:10, 0].max() < xyz[10:, 0].min() and xyz.shape == (20, 3)
    with pytest.raises(ValueError, match="one part per point"):
        segmentation_view(points, labels[:5], pred, num_parts=4)


@pytest.mark.slow
def test_writes_pngs_with_the_parts_and_plys_that_read_back(trained: Path, tmp_path: Path) -> None:
    o3d = _open3d()
    out = tmp_path / "viz"
    args = ["--checkpoint", str(trained / "best.pt"), "--headless", "--output-dir", str(out), "--width", "320",
            "--height", "200"]  # fmt: skip
    proc = run_tool("visualize_partseg", [*args, "--index", "0", "2"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    # one log line per shape: "<split>_<index> (<name>, <category>): IoU <iou>"
    logged = re.findall(r"(test_\d+) \((\w+), (\w+)\): IoU ([\d.]+)", proc.stderr)
    assert [(stem, cat) for stem, _, cat, _ in logged] == [("test_0", "table"), ("test_2", "mug")], proc.stderr[-2000:]
    assert all(0 <= float(iou) <= 1 for *_, iou in logged)
    image = np.asarray(o3d.io.read_image(str(out / "test_2.png"))).astype(np.float64)
    assert image.shape[:2] == (200, 320) and image.std() > 5.0, "the PNG is blank"
    panel = image[:, -140:, :3].reshape(-1, 3)  # the legend: the mug's parts (labels 2 and 3 of table, mug)
    for part in (2, 3):
        assert (np.abs(panel - 255 * palette(4)[part]).max(-1) < 3).sum() > 10, f"part {part} not in the legend"
    cloud = o3d.io.read_point_cloud(str(out / "test_2.ply"))
    assert len(cloud.points) == 64  # ground truth + prediction, 32 points each
    nearest = np.abs(np.asarray(cloud.colors)[:, None] - palette(4)[None]).max(-1).min(-1)
    assert (nearest < 0.01).all(), "a point whose colour is no part's"  # (8-bit colours in the .ply)
    together = run_tool("visualize_partseg", [*args, "--index", "0", "3", "--together"])
    assert together.returncode == 0, together.stderr[-3000:]
    assert (out / "test_0-3.png").is_file()
    bad = run_tool("visualize_partseg", [*args, "--index", "9"])
    assert bad.returncode == 2 and "outside the test split's 4 shapes" in bad.stderr


def test_shapes_are_chosen_by_name(trained: Path, tmp_path: Path) -> None:
    checkpoint = trained / "best.pt"
    rows = visualize_checkpoint(checkpoint, shapes=["mug_0001", "table_0000"], headless=True, width=200, height=100,
                                output_dir=tmp_path / "viz")  # fmt: skip
    assert [(r["index"], r["name"], r["category"]) for r in rows] == [
        (3, "mug_0001", "mug"),
        (0, "table_0000", "table"),
    ]
    assert (tmp_path / "viz" / "test_3.png").is_file()
    with pytest.raises(engine.UsageError, match=r"no shape named 'mug_01': close names \['mug_0001'"):
        visualize_checkpoint(checkpoint, shapes=["mug_01"])
    with pytest.raises(
        engine.UsageError, match=r"no shape named 'sofa_x' in the test split \(4 shapes, e.g. \['table_0000'"
    ):
        visualize_checkpoint(checkpoint, shapes=["sofa_x"])
    bad = run_tool("visualize_partseg", ["--checkpoint", str(checkpoint), "--shape", "mug_01"])
    assert bad.returncode == 2 and "error: no shape named 'mug_01': close names ['mug_0001'" in bad.stderr, bad.stderr
