"""The Triton kernels' launches as PyTorch operators, ``torch.ops.attention.<name>``, declared without importing triton.

An operator with a fake implementation (shapes and dtypes only) is one opaque call to ``torch.compile``: a compiled
model keeps the fused kernels while inductor fuses the element-wise ops around them, where dynamo would otherwise
have to trace each launch. :mod:`attention.backends` marks these kernels ``traceable``, so ``"auto"`` keeps them under
``torch.compile`` (not under FX or ``torch.export``, whose graphs stay plain aten ops that every exporter reads). A
dispatch-level counter (:func:`measure.bench.count_aten_ops`, a FLOP counter) sees each launch as one op.

Each implementation imports its kernel module, and with it triton, on its first call; the autograd Functions and
public wrappers live in the kernel modules (``attention.kernels.knn_attention_triton``, ``fsat_triton``,
``ssd_triton``, ``mixers_triton``, ``fps_triton``, ``knn_triton``). Tested by ``tests/attention/test_kernel_ops.py``
under Triton's interpreter (``TRITON_INTERPRET=1``, CPU tensors): ``torch.library.opcheck`` on every operator, and
inductor-compiled layers and the point model equal to eager with the kernels launched from the compiled graph.
"""

from __future__ import annotations

import importlib

import torch
from torch import Tensor

from .limits import SSD_TRITON_CHUNK

__all__ = ["fps_triton", "knn_triton"]

_LIB = torch.library.Library("attention", "FRAGMENT")  # attention.centroid.functional holds the namespace's DEF


def _declare(schema: str, module: str, function: str) -> None:
    """Declares ``attention::<schema>``, run by ``attention.kernels.<module>.<function>`` (imported on first use)."""
    name = schema.split("(", 1)[0]
    _LIB.define(schema)

    def impl(*args: object) -> object:
        return getattr(importlib.import_module(f"attention.kernels.{module}"), function)(*args)

    _LIB.impl(name, impl, "CompositeExplicitAutograd")


def _fake(name: str):
    return torch.library.register_fake(f"attention::{name}", lib=_LIB)


# -------------------------------------------------------------------------------------------------------------------
# Point ops (no gradient: indices)
# -------------------------------------------------------------------------------------------------------------------

_declare("fps_triton(Tensor x, int num_samples, Tensor start, Tensor? mask) -> Tensor", "fps_triton", "fps_triton")
_declare("knn_triton(Tensor query, Tensor ref, int k, Tensor? mask) -> (Tensor, Tensor)", "knn_triton", "knn_triton")


@_fake("fps_triton")
def _fps_fake(x: Tensor, num_samples: int, start: Tensor, mask: Tensor | None) -> Tensor:
    return x.new_empty(x.shape[0], num_samples, dtype=torch.long)


@_fake("knn_triton")
def _knn_fake(query: Tensor, ref: Tensor, k: int, mask: Tensor | None) -> tuple[Tensor, Tensor]:
    B, M = query.shape[:2]
    return query.new_empty(B, M, k, dtype=torch.float32), query.new_empty(B, M, k, dtype=torch.long)


def fps_triton(x: Tensor, num_samples: int, start: Tensor, mask: Tensor | None) -> Tensor:
    """``backend="triton"`` of :func:`attention.fps` (the switchboard's signature): ``(B, M)`` int64 indices."""
    return torch.ops.attention.fps_triton(x.detach(), num_samples, start, mask)


def knn_triton(
    query: Tensor, ref: Tensor, k: int, mask: Tensor | None = None, chunk_bytes: int | None = None
) -> tuple[Tensor, Tensor]:
    """``backend="triton"`` of :func:`attention.knn` (the switchboard's signature; ``chunk_bytes`` unused: the kernel
    holds no distance matrix): ``(dist, idx)``, ``(B, M, k)`` float32 squared distances and int64 indices."""
    return torch.ops.attention.knn_triton(query.detach(), ref.detach(), k, mask)


# -------------------------------------------------------------------------------------------------------------------
# KNN centroid attention (.knn_attention_triton)
# -------------------------------------------------------------------------------------------------------------------

_declare(
    "knn_attention_triton_fwd(Tensor q, Tensor k, Tensor v, Tensor idx, Tensor? mask, int? block_k, int? block_h) "
    "-> (Tensor, Tensor, Tensor)",
    "knn_attention_triton",
    "launch_forward",
)
_declare(
    "knn_attention_triton_bwd(Tensor q, Tensor k, Tensor v, Tensor idx, Tensor? mask, Tensor out32, Tensor g, "
    "Tensor lse, int? block_k, int? block_h) -> (Tensor, Tensor, Tensor)",
    "knn_attention_triton",
    "launch_backward",
)


@_fake("knn_attention_triton_fwd")
def _knn_attention_fwd_fake(q, k, v, idx, mask, block_k, block_h) -> tuple[Tensor, Tensor, Tensor]:
    B, H, M, D = q.shape
    low = q.dtype != torch.float32
    out32 = q.new_empty(B, M, H, D, dtype=torch.float32).transpose(1, 2) if low else q.new_empty(0, dtype=torch.float32)
    return q.new_empty(B, M, H, D).transpose(1, 2), q.new_empty(B, H, M, dtype=torch.float32), out32


