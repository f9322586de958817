"""The backend switchboard: which optional packages are installed, what each fast kernel supports, and one resolver.

Every op with fast paths (FPS, KNN, Chamfer, the Cauchy / Vandermonde mixers, FSAT's edge products) has a plain
PyTorch reference (``"torch"``) and optional backends. Each backend is declared once here, with the package it needs,
the devices it runs on, whether its result is exact (identical to the reference) and the shapes it supports.
:func:`resolve` turns a requested backend into the one that runs:

* ``"auto"`` walks the op's per-device preference order (measured: ``tools/bench_points.py`` and
  ``docs/benchmarks.md``) and takes the first *exact* backend that is installed, runs on the device and supports the
  shape; the reference always qualifies.
* while FX, dynamo or ``torch.export`` trace the caller, ``"auto"`` is the reference (plain tensor code);
* an explicit name runs that backend or raises: ``ImportError`` (with the install hint) when its package is missing,
  ``ValueError`` when it cannot take the device or the shape (never a silent fallback).

Optional packages are probed once at import with ``importlib.util.find_spec`` (nothing is imported until a backend
runs), like PyG's ``torch_geometric.typing``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch

from .checks import is_tracing

__all__ = [
    "AUTO_ORDER",
    "BACKENDS",
    "HAS_FPSAMPLE",
    "HAS_NUMBA",
    "HAS_PYTORCH3D",
    "HAS_TORCH_CLUSTER",
    "HAS_TRITON",
    "INSTALLED",
    "INSTALL_HINTS",
    "Backend",
    "available",
    "backend_names",
    "resolve",
]

HAS_TORCH_CLUSTER = importlib.util.find_spec("torch_cluster") is not None
HAS_PYTORCH3D = importlib.util.find_spec("pytorch3d") is not None
HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_FPSAMPLE = importlib.util.find_spec("fpsample") is not None
HAS_NUMBA = importlib.util.find_spec("numba") is not None

INSTALL_HINTS = {
    "torch_cluster": "torch-cluster: `pip install --no-build-isolation torch-cluster` after torch (or `pip install "
    "--no-build-isolation -e '.[cluster]'`); tools/bootstrap.sh does it",
    "pytorch3d": "pytorch3d (not on PyPI: build it from source, see its INSTALL.md)",
    "triton": "triton (installed with CUDA builds of torch) and a CUDA device",
    "fpsample": "fpsample: `pip install fpsample` (or `pip install -e '.[fps]'`)",
    "numba": "numba: `pip install numba` (or `pip install -e '.[fps]'`)",
}

# package -> installed, probed once (tests may override an entry to exercise a dispatch path)
INSTALLED: dict[str | None, bool] = {
    None: True,
    "torch_cluster": HAS_TORCH_CLUSTER,
    "pytorch3d": HAS_PYTORCH3D,
    "triton": HAS_TRITON,
    "fpsample": HAS_FPSAMPLE,
    "numba": HAS_NUMBA,
}


@dataclass(frozen=True)
class Backend:
    """What one fast kernel of one op needs and supports.

    Attributes:
        op: the op (``"fps"``, ``"knn"``, ``"chamfer"``, ``"cauchy_mix"``, ``"vandermonde_mix"``, ``"fsat_edges"``).
        name: the backend name users pass (``backend="cluster"``).
        package: the optional package it imports, or None (plain torch).
        devices: device types it runs on.
        exact: True when its result equals the reference's (same indices / values up to rounding); ``"auto"`` picks
            only exact backends.
        limits: shape key -> largest supported value (e.g. ``{"N": 65536, "C": 8}``); a shape over a limit is
            skipped by ``"auto"`` and refused when the backend is explicit.
        check: extra shape test returning why the backend cannot run, or None.
    """

    op: str
    name: str
    package: str | None = None
    devices: tuple[str, ...] = ("cpu", "cuda")
    exact: bool = True
    limits: Mapping[str, int] = field(default_factory=dict)
    check: Callable[[Mapping[str, object]], str | None] | None = None

    def installed(self) -> bool:
        return INSTALLED[self.package]

    def unsupported(self, device: torch.device, shape: Mapping[str, object] | None) -> str | None:
        """Why this backend cannot run on ``device`` for ``shape``, or None when it can."""
        if device.type not in self.devices:
            return f"backend {self.name!r} of {self.op} runs on {'/'.join(self.devices)}, got a {device.type} tensor"
        for key, limit in self.limits.items():
            value = (shape or {}).get(key)
            if value is not None and value > limit:
                return f"backend {self.name!r} of {self.op} supports {key} <= {limit}, got {key}={value}"
        if self.check is not None and shape is not None:
            return self.check(shape)
        return None


# Limits of attention/kernels/fps_triton.py (MAX_POINTS, MAX_CHANNELS: one block of points per cloud in registers);
# tests/attention/test_backends.py checks they match the kernel's constants where triton is installed.
TRITON_FPS_MAX_POINTS = 65536
TRITON_FPS_MAX_CHANNELS = 8

BACKENDS: dict[str, dict[str, Backend]] = {}


def _register(*backends: Backend) -> None:
    for b in backends:
        BACKENDS.setdefault(b.op, {})[b.name] = b


_register(
    Backend("fps", "torch"),
    # torch-cluster's FPS is FPS, but on CUDA its rounding differs from the reference's (tools/bench_points.py on an
    # H100: other indices in one cloud of B = 32, N = 4096 and at N = 100K), and there it was never faster than the
    # torch path beyond the Triton kernel's limit (1501 vs 966-1486 ms at N = 100K): "auto" does not pick it.
    Backend("fps", "cluster", "torch_cluster", exact=False),
    Backend("fps", "pytorch3d", "pytorch3d"),
    Backend(
        "fps",
        "triton",
        "triton",
        devices=("cuda",),
        limits={"N": TRITON_FPS_MAX_POINTS, "C": TRITON_FPS_MAX_CHANNELS},
    ),
    # fpsample's plain FPS (Rust, CPU, one cloud at a time) is FPS, but its float rounding differs from the
    # reference's: near-ties resolve differently and the indices then diverge (tools/bench_points.py: one of the
    # B = 32, N = 1024, M = 512 batches differed), so it is not "exact" here and "auto" does not pick it.
    Backend("fps", "fpsample", "fpsample", devices=("cpu",), exact=False),
    # fpsample's bucket FPS (kd-line buckets): much faster on large clouds, but an approximation (other indices, its
    # first sample is not ``start``, coverage measured in docs/benchmarks.md); explicit only.
    Backend("fps", "fpsample_bucket", "fpsample", devices=("cpu",), exact=False),
    # attention/kernels/fps_numba.py: exact FPS (the reference's indices) with kd-tree pruning, one cloud at a time;
    # any C, masks and lengths.
    Backend("fps", "numba", "numba", devices=("cpu",)),
    Backend("knn", "torch"),
    Backend("knn", "cluster", "torch_cluster"),
    Backend("knn", "pytorch3d", "pytorch3d"),
    # capsules.chamfer_distance: the dense reference, the chunked exact search, KNN searches, pytorch3d
    Backend("chamfer", "dense"),
    Backend("chamfer", "chunked"),
    Backend("chamfer", "knn_torch"),
    Backend("chamfer", "knn_cluster", "torch_cluster"),
    Backend("chamfer", "pytorch3d", "pytorch3d"),
    Backend("cauchy_mix", "torch"),
    Backend("cauchy_mix", "triton", "triton", devices=("cuda",), limits={"D": 64, "Dv": 64}),
    Backend("vandermonde_mix", "torch"),
    Backend("vandermonde_mix", "triton", "triton", devices=("cuda",), limits={"D": 64, "Dv": 64}),
    Backend("fsat_edges", "csr"),
    Backend("fsat_edges", "gather"),
    # attention.centroid: the KNN path as chunked gathers (memory O(B M K H) + a chunk) or as dense products under the
    # neighbour mask (attention.centroid.masked_knn_attention: O(M N) work, faster where N / K is small)
    Backend("knn_attention", "gather"),
    Backend("knn_attention", "masked"),
)

# "auto" preference per (op, device type), fastest first, from tools/bench_points.py (docs/benchmarks.md); the
# reference ends every list. Callers may narrow the choice by shape (e.g. KNN uses torch_cluster's kd-tree only in
# low dimensions) through the shape checks and limits above, or by passing their own order.
AUTO_ORDER: dict[tuple[str, str], tuple[str, ...]] = {
    ("fps", "cpu"): ("torch",),  # farthest_point_sample passes ("numba", "torch") for coordinates (C <= 4)
    ("fps", "cuda"): ("triton", "pytorch3d", "torch"),
    ("knn", "cpu"): ("torch",),
    ("knn", "cuda"): ("pytorch3d", "torch"),
    ("chamfer", "cpu"): ("dense",),  # capsules.chamfer passes a per-shape order (size, dimension, dtype)
    ("chamfer", "cuda"): ("pytorch3d", "chunked"),
    ("cauchy_mix", "cpu"): ("torch",),
    ("cauchy_mix", "cuda"): ("triton", "torch"),
    ("vandermonde_mix", "cpu"): ("torch",),
    ("vandermonde_mix", "cuda"): ("triton", "torch"),
    ("fsat_edges", "cpu"): ("csr",),
    ("fsat_edges", "cuda"): ("gather",),
    # "masked" was 2.2x faster on one CPU thread at the point model's first stage (M=512, N=1024, K=24) but keeps
    # O(B H M N) memory, so CPU stays on "gather". On CUDA "masked" comes first, and
    # attention.centroid.knn_attention_form takes it only for a layer's own N / K <= MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR
    # (H100 timings there).
    ("knn_attention", "cpu"): ("gather",),
    ("knn_attention", "cuda"): ("masked", "gather"),
}


def backend_names(op: str) -> list[str]:
    """The backends declared for ``op`` (reference first), without ``"auto"``."""
    if op not in BACKENDS:
        raise ValueError(f"unknown op {op!r}; choose one of {sorted(BACKENDS)}")
    return list(BACKENDS[op])


def available(op: str, name: str, device: torch.device | str = "cpu") -> bool:
    """Whether backend ``name`` of ``op`` is installed and runs on ``device`` (shape limits aside)."""
    b = BACKENDS.get(op, {}).get(name)
    return b is not None and b.installed() and torch.device(device).type in b.devices


def resolve(
    op: str,
    backend: str,
    device: torch.device | str,
    shape: Mapping[str, object] | None = None,
    order: tuple[str, ...] | None = None,
) -> str:
    """The backend that runs ``op`` for a request.

    Args:
        op: a key of :data:`BACKENDS`.
        backend: ``"auto"`` or a backend name.
        device: the device of the op's tensors.
        shape: sizes the kernels' limits are checked against (e.g. ``{"N": 70000, "C": 3, "masked": False}``).
        order: overrides the ``"auto"`` preference (:data:`AUTO_ORDER`) for this call.

    Raises:
        ValueError: unknown backend, or an explicit backend that cannot take this device or shape.
        ImportError: an explicit backend whose package is not installed (the message says what to install).
    """
    choices = BACKENDS.get(op)
    if choices is None:
        raise ValueError(f"unknown op {op!r}; choose one of {sorted(BACKENDS)}")
    reference = next(iter(choices))
    if backend == "auto" and is_tracing():
        return reference  # FX / dynamo / export follow plain tensor code; a compiled extension or numpy would break it
    device = torch.device(device)  # after the tracing check: under FX a tensor's .device is a proxy
    if backend == "auto":
        for name in order if order is not None else AUTO_ORDER.get((op, device.type), (reference,)):
            b = choices[name]
            if b.exact and b.installed() and b.unsupported(device, shape) is None:
                return name
        return reference
    if backend not in choices:
        raise ValueError(f"unknown backend {backend!r} for {op}; choose one of {['auto', *choices]}")
    b = choices[backend]
    if not b.installed():
        raise ImportError(f"backend {backend!r} of {op} is not installed; install {INSTALL_HINTS[b.package]}")
    why = b.unsupported(device, shape)
    if why is not None:
        raise ValueError(f"{why}; use backend='auto' to pick one that can")
    return backend
