"""The suite's own scheduling (tests/conftest.py): test files start longest first by their recorded seconds, and
`--durations-out` records those seconds from pytest-xdist's controller, the serial tests left out."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

_BODY = """
import time
from pathlib import Path

import pytest


def _log(name):
    with open(Path(__file__).parent / "order.log", "a") as f:
        f.write(name + "\\n")


def test_one():
    _log("{name}::test_one")
    time.sleep({sleep})


@pytest.mark.serial
def test_serial():
    _log("{name}::test_serial")
"""


def test_files_run_longest_first_and_their_seconds_are_recorded(tmp_path: Path) -> None:
    """As `bash tools/run.sh test` runs them: the conftest in tests/ (found through testpaths), no path on the command
    line, a second pass (the serial tests) while the first pass's file exists."""
    suite = tmp_path / "tests"
    suite.mkdir()
    shutil.copy(TESTS / "conftest.py", suite / "conftest.py")
    (tmp_path / "pytest.ini").write_text("[pytest]\ntestpaths = tests\nmarkers =\n    serial: alone\n    gpu: cuda\n")
    for name, sleep in (("test_a.py", 0.0), ("test_b.py", 0.3), ("test_c.py", 0.0)):
        (suite / name).write_text(_BODY.format(name=name, sleep=sleep))
    # recorded: c longest, then a; b (added since) counts as the mean of the known files
    (suite / "durations.json").write_text(json.dumps({"tests/test_c.py": 50.0, "tests/test_a.py": 10.0}))
    out = tmp_path / "runs" / "durations.json"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--durations-out={out}"]
    run = subprocess.run([*cmd, "-n", "1", "--dist", "loadfile", "--no-loadscope-reorder", "--serial=exclude"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=300)  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    order = (suite / "order.log").read_text().split()
    assert order == ["test_c.py::test_one", "test_b.py::test_one", "test_a.py::test_one"]
    seconds = json.loads(out.read_text())
    assert set(seconds) == {"tests/test_a.py", "tests/test_b.py", "tests/test_c.py"}, seconds
    assert seconds["tests/test_b.py"] >= 0.3 and next(iter(seconds)) == "tests/test_b.py"  # written longest first
    # the serial pass adds nothing: its tests do not share the cores
    run = subprocess.run([*cmd, "--serial=only"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert json.loads(out.read_text()) == seconds
    assert (suite / "order.log").read_text().split()[3:] == [
        "test_c.py::test_serial",
        "test_b.py::test_serial",
        "test_a.py::test_serial",
    ]
