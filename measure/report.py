"""docs/benchmarks.md, generated from the benches' ``--json`` reports (``tools/docs_benchmarks.py``).

Each ``tools/bench_*.py`` writes with ``--json`` a report (:func:`measure.bench.write_report`): the command, the
commit, the machine line, the flags, the rows (``results``), the target verdicts (``targets``) and every table it
printed (``tables``). The reports kept in ``docs/benchmarks/`` (one per bench and device, named
``<tool>-<device>.json``) are the page's only source: for each bench, each device's command, machine and commit, its
tables and its verdicts. A new measurement replaces its report, and the page is written again from the folder.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

from measure.atomic import atomic_write_text
from measure.bench import format_target, markdown_table

__all__ = [
    "DEVICE_ORDER",
    "REPORT_KEYS",
    "TOOL_ORDER",
    "check_page",
    "load_reports",
    "render_page",
    "render_report",
    "write_page",
]

# keys every report must hold to be rendered (measure.bench.write_report writes them)
REPORT_KEYS = ("tool", "command", "commit", "machine", "args", "tables", "targets")
DEVICE_ORDER = ("cpu", "cuda")
# the page's order: the core ops, then the models by domain; a bench not listed here comes after them, by name
TOOL_ORDER = ("bench_points", "bench_centroid", "bench_knn_attention", "bench_mixers", "bench_modelnet",
              "bench_partseg", "bench_vision", "bench_capsules")  # fmt: skip

_INTRO = """\
# Benchmarks

Each section is the latest report of one bench on one kind of machine: the command that made it, the machine line
the bench printed, the commit it ran at, its tables and its target verdicts. Ratios compare rows of the same run;
absolute times depend on the machine and on its load while the bench ran.

This page is generated: `python tools/docs_benchmarks.py` writes it from the reports in `docs/benchmarks/`
(`<bench>-<device>.json`, each a bench's own `--json`). To update a section, run its command with
`--json docs/benchmarks/<bench>-<device>.json`, then the generator; a test checks that the page matches the reports.
"""


def _device(report: dict) -> str:
    return str(report["args"].get("device", "cpu")).split(":")[0]


def _rank(order: Sequence[str], name: str) -> int:
    return order.index(name) if name in order else len(order)


def _sort_key(report: dict) -> tuple:
    tool, device = report["tool"], _device(report)
    return _rank(TOOL_ORDER, tool), tool, _rank(DEVICE_ORDER, device), device


def load_reports(folder: str | os.PathLike) -> list[dict]:
    """Every ``*.json`` report in ``folder``, ordered by bench (:data:`TOOL_ORDER`) and then device (CPU first).

    Raises:
        ValueError: a report lacks one of :data:`REPORT_KEYS` (say which file and which keys), or two reports are
            for the same bench and device.
    """
    reports, seen = [], {}
    for path in sorted(Path(folder).glob("*.json")):
        report = json.loads(path.read_text())
        missing = [k for k in REPORT_KEYS if k not in report]
        if missing:
            raise ValueError(f"{path} lacks {missing}: write it with a bench's --json (measure.bench.write_report)")
        key = (report["tool"], _device(report))
        if key in seen:
            raise ValueError(f"{path} and {seen[key]} are both {key[0]} on {key[1]}: keep the latest one")
        seen[key] = path
        reports.append(report)
    if not reports:
        raise ValueError(f"no bench reports (*.json) in {folder}")
    return sorted(reports, key=_sort_key)


def render_report(report: dict, level: int = 3) -> str:
    """One report as Markdown: a heading for its device, the command, machine and commit, each table (under its
    title, one level down) and each target's verdict line (:func:`measure.bench.format_target`)."""
    hashes = "#" * level
    commit = f"`{report['commit']}`" if report["commit"] else "unknown"
    lines = [
        f"{hashes} {report['tool']} on {_device(report)}",
        "",
        "```bash",
        report["command"],
        "```",
        "",
        f"Machine: {report['machine']}; commit {commit}.",
        "",
    ]
    for table in report["tables"]:
        if table.get("title"):
            lines += [f"{hashes}# {table['title']}", ""]
        lines += [markdown_table(table["headers"], table["rows"]), ""]
    if report["targets"]:
        lines += [f"- {format_target(t)}" for t in report["targets"]]
        lines.append("")
    return "\n".join(lines)


def render_page(reports: Sequence[dict]) -> str:
    """The whole page: a short introduction, then for each bench (``## bench_x``, :data:`TOOL_ORDER`) its reports,
    CPU first."""
    parts = [_INTRO]
    tool = None
    for report in sorted(reports, key=_sort_key):
        if report["tool"] != tool:
            tool = report["tool"]
            parts.append(f"## {tool}\n")
        parts.append(render_report(report))
    return "\n".join(parts).rstrip("\n") + "\n"


def write_page(folder: str | os.PathLike, out: str | os.PathLike) -> Path:
    """Renders the reports of ``folder`` into ``out`` (atomically); returns ``out``."""
    atomic_write_text(out, render_page(load_reports(folder)))
    return Path(out)


def check_page(folder: str | os.PathLike, out: str | os.PathLike) -> bool:
    """Whether ``out`` is what :func:`write_page` would write from ``folder`` (False: the page is stale)."""
    path = Path(out)
    return path.is_file() and path.read_text() == render_page(load_reports(folder))
