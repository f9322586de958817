"""The backend switchboard: which optional packages are installed, what each fast kernel supports, and one resolver.

Every op with fast paths (FPS, KNN, Chamfer, the Cauchy / Vandermonde mixers, FSAT's edge products, Hydra's scan,
the KNN attention's form) has a plain PyTorch reference and optional backends. Each backend is declared once here
(:class:`Backend`): the callable that runs it (imported when it first runs), the package it needs, the devices it
runs on, whether its result is exact (identical to the reference), the shapes it supports (limits read from the
kernel module, :mod:`attention.kernels.limits`) and, apart from those hard limits, the shapes where ``"auto"``
prefers it. :func:`resolve` is the only code that orders or rejects backends; callers pass the shape and ask:

* ``"auto"`` walks the op's per-device order (:data:`AUTO_ORDER`) and takes the first *exact* backend that is
  installed, runs on the device, supports the shape and prefers it; the list's last entry takes every shape. A backend
  enters an order only once a bench has timed it on that device (``tools/bench_points.py``, ``tools/bench_centroid.py``,
  ``tools/bench_modelnet.py``; ``docs/benchmarks.md``): pytorch3d, timed on CPU by ``tools/bench_points.py`` but not
  clearly faster at any of the models' sizes, and never timed on CUDA, is explicit only.
* while ``torch.compile`` traces the caller, ``"auto"`` walks the same order but takes only *traceable* backends
  (plain tensor code, or a Triton kernel run as an operator of :mod:`attention.kernels.ops`, which the compiled graph
  calls as one opaque op); while FX or ``torch.export`` trace it, ``"auto"`` is the reference (plain tensor code);
* an explicit name runs that backend or raises: ``ImportError`` (with the install hint) when its package is missing,
  ``ValueError`` naming the limit when it cannot take the device or the shape (never a silent fallback).

Optional packages are probed once at import with ``importlib.util.find_spec`` (nothing is imported until a backend
runs), like PyG's ``torch_geometric.typing``. The exception is pytorch3d, whose compiled extension is built against
one torch release: a wheel that ``find_spec`` finds may not load with the installed torch (an undefined symbol), so
where it is found its probe imports the extension (``pytorch3d._C``, a few milliseconds); one that fails leaves the
backend unavailable, and the error it raised is in :data:`LOAD_ERRORS` and in what :func:`resolve` raises.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType

import torch

from .checks import is_compiling, is_tracing
from .kernels import ops as _kernel_ops  # noqa: F401  (declares the kernels' operators, torch.ops.attention.*)
from .kernels.limits import (
    FPS_TRITON_MAX_CHANNELS,
    FPS_TRITON_MAX_POINTS,
    FSAT_TRITON_MAX_HEAD_DIM,
    KNN_ATTN_TRITON_MAX_HEAD_DIM,
    KNN_TRITON_MAX_NEIGHBORS,
    MIX_TRITON_MAX_HEAD_DIM,
    SSD_TRITON_MAX_DIM,
)

__all__ = [
    "AUTO_ORDER",
    "BACKENDS",
    "HAS_FPSAMPLE",
    "HAS_MAMBA_SSM",
    "HAS_NUMBA",
    "HAS_PYTORCH3D",
    "HAS_TORCH_CLUSTER",
    "HAS_TRITON",
    "INSTALLED",
    "INSTALL_HINTS",
    "LOAD_ERRORS",
    "MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR",
    "Backend",
    "available",
    "backend_names",
    "load_error",
    "resolve",
]


def load_error(package: str, extension: str) -> str | None:
    """Why the compiled ``extension`` of the installed ``package`` does not load (None when it loads or when the package
    is not installed): the import's own message, e.g. the undefined symbol of a wheel built against another torch."""
    if importlib.util.find_spec(package) is None:
        return None
    try:
        importlib.import_module(extension)
    except (ImportError, OSError) as e:  # OSError: a shared library it needs is missing
        return f"{type(e).__name__}: {e}"
    return None


# package -> the error its compiled extension raised when imported: found by find_spec, but it does not load
LOAD_ERRORS: dict[str, str] = {
    package: error
    for package, extension in (("pytorch3d", "pytorch3d._C"),)
    if (error := load_error(package, extension)) is not None
}

