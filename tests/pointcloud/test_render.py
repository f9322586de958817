"""The viewers' shared helpers of :mod:`pointcloud.render` that need no renderer: the choice of shapes by index or
name, the viewer flags and the keywords they give, whether a window opens."""

from __future__ import annotations

import argparse
import inspect

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
