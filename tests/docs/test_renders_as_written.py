"""What a reader sees is what the source means: the docs pages' nested lists stay nested on the site, and every CLI's
``--help`` is plain text that fits a terminal.

MkDocs renders Markdown with Python-Markdown, which nests a list item only when it is indented by four spaces more
than its parent (GitHub's renderer takes two): an item indented by two or three becomes one more item of the parent's
list, and a paragraph indented by two or three after a blank line leaves the list. The ``--help`` texts are the
scripts' docstrings, printed as they are: reStructuredText markup there (roles, double backticks) reaches the
terminal as raw markup. The rendered site is checked for roles in ``tests/docs/test_site.py``.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.testing import HELP_COLUMNS, REPO, TOOLS, tools_help

PAGES = sorted((REPO / "docs").rglob("*.md"))
HELP_WIDTH = HELP_COLUMNS  # the source's line length: the docstrings fit it, and argparse wraps its own text to it
# reStructuredText that a terminal shows as is: a role (:func:`x`) or an inline literal (``x``)
RST = re.compile(r":(?:func|class|meth|attr|mod|data|exc|obj|const|ref|doc):`|``")
_ITEM = re.compile(r" *(?:[-*+]|\d+[.)]) +\S")
_FENCE = re.compile(r" *(`{3,}|~{3,})")


def flattened_lists(text: str) -> list[tuple[int, str]]:
    """The lines of Markdown ``text`` that Python-Markdown takes out of the list they are indented under, with their
    1-based numbers: an item indented deeper than the item above it but by less than four spaces (it becomes that
    item's sibling), and a paragraph after a blank line inside a list indented by other than a multiple of four (it
    ends the list). Fenced code blocks are skipped."""
    found: list[tuple[int, str]] = []
    above: int | None = None  # the indentation of the list item above, while a list is open
    blank = False
    fence = None
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence is not None:
            fence = None if stripped.startswith(fence) else fence
            continue
        if m := _FENCE.match(line):
            fence = m.group(1)
            continue
        if not stripped:
            blank = True
            continue
        indent = len(line) - len(line.lstrip(" "))
        if _ITEM.match(line):
            if above is not None and indent > above and indent // 4 == above // 4:
                found.append((number, line))
            above = indent
        elif above is not None and blank and indent % 4:
            found.append((number, line))
        elif indent == 0 and (blank or stripped.startswith(("#", "|"))):
            above = None  # a paragraph, heading or table ends the list
        blank = False
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_nested_lists_are_indented_four_spaces(page: Path) -> None:
    bad = flattened_lists(page.read_text(encoding="utf-8"))
    assert not bad, (
        f"{page.relative_to(REPO)}: MkDocs nests a list item or a list item's paragraph only four spaces deeper "
        "than its parent; these lines lose their nesting:\n" + "\n".join(f"  {n}: {line}" for n, line in bad)
    )


@pytest.mark.parametrize(
    ("source", "flagged", "nested"),
    [
        ("- a\n  - b\n  - c\n- d\n", True, False),  # two spaces: GitHub nests it, MkDocs does not
        ("3. a\n   - b\n     more of b\n4. d\n", True, False),  # three, under an ordered item
        ("1. a\n\n   its second paragraph\n2. b\n", True, False),
        ("- a\n    - b\n        - c\n    - d\n- e\n", False, True),
        ("3. a\n    - b\n      more of b\n4. d\n", False, True),
        ("1. a\n\n    its second paragraph\n2. b\n", False, True),
        ("- a\n\n```text\n  - not a list\n```\n", False, False),
        ("- a\n\nA paragraph.\n\n  - a list of its own\n", False, False),
    ],
)
def test_the_nesting_check_agrees_with_python_markdown(source: str, flagged: bool, nested: bool) -> None:
    """The check flags exactly the sources whose nesting Python-Markdown drops."""
    markdown = pytest.importorskip("markdown", reason="the docs extra is not installed: pip install -e .[docs]")
    html = markdown.markdown(source, extensions=["pymdownx.superfences"])
    # a list or a second paragraph inside a list item
    assert bool(re.search(r"<li>(?:(?!</li>).)*?(?:<[ou]l>|<p>its second)", html, re.S)) == nested, html
    assert bool(flattened_lists(source)) == flagged


def test_the_help_check_sees_markup() -> None:
    assert RST.search("see :func:`engine.run` and ``--set``")
    assert RST.findall("``a`` and :class:`~b.C`") == ["``", "``", ":class:`"]
    assert not RST.search("see `engine.run` and `--set`: time (s)")


@pytest.mark.slow
@pytest.mark.parametrize("tool", TOOLS)
def test_help_is_plain_text_that_fits_a_terminal(tool: str) -> None:
    done = tools_help()[tool]
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    markup = [line for line in lines if RST.search(line)]
    long = [f"({len(line)} characters) {line[:100]}..." for line in lines if len(line) > HELP_WIDTH]
    assert not markup, f"tools/{tool}.py --help shows reStructuredText markup:\n" + "\n".join(markup)
    assert not long, f"tools/{tool}.py --help has lines over {HELP_WIDTH} characters:\n" + "\n".join(long)