HAS_TORCH_CLUSTER = importlib.util.find_spec("torch_cluster") is not None
# found and its extension loads (easypytorch3d's wheel loads with torch 2.11 and 2.12 only: docs/gpu.md)
HAS_PYTORCH3D = importlib.util.find_spec("pytorch3d") is not None and "pytorch3d" not in LOAD_ERRORS
HAS_TRITON = importlib.util.find_spec("triton") is not None
HAS_FPSAMPLE = importlib.util.find_spec("fpsample") is not None
HAS_NUMBA = importlib.util.find_spec("numba") is not None
HAS_MAMBA_SSM = importlib.util.find_spec("mamba_ssm") is not None

INSTALL_HINTS = {
    "torch_cluster": "torch-cluster: `pip install --no-build-isolation torch-cluster` after torch (or `pip install "
    "--no-build-isolation -e '.[cluster]'`); tools/bootstrap.sh does it",
    "pytorch3d": "pytorch3d: on torch 2.11 (or 2.12) with CPython 3.11 on Linux x86-64, `pip install "
    "easypytorch3d==0.7.9.post1` (a prebuilt wheel that imports as pytorch3d; tools/bootstrap.sh installs it where the "
    "constraints pin it, constraints-torch211.txt); for another torch, build pytorch3d from source (its INSTALL.md)",
    "triton": "triton (installed with CUDA builds of torch) and a CUDA device",
    "fpsample": "fpsample: `pip install fpsample` (or `pip install -e '.[fps]'`)",
    "numba": "numba: `pip install numba` (or `pip install -e '.[fps]'`)",
    "mamba_ssm": "mamba-ssm: `pip install --no-build-isolation mamba-ssm` (CUDA only; it compiles against your torch)",
}

# package -> installed, probed once (tests may override an entry to exercise a dispatch path)
INSTALLED: dict[str | None, bool] = {
    None: True,
    "torch_cluster": HAS_TORCH_CLUSTER,
    "pytorch3d": HAS_PYTORCH3D,
    "triton": HAS_TRITON,
    "fpsample": HAS_FPSAMPLE,
    "numba": HAS_NUMBA,
    "mamba_ssm": HAS_MAMBA_SSM,
}

Shape = Mapping[str, object]


def _triton_interpreted() -> bool:
    """Whether Triton's interpreter is on (``TRITON_INTERPRET=1``, read by triton when it is imported): its kernels
    then run on CPU tensors, which is how CI runs them without a GPU."""
    return os.environ.get("TRITON_INTERPRET", "").lower() in ("1", "true", "on", "yes")


