"""Every ```` ```python ```` block of README.md and of the docs pages runs as written.

The blocks of one file run in order in one namespace (a later block may use what an earlier one defined, as a reader
who pastes them in turn would), in a Python process of their own whose working directory is an empty temporary folder
(forked by :func:`engine.testing.run_python`, which has imported torch once for all the pages).

A block that cannot run here (it needs a full dataset, a GPU or minutes of work) is skipped when the line right above
its fence is the HTML comment ``<!-- notest -->`` (:data:`engine.testing.NOTEST`), invisible on GitHub and on the
site::

    <!-- notest -->
    ```python
    train = pointcloud.build_dataset("modelnet40_normal", split="train")
    ```
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.testing import REPO, doc_pages, fenced_blocks, run_python, tool_env

# runs the blocks of one file, each compiled under its file and line so that a traceback points at the page
_RUNNER = """\
import json, sys, traceback
ns = {"__name__": "__main__"}
for where, code in json.load(open(sys.argv[1])):
    try:
        exec(compile(code, where, "exec"), ns)
    except BaseException:
        traceback.print_exc()
        sys.exit(f"the block at {where} failed")
"""

PAGES = [p for p in doc_pages() if fenced_blocks(p, ("python",))]


def _label(path: Path) -> str:
    return str(path.relative_to(REPO))


def test_the_pages_have_python_blocks() -> None:
    """The finder sees the README's blocks (so that an empty parametrization below means something)."""
    assert REPO / "README.md" in PAGES


@pytest.mark.slow
@pytest.mark.parametrize("page", PAGES, ids=_label)
def test_python_blocks_run(page: Path, tmp_path: Path) -> None:
    blocks = [b for b in fenced_blocks(page, ("python",)) if not b.notest]
    if not blocks:
        pytest.skip(f"every python block of {_label(page)} is marked notest")
    script = tmp_path / "blocks.json"
    script.write_text(json.dumps([[f"{_label(page)}:{b.line}", b.code] for b in blocks]))
    env = tool_env(display=False)
    done = run_python(["-c", _RUNNER, str(script)], env=env, timeout=900, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]


def test_notest_marks_a_block(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n\n<!-- notest -->\n```python\nraise SystemExit(1)\n```\n\n```python\nx = 1\n```\n")
    blocks = fenced_blocks(page, ("python",))
    assert [(b.line, b.notest, b.code) for b in blocks] == [(4, True, "raise SystemExit(1)\n"), (8, False, "x = 1\n")]
