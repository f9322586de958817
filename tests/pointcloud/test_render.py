"""The viewers' shared helpers of :mod:`pointcloud.render` that need no renderer: the choice of shapes by index or
name, the viewer flags and the keywords they give, whether a window opens."""

from __future__ import annotations

import argparse
import inspect

import numpy as np
import pytest

from engine import UsageError
from pointcloud.render import add_viewer_flags, choose_shapes, has_display, viewer_kwargs

NAMES = ["table_0000", "table_0001", "mug_0000", "mug_0001", "chair_0000"]


def test_shapes_by_index_then_by_name_else_the_first_few() -> None:
    assert choose_shapes(NAMES, [4], ["mug_0001", "table_0000"]) == [4, 3, 0]
    assert choose_shapes(NAMES) == [0, 1, 2, 3]
    assert choose_shapes(NAMES, default=2) == [0, 1]
    assert choose_shapes(NAMES[:1]) == [0]


def test_unknown_names_and_indices_are_refused_with_the_close_names() -> None:
    with pytest.raises(UsageError, match=r"no shape named 'mug_01': close names \['mug_0001', 'mug_0000'\]"):
        choose_shapes(NAMES, shapes=["mug_01"], split="train")
    with pytest.raises(UsageError, match=r"'sofa_x' in the test split \(5 shapes, e.g. \['table_0000', 'table_0001', "):
        choose_shapes(NAMES, shapes=["sofa_x"])
    with pytest.raises(UsageError, match=r"shape indices \[5, -1\] are outside the test split's 5 shapes"):
        choose_shapes(NAMES, [5, -1, 2])


def test_viewer_flags_take_the_shapes_and_the_picture_settings() -> None:
    parser = argparse.ArgumentParser()
    add_viewer_flags(parser, "tools/train_capsules.py")
    args = parser.parse_args(["--checkpoint", "best.pt", "--index", "3", "7", "--shape", "mug_0000", "--width", "64"])
    assert (args.checkpoint, args.split, args.index, args.shape) == ("best.pt", "test", [3, 7], ["mug_0000"])
    assert (args.output_dir, args.headless, args.width, args.height, args.trust_checkpoint) == (
        None,
        False,
        64,
        480,
        False,
    )
    assert "written by tools/train_capsules.py" in parser.format_help()
    with pytest.raises(SystemExit):
        parser.parse_args(["--checkpoint", "best.pt", "--split", "val"])
    parser = argparse.ArgumentParser()
    add_viewer_flags(parser, "tools/train_modelnet.py", splits=None, output_aliases=("--out",))
    args = parser.parse_args(["--checkpoint", "best.pt", "--split", "val", "--out", "viz"])
    assert (args.split, args.output_dir) == ("val", "viz")


def test_viewer_flags_name_the_keywords_of_every_viewer() -> None:
    import capsules.visualize
    import pointcloud.neighbourhoods
    import pointcloud.partseg.visualize

    parser = argparse.ArgumentParser()
    add_viewer_flags(parser, "tools/train_modelnet.py")
    kwargs = viewer_kwargs(parser.parse_args(["--checkpoint", "best.pt", "--shape", "mug_0000", "--trust-checkpoint"]))
    assert kwargs["shapes"] == ["mug_0000"] and kwargs["allow_pickle"] and kwargs["indices"] == []
    for viewer in (capsules.visualize, pointcloud.partseg.visualize, pointcloud.neighbourhoods):
        inspect.signature(viewer.visualize_checkpoint).bind("best.pt", **kwargs)


def test_a_window_needs_a_display_and_no_headless(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    assert not has_display()
    monkeypatch.setenv("WAYLAND_DISPLAY", "wayland-0")
    assert has_display() and not has_display(headless=True)


def _project(xyz: np.ndarray, width: int, height: int, camera: tuple) -> np.ndarray:
    """Pixel coordinates ``(N, 2)`` of ``xyz`` under the pinhole camera ``(centre, eye, up)`` that the renderers get."""
    from pointcloud.render import FIELD_OF_VIEW

    centre, eye, up = camera
    back = (eye - centre) / np.linalg.norm(eye - centre)
    right = np.cross(up, back) / np.linalg.norm(np.cross(up, back))
    rel = xyz - eye
    depth, focal = -(rel @ back), height / 2 / np.tan(np.radians(FIELD_OF_VIEW) / 2)
    return np.stack(
        [width / 2 + focal * (rel @ right) / depth, height / 2 - focal * (rel @ np.cross(back, right)) / depth], 1
    )


def _splat(xyz, rgb, width, height, camera, point_size):
    """A renderer without Open3D: each point's pixel under the camera it is given, in its colour."""
    image = np.full((height, width, 3), 255, dtype=np.uint8)
    uv = np.round(_project(np.asarray(xyz, dtype=np.float64), width, height, camera)).astype(int)
    inside = (uv[:, 0] >= 0) & (uv[:, 0] < width) & (uv[:, 1] >= 0) & (uv[:, 1] < height)
    image[uv[inside, 1], uv[inside, 0]] = (np.asarray(rgb)[inside] * 255).astype(np.uint8)
    return image


def test_partseg_halves_show_each_point_at_the_same_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Ground truth and prediction are rendered from one camera: the same points project alike in both halves (equal
    pictures for equal labels). One perspective picture of two copies shifted sideways sees them from two angles."""
    import pointcloud.render as render
    from pointcloud.partseg.visualize import segmentation_halves, segmentation_view

    monkeypatch.setattr(render, "_render_offscreen", _splat)
    rng = np.random.default_rng(0)
    points = rng.uniform(-1, 1, (300, 3)) * [0.6, 0.4, 1.0]
    labels, other = rng.integers(0, 4, 300), rng.integers(0, 4, 300)
    same = render.render_side_by_side(segmentation_halves(points, labels, labels, 4), 201, 120, "z")
    assert same.shape == (120, 201, 3) and (same[:, 200] == 255).all()  # the odd pixel column left white
    np.testing.assert_array_equal(same[:, :100], same[:, 100:200])
    assert (same[:, :100] != 255).any()
    differ = render.render_side_by_side(segmentation_halves(points, labels, other, 4), 200, 120, "z")
    drawn = (differ != 255).any(-1)
    np.testing.assert_array_equal(drawn[:, :100], drawn[:, 100:])  # the same pixels drawn, in other colours
    assert (differ[:, :100] != differ[:, 100:]).any()
    # why: the shifted pair in one perspective picture puts the same point at other places in the two halves
    xyz, _ = segmentation_view(points, labels, labels, 4)
    uv = _project(xyz, 200, 120, render._camera(xyz, "z", aspect=200 / 120))
    offset = uv[300:] - uv[:300]
    assert np.ptp(offset, axis=0).max() > 2.0  # pixels: not one shift for every point