@dataclass(frozen=True)
class Backend:
    """One backend of one op: its callable, what it needs, what it supports, and where ``"auto"`` prefers it.

    Attributes:
        op: the op (``"fps"``, ``"knn"``, ``"chamfer"``, ``"cauchy_mix"``, ``"vandermonde_mix"``, ``"fsat_edges"``,
            ``"quasiseparable_mix"``, ``"knn_attention"``).
        name: the backend name users pass (``backend="cluster"``).
        impl: the callable, as ``"module:function"`` (imported when it first runs, so that importing
            :mod:`attention` imports no optional package) or the callable itself. FPS and KNN, whose backends share
            a signature, call it through :meth:`load`; the other ops' callers branch on the resolved name (their
            backends take different arguments, or FX must see each form's function as a leaf), and None marks an
            entry whose callable lives in the calling package (Chamfer's, in ``capsules``).
        package: the optional package it imports, or None (plain torch).
        devices: device types it runs on.
        exact: True when its result equals the reference's (same indices / values up to rounding); ``"auto"`` picks
            only exact backends.
        limits: shape key -> largest supported value (e.g. ``{"N": 65536, "C": 8}``), read from the kernel module;
            a shape over a limit is skipped by ``"auto"`` and refused when the backend is explicit.
        check: a further requirement, ``check(shape, dtype)`` -> why the backend cannot run, or None.
        prefer: ``"auto"`` only: ``prefer(shape, dtype)`` -> whether auto takes this backend for that shape (where a
            bench found it faster); an explicit request ignores it.
        interpreted: a Triton kernel, which also runs CPU tensors under Triton's interpreter (``TRITON_INTERPRET=1``).
        traceable: ``torch.compile`` follows it (plain tensor code dynamo traces, or a kernel launched through an
            operator of :mod:`attention.kernels.ops`); default: no optional package. Under ``torch.compile`` ``"auto"``
            takes only traceable backends.
    """

    op: str
    name: str
    impl: str | Callable | None = None
    package: str | None = None
    devices: tuple[str, ...] = ("cpu", "cuda")
    exact: bool = True
    limits: Mapping[str, int] = field(default_factory=dict)
    check: Callable[[Shape, torch.dtype | None], str | None] | None = None
    prefer: Callable[[Shape, torch.dtype | None], bool] | None = None
    interpreted: bool = False
    traceable: bool | None = None

    def installed(self) -> bool:
        return INSTALLED[self.package]

    def runs_on(self, device: torch.device | str) -> bool:
        kind = torch.device(device).type
        return kind in self.devices or (self.interpreted and kind == "cpu" and _triton_interpreted())

    def unsupported(
        self, device: torch.device | str, shape: Shape | None = None, dtype: torch.dtype | None = None
    ) -> str | None:
        """Why this backend cannot run on ``device`` for ``shape`` and ``dtype``, or None when it can."""
        device = torch.device(device)
        if not self.runs_on(device):
            also = " (CPU tensors under TRITON_INTERPRET=1, set before triton is imported)" if self.interpreted else ""
            return (
                f"backend {self.name!r} of {self.op} runs on {'/'.join(self.devices)}{also}, got a {device.type} tensor"
            )
        for key, limit in self.limits.items():
            value = (shape or {}).get(key)
            if value is not None and value > limit:
                return f"backend {self.name!r} of {self.op} supports {key} <= {limit}, got {key}={value}"
        if self.check is not None and shape is not None:
            return self.check(shape, dtype)
        return None

    def supports(
        self, device: torch.device | str, shape: Shape | None = None, dtype: torch.dtype | None = None
    ) -> bool:
        """Whether this backend can run on ``device`` for ``shape`` and ``dtype`` (installation aside)."""
        return self.unsupported(device, shape, dtype) is None

    def preferred(self, shape: Shape | None = None, dtype: torch.dtype | None = None) -> bool:
        """Whether ``"auto"`` takes this backend for ``shape`` and ``dtype`` (given that it supports them)."""
        return self.prefer is None or (shape is not None and self.prefer(shape, dtype))

    def compiles(self) -> bool:
        """Whether ``torch.compile`` follows this backend (:attr:`traceable`, by default: it needs no package)."""
        return self.package is None if self.traceable is None else self.traceable

    def load(self) -> Callable:
        """The callable that runs this backend (its module is imported on the first call)."""
        if self.impl is None:
            raise TypeError(f"backend {self.name!r} of {self.op} is run by its caller, not through load()")
        if callable(self.impl):
            return self.impl
        module, name = self.impl.split(":")
        if is_compiling():  # no cache lookup to guard on: the compiled code holds the callable
            return getattr(_import(module), name)
        fn = _LOADED.get(self.impl)
        if fn is None:
            fn = _LOADED[self.impl] = getattr(_import(module), name)
        return fn


_LOADED: dict[str, Callable] = {}


def _import(module: str) -> ModuleType:
    """The module ``module``, imported if it was not. The kernel modules import triton, so they load on a backend's
    first call, which may be a compiled model's first call: there dynamo runs an import statement while it traces, but
    ``importlib`` is a graph break, and one inside a loop (a centroid layer's T steps) runs the whole frame eagerly."""
    if module == "attention.kernels.knn_attention_triton":
        from .kernels import knn_attention_triton as loaded
    elif module == "attention.kernels.fsat_triton":
        from .kernels import fsat_triton as loaded
    elif module == "attention.kernels.ssd_triton":
        from .kernels import ssd_triton as loaded
    elif module == "attention.kernels.mixers_triton":
        from .kernels import mixers_triton as loaded
    else:  # the package's own modules (imported with it, found in sys.modules by dynamo) and optional packages
        loaded = sys.modules.get(module) or importlib.import_module(module)
    return loaded


