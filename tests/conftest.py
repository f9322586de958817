"""Shared pytest set-up: `gpu` tests skip without CUDA; `--serial` picks the tests marked serial or the rest; paths to
the real data samples."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

REPO_ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO_ROOT.parent / "shared" / "data"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--serial",
        choices=("include", "exclude", "only"),
        default="include",
        help="tests marked serial: run them with the rest (default), leave them out, or run only them "
        "(`bash tools/run.sh test` runs the rest on every core, then these alone)",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
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


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
