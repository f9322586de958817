"""engine.ablation's learning-curve chart and the lever rows' items in the table: from planted records, no training."""

from __future__ import annotations

import re

import pytest

from engine.ablation import Row, Table, curves_svg, summarize, write_table
from engine.recipe import Recipe

TABLE = Table(
    name="toy",
    title="toy",
    recipe=Recipe,
    tool="tools/train_modelnet.py",
    metric="test_oa",
    rows=(Row("base", "configs/a.yaml"), Row("lever", "configs/a.yaml", ("model_kwargs.x=true",))),
)


def _record(row: str, seed: int, curve: list[float]) -> dict:
    epochs = [{"epoch": e + 1, "test_oa": v, "train_acc": v - 5} for e, v in enumerate(curve)]
    return {"row": row, "seed": seed, "test_oa": curve[-1], "train_time_s": 1.0, "curve": epochs}


def test_curves_average_the_seeds_of_each_row() -> None:
    records = [_record("base", 0, [50, 70, 90]), _record("base", 1, [30, 50, 70]), _record("lever", 0, [40, 60, 80])]
    svg = curves_svg(TABLE, records)
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    assert "base (n=2)" in svg and "lever (n=1)" in svg
    lines = re.findall(r'<polyline [^>]*points="([^"]+)"', svg)
    assert len(lines) == 4  # metric and train accuracy per row
    base, lever = lines[0].split(), lines[2].split()
    assert len(base) == 3
    # the two rows' last test values are the same mean (80): the same height
    assert base[-1].split(",")[1] == lever[-1].split(",")[1]
    assert curves_svg(TABLE, records, rows=["lever"]).count("<polyline") == 2


def test_curves_need_a_curve() -> None:
    with pytest.raises(ValueError, match="no learning curve"):
        curves_svg(TABLE, [{"row": "base", "seed": 0, "test_oa": 1.0}])


def test_table_shows_each_rows_own_items(tmp_path) -> None:
    records = [_record("lever", 0, [40, 60, 80])]
    md = write_table(TABLE, summarize(TABLE, records, [0]), [0], tmp_path)
    assert "`a.yaml` `model_kwargs.x=true`" in md
    assert "`lever` / `configs/a.yaml` `model_kwargs.x=true`" in md