@_fake("knn_attention_triton_bwd")
def _knn_attention_bwd_fake(q, k, v, idx, mask, out32, g, lse, block_k, block_h) -> tuple[Tensor, Tensor, Tensor]:
    B, H, M, D = q.shape
    dk, dv = (t.new_empty(B, k.shape[2], H, D).transpose(1, 2) for t in (k, v))
    return q.new_empty(B, M, H, D).transpose(1, 2), dk, dv


# -------------------------------------------------------------------------------------------------------------------
# FSAT's edge attention (.fsat_triton), on (B, H, L, D) rows of any strides
# -------------------------------------------------------------------------------------------------------------------

_declare(
    "fsat_edges_fwd(Tensor q, Tensor k, Tensor v, Tensor conf, Tensor crow, Tensor order, int? block) "
    "-> (Tensor, Tensor)",
    "fsat_triton",
    "launch_forward",
)
_declare(
    "fsat_edges_bwd(Tensor q, Tensor k, Tensor v, Tensor idx, Tensor conf, Tensor lse, Tensor delta, Tensor do, "
    "bool truncate, int? block) -> (Tensor, Tensor, Tensor, Tensor)",
    "fsat_triton",
    "launch_backward",
)


def _rows_like(q: Tensor, dtype: torch.dtype) -> Tensor:
    B, H, L, D = q.shape  # fsat_triton.rows_like: (B, H, L, D) laid out as (B, L, H, D)
    return q.new_empty(B, L, H, D, dtype=dtype).transpose(1, 2)


@_fake("fsat_edges_fwd")
def _fsat_fwd_fake(q, k, v, conf, crow, order, block) -> tuple[Tensor, Tensor]:
    return _rows_like(q, v.dtype), q.new_empty(q.shape[:3].numel(), dtype=torch.float32)


@_fake("fsat_edges_bwd")
def _fsat_bwd_fake(q, k, v, idx, conf, lse, delta, do, truncate, block) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    return _rows_like(q, torch.float32), _rows_like(k, k.dtype), _rows_like(v, v.dtype), conf.new_empty(conf.shape)


# -------------------------------------------------------------------------------------------------------------------
# Hydra's quasiseparable scan (.ssd_triton): both directions per launch
# -------------------------------------------------------------------------------------------------------------------

_declare(
    "ssd_scan_fwd(Tensor c, Tensor b, Tensor v, Tensor log_a, int? chunk) -> (Tensor, Tensor, Tensor)",
    "ssd_triton",
    "launch_forward",
)
_declare(
    "ssd_scan_bwd(Tensor c, Tensor b, Tensor v, Tensor log_a, Tensor states, Tensor tot, Tensor dy, int? chunk) "
    "-> (Tensor, Tensor, Tensor)",
    "ssd_triton",
    "launch_backward",
)


def _ssd_chunks(L: int, chunk: int | None) -> int:
    T = chunk or SSD_TRITON_CHUNK
    return (L + T - 1) // T


@_fake("ssd_scan_fwd")
def _ssd_fwd_fake(c, b, v, log_a, chunk) -> tuple[Tensor, Tensor, Tensor]:
    _, B, H, L, N = c.shape
    nc, f32 = _ssd_chunks(L, chunk), torch.float32
    z = v.new_empty(2, B, H, L, v.shape[-1], dtype=f32)
    return v.new_empty(2, B * H, nc, N, v.shape[-1], dtype=f32), v.new_empty(2, B * H, nc, dtype=f32), z


@_fake("ssd_scan_bwd")
def _ssd_bwd_fake(c, b, v, log_a, states, tot, dy, chunk) -> tuple[Tensor, Tensor, Tensor]:
    return c.new_empty(c.shape), b.new_empty(b.shape), v.new_empty(2, *v.shape, dtype=torch.float32)


# -------------------------------------------------------------------------------------------------------------------
# The Cauchy and Vandermonde mixers (.mixers_triton)
# -------------------------------------------------------------------------------------------------------------------

_declare(
    "structured_mix_fwd(Tensor x, Tensor y, Tensor v, float f, int kind, int? block_m, int? block_n) -> Tensor",
    "mixers_triton",
    "launch_forward",
)
_declare(
    "structured_mix_bwd(Tensor x, Tensor y, Tensor v, Tensor g, float f, int kind, int? block_m, int? block_n) "
    "-> (Tensor, Tensor, Tensor)",
    "mixers_triton",
    "launch_backward",
)


@_fake("structured_mix_fwd")
def _mix_fwd_fake(x, y, v, f, kind, block_m, block_n) -> Tensor:
    return torch.empty_like(v)


@_fake("structured_mix_bwd")
def _mix_bwd_fake(x, y, v, g, f, kind, block_m, block_n) -> tuple[Tensor, Tensor, Tensor]:
    return torch.empty_like(x), torch.empty_like(y), torch.empty_like(v)
