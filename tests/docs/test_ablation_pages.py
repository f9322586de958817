"""The ablation figures the docs show are the kept records': docs/ablations.md holds each table of
docs/ablations/records as ``tools/run_ablation.py --plan --records docs/ablations/records`` writes it, and the capsules
guide and the README quote the capsules table's means and seeds."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import capsules.ablation  # noqa: F401  (registers the tables whose records the docs keep)
import lra.ablation  # noqa: F401
import pointcloud.ablation  # noqa: F401
from engine.ablation import TABLES, ablate, run_table, summarize
from engine.testing import REPO

RECORDS = REPO / "docs" / "ablations" / "records"
PAGE = REPO / "docs" / "ablations.md"
SEEDS = [0, 1, 2]


def _table_lines(md: str) -> list[str]:
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| row"))
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return lines[start:end]


@pytest.mark.parametrize("name", sorted(p.name for p in RECORDS.iterdir() if p.is_dir()))
def test_the_page_shows_each_table_as_its_records_give_it(name: str, tmp_path: Path) -> None:
    md = ablate(TABLES[name], SEEDS, tmp_path, max_runs=0, records=RECORDS, plan=True)
    table = "\n".join(_table_lines(md))
    assert table in PAGE.read_text(), (
        f"docs/ablations.md does not show table {name!r} as its kept records give it: paste the table that "
        f"`python tools/run_ablation.py --table {name} --seeds 3 --plan --records docs/ablations/records` prints"
    )


def _capsules_summary(tmp_path: Path) -> dict[str, dict]:
    table = TABLES["capsules"]
    records = run_table(table, SEEDS, tmp_path, records=RECORDS, plan=True)
    return {s["row"]: s for s in summarize(table, records, SEEDS)}


def test_the_capsules_guide_and_the_readme_quote_the_capsules_records(tmp_path: Path) -> None:
    summary = _capsules_summary(tmp_path)
    guide = (REPO / "docs" / "guides" / "capsules.md").read_text()
    rows = {cells[0]: cells for cells in (
        [c.strip() for c in line.strip("|").split("|")] for line in guide.splitlines() if line.startswith("| ")
    )}  # fmt: skip
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