# --------------------------------------------------------------------------------------------------------------------
# Shape requirements and "auto" preferences (each from a bench, docs/benchmarks.md)
# --------------------------------------------------------------------------------------------------------------------

# The numba FPS prunes with a kd-tree, which skips most of a cloud in low dimensions only: faster than the reference
# for coordinates, not reliably from C = 8 up, so "auto" uses it for coordinates only: tools/bench_points.py.
FPS_NUMBA_AUTO_MAX_DIM = 4

# torch_cluster's CPU kd-tree beats the brute-force reference only in low dimensions, so "auto" uses it (for KNN and
# for Chamfer's search) for coordinates only: tools/bench_points.py times it for C = 3 and C = 64.
KNN_CLUSTER_AUTO_MAX_DIM = 4

# Chamfer on CPU: "auto" uses the dense reference while its (B, N, M, C) difference tensor stays below this many bytes.
CHAMFER_DENSE_AUTO_BYTES = 2 * 2**20

# "auto" takes the masked form of the KNN attention (where AUTO_ORDER lists it: CUDA) while a stage's inputs per
# neighbour N / K is at most this: the masked form does N / K times the gather form's attention work, but as large
# matrix products instead of gathers. Timed for normalize="inputs" ("centroids" keeps several dense (B, H, M, N)
# tensors): tools/bench_centroid.py, knn against knn-masked.
MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR = 128


def _numba_fps_preferred(shape: Shape, dtype: torch.dtype | None) -> bool:
    return shape.get("C", 0) <= FPS_NUMBA_AUTO_MAX_DIM


def _low_dimensional(shape: Shape, dtype: torch.dtype | None) -> bool:
    return shape.get("C", 0) <= KNN_CLUSTER_AUTO_MAX_DIM


def _cluster_chamfer_preferred(shape: Shape, dtype: torch.dtype | None) -> bool:
    return _low_dimensional(shape, dtype) and dtype != torch.float64  # the kd-tree searches in float32


def _small_dense_chamfer(shape: Shape, dtype: torch.dtype | None) -> bool:
    size = shape.get("B", 1) * shape.get("N", 1) * shape.get("M", 1) * shape.get("C", 1) * shape.get("itemsize", 4)
    return size <= CHAMFER_DENSE_AUTO_BYTES


def _not_float64(shape: Shape, dtype: torch.dtype | None) -> bool:
    return dtype != torch.float64  # the Triton mixers compute in float32; float64 keeps the reference's precision


def _refuse_atomic_sums(op: str, what: str) -> str | None:
    """Why the Triton kernel of ``op``, which sums ``what`` with float32 atomics in no fixed order, cannot run while
    deterministic algorithms are on (None while they are off)."""
    if torch.are_deterministic_algorithms_enabled():
        return (
            f"backend 'triton' of {op} sums {what} with float32 atomics in no fixed order, got "
            "torch.use_deterministic_algorithms(True)"
        )
    return None


def _fsat_kernel_supported(shape: Shape, dtype: torch.dtype | None) -> str | None:
    """The fused FSAT edge attention sums the queries' gradients with float32 atomics, in no fixed order."""
    return _refuse_atomic_sums("fsat_edges", "the queries' gradients")


def _separate_dt_and_a(shape: Shape, dtype: torch.dtype | None) -> str | None:
    """Mamba-2's scan takes the steps dt and the rates A apart (``exp(A dt)``, ``dt B``), which only Hydra's
    :func:`attention.mixers.functional.hydra_mix` still holds: the factored ``quasiseparable_mix`` cannot call it."""
    if not shape.get("separate_dt"):
        return (
            "backend 'mamba' of quasiseparable_mix takes Hydra's dt and A apart: use hydra_mix "
            "(MatrixMixer(matrix='hydra', backend='mamba')), not the factored quasiseparable_mix"
        )
    if dtype == torch.float64:
        return "backend 'mamba' of quasiseparable_mix takes float32, bfloat16 or float16 tensors, got float64"
    return None


def _masked_attention_preferred(shape: Shape, dtype: torch.dtype | None) -> bool:
    # N / K must be known and the neighbours distinct (the masked form counts a repeated index once), as after a KNN
    # search, or checked to be (a caller's own index may repeat one): the check runs last, when all else prefers it.
    if shape.get("normalize", "inputs") != "inputs" or shape["N"] / shape["K"] > MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR:
        return False
    return _known_distinct(shape)


