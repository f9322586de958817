"""The repository's layout rules (HOUSE_STYLE "Layout"): packages hold the library, scripts hold argparse and one call.

* no file edits ``sys.path`` (the README's set-up installs the toolkit; tests import it like any user);
* the import graph of the packages has no cycle, and dependencies point one way: ``measure`` (timing, memory, op
  counts, reports) is the ground floor and imports nothing of the toolkit, and only torch, numpy and the standard
  library when it is imported; ``attention`` and ``engine`` import ``measure`` and no domain package (checked in the
  source, and in a fresh process: importing them loads no package above them); nothing imports ``tools/``;
* no package module or test imports a script of ``tools/`` (by name, or by loading its file).

Imports are read from the source with ``ast`` (those inside functions included: a lazy import back into a module
that imports you is still a cycle), so the checks do not depend on what is installed.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = sorted(p.parent.name for p in REPO.glob("*/__init__.py"))
TOOLS = sorted(p.stem for p in (REPO / "tools").glob("*.py"))
# the toolkit's packages each lower package may import (HOUSE_STYLE: vision, pointcloud -> attention; capsules ->
# pointcloud, attention): measure is the ground floor the core's benches and the harness both measure with;
# attention, the shared core, and engine, the domain-free harness, stand on it and on nothing else of the toolkit
LOWER = {"measure": {"measure"}, "attention": {"attention", "measure"}, "engine": {"engine", "measure"}}
# what a module of measure may import when it is imported (optional packages: inside the function that needs them)
MEASURE_IMPORTS = {"torch", "numpy", "measure", *sys.stdlib_module_names}


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


def _module_level_imports(file: Path) -> set[str]:
    """The absolute imports that run when ``file`` is imported: those outside function bodies."""
    found, todo = set(), [ast.parse(file.read_text(), str(file))]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level:
            found.add(node.module or "")
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
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


@pytest.mark.parametrize("package", sorted(LOWER))
def test_lower_packages_import_nothing_above_them(package: str) -> None:
    """No module of ``package`` imports (at its top or inside a function) a package of the toolkit outside
    ``LOWER[package]``, nor a script of ``tools/``."""
    ours = {*PACKAGES, "tools", *TOOLS}
    bad = sorted(
        f"{file.relative_to(REPO)} imports {name}"
        for file in _python_files(package)
        for name in _imports(file)
        if name.split(".")[0] in ours and name.split(".")[0] not in LOWER[package]
    )
    assert not bad, bad


def test_measure_imports_only_torch_numpy_and_the_standard_library() -> None:
    bad = sorted(
        f"{file.relative_to(REPO)} imports {name}"
        for file in _python_files("measure")
        for name in _module_level_imports(file)
        if name.split(".")[0] not in MEASURE_IMPORTS
    )
    assert not bad, f"measure imports only torch, numpy and the standard library (others lazily): {bad}"


@pytest.mark.parametrize(
    ("statement", "loaded"),
    [
        ("import measure.atomic, measure.bench, measure.gpu_check, measure.report, measure.stats", {"measure"}),
        ("import attention, attention.bench", {"attention", "measure"}),
        ("import engine", {"engine", "measure"}),
    ],
)
def test_importing_a_lower_package_loads_no_package_above_it(statement: str, loaded: set[str]) -> None:
    """In a fresh process, as a user of the core imports it: the toolkit's packages it loads, including those the
    source check above cannot see (a module imported by ``importlib`` from its name)."""
    from engine.testing import run_python

    code = f"import sys; {statement}; print(' '.join(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = run_python(["-c", code], timeout=600)
    assert out.returncode == 0, out.stderr
    assert set(out.stdout.split()) & {*PACKAGES, "tools", *TOOLS} == loaded


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
    assert "measure.bench" in graph["attention.bench"]
    assert "measure.atomic" in graph["engine.checkpoint"]
    assert {"torch", "measure.atomic"} <= _module_level_imports(REPO / "measure" / "bench.py")
    assert "torch" not in _module_level_imports(REPO / "measure" / "gpu_check.py")  # inside its functions only
    assert "torch" in _imports(REPO / "measure" / "gpu_check.py")
