"""The README's commands that open a run (resume, eval-only, export, the capsule viewer) run as written.

Each training CLI first trains a tiny run (one epoch, its config given entirely with ``--set``) into the folder its
default config names (``runs/<group>/<name>/latest``); then every README command that opens a run is executed as
written, from the same working directory: it must find the run and rebuild it from the checkpoint's config alone.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

import engine
import lra
from capsules.recipe import CapsulesRecipe
from capsules.testing import TINY_CAPSULES_SETS
from engine.testing import REPO, tool_env
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


def readme_commands() -> list[str]:
    """Every ``python tools/...`` command of the README's bash blocks that opens a run, continuation lines joined and
    trailing comments and ``&& ...`` dropped."""
    commands = []
    for block in re.findall(r"```bash\n(.*?)```", (REPO / "README.md").read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.strip().split("  #")[0].split(" && ")[0].strip()
            if line.startswith("python tools/") and any(key in line for key in OPENS_A_RUN):
                commands.append(line)
    return commands


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
    finally:
        os.chdir(here)
    return cwd


@pytest.mark.slow
@pytest.mark.parametrize("command", readme_commands())
def test_readme_command_runs_as_written(command: str, trained: Path) -> None:
    argv = shlex.split(command)[1:]  # drop "python"
    if argv[0].endswith(("visualize_capsules.py", "visualize_partseg.py")):
        pytest.importorskip("open3d", exc_type=ImportError)
    env = {k: v for k, v in tool_env().items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}  # render PNGs, no window
    argv[0] = str(REPO / argv[0])
    if argv[0].endswith(
        ("train_modelnet.py", "train_partseg.py", "train_capsules.py", "train_deit.py", "lra_listops.py")
    ):
        argv.append("--no-progress")
    done = subprocess.run([sys.executable, *argv], cwd=trained, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, f"{command}\n{done.stderr[-3000:]}"
