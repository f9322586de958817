"""attention.backends: one resolver; kernels declare what they support; auto skips, explicit raises."""

from __future__ import annotations

import importlib

import pytest
import torch

import attention
from attention import backends
from attention.backends import BACKENDS, available, resolve


def test_auto_falls_back_to_the_reference_when_nothing_is_installed(monkeypatch: pytest.MonkeyPatch) -> None:
    for package in ("torch_cluster", "pytorch3d", "triton", "fpsample"):
        monkeypatch.setitem(backends.INSTALLED, package, False)
    for op, choices in BACKENDS.items():
        for device in ("cpu", "cuda"):
            assert choices[resolve(op, "auto", device)].package is None


def test_auto_skips_a_kernel_that_cannot_take_the_shape(monkeypatch: pytest.MonkeyPatch) -> None:
    """The Triton FPS kernel holds one cloud of at most 65536 points and 8 channels: auto moves on, explicit raises."""
    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    monkeypatch.setitem(backends.INSTALLED, "pytorch3d", False)
    monkeypatch.setitem(backends.INSTALLED, "torch_cluster", False)
    assert resolve("fps", "auto", "cuda", {"N": 4096, "C": 3}) == "triton"
    assert resolve("fps", "auto", "cuda", {"N": 70000, "C": 3}) == "torch"
    assert resolve("fps", "auto", "cuda", {"N": 4096, "C": 16}) == "torch"
    with pytest.raises(ValueError, match=r"supports N <= 65536, got N=70000"):
        resolve("fps", "triton", "cuda", {"N": 70000, "C": 3})
    with pytest.raises(ValueError, match=r"supports C <= 8, got C=16"):
        resolve("fps", "triton", "cuda", {"N": 100, "C": 16})


def test_auto_never_picks_an_approximate_backend(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backends.INSTALLED, "fpsample", True)
    monkeypatch.setitem(backends.INSTALLED, "torch_cluster", True)
    monkeypatch.setitem(backends.INSTALLED, "pytorch3d", False)
    assert not BACKENDS["fps"]["fpsample_bucket"].exact and not BACKENDS["fps"]["fpsample"].exact
    # torch-cluster's CUDA FPS chose other indices on an H100 (docs/benchmarks.md): past Triton's limit, torch
    assert resolve("fps", "auto", "cuda", {"N": 100_000, "C": 3}) == "torch"
    assert resolve("fps", "auto", "cuda", {"N": 100, "C": 3}, order=("cluster", "torch")) == "torch"
    order = ("fpsample_bucket", "fpsample", "torch")
    assert resolve("fps", "auto", "cpu", {"N": 100, "C": 3}, order=order) == "torch"
    assert resolve("fps", "fpsample_bucket", "cpu", {"N": 100, "C": 3}) == "fpsample_bucket"
    with pytest.raises(ValueError, match="runs on cpu, got a cuda tensor"):
        resolve("fps", "fpsample", "cuda", {"N": 100, "C": 3})


def test_explicit_backend_errors_name_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backends.INSTALLED, "torch_cluster", False)
    with pytest.raises(ImportError, match="pip install --no-build-isolation torch-cluster"):
        resolve("knn", "cluster", "cpu")
    with pytest.raises(ValueError, match=r"unknown backend 'nope' for fps; choose one of \['auto', 'torch'"):
        resolve("fps", "nope", "cpu")
    with pytest.raises(ValueError, match="unknown op"):
        resolve("sort", "auto", "cpu")
    assert available("fps", "torch", "cpu") and not available("fps", "triton", "cpu")


@pytest.mark.skipif(not backends.HAS_TRITON, reason="triton not installed")
def test_declared_triton_limits_match_the_kernels() -> None:
    kernel = importlib.import_module("attention.kernels.fps_triton")
    assert backends.TRITON_FPS_MAX_POINTS == kernel.MAX_POINTS
    assert backends.TRITON_FPS_MAX_CHANNELS == kernel.MAX_CHANNELS
    mixers_kernel = importlib.import_module("attention.kernels.mixers_triton")
    for op in ("cauchy_mix", "vandermonde_mix"):
        assert dict(BACKENDS[op]["triton"].limits) == {
            "D": mixers_kernel.MAX_HEAD_DIM,
            "Dv": mixers_kernel.MAX_HEAD_DIM,
        }


def test_submodule_all_agree_with_the_package() -> None:
    """Every public name of a submodule is exported by `attention`, and every package name comes from one."""
    names: set[str] = set()
    for sub in ("backends", "centroid", "checks", "fsat", "layers", "mixers", "points"):
        module = importlib.import_module(f"attention.{sub}")
        assert all(hasattr(module, n) for n in module.__all__), sub
        names |= set(module.__all__)
    assert names == set(attention.__all__)
    assert all(getattr(attention, n) is not None for n in attention.__all__)


def test_no_private_attention_imports_outside_the_package() -> None:
    """Tools, tests and the domain packages use attention's public API (no `_private` module or name)."""
    import pathlib
    import re

    root = pathlib.Path(__file__).resolve().parents[2]
    pattern = re.compile(
        r"from attention(\.\w+)* import [^\n]*\b_\w+|import attention\._|attention\.(\w+\.)*_[a-z]"
        r"|(?<![\w.])(points|backends|checks|centroid|fsat|mixers|layers)\._[a-z]"
    )
    offenders = []
    for folder in ("capsules", "pointcloud", "vision", "engine", "tools", "tests"):
        for path in (root / folder).rglob("*.py"):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line) and "noqa: private" not in line:
                    offenders.append(f"{path.relative_to(root)}:{i}: {line.strip()}")
    assert not offenders, "\n".join(offenders)


def test_backend_tensor_device_is_checked() -> None:
    assert resolve("fps", "auto", torch.device("cpu"), {"N": 10, "C": 3}) in BACKENDS["fps"]
