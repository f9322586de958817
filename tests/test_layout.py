"""The repository's layout rules (HOUSE_STYLE "Layout"): packages hold the library, scripts hold argparse and one call.

* no file edits ``sys.path`` (the README's set-up installs the toolkit; tests import it like any user);
* the import graph of the packages has no cycle, and dependencies point one way: ``engine`` and ``attention`` import
  no domain package, and nothing imports ``tools/``;
* no package module or test imports a script of ``tools/`` (by name, or by loading its file).

Imports are read from the source with ``ast`` (those inside functions included: a lazy import back into a module
that imports you is still a cycle), so the checks do not depend on what is installed.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.parent.name for p in REPO.glob("*/__init__.py"))
TOOLS = sorted(p.stem for p in (REPO / "tools").glob("*.py"))
# what the core packages may import (HOUSE_STYLE: vision, pointcloud -> attention; capsules -> pointcloud, attention):
# engine is the domain-free harness every recipe and bench builds on; attention may use its bench utilities
DOMAIN_FREE = {"attention": {"attention", "engine"}, "engine": {"engine"}}


def _python_files(*roots: str) -> list[Path]:
    files = []
    for root in roots:
        path = REPO / root
        files += [path] if path.is_file() else sorted(path.rglob("*.py"))
    return [f for f in files if ".venv" not in f.parts]


def _module_name(file: Path) -> str:
    parts = list(file.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    path = REPO.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _imports(file: Path) -> set[str]:
    """The modules ``file`` imports (absolute names; ``from a import b`` gives ``a.b`` when that is a module)."""
    module = _module_name(file)
    package = module if file.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(file.read_text(), str(file))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                found.add(sub if _is_module(sub) else target)
    return found


def _package_graph() -> dict[str, set[str]]:
    graph = {}
    for file in _python_files(*PACKAGES):
        ours = {m for m in _imports(file) if m.split(".")[0] in PACKAGES and _is_module(m)}
        graph[_module_name(file)] = ours - {_module_name(file)}
    return graph


def test_no_file_edits_sys_path() -> None:
    offenders = []
    for file in _python_files(*PACKAGES, "tools", "tests", "datasets"):
        before = len(offenders)
        for node in ast.walk(ast.parse(file.read_text(), str(file))):
            if (
                isinstance(node, ast.Attribute)
                and node.attr == "path"
                and isinstance(node.value, ast.Name)
                and node.value.id == "sys"
            ):
                offenders.append(f"{file.relative_to(REPO)}:{node.lineno}")
        in_text = any(f"sys.path.{verb}" in file.read_text() for verb in ("insert", "append"))
        if len(offenders) == before and file != Path(__file__) and in_text:
            offenders.append(f"{file.relative_to(REPO)} (in a string: a script it runs)")
    assert not offenders, f"sys.path is edited (install the toolkit instead: bash tools/bootstrap.sh): {offenders}"


def test_package_import_graph_has_no_cycle() -> None:
    graph = _package_graph()
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            pytest.fail(f"import cycle: {' -> '.join(cycle)}")


@pytest.mark.parametrize("package", sorted(DOMAIN_FREE))
def test_core_packages_import_no_domain_package(package: str) -> None:
    graph = _package_graph()
    bad = sorted(
        f"{m} imports {dep}"
        for m, deps in graph.items()
        if m.split(".")[0] == package
        for dep in deps
        if dep.split(".")[0] not in DOMAIN_FREE[package]
    )
    assert not bad, bad


def test_nothing_imports_a_script_of_tools() -> None:
    offenders = []
    for file in _python_files(*PACKAGES, "tests"):
        text = file.read_text()
        for name in _imports(file):
            if name.split(".")[0] in {"tools", *TOOLS}:
                offenders.append(f"{file.relative_to(REPO)} imports {name}")
        if file != Path(__file__) and ("load_tool(" in text or ("spec_from_file_location" in text and "tools" in text)):
            offenders.append(f"{file.relative_to(REPO)} loads a script by its path")
    assert not offenders, f"scripts in tools/ are argparse and one call; move what is shared to a package: {offenders}"


def test_the_checks_see_imports() -> None:
    """The readers above find what they must (so that an empty result means something)."""
    graph = _package_graph()
    assert "attention.backends" in graph["attention.points"]
    assert "attention.checks" in graph["attention.backends"]
    assert "engine.trainer" in _imports(REPO / "engine" / "testing.py")
