"""tools/install_torch_cluster.sh: the torch-cluster wheel is built once per torch and Python into a cache outside the
clone, then installed from there. A stand-in virtualenv records its pip calls (and leaves a wheel where ``pip wheel``
is asked for one) and imports a stand-in torch, so the logic runs in a moment without compiling anything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from engine.testing import REPO

SCRIPT = REPO / "tools" / "install_torch_cluster.sh"
PYTAG = f"cp{sys.version_info[0]}{sys.version_info[1]}"
WHEEL = f"torch_cluster-1.6.3-{PYTAG}-{PYTAG}-linux_x86_64.whl"
TORCH = "2.15.0+cu130"


def _venv(tmp_path: Path, importable: str = "") -> Path:
    """A stand-in virtualenv; its torch_cluster module runs ``importable`` on import (``raise ImportError`` for a wheel
    built against another torch)."""
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    python = venv / "bin" / "python"
    python.write_text(
        f"""#!/usr/bin/env bash
if [ "$1" = -m ] && [ "$2" = pip ]; then
    echo "${{*:3}}" >> "{tmp_path / "pip.log"}"
    args=("$@")
    for i in "${{!args[@]}}"; do
        [ "${{args[$i]}}" = -w ] && touch "${{args[$((i + 1))]}}/{WHEEL}"
    done
    exit 0
fi
exec "{sys.executable}" "$@"
"""
    )
    python.chmod(0o755)
    (tmp_path / "stub" / "torch").mkdir(parents=True)
    (tmp_path / "stub" / "torch" / "__init__.py").write_text(f"__version__ = {TORCH!r}\n")
    (tmp_path / "stub" / "torch_cluster").mkdir(parents=True)
    (tmp_path / "stub" / "torch_cluster" / "__init__.py").write_text(importable)
    return venv


def _run(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "CENTROID_WHEEL_CACHE"}
    return {**env, "PYTHONPATH": str(tmp_path / "stub"), **extra}


def test_the_wheel_folder_is_keyed_by_python_and_torch(tmp_path: Path) -> None:
    venv = _venv(tmp_path)
    done = _run("--dir", str(venv), env=_env(tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg")))
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"{tmp_path}/xdg/centroid-toolkit/wheels/{PYTAG}-torch{TORCH}"
    done = _run("--dir", str(venv), env=_env(tmp_path, CENTROID_WHEEL_CACHE=str(tmp_path / "mine")))
    assert done.stdout.strip() == f"{tmp_path}/mine/{PYTAG}-torch{TORCH}"
    assert _run("--dir", env=_env(tmp_path)).returncode == 2  # usage


def test_the_wheel_is_built_once_then_installed_from_the_cache(tmp_path: Path) -> None:
    venv, cache, log = _venv(tmp_path), tmp_path / "cache", tmp_path / "pip.log"
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch==2.15.0\ntorch-cluster==1.6.3  # compiled\n")
    folder = cache / f"{PYTAG}-torch{TORCH}"
    folder.mkdir(parents=True)
    (folder / WHEEL.replace(PYTAG, "cp27")).touch()  # another Python's wheel is not taken
    env = _env(tmp_path, CENTROID_WHEEL_CACHE=str(cache))

    done = _run(str(venv), str(constraints), env=env)
    assert done.returncode == 0, done.stderr
    build, reinstall, install = log.read_text().splitlines()
    assert build.startswith("--disable-pip-version-check wheel -q --no-build-isolation --no-deps -w ")  # pip's cache
    assert build.endswith(" torch-cluster==1.6.3") and f"-w {folder}/.build." in build
    assert reinstall == f"--disable-pip-version-check install -q --force-reinstall --no-deps {folder / WHEEL}"
    assert install == f"--disable-pip-version-check install -q -c {constraints} {folder / WHEEL}"
    assert sorted(p.name for p in folder.iterdir()) == sorted([WHEEL, WHEEL.replace(PYTAG, "cp27")])  # no scratch

    log.unlink()
    done = _run(str(venv), str(constraints), env=env)  # a second clone: installed from the cache, nothing built
    assert done.returncode == 0, done.stderr
    assert log.read_text().splitlines() == [reinstall, install]
    assert "installing torch-cluster from" in done.stderr


def test_a_cached_wheel_that_does_not_import_is_built_again_without_pips_cache(tmp_path: Path) -> None:
    venv = _venv(tmp_path, "raise ImportError('undefined symbol')\n")
    cache, log = tmp_path / "cache", tmp_path / "pip.log"
    constraints = tmp_path / "constraints.txt"
    constraints.write_text("torch-cluster==1.6.3\n")
    done = _run(str(venv), str(constraints), env=_env(tmp_path, CENTROID_WHEEL_CACHE=str(cache)))
    assert done.returncode == 1  # the stand-in never imports: refused after the fresh build, named
    assert "does not import after a fresh build" in done.stderr
    builds = [line for line in log.read_text().splitlines() if " wheel " in line]
    assert len(builds) == 2 and "--no-cache-dir" not in builds[0] and "--no-cache-dir" in builds[1]
