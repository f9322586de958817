"""docs/benchmarks.md is what ``tools/docs_benchmarks.py`` writes from the committed reports, and a report written
by a real bench (``measure.bench.finish``) renders to the tables that bench printed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.testing import REPO, run_tool
from measure.bench import target
from measure.report import check_page, load_reports, render_page, render_report

REPORTS = REPO / "docs" / "benchmarks"
PAGE = REPO / "docs" / "benchmarks.md"


def test_the_page_matches_the_reports() -> None:
    assert check_page(REPORTS, PAGE), "docs/benchmarks.md is stale: run `python tools/docs_benchmarks.py`"


def test_every_bench_has_a_report() -> None:
    benches = {p.stem for p in (REPO / "tools").glob("bench_*.py")}
    assert benches <= {r["tool"] for r in load_reports(REPORTS)}


def test_the_cli_checks_and_writes(tmp_path: Path) -> None:
    out = tmp_path / "benchmarks.md"
    stale = run_tool("docs_benchmarks", ["--reports", str(REPORTS), "--out", str(out), "--check"])
    assert stale.returncode == 1 and "stale" in stale.stderr
    assert run_tool("docs_benchmarks", ["--reports", str(REPORTS), "--out", str(out)]).returncode == 0
    assert out.read_text() == PAGE.read_text()
    assert run_tool("docs_benchmarks", ["--reports", str(REPORTS), "--out", str(out), "--check"]).returncode == 0


def _report(tool: str, device: str, **extra: object) -> dict:
    return {"tool": tool, "command": f"python tools/{tool}.py", "commit": "abc1234", "machine": "m", "args":
            {"device": device}, "tables": [], "targets": [], **extra}  # fmt: skip


def test_reports_are_checked_and_ordered(tmp_path: Path) -> None:
    (tmp_path / "b-cuda.json").write_text(json.dumps(_report("bench_b", "cuda")))
    (tmp_path / "b-cpu.json").write_text(json.dumps(_report("bench_b", "cpu")))
    (tmp_path / "a.json").write_text(json.dumps(_report("bench_a", "cuda:0")))
    assert [(r["tool"], r["args"]["device"]) for r in load_reports(tmp_path)] == [
        ("bench_a", "cuda:0"), ("bench_b", "cpu"), ("bench_b", "cuda")]  # fmt: skip
    (tmp_path / "again.json").write_text(json.dumps(_report("bench_b", "cpu")))
    with pytest.raises(ValueError, match="both bench_b on cpu"):
        load_reports(tmp_path)
    (tmp_path / "again.json").write_text(json.dumps({"tool": "bench_c"}))
    with pytest.raises(ValueError, match="lacks"):
        load_reports(tmp_path)


def test_a_report_renders_its_tables_and_verdicts() -> None:
    goal = target("x vs y", 2.0, ">=", 1.5, device="cpu")
    report = _report("bench_a", "cpu", targets=[goal],
                     tables=[{"title": "Rows", "headers": ["n", "ms"], "rows": [[1, 0.123456]]}])  # fmt: skip
    text = render_report(report)
    assert "### bench_a on cpu" in text and "python tools/bench_a.py" in text
    assert "Machine: m; commit `abc1234`." in text
    assert "#### Rows" in text and "| 1 | 0.123 |" in text
    assert "- target: x vs y >= 1.5x: MET (2)" in text
    assert render_page([report]).startswith("# Benchmarks\n")


@pytest.mark.slow
def test_a_real_bench_report_renders_what_the_bench_printed(tmp_path: Path) -> None:
    """Round trip: ``tools/bench_centroid.py`` at a tiny size writes its report through ``measure.bench.finish``; the
    rendered report holds its command, its machine line, every table exactly as the bench printed it, and its
    verdict lines."""
    path = tmp_path / "bench_centroid-cpu.json"
    argv = ["--points", "64", "--dim", "16", "--k", "4", "--repeats", "1", "--paths", "dense-matmul", "dense-sdpa",
            "knn", "--isolate", "no", "--json", str(path)]  # fmt: skip
    done = run_tool("bench_centroid", argv)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(path.read_text())
    text = render_report(report)
    assert f"python tools/bench_centroid.py {' '.join(argv)}" in text
    assert f"Machine: {report['machine']};" in text and report["machine"] in done.stdout
    assert report["tables"] and report["targets"]
    for table in report["tables"]:
        printed = "\n".join(line for line in done.stdout.splitlines() if line.startswith("|"))
        rendered = "\n".join(line for line in text.splitlines() if line.startswith("|"))
        assert rendered == printed and len(printed.splitlines()) == len(table["rows"]) + 2
    for line in done.stdout.splitlines():
        if line.startswith("target: "):
            assert f"- {line}" in text
