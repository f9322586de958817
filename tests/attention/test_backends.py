"""attention.backends: one resolver; kernels declare what they support; auto skips, explicit raises."""

from __future__ import annotations

import importlib
import itertools
from pathlib import Path

import pytest
import torch

import attention
from attention import backends
from attention.backends import AUTO_ORDER, BACKENDS, available, resolve
from attention.kernels import limits

# The switchboard (resolve, auto orders, limits, the interpreter switch) reads torch and triton at run time
pytestmark = pytest.mark.torch_compat


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
    # torch-cluster's CUDA FPS rounds differently from the reference (not exact): past Triton's limit, torch
    assert resolve("fps", "auto", "cuda", {"N": 100_000, "C": 3}) == "torch"
    # even an order that lists them skips them
    monkeypatch.setitem(AUTO_ORDER, ("fps", "cuda"), ("cluster", "torch"))
    assert resolve("fps", "auto", "cuda", {"N": 100, "C": 3}) == "torch"
    monkeypatch.setitem(AUTO_ORDER, ("fps", "cpu"), ("fpsample_bucket", "fpsample", "torch"))
    assert resolve("fps", "auto", "cpu", {"N": 100, "C": 3}) == "torch"
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


def test_declared_limits_are_the_kernels() -> None:
    """The entries read their limits from attention.kernels.limits (no triton needed), which the kernels import."""
    assert dict(BACKENDS["fps"]["triton"].limits) == {
        "N": limits.FPS_TRITON_MAX_POINTS,
        "C": limits.FPS_TRITON_MAX_CHANNELS,
    }
    for op in ("cauchy_mix", "vandermonde_mix"):
        assert dict(BACKENDS[op]["triton"].limits) == {
            "D": limits.MIX_TRITON_MAX_HEAD_DIM,
            "Dv": limits.MIX_TRITON_MAX_HEAD_DIM,
        }
    assert dict(BACKENDS["knn"]["triton"].limits) == {"k": limits.KNN_TRITON_MAX_NEIGHBORS}
    assert dict(BACKENDS["knn_attention"]["triton"].limits) == {"D": limits.KNN_ATTN_TRITON_MAX_HEAD_DIM}
    assert dict(BACKENDS["fsat_edges"]["triton"].limits) == {"D": limits.FSAT_TRITON_MAX_HEAD_DIM}
    assert dict(BACKENDS["quasiseparable_mix"]["triton"].limits) == {
        "N": limits.SSD_TRITON_MAX_DIM,
        "Dv": limits.SSD_TRITON_MAX_DIM,
    }
    if backends.HAS_TRITON:
        fps_kernel = importlib.import_module("attention.kernels.fps_triton")
        assert (fps_kernel.MAX_POINTS, fps_kernel.MAX_CHANNELS) == (
            limits.FPS_TRITON_MAX_POINTS,
            limits.FPS_TRITON_MAX_CHANNELS,
        )
        assert importlib.import_module("attention.kernels.mixers_triton").MAX_HEAD_DIM == limits.MIX_TRITON_MAX_HEAD_DIM
        knn_kernel = importlib.import_module("attention.kernels.knn_triton")
        assert knn_kernel.MAX_NEIGHBORS == limits.KNN_TRITON_MAX_NEIGHBORS
        attn_kernel = importlib.import_module("attention.kernels.knn_attention_triton")
        assert attn_kernel.MAX_HEAD_DIM == limits.KNN_ATTN_TRITON_MAX_HEAD_DIM
        assert importlib.import_module("attention.kernels.fsat_triton").MAX_HEAD_DIM == limits.FSAT_TRITON_MAX_HEAD_DIM
        assert importlib.import_module("attention.kernels.ssd_triton").MAX_DIM == limits.SSD_TRITON_MAX_DIM


