"""The API reference (docs/api/<package>.md, with its internals on docs/api/<package>-*.md) renders every public module
of every package, and mkdocs.yml lists every page under docs/ in its navigation."""

from __future__ import annotations

import re

import pytest
import yaml

from engine.testing import REPO

PACKAGES = sorted(p.parent.name for p in REPO.glob("*/__init__.py"))


def _public_modules(package: str) -> list[str]:
    """``package`` and its modules and subpackages whose path has no part starting with ``_``."""
    names = []
    for file in sorted((REPO / package).rglob("*.py")):
        parts = list(file.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        if not any(p.startswith("_") for p in parts):
            names.append(".".join(parts))
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_api_page_renders_every_public_module(package: str) -> None:
    page = REPO / "docs" / "api" / f"{package}.md"
    assert page.is_file(), f"no API page for {package}: add docs/api/{package}.md and list it in mkdocs.yml"
    pages = [page, *sorted(page.parent.glob(f"{package}-*.md"))]  # e.g. attention-internals.md: kernels, benches
    rendered = {m for p in pages for m in re.findall(r"^::: ([\w.]+)", p.read_text(), re.M)}
    missing = [m for m in _public_modules(package) if m not in rendered]
    assert not missing, f"docs/api/{package}.md lacks {missing}: add a `::: <module>` line for each"


def _nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node]
    if isinstance(node, dict):
        return [p for v in node.values() for p in _nav_pages(v)]
    if isinstance(node, list):
        return [p for v in node for p in _nav_pages(v)]
    return []


def test_the_navigation_lists_every_page() -> None:
    nav = _nav_pages(yaml.safe_load((REPO / "mkdocs.yml").read_text())["nav"])
    pages = sorted(str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md"))
    assert sorted(nav) == pages, f"mkdocs.yml's nav and docs/ differ: {sorted(set(nav) ^ set(pages))}"
