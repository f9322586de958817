"""The commands of the README and the docs pages run as written: those that open a run (resume, eval-only, export,
the viewers) for real, and every one names a script and flags that exist (its ``--help``).

Each training CLI first trains a tiny run (one epoch, its config given entirely with ``--set``) into the folder its
default config names (``runs/<group>/<name>/latest``), and every README training command with an ``--output-dir``
runs for one epoch (``DIR`` standing for the real ModelNet40 sample); then every README command that opens a run is
executed as written, from the same working directory: it must find the run and rebuild it from the checkpoint's config
alone.
"""

from __future__ import annotations

import os
import re
import shlex
from pathlib import Path

import pytest

import engine
import lra
from capsules.recipe import CapsulesRecipe
from capsules.testing import TINY_CAPSULES_SETS
from engine.testing import REPO, doc_pages, fenced_blocks, run_python, tool_env, tools_help
from lra.testing import TINY_LISTOPS_SETS
from pointcloud.partseg.recipe import PartSegRecipe
from pointcloud.recipe import ModelNetRecipe
from pointcloud.testing import TINY_MODELNET_SETS, TINY_PARTSEG_SETS
from vision.recipe import DeiTRecipe
from vision.testing import TINY_DEIT_SETS

TINY_RUNS = {
    ModelNetRecipe: TINY_MODELNET_SETS,
    CapsulesRecipe: TINY_CAPSULES_SETS,
    DeiTRecipe: TINY_DEIT_SETS,
    lra.ListOpsRecipe: TINY_LISTOPS_SETS,
    # the main job's five categories and 24 test shapes each, so that the README's picture command finds its shapes
    PartSegRecipe: (
        *TINY_PARTSEG_SETS,
        "synthetic_classes=[table,chair,airplane,lamp,mug]",
        "synthetic_test_per_class=24",
    ),
}
OPENS_A_RUN = ("--resume", "--eval-only", "export_weights.py", "visualize_capsules.py", "visualize_partseg.py")


SAMPLE = REPO.parent / "shared" / "data" / "modelnet40_normal_resampled_sample"


def _doc_lines(prefixes: tuple[str, ...] = ("python tools/",)) -> list[str]:
    """The lines starting with one of ``prefixes`` in the bash blocks of the README and of every docs page,
    continuation lines joined, comments and ``&& ...`` dropped."""
    lines = []
    for page in doc_pages():
        for block in fenced_blocks(page, ("bash", "sh", "shell")):
            for line in block.code.replace("\\\n", " ").splitlines():
                line = re.split(r"\s#", line.strip())[0].split(" && ")[0].strip()  # a shell comment follows a blank
                if line.startswith(prefixes):
                    lines.append(line)
    return lines


def _readme_lines() -> list[str]:
    """The ``python tools/...`` commands of the README and the docs pages (:func:`_doc_lines`) that run as written:
    a template with ``<placeholders>`` (``--config <config>``) only has its script and flags checked."""
    return [line for line in _doc_lines() if not re.search(r"<[^<>\s]+>", line)]


def readme_commands() -> list[str]:
    """Every README command that opens a run."""
    return [line for line in _readme_lines() if any(key in line for key in OPENS_A_RUN)]


def readme_named_runs() -> list[str]:
    """Every README training command that writes a named run folder (``--output-dir``) another command opens."""
    return [line for line in _readme_lines() if "--output-dir" in line and not any(k in line for k in OPENS_A_RUN)]


def test_the_readme_has_a_command_of_each_kind() -> None:
    commands = readme_commands()
    for key in OPENS_A_RUN:
        assert any(key in c for c in commands), f"no README command with {key}"


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A working directory holding one tiny run per training CLI under its default run folder."""
    cwd = tmp_path_factory.mktemp("readme")
    here = os.getcwd()
    os.chdir(cwd)
    try:
        for recipe, sets in TINY_RUNS.items():
            engine.main(recipe, ["--no-progress", "--device", "cpu", "--epochs", "1", "--set", *sets])
        for command in readme_named_runs():
            if "DIR" in command and not SAMPLE.is_dir():
                continue  # its readers skip too
            _run([*shlex.split(command.replace("DIR", str(SAMPLE))), "--epochs", "1"], cwd)
    finally:
        os.chdir(here)
    return cwd


def _run(argv: list[str], cwd: Path) -> None:
    """``python tools/<x>.py ...`` (``argv[0] == "python"``) in ``cwd``; asserts exit status 0."""
    script = str(REPO / argv[1])
    if argv[1].startswith("tools/train_") or argv[1] == "tools/lra_listops.py":
        argv = [*argv, "--no-progress"]
    env = tool_env(display=False)  # render PNGs, no window
    done = run_python([script, *argv[2:]], env=env, timeout=600, cwd=cwd)
    assert done.returncode == 0, f"{' '.join(argv)}\n{done.stderr[-3000:]}"


@pytest.mark.slow
@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_runs_as_written(command: str, trained: Path) -> None:
    if "visualize_capsules.py" in command or "visualize_partseg.py" in command:
        pytest.importorskip("open3d", exc_type=ImportError)
    opened = re.search(r"(runs/\S+?)/(?:latest/)?best\.pt", command)
    if opened and not (trained / opened.group(0)).exists() and not SAMPLE.is_dir():
        pytest.skip(f"{opened.group(1)} is trained on the real ModelNet40 sample (../shared/data), absent here")
    _run(shlex.split(command), trained)


def _script_and_args(command: str) -> tuple[str, list[str]]:
    """``(tools/<x>.py, its arguments)`` of a ``python tools/...`` or ``bash tools/run.sh train|test ...`` line
    (``run.sh train`` is ``tools/train_modelnet.py``; ``run.sh test`` passes its arguments to pytest: none checked)."""
    argv = shlex.split(command)
    if argv[:2] == ["bash", "tools/run.sh"]:
        if len(argv) > 2 and argv[2] == "train":
            return "tools/train_modelnet.py", argv[3:]
        return "tools/run.sh", []
    return argv[1], argv[2:]


@pytest.mark.slow
def test_doc_commands_name_a_script_and_its_flags() -> None:
    """Every ``python tools/...`` and ``bash tools/run.sh ...`` command shown in the README and the docs pages names
    a script that exists and only flags that its ``--help`` lists."""
    commands = _doc_lines(("python tools/", "bash tools/run.sh"))
    assert any(c.startswith("bash tools/run.sh") for c in commands), "the finder sees no run.sh command"
    helps: dict[str, set[str]] = {}
    problems = []
    for command in commands:
        script, args = _script_and_args(command)
        if not (REPO / script).is_file():
            problems.append(f"{command}: no {script}")
            continue
        if script.endswith(".sh"):
            continue
        if script not in helps:
            done = tools_help()[Path(script).stem]
            assert done.returncode == 0, f"{script} --help: {done.stderr[-2000:]}"
            helps[script] = set(re.findall(r"--[\w-]+", done.stdout))
        unknown = [a.split("=")[0] for a in args if a.startswith("--") and a.split("=")[0] not in helps[script]]
        if unknown:
            problems.append(f"{command}: {script} has no {unknown}")
    assert not problems, "\n".join(problems)
