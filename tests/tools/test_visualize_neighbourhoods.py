"""tools/visualize_neighbourhoods.py: on a tiny trained ModelNet run, the part agreement over the synthetic part
shapes, a non-blank PNG per chosen shape and a .ply that reads back; unknown shapes and models are refused."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch

import engine
from engine.testing import run_tool
from pointcloud.neighbourhoods import visualize_checkpoint
from pointcloud.recipe import ModelNetRecipe
from pointcloud.render import palette
from pointcloud.testing import TINY_MODELNET_SETS


def _open3d():
    try:
        import open3d
    except (ImportError, OSError) as err:  # missing Debian libraries (libusb, libGL): tools/bootstrap.sh installs them
        pytest.skip(f"open3d does not import here: {err}")
    return open3d


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny centroid transformer trained for one epoch (32 points, 16 then 8 centroids, K = 4)."""
    threads = torch.get_num_threads()
    run = tmp_path_factory.mktemp("neighbourhoods") / "run"
    try:
        engine.main(ModelNetRecipe, ["--no-progress", "--device", "cpu", "--epochs", "1", "--output-dir", str(run),
                                     "--set", *TINY_MODELNET_SETS])  # fmt: skip
    finally:
        torch.set_num_threads(threads)
    return run / "best.pt"


def test_writes_the_agreement_and_a_png_per_shape(checkpoint: Path, tmp_path: Path) -> None:
    o3d = _open3d()
    out = tmp_path / "viz"
    proc = run_tool("visualize_neighbourhoods", ["--checkpoint", str(checkpoint), "--shape", "chair_0001", "--index",
                                                 "0", "--out", str(out), "--headless", "--no-progress", "--width",
                                                 "480", "--height", "240", "--centroids", "0", "7"])  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((out / "agreement.json").read_text())
    agreement = report["agreement"]
    assert (agreement["shapes"], agreement["num_centroids"], agreement["num_neighbors"]) == (40, 8, 4)
    assert sorted(agreement["by_category"]) == ["airplane", "chair", "lamp", "mug", "table"]
    assert all(0.0 <= agreement[k] <= 1.0 for k in ("feature", "xyz", "random"))
    assert re.search(r"same part over 40 test shapes \(K = 4\): feature space [\d.]+, xyz [\d.]+, random", proc.stderr)
    assert [(r["index"], r["name"]) for r in report["shapes"]] == [(0, "table_0000"), (9, "chair_0001")]
    image = np.asarray(o3d.io.read_image(str(out / "test_9.png"))).astype(np.float64)
    assert image.shape[:2] == (240, 480) and image.std() > 5.0, "the PNG is blank"
    panel = image[:, -144:, :3].reshape(-1, 3)  # the legend: both shown centroids' colours
    for j in range(2):
        assert (np.abs(panel - 255 * palette(2)[j]).max(-1) < 3).sum() > 10, f"centroid colour {j} not in the legend"
    cloud = o3d.io.read_point_cloud(str(out / "test_9.ply"))
    assert len(cloud.points) == 2 * 32 + 2 * 2 * 13  # the shape twice, a 13-point marker per centroid and side


def test_unknown_shapes_and_models_are_refused(checkpoint: Path, tmp_path: Path) -> None:
    bad = run_tool("visualize_neighbourhoods", ["--checkpoint", str(checkpoint), "--shape", "chair_01"])
    assert bad.returncode == 2, bad.stderr[-3000:]
    assert "error: no shape named 'chair_01': close names ['chair_0001'" in bad.stderr
    assert "Traceback" not in bad.stderr
    state = torch.load(checkpoint, weights_only=True)
    state["model_spec"] = {"name": "pointnet_modelnet40", "kwargs": {"num_classes": 4}}
    torch.save(state, tmp_path / "pointnet.pt")
    with pytest.raises(engine.UsageError, match="not a centroid transformer"):
        visualize_checkpoint(tmp_path / "pointnet.pt")