def _known_distinct(shape: Shape) -> bool:
    """``shape["distinct"]``: True (a KNN search's neighbours), False (not known) or a check to run (a caller's)."""
    distinct = shape.get("distinct", False)
    return bool(distinct()) if callable(distinct) else bool(distinct)


def _masked_attention_supported(shape: Shape, dtype: torch.dtype | None) -> str | None:
    """The masked form marks each centroid's neighbours in a (B, M, N) mask, so a neighbour listed twice in a row
    counts once; the other forms count it each time. Refused when the caller's index was checked to repeat one; when
    nothing was checked (input checks off) an explicit request is taken as asked."""
    distinct = shape.get("distinct")
    if callable(distinct) and not distinct():
        return (
            "backend 'masked' of knn_attention counts a neighbour index listed twice in a row once (the others count "
            "it each time), got an idx that repeats one: use backend='gather' (or 'triton' on CUDA), which count "
            "every listed neighbour"
        )
    return None


def _fused_attention_supported(shape: Shape, dtype: torch.dtype | None) -> str | None:
    """What the fused KNN attention kernel computes: the softmax over each centroid's neighbours, without dropout,
    with gradients summed by float32 atomics (nondeterministic order)."""
    if shape.get("normalize", "inputs") != "inputs":
        return f"backend 'triton' of knn_attention supports normalize='inputs' only, got {shape['normalize']!r}"
    if shape.get("dropout", 0.0) > 0:
        return (
            "backend 'triton' of knn_attention supports dropout_p == 0 only (no attention dropout while training), "
            f"got dropout_p={shape['dropout']}"
        )
    return _refuse_atomic_sums("knn_attention", "its gradients")


def _every_cloud_has_k_real_points(shape: Shape, dtype: torch.dtype | None) -> str | None:
    """torch_cluster's and pytorch3d's KNN cannot pad missing neighbours with inf (the reference can).

    ``shape["min_real"]``: the real points of the smallest cloud, None when every point is real, or a callable that
    counts them (a host sync on CUDA, run only when this check is reached)."""
    fewest = shape.get("min_real")
    if callable(fewest):
        fewest = fewest()
    k = shape.get("k")
    if fewest is not None and k is not None and fewest < k:
        return f"this KNN backend needs k <= the real points of every cloud, got k={k} and a cloud of {fewest}"
    return None


BACKENDS: dict[str, dict[str, Backend]] = {}


def _triton_backend(op: str, target: str, limits: Mapping[str, int], **kwargs: Callable) -> Backend:
    """Backend ``"triton"`` of ``op``: a kernel of :mod:`attention.kernels` for CUDA tensors (CPU ones under Triton's
    interpreter) within its shape ``limits``; launched through :mod:`attention.kernels.ops`, so traceable."""
    return Backend(
        op, "triton", target, "triton", devices=("cuda",), limits=limits, interpreted=True, traceable=True, **kwargs
    )


def _register(*backends: Backend) -> None:
    for b in backends:
        BACKENDS.setdefault(b.op, {})[b.name] = b


