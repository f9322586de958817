"""The ablation figures the docs show are the kept records': docs/ablations.md holds each table of
docs/ablations/records as ``tools/run_ablation.py --plan --records docs/ablations/records`` writes it, and the capsules
guide and the README quote the capsules table's means and seeds."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import capsules.ablation  # noqa: F401  (registers the tables whose records the docs keep)
import pointcloud.ablation  # noqa: F401
from engine.ablation import TABLES, Table, ablate, run_table, summarize, write_table
from engine.testing import REPO

RECORDS = REPO / "docs" / "ablations" / "records"
PAGE = REPO / "docs" / "ablations.md"
SEEDS = [0, 1, 2]


def _cells(line: str) -> list[str]:
    """A Markdown table row's cells, stripped."""
    return [c.strip() for c in line.strip("|").split("|")]


def _table_lines(md: str) -> list[str]:
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| row"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


def _page_tables(text: str) -> list[list[str]]:
    """Every Markdown table of ``text`` whose header starts with ``| row``, as its lines."""
    lines, tables = text.splitlines(), []
    for i, line in enumerate(lines):
        if line.startswith("| row") and (i == 0 or not lines[i - 1].startswith("|")):
            tables.append(_table_lines("\n".join(lines[i:])))
    return tables


KEPT = sorted(p.name for p in RECORDS.iterdir() if p.is_dir())  # the tables with kept records


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Each kept table as ``--plan --records`` writes it, by name (computed once for the tests below)."""
    out = tmp_path_factory.mktemp("plans")
    return {name: ablate(TABLES[name], SEEDS, out / name, max_runs=0, records=RECORDS, plan=True) for name in KEPT}


def _summary(name: str, tmp_path: Path) -> dict[str, dict]:
    """The kept records of table ``name`` summarized, by row label."""
    table = TABLES[name]
    records = run_table(table, SEEDS, tmp_path, records=RECORDS, plan=True)
    return {s["row"]: s for s in summarize(table, records, SEEDS)}


@pytest.mark.parametrize("name", KEPT)
def test_the_page_shows_each_table_as_its_records_give_it(name: str, plans: dict[str, str]) -> None:
    md = plans[name]
    # the whole table, not a part of a longer one: a stale row after it fails too
    assert _table_lines(md) in _page_tables(PAGE.read_text()), (
        f"docs/ablations.md does not show table {name!r} as its kept records give it: paste the table that "
        f"`python tools/run_ablation.py --table {name} --seeds 3 --plan --records docs/ablations/records` prints"
    )


def test_the_runs_the_page_lists_as_not_run_are_those_the_records_lack(plans: dict[str, str]) -> None:
    """A table's "Not run yet (N runs): ..." line on the page is the one ``--plan`` prints from the records: a run
    recorded since is not listed as missing."""
    todo = {line for md in plans.values() for line in md.splitlines() if line.startswith("Not run yet (")}
    shown = [line for line in PAGE.read_text().splitlines() if line.startswith("Not run yet (")]
    stale = [line[:120] for line in shown if line not in todo]
    assert not stale, f"docs/ablations.md lists runs as not run that the records hold (paste --plan's line): {stale}"


def test_a_table_shows_its_columns_as_means_and_a_gap_as_missing(tmp_path: Path) -> None:
    table = Table("t", "T", TABLES["capsules"].recipe, "tools/train_capsules.py", "purity",
                  TABLES["capsules"].rows[:1], metric_range=(0.0, 1.0), columns=("chamfer",), digits=3)  # fmt: skip
    label = table.rows[0].label
    runs = [{"row": label, "seed": 0, "purity": 0.5, "chamfer": 0.25, "train_time_s": 60.0},
            {"row": label, "seed": 1, "purity": 0.7, "chamfer": 0.75, "train_time_s": 60.0}]  # fmt: skip
    out = tmp_path / "t.json"
    md = write_table(table, summarize(table, runs, [0, 1]), [0, 1], tmp_path, json_path=out)
    header, _, row = (_cells(line) for line in _table_lines(md))
    assert header[2:7] == ["purity mean", "std", "n", "per seed", "chamfer mean"]
    assert row[2:7] == ["0.600", "0.141", "2", "0: 0.500, 1: 0.700", "0.500"]
    assert json.loads(out.read_text())["columns"] == ["chamfer"]
    del runs[1]["chamfer"]  # one run without it: no mean rather than the mean of the others
    row = _table_lines(write_table(table, summarize(table, runs, [0, 1]), [0, 1], tmp_path))[2]
    assert _cells(row)[5:7] == ["0: 0.500, 1: 0.700", "-"]


def test_the_capsules_guide_and_the_readme_quote_the_capsules_records(tmp_path: Path) -> None:
    summary = _summary("capsules", tmp_path)
    guide = (REPO / "docs" / "guides" / "capsules.md").read_text()
    results = guide[guide.index("**Results on the synthetic parts.**") :]
    results = results[: results.index("\n## ")]  # the results' table only
    rows = {cells[0]: cells for cells in (_cells(line) for line in results.splitlines() if line.startswith("| "))}
    for label, s in summary.items():
        assert s["n"] == len(SEEDS), (label, s["missing_seeds"])
        cells = rows[label]  # run | command | steps | Chamfer | part purity | chance | purity per seed
        chamfer, chance = s["columns"]["test_chamfer"], s["columns"]["test_part_purity_chance"]
        want = [f"{chamfer:.4f}", f"{s['mean']:.3f}", f"{chance:.3f}", " / ".join(f"{v:.3f}" for v in s["values"])]
        assert cells[3:7] == want, (label, cells[3:7], want)
    readme = (REPO / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("| capsules: part purity"))
    centroid, routing = summary["patch decoder, centroid (the default)"], summary["patch decoder, routing"]
    figures = [f"{s[k] if k == 'mean' else s['columns'][k]:.3f}" for s in (centroid, routing)
               for k in ("mean", "test_part_purity_chance")]  # fmt: skip
    assert re.findall(r"\d\.\d{3}", line.split("|")[3]) == figures, (line, figures)


def test_the_readme_quotes_the_converged_table_of_the_default_and_its_peers(tmp_path: Path) -> None:
    means = _summary("modelnet_converged", tmp_path)
    rows = ["T = 1, local embedding", "FPS only, local embedding", "random sampling only, local embedding",
            "k-means only, local embedding", "PointNet++ (SSG)"]  # fmt: skip
    assert all(means[r]["n"] == len(SEEDS) for r in rows), {r: means[r]["missing_seeds"] for r in rows}
    readme = (REPO / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith("| classification, converged"))
    figures = [f"{means[r]['mean']:.2f}" for r in rows]
    assert re.findall(r"\b\d{2}\.\d{2}\b", line.split("|")[3]) == figures, (line, figures)