def test_importing_attention_imports_no_optional_package() -> None:
    """Backends are imported when they first run: a fresh interpreter that imports the package (and resolves every
    op) has loaded no kernel module and none of the optional packages (torch's own FLOP counter imports triton). The
    exception is pytorch3d, found but perhaps built for another torch: where it is installed its probe imports its
    extension, and ``HAS_PYTORCH3D`` says whether that loads."""
    import subprocess
    import sys

    code = (
        "import importlib.util, sys, attention, capsules\n"
        "from attention.backends import BACKENDS, resolve\n"
        "for op in BACKENDS:\n"
        "    for device in ('cpu', 'cuda'):\n"
        "        resolve(op, 'auto', device, {})\n"
        "lazy = ('numba', 'torch_cluster', 'fpsample', 'mamba_ssm', 'attention.kernels.fps_triton',\n"
        "        'attention.kernels.fps_numba', 'attention.kernels.mixers_triton', 'attention.kernels.knn_triton',\n"
        "        'attention.kernels.knn_attention_triton', 'attention.kernels.fsat_triton',\n"
        "        'attention.kernels.ssd_triton')\n"
        "print(sorted(m for m in lazy if m in sys.modules))\n"
        "print(('pytorch3d' in sys.modules) == (importlib.util.find_spec('pytorch3d') is not None))\n"
        "try:\n"
        "    import pytorch3d._C\n"
        "    loads = True\n"
        "except ImportError:\n"
        "    loads = False\n"
        "print(attention.HAS_PYTORCH3D == loads)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["[]", "True", "True"]


def test_an_extension_that_does_not_load_leaves_its_backend_unavailable_with_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """find_spec finds a wheel built for another torch, whose extension then fails to load (an undefined symbol): the
    probe imports the extension, and the import's error is what an explicit request raises, with the install hint."""
    import sys

    symbol = "_ZN3c104cuda29c10_cuda_check_implementationEiPKcS2_jb"  # easypytorch3d 0.7.9.post1 on torch 2.15
    (tmp_path / "fake3d").mkdir()
    (tmp_path / "fake3d" / "__init__.py").write_text("")
    (tmp_path / "fake3d" / "_C.py").write_text(f"raise ImportError('fake3d/_C.so: undefined symbol: {symbol}')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        error = backends.load_error("fake3d", "fake3d._C")
    finally:
        sys.modules.pop("fake3d", None)
    assert error == f"ImportError: fake3d/_C.so: undefined symbol: {symbol}"
    assert backends.load_error("fake3d_not_installed", "fake3d_not_installed._C") is None  # missing is not broken
    monkeypatch.setitem(backends.INSTALLED, "pytorch3d", False)
    monkeypatch.setitem(backends.LOAD_ERRORS, "pytorch3d", error)
    for op in ("fps", "knn", "chamfer"):
        assert not available(op, "pytorch3d") and resolve(op, "auto", "cpu", {"N": 64, "C": 3, "k": 4}) != "pytorch3d"
        with pytest.raises(ImportError, match=rf"installed but does not load with torch .*{symbol}.*easypytorch3d"):
            resolve(op, "pytorch3d", "cpu")


def test_pytorch3d_is_in_no_auto_order() -> None:
    """A backend enters an auto order once a bench has timed it there and found it faster; pytorch3d, timed on CPU
    (tools/bench_points.py on torch 2.11), is not clearly faster at the models' sizes, and was never timed on CUDA."""
    assert all("pytorch3d" not in order for order in AUTO_ORDER.values())


def test_every_auto_order_names_declared_exact_backends_and_ends_with_one_that_takes_every_shape() -> None:
    for (op, device), order in AUTO_ORDER.items():
        assert device in ("cpu", "cuda") and order, (op, device)
        for name in order:
            b = BACKENDS[op][name]
            assert b.exact and (device in b.devices), (op, device, name)
        last = BACKENDS[op][order[-1]]
        assert last.package is None and last.prefer is None and not last.limits and last.check is None, (op, device)


# Inputs that each entry's ``check`` refuses: (shape, what the error names).
_CHECKED = {
    # the KNN kd-tree / pytorch3d: every cloud needs k real points
    ("knn", "cluster"): [({"k": 4, "min_real": 3}, "got k=4 and a cloud of 3")],
    ("knn", "pytorch3d"): [({"k": 4, "min_real": 3}, "got k=4 and a cloud of 3")],
    # the fused KNN attention: the softmax over inputs, without dropout
    ("knn_attention", "triton"): [
        ({"normalize": "centroids"}, "supports normalize='inputs' only, got 'centroids'"),
        ({"normalize": "inputs", "dropout": 0.1}, r"supports dropout_p == 0 only .*got dropout_p=0.1"),
    ],
    # the masked KNN attention: a neighbour listed twice in a row (a caller's idx, checked) counts once there
    ("knn_attention", "masked"): [
        ({"distinct": lambda: False}, r"counts a neighbour index listed twice in a row once.*use backend='gather'"),
    ],
    # the fused FSAT edge attention: its atomics refuse deterministic mode (no input shape does)
    ("fsat_edges", "triton"): [],
    # Mamba-2's scan: Hydra's dt and A apart, which only hydra_mix holds
    ("quasiseparable_mix", "mamba"): [({"N": 16, "Dv": 16}, "takes Hydra's dt and A apart: use hydra_mix")],
}


# One input each restriction of an entry refuses: (op, backend, device, shape, dtype, what the error names).
def _refused_inputs() -> list[tuple[str, str, str, dict, torch.dtype | None, str]]:
    cases = []
    for op, choices in BACKENDS.items():
        for name, b in choices.items():
            for device in ("cpu", "cuda"):
                if device not in b.devices:
                    cases.append((op, name, device, {}, None, f"runs on {'/'.join(b.devices)}.*got a {device} tensor"))
            device = b.devices[0]
            for key, limit in b.limits.items():
                cases.append((op, name, device, {key: limit + 1}, None, f"supports {key} <= {limit}, got {key}="))
            if b.check is not None:
                cases += [(op, name, device, shape, None, match) for shape, match in _CHECKED[op, name]]
    return cases


REFUSED = _refused_inputs()


@pytest.mark.parametrize(
    "op, name, device, shape, dtype, match", REFUSED, ids=lambda v: str(v) if isinstance(v, str) else None
)
def test_explicit_backend_that_cannot_take_the_input_raises_naming_the_limit(
    op: str, name: str, device: str, shape: dict, dtype, match: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(backends.INSTALLED, BACKENDS[op][name].package, True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=match):
        resolve(op, name, device, shape, dtype)


@pytest.mark.parametrize("op", sorted(BACKENDS))
def test_every_op_refuses_what_its_backends_cannot_take(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every restriction declared for ``op`` is among the refused inputs above, and an unknown name is refused too
    (the ops whose backends all take every input: Chamfer, FSAT's edges, the KNN attention's forms)."""
    restricted = {n for n, b in BACKENDS[op].items() if b.limits or b.check or set(b.devices) != {"cpu", "cuda"}}
    assert restricted == {case[1] for case in REFUSED if case[0] == op}
    with pytest.raises(ValueError, match=rf"unknown backend 'nope' for {op}; choose one of \['auto'"):
        resolve(op, "nope", "cpu")


def _shapes(op: str) -> list[tuple[dict, torch.dtype]]:
    """Inputs that each op's preferences and limits tell apart."""
    if op == "fps":
        grid = [{"B": 2, "N": n, "C": c, "M": 5, "masked": m} for n in (100, 70_000) for c in (3, 16) for m in (0, 1)]
    elif op == "knn":
        grid = [
            {"N": 20, "C": c, "k": k, "min_real": r} for c in (3, 16) for k in (4, 65) for r in (None, 3, lambda: 3)
        ]
    elif op == "chamfer":
        grid = [{"B": b, "N": n, "M": n, "C": c, "itemsize": 4} for b in (1, 8) for n in (10, 2048) for c in (3, 8)]
    elif op in ("cauchy_mix", "vandermonde_mix"):
        grid = [{"D": d, "Dv": dv} for d in (16, 65) for dv in (16, 65)]
    elif op == "fsat_edges":
        grid = [{"D": d, "E": 8} for d in (64, 129)]
    elif op == "quasiseparable_mix":
        grid = [{"N": n, "Dv": dv, "separate_dt": s} for n in (16, 65) for dv in (16, 65) for s in (True, False)]
    elif op == "knn_attention":
        grid = [
            {"N": n, "K": 8, "D": dim, "dropout": p, "distinct": d, "normalize": z}
            for n in (64, 1024, 1028) for dim in (32, 129) for p in (0.0, 0.1)
            for d in (True, False, lambda: True, lambda: False) for z in ("inputs", "centroids")
        ]  # fmt: skip
    else:
        grid = [{}]
    return [(shape, dtype) for shape in grid for dtype in (torch.float32, torch.float64, torch.bfloat16)]


@pytest.mark.parametrize("op", sorted(BACKENDS))
def test_auto_never_picks_a_backend_that_cannot_take_the_input(op: str, monkeypatch: pytest.MonkeyPatch) -> None:
    for package in backends.INSTALLED:
        monkeypatch.setitem(backends.INSTALLED, package, True)
    for device, (shape, dtype) in itertools.product(("cpu", "cuda"), _shapes(op)):
        name = resolve(op, "auto", device, shape, dtype)
        b = BACKENDS[op][name]
        assert b.exact and b.supports(device, shape, dtype), (device, shape, dtype, name)


def test_auto_decisions(monkeypatch: pytest.MonkeyPatch) -> None:
    """What "auto" takes, per device and shape (each from a bench, docs/benchmarks.md), with every package present."""
    for package in backends.INSTALLED:
        monkeypatch.setitem(backends.INSTALLED, package, True)
    f32, f64, bf16 = torch.float32, torch.float64, torch.bfloat16

    def attn(n: int, k: int, d: int, normalize: str, dropout: float, distinct: bool) -> dict:
        return {"N": n, "K": k, "D": d, "normalize": normalize, "dropout": dropout, "distinct": distinct}

    cases = [
        ("fps", "cpu", {"N": 1024, "C": 3}, f32, "numba"),  # the kd-tree pays for coordinates only
        ("fps", "cpu", {"N": 1024, "C": 16}, f32, "torch"),
        ("fps", "cuda", {"N": 4096, "C": 3}, f32, "triton"),
        ("fps", "cuda", {"N": 70_000, "C": 3}, f32, "torch"),  # beyond the kernel's registers
        ("knn", "cpu", {"N": 1024, "C": 3, "k": 16, "min_real": None}, f32, "cluster"),
        ("knn", "cpu", {"N": 1024, "C": 64, "k": 16, "min_real": None}, f32, "torch"),
        ("knn", "cpu", {"N": 1024, "C": 3, "k": 16, "min_real": 15}, f32, "torch"),  # the reference pads with inf
        ("knn", "cuda", {"N": 1024, "C": 3, "k": 16, "min_real": None}, f32, "triton"),
        ("knn", "cuda", {"N": 1024, "C": 64, "k": 16, "min_real": 15}, f32, "triton"),  # pads with inf too
        ("knn", "cuda", {"N": 1024, "C": 64, "k": 65, "min_real": None}, f32, "torch"),  # beyond the kernel's list
        ("chamfer", "cpu", {"B": 2, "N": 10, "M": 12, "C": 3, "itemsize": 4}, f32, "dense"),
        ("chamfer", "cpu", {"B": 8, "N": 2048, "M": 2048, "C": 3, "itemsize": 4}, f32, "knn_cluster"),
        ("chamfer", "cpu", {"B": 8, "N": 2048, "M": 2048, "C": 3, "itemsize": 8}, f64, "chunked"),
        ("chamfer", "cpu", {"B": 8, "N": 2048, "M": 2048, "C": 8, "itemsize": 4}, f32, "chunked"),
        ("chamfer", "cuda", {"B": 2, "N": 10, "M": 12, "C": 3, "itemsize": 4}, f32, "chunked"),
        ("cauchy_mix", "cuda", {"D": 16, "Dv": 16}, f32, "triton"),
        ("cauchy_mix", "cuda", {"D": 16, "Dv": 16}, f64, "torch"),  # the reference's precision
        ("vandermonde_mix", "cuda", {"D": 65, "Dv": 16}, f32, "torch"),
        ("vandermonde_mix", "cpu", {"D": 16, "Dv": 16}, f32, "torch"),
        # the fused kernel wherever it applies, any N / K and repeated neighbours included
        ("knn_attention", "cuda", attn(128 * 8, 8, 32, "inputs", 0.0, True), f32, "triton"),
        ("knn_attention", "cuda", attn(16384, 32, 32, "inputs", 0.0, True), bf16, "triton"),
        ("knn_attention", "cuda", attn(64, 8, 32, "inputs", 0.0, False), f32, "triton"),
        # else the masked form while N / K is small, else gather
        ("knn_attention", "cuda", attn(128 * 8, 8, 32, "inputs", 0.1, True), f32, "masked"),  # dropout in training
        ("knn_attention", "cuda", attn(128 * 8, 8, 129, "inputs", 0.0, True), f32, "masked"),  # heads too large
        ("knn_attention", "cuda", attn(128 * 8, 8, 32, "inputs", 0.0, True), f64, "masked"),  # float64's precision
        ("knn_attention", "cuda", attn(1028, 8, 32, "inputs", 0.1, True), f32, "gather"),
        ("knn_attention", "cuda", attn(64, 8, 32, "inputs", 0.1, False), f32, "gather"),
        # a caller's idx, checked: masked for distinct rows only (it counts a repeated neighbour once)
        ("knn_attention", "cuda", attn(64, 8, 32, "inputs", 0.1, lambda: True), f32, "masked"),
        ("knn_attention", "cuda", attn(64, 8, 32, "inputs", 0.1, lambda: False), f32, "gather"),
        ("knn_attention", "cuda", attn(64, 8, 32, "centroids", 0.0, True), f32, "gather"),
        ("knn_attention", "cpu", attn(64, 8, 32, "inputs", 0.0, True), f32, "gather"),
        ("fsat_edges", "cpu", {"D": 64, "E": 8}, f32, "csr"),
        # the fused kernel on CUDA for float32 / bf16 heads it holds (tools/bench_mixers.py: fsat vs fsat-torch)
        ("fsat_edges", "cuda", {"D": 64, "E": 8}, f32, "triton"),
        ("fsat_edges", "cuda", {"D": 64, "E": 8}, torch.bfloat16, "triton"),
        ("fsat_edges", "cuda", {"D": 64, "E": 8}, f64, "gather"),  # the reference's precision
        ("fsat_edges", "cuda", {"D": 129, "E": 8}, f32, "gather"),
        ("quasiseparable_mix", "cpu", {"N": 64, "Dv": 64, "separate_dt": True}, f32, "torch"),
        # the SSD kernels on CUDA (tools/bench_mixers.py: hydra vs hydra-torch); Mamba-2's kernels are explicit only
        ("quasiseparable_mix", "cuda", {"N": 64, "Dv": 64, "separate_dt": True}, f32, "triton"),
        ("quasiseparable_mix", "cuda", {"N": 64, "Dv": 64, "separate_dt": False}, torch.bfloat16, "triton"),
        ("quasiseparable_mix", "cuda", {"N": 64, "Dv": 64, "separate_dt": True}, f64, "torch"),
        ("quasiseparable_mix", "cuda", {"N": 65, "Dv": 64, "separate_dt": True}, f32, "torch"),
    ]
    for op, device, shape, dtype, expected in cases:
        assert resolve(op, "auto", device, shape, dtype) == expected, (op, device, shape, dtype)


def test_fused_knn_attention_is_not_taken_under_deterministic_algorithms(monkeypatch: pytest.MonkeyPatch) -> None:
    """Its gradients are float32 atomic sums in no fixed order: with deterministic algorithms on, "auto" moves on and
    an explicit request says why."""
    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    shape = {"N": 1024, "K": 32, "D": 32, "normalize": "inputs", "dropout": 0.0, "distinct": True}
    assert resolve("knn_attention", "auto", "cuda", shape, torch.float32) == "triton"
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert resolve("knn_attention", "auto", "cuda", shape, torch.float32) == "masked"
    with pytest.raises(ValueError, match=r"float32 atomics .*use_deterministic_algorithms\(True\)"):
        resolve("knn_attention", "triton", "cuda", shape, torch.float32)


def test_auto_is_the_reference_while_tracing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "is_tracing", lambda: True)
    for op, choices in BACKENDS.items():
        assert resolve(op, "auto", "cuda", {}) == next(iter(choices))


def test_triton_takes_cpu_tensors_only_under_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    shape = {"C": 3, "D": 16, "Dv": 16, "k": 4, "N": 16, "E": 8}
    for op in ("fps", "cauchy_mix", "vandermonde_mix", "knn", "knn_attention", "fsat_edges", "quasiseparable_mix"):
        assert resolve(op, "triton", "cpu", {}) == "triton"
        assert resolve(op, "auto", "cpu", shape) != "triton"  # never timed on CPU
    monkeypatch.delenv("TRITON_INTERPRET")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        resolve("cauchy_mix", "triton", "cpu", {})


def test_submodule_all_agree_with_the_package() -> None:
    """Every public name of a submodule is exported by `attention`, and every package name comes from one."""
    names: set[str] = set()
    for sub in ("backends", "centroid", "checks", "chunking", "layers", "mixers", "mixers.fsat", "points"):
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