_register(
    # FPS: (x (B, N, C), num_samples, start (B,), mask (B, N) or None) -> (B, M) indices
    Backend("fps", "torch", "attention.points:_fps_torch"),
    # torch-cluster's FPS is FPS, but on CUDA its rounding differs from the reference's (near-ties pick other
    # indices), and it is not faster than the torch path beyond the Triton kernel's limit (tools/bench_points.py
    # --device cuda): "auto" does not pick it.
    Backend("fps", "cluster", "attention.points:_fps_cluster", "torch_cluster", exact=False),
    # pytorch3d (where its extension loads): the reference's indices; timed on CPU by tools/bench_points.py, slower than
    # numba for coordinates and about the reference's time at the models' batch of 32; never timed on CUDA: explicit.
    Backend("fps", "pytorch3d", "attention.points:_fps_pytorch3d", "pytorch3d"),
    _triton_backend(
        "fps",
        "attention.kernels.ops:fps_triton",
        {"N": FPS_TRITON_MAX_POINTS, "C": FPS_TRITON_MAX_CHANNELS},
    ),
    # fpsample's plain FPS (Rust, CPU, one cloud at a time) is FPS, but its float rounding differs from the
    # reference's: near-ties resolve differently and the indices then diverge (tools/bench_points.py checks every
    # backend's indices), so it is not "exact" and "auto" does not pick it.
    Backend("fps", "fpsample", "attention.points:_fps_fpsample", "fpsample", devices=("cpu",), exact=False),
    # fpsample's bucket FPS (kd-line buckets): much faster on large clouds, but an approximation (other indices, its
    # first sample is not ``start``, coverage measured in docs/benchmarks.md); explicit only.
    Backend(
        "fps", "fpsample_bucket", "attention.points:_fps_fpsample_bucket", "fpsample", devices=("cpu",), exact=False
    ),
    # attention/kernels/fps_numba.py: exact FPS (the reference's indices) with kd-tree pruning, one cloud at a time;
    # any C, masks and lengths.
    Backend(
        "fps", "numba", "attention.kernels.fps_numba:fps_numba", "numba", devices=("cpu",), prefer=_numba_fps_preferred
    ),
    # KNN: (query (B, M, C), ref (B, N, C), k, mask (B, N) or None, chunk_bytes) -> (dist, idx) (B, M, k)
    Backend("knn", "torch", "attention.points:_knn_torch"),
    Backend(
        "knn",
        "cluster",
        "attention.points:_knn_cluster",
        "torch_cluster",
        check=_every_cloud_has_k_real_points,
        prefer=_low_dimensional,
    ),
    # pytorch3d: exact; on CPU about the reference's time for coordinates and slower in feature space (one thread per
    # batch, no matmul: tools/bench_points.py); never timed on CUDA: explicit only.
    Backend("knn", "pytorch3d", "attention.points:_knn_pytorch3d", "pytorch3d", check=_every_cloud_has_k_real_points),
    # attention/kernels/knn_triton.py: exact squared distances tile by tile with a running top-k per query in
    # registers (no distance matrix); pads missing neighbours with inf as the reference does. Timed against the
    # reference by tools/bench_points.py (KNN rows, --device cuda).
    _triton_backend("knn", "attention.kernels.ops:knn_triton", {"k": KNN_TRITON_MAX_NEIGHBORS}),
    # Chamfer (capsules.chamfer_distance, which holds the callables: capsules depends on attention, not the other way):
    # the dense reference, the chunked exact search in the inputs' precision, attention.knn's searches (float32),
    # pytorch3d's KNN (float32; on CPU faster than the chunked search at a batch of 8, slower at 32:
    # tools/bench_points.py; explicit only).
    Backend("chamfer", "dense", prefer=_small_dense_chamfer),
    Backend("chamfer", "chunked"),
    Backend("chamfer", "knn_torch"),
    Backend("chamfer", "knn_cluster", package="torch_cluster", prefer=_cluster_chamfer_preferred),
    Backend("chamfer", "pytorch3d", package="pytorch3d"),
    # The structured mixers' chunked path and their tiled Triton kernels (attention.mixers.functional branches on the
    # name: the two take different arguments).
    *(
        entry
        for op, kernel in (("cauchy_mix", "CauchyMixTriton"), ("vandermonde_mix", "VandermondeMixTriton"))
        for entry in (
            Backend(op, "torch", f"attention.mixers.functional:{op}"),
            _triton_backend(
                op,
                f"attention.kernels.mixers_triton:{kernel}",
                {"D": MIX_TRITON_MAX_HEAD_DIM, "Dv": MIX_TRITON_MAX_HEAD_DIM},
                prefer=_not_float64,
            ),
        )
    ),
    # FSAT's edge products (attention.mixers.fsat.sparse_edge_attention branches on the name)
    Backend("fsat_edges", "csr", traceable=False),  # dynamo does not trace torch.sparse's CSR tensors
    Backend("fsat_edges", "gather"),
    # attention/kernels/fsat_triton.py: the fused edge attention (edges grouped by query, online softmax, gathered rows)
    _triton_backend(
        "fsat_edges",
        "attention.kernels.fsat_triton:EdgeAttentionTriton",
        {"D": FSAT_TRITON_MAX_HEAD_DIM},
        check=_fsat_kernel_supported,
        prefer=_not_float64,
    ),
    # Hydra's scan (attention.mixers.functional.hydra_mix branches on the name): the chunked PyTorch scan, the chunked
    # SSD Triton kernels (attention/kernels/ssd_triton.py), Mamba-2's SSD kernels from mamba_ssm (explicit only)
    Backend("quasiseparable_mix", "torch", "attention.mixers.functional:quasiseparable_mix"),
    _triton_backend(
        "quasiseparable_mix",
        "attention.kernels.ssd_triton:quasiseparable_mix_triton",
        {"N": SSD_TRITON_MAX_DIM, "Dv": SSD_TRITON_MAX_DIM},
        prefer=_not_float64,
    ),
    Backend(
        "quasiseparable_mix",
        "mamba",
        "mamba_ssm.ops.triton.ssd_combined:mamba_chunk_scan_combined",
        "mamba_ssm",
        devices=("cuda",),
        check=_separate_dt_and_a,
    ),
    # attention.centroid: the KNN path as chunked gathers (memory O(B M K H) + a chunk) or as dense products under the
    # neighbour mask (O(M N) work, faster where N / K is small). The layer and centroid_attention branch on the name
    # (FX keeps each form's function as a leaf).
    Backend("knn_attention", "gather", "attention.centroid.functional:knn_centroid_attention"),
    Backend(
        "knn_attention",
        "masked",
        "attention.centroid.functional:masked_knn_attention",
        check=_masked_attention_supported,
        prefer=_masked_attention_preferred,
    ),
    # attention/kernels/knn_attention_triton.py: one fused kernel per direction, keys and values read by index, an
    # online softmax, the log-sum-exp saved for the backward pass; O(M K D) work like "gather" without its gathered
    # (rows, K, H, D) chunks, and no (B, M, N) mask like "masked". Exact up to float32 rounding (the gradients' atomic
    # sums vary in their last bits). Timed against "masked", "gather" and SDPA by tools/bench_centroid.py
    # (--device cuda, rows knn-triton) and in the point model by tools/bench_modelnet.py (rows "T=1 triton").
    _triton_backend(
        "knn_attention",
        "attention.kernels.knn_attention_triton:knn_attention_triton",
        {"D": KNN_ATTN_TRITON_MAX_HEAD_DIM},
        check=_fused_attention_supported,
        prefer=_not_float64,
    ),
)

