"""MkDocs hook: the docstrings' Sphinx roles (``:class:`x```, ``:func:`~a.b```) become code, linked when they name
an absolute path that the API reference documents.

The docstrings are written for both ``help()`` and this site: the roles read well as plain text, and here each one
becomes its code span, wrapped in an optional cross-reference that mkdocs-autorefs resolves (and leaves as plain
code when the name is relative or not documented). A paragraph that ends in ``::`` (reStructuredText's literal-block
marker, followed by an indented code block) ends in ``:``.
"""

from __future__ import annotations

import re

PACKAGES = ("attention", "pointcloud", "capsules", "vision", "engine", "lra")
_ROLE = re.compile(r":(?:class|func|mod|data|meth|attr|exc|obj|const):<code>(~?)([^<]+)</code>")
_LITERAL = re.compile(r"::</p>")


def _role(match: re.Match) -> str:
    short, name = match.group(1), match.group(2)
    shown = name.rsplit(".", 1)[-1] if short else name
    if name.split(".")[0] not in PACKAGES:
        return f"<code>{shown}</code>"
    return f'<autoref identifier="{name}" optional><code>{shown}</code></autoref>'


def on_page_content(html: str, **kwargs: object) -> str:
    return _LITERAL.sub(":</p>", _ROLE.sub(_role, html))
