"""Shared pytest set-up: `gpu` tests skip without CUDA; `--serial` picks the tests marked serial or the rest; the
files run longest first (their seconds in tests/durations.json, written by `--durations-out`); paths to the real data
samples."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"
DURATIONS = Path(__file__).resolve().parent / "durations.json"
"""Seconds each test file's tests (setup, call and teardown; those marked serial left out) took in a run of
`bash tools/run.sh test`, which writes them to runs/test-durations.json: copy that file here when the suite's balance
has changed."""


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial",
        choices=("include", "exclude", "only"),
        default="include",
        help="tests marked serial: run them with the rest (default), leave them out, or run only them "
        "(`bash tools/run.sh test` runs the rest on every core, then these alone)",
    )
    parser.addoption(
        "--durations-out",
        metavar="PATH",
        help="add the seconds each test file took to those in PATH (JSON), the source of tests/durations.json",
    )


def _longest_files_first(items: list[pytest.Item]) -> None:
    """Order the files by their recorded seconds, longest first, each file's tests in place: pytest-xdist's
    ``--dist loadfile`` hands out whole files in collection order (with ``--no-loadscope-reorder``), so the longest
    ones start first and the short ones fill the gaps at the end, instead of a long file starting last."""
    try:
        seconds = json.loads(DURATIONS.read_text())
    except (OSError, ValueError):
        return
    known = [float(v) for v in seconds.values()] or [0.0]
    unknown = sum(known) / len(known)  # a file added since: the mean file's time
    items.sort(key=lambda item: -float(seconds.get(item.nodeid.split("::")[0], unknown)))


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    _longest_files_first(items)
    serial = config.getoption("--serial")
    if serial != "include":
        # a deselection rather than -m, so that a -m of the caller's still applies to both passes
        keep, drop = [], []
        for item in items:
            marked = item.get_closest_marker("serial") is not None
            (keep if marked == (serial == "only") else drop).append(item)
        if drop:
            config.hook.pytest_deselected(items=drop)
            items[:] = keep
    if torch.cuda.is_available():
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device (marked gpu)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)


_FILE_SECONDS: defaultdict[str, float] = defaultdict(float)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    # under pytest-xdist the controller receives every worker's reports too: it alone writes them (below). The tests
    # marked serial run in a pass of their own, not spread over the workers: left out of the balance.
    if "serial" in report.keywords:
        return
    _FILE_SECONDS[report.nodeid.split("::")[0]] += report.duration


def pytest_sessionfinish(session: pytest.Session) -> None:
    out = session.config.getoption("--durations-out")
    if not out or hasattr(session.config, "workerinput"):
        return
    path = Path(out)
    try:  # added to what the file holds: both passes of `bash tools/run.sh test` (it removes the file first)
        seconds = json.loads(path.read_text())
    except (OSError, ValueError):
        seconds = {}
    for name, took in _FILE_SECONDS.items():
        seconds[name] = round(seconds.get(name, 0.0) + took, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(sorted(seconds.items(), key=lambda kv: -kv[1])), indent=1) + "\n")


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