# "auto" order per (op, device type), fastest first; each entry timed on that device by a bench (docs/benchmarks.md),
# and the last entry takes every shape (the reference, or for Chamfer the chunked search). Shape preferences sit in the
# entries' ``prefer`` above.
AUTO_ORDER: dict[tuple[str, str], tuple[str, ...]] = {
    ("fps", "cpu"): ("numba", "torch"),  # numba for coordinates (C <= FPS_NUMBA_AUTO_MAX_DIM)
    ("fps", "cuda"): ("triton", "torch"),
    ("knn", "cpu"): ("cluster", "torch"),  # the kd-tree for coordinates (C <= KNN_CLUSTER_AUTO_MAX_DIM)
    ("knn", "cuda"): ("triton", "torch"),  # k <= KNN_TRITON_MAX_NEIGHBORS
    # the dense reference for small inputs, the kd-tree for low-dimensional float32 clouds, else the chunked search
    ("chamfer", "cpu"): ("dense", "knn_cluster", "chunked"),
    ("chamfer", "cuda"): ("chunked",),
    ("cauchy_mix", "cpu"): ("torch",),
    ("cauchy_mix", "cuda"): ("triton", "torch"),  # float64 stays on the reference
    ("vandermonde_mix", "cpu"): ("torch",),
    ("vandermonde_mix", "cuda"): ("triton", "torch"),
    ("fsat_edges", "cpu"): ("csr",),  # sparse products: far faster than gathering on CPU
    # CUDA: the fused kernel for float32 / bf16 heads up to its limit (one pass over the edges, against gather's
    # chunked round trips through memory; tools/bench_mixers.py --device cuda times fsat against fsat-torch, gather),
    # then gather (CUDA's index_add is fast; csr is not measured on a GPU)
    ("fsat_edges", "cuda"): ("triton", "gather"),
    ("quasiseparable_mix", "cpu"): ("torch",),
    # the SSD kernels (a few launches over every chunk) against the chunked scan's loop over chunks; timed by
    # tools/bench_mixers.py --device cuda (hydra against hydra-torch)
    ("quasiseparable_mix", "cuda"): ("triton", "torch"),
    # "masked" can be faster on CPU at small N / K but keeps O(B H M N) memory, so CPU stays on "gather"; on CUDA the
    # fused kernel where it applies (normalize="inputs", no dropout, D <= KNN_ATTN_TRITON_MAX_HEAD_DIM, not float64),
    # else "masked" while N / K <= MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR, else "gather".
    ("knn_attention", "cpu"): ("gather",),
    ("knn_attention", "cuda"): ("triton", "masked", "gather"),
}


def backend_names(op: str) -> list[str]:
    """The backends declared for ``op`` (reference first), without ``"auto"``."""
    if op not in BACKENDS:
        raise ValueError(f"unknown op {op!r}; choose one of {sorted(BACKENDS)}")
    return list(BACKENDS[op])


def available(op: str, name: str, device: torch.device | str = "cpu") -> bool:
    """Whether backend ``name`` of ``op`` is installed and runs on ``device`` (shape limits aside)."""
    b = BACKENDS.get(op, {}).get(name)
    return b is not None and b.installed() and b.runs_on(device)


def resolve(
    op: str,
    backend: str,
    device: torch.device | str,
    shape: Shape | None = None,
    dtype: torch.dtype | None = None,
) -> str:
    """The backend that runs ``op`` for a request: the only place where backends are ordered or refused.

    Args:
        op: a key of :data:`BACKENDS`.
        backend: ``"auto"`` or a backend name.
        device: the device of the op's tensors.
        shape: sizes the kernels' limits and preferences are read from (e.g. ``{"N": 70000, "C": 3}``; each op's
            keys are those its entries read).
        dtype: the dtype of the op's tensors (some backends prefer or refuse one).

    Raises:
        ValueError: unknown backend, or an explicit backend that cannot take this device or shape (the message names
            the limit).
        ImportError: an explicit backend whose package is not installed (the message says what to install).
    """
    choices = BACKENDS.get(op)
    if choices is None:
        raise ValueError(f"unknown op {op!r}; choose one of {sorted(BACKENDS)}")
    reference = next(iter(choices))
    if backend == "auto" and is_tracing() and not is_compiling():
        return reference  # FX / export graphs hold plain aten ops; an extension, numpy or a kernel would break them
    if backend == "auto":
        device = torch.device(device)  # after the tracing check: under FX a tensor's .device is a proxy
        compiling = is_compiling()
        for name in AUTO_ORDER.get((op, device.type), (reference,)):
            b = choices[name]
            if compiling and not b.compiles():
                continue
            if b.exact and b.installed() and b.preferred(shape, dtype) and b.supports(device, shape, dtype):
                return name
        if compiling and not choices[reference].compiles():  # FSAT's csr: the first traceable entry that can run
            runnable = (
                n
                for n, b in choices.items()
                if b.compiles() and b.exact and b.installed() and b.supports(device, shape, dtype)
            )
            return next(runnable, reference)
        return reference
    if backend not in choices:
        raise ValueError(f"unknown backend {backend!r} for {op}; choose one of {['auto', *choices]}")
    b = choices[backend]
    if not b.installed():
        if b.package in LOAD_ERRORS:
            raise ImportError(
                f"backend {backend!r} of {op} is installed but does not load with torch {torch.__version__} "
                f"({LOAD_ERRORS[b.package]}); install {INSTALL_HINTS[b.package]}"
            )
        raise ImportError(f"backend {backend!r} of {op} is not installed; install {INSTALL_HINTS[b.package]}")
    if not isinstance(device, (str, torch.device)):
        return backend  # FX symbolic tracing: the device is a proxy, there is nothing to check it against
    why = b.unsupported(device, shape, dtype)
    if why is not None:
        raise ValueError(f"{why}; use backend='auto' to pick one that can")
    return backend
