"""Input validation shared by the public ops of :mod:`attention` (and by the models built on them).

Every public op checks its inputs once at the edge and raises a ``ValueError`` / ``TypeError`` that names what was
expected and what came. The finiteness check is one reduction over the input; hot loops that have already validated
their data can switch all checks off with :func:`set_input_checks` or the :func:`input_checks` context manager.

Checks are eager-mode only: :func:`checks_active` is False while FX, TorchScript, ``torch.jit.trace``, dynamo
(``torch.compile``) or ``torch.export`` trace a model, so no data-dependent check (``isfinite`` reductions, host
syncs) and no read of the process-global switch ends up in a traced graph; and while a CUDA graph is being captured
(``torch.cuda.graph``, ``torch.cuda.make_graphed_callables``), where reading a value back is not permitted. Validate a
model's input in eager mode (e.g. ``model.check_inputs``) before exporting or capturing it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import Tensor

__all__ = [
    "check_heads",
    "check_index",
    "check_mask",
    "check_points",
    "check_seq",
    "checks_active",
    "input_checks",
    "input_checks_enabled",
    "is_compiling",
    "is_tracing",
    "set_input_checks",
]

_ENABLED = True

# torch >= 2.12 splits FX symbolic tracing from export tracing (is_fx_tracing covers both and warns); older torch
# has only is_fx_tracing.
_is_fx_tracing = (
    getattr(torch.fx._symbolic_trace, "is_fx_symbolic_tracing", None) or torch.fx._symbolic_trace.is_fx_tracing
)


def set_input_checks(enabled: bool) -> None:
    """Turns the validation of inputs (ranks, dtypes, NaN/Inf, devices) of every public op on or off."""
    global _ENABLED
    _ENABLED = bool(enabled)


def input_checks_enabled() -> bool:
    """The process-wide switch of :func:`set_input_checks` (eager mode; see :func:`checks_active`)."""
    return _ENABLED


def is_tracing() -> bool:
    """True while FX, ``torch.jit.trace``, dynamo (``torch.compile``) or ``torch.export`` trace the caller."""
    return _is_fx_tracing() or torch.jit.is_tracing() or torch.compiler.is_compiling() or torch.compiler.is_exporting()


def is_compiling() -> bool:
    """True while ``torch.compile`` traces the caller, and neither ``torch.export``, FX nor ``torch.jit.trace`` does:
    the one tracer whose graph may hold the package's kernel operators (:mod:`attention.kernels.ops`)."""
    return torch.compiler.is_compiling() and not _exporting() and not _is_fx_tracing() and not torch.jit.is_tracing()


def _exporting() -> bool:
    # the flag torch.compiler.is_exporting() returns: dynamo reads it as it traces, where torch 2.11 folds the call
    # itself to True under torch.compile too
    flag = getattr(torch.compiler, "_is_exporting_flag", None)
    return torch.compiler.is_exporting() if flag is None else flag


def _capturing() -> bool:
    """Whether the current CUDA stream is capturing a graph (False before CUDA is initialized, e.g. on a CPU)."""
    return torch.cuda.is_initialized() and torch.cuda.is_current_stream_capturing()


def checks_active() -> bool:
    """Whether a layer's forward should validate its inputs now: the switch is on, nothing is tracing it and no CUDA
    graph is being captured.

    Callers guard with ``if not torch.jit.is_scripting() and checks_active():`` so TorchScript skips the check too.
    """
    return _ENABLED and not is_tracing() and not _capturing()


@contextlib.contextmanager
def input_checks(enabled: bool) -> Iterator[None]:
    """Context manager form of :func:`set_input_checks`; restores the previous setting on exit."""
    previous = _ENABLED
    set_input_checks(enabled)
    try:
        yield
    finally:
        set_input_checks(previous)


def _check_batched(x: Tensor, name: str, axis: str, channels: int | None) -> bool:
    """The part :func:`check_points` and :func:`check_seq` share: ``x`` is a floating ``(B, <axis>, C)`` tensor (C =
    ``channels`` if given). The type is always checked; False (nothing more to check) while checks are off."""
    if not isinstance(x, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of shape (B, {axis}, C), got {type(x).__name__}")
    if not checks_active():
        return False
    expected = f"(B, {axis}, {channels})" if channels is not None else f"(B, {axis}, C)"
    if x.dim() != 3:
        raise ValueError(f"{name} must be {expected}, got a {x.dim()}-d tensor of shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating point tensor (float32, float16, bfloat16, float64), got {x.dtype}")
    if channels is not None and x.shape[-1] != channels:
        raise ValueError(f"{name} must be {expected}, got shape {tuple(x.shape)}")
    return True


def check_points(
    x: Tensor,
    name: str,
    *,
    channels: int | None = None,
    min_points: int = 1,
    like: Tensor | None = None,
    like_name: str = "",
) -> None:
    """Checks that ``x`` is a finite floating ``(B, N, C)`` tensor.

    Args:
        x: the tensor to check.
        name: its argument name, used in messages.
        channels: the required size of the last dim, if any.
        min_points: the smallest acceptable N.
        like: another tensor whose batch size, channel count and device ``x`` must match.
        like_name: the argument name of ``like``.
    """
    if not _check_batched(x, name, "N", channels):
        return
    if x.shape[1] < min_points:
        what = "an empty point set" if x.shape[1] == 0 else f"{x.shape[1]} points"
        raise ValueError(f"{name} must hold at least {min_points} point(s) per batch element, got {what}")
    if x.shape[0] == 0:
        raise ValueError(f"{name} must have a batch size of at least 1, got shape {tuple(x.shape)}")
    if like is not None:
        if x.device != like.device:
            raise ValueError(f"{name} is on {x.device} but {like_name} is on {like.device}: move both to one device")
        if x.shape[0] != like.shape[0]:
            raise ValueError(
                f"{name} and {like_name} must have the same batch size, got {x.shape[0]} and {like.shape[0]}"
            )
        if x.shape[-1] != like.shape[-1]:
            raise ValueError(
                f"{name} and {like_name} must have the same channel count C, got {x.shape[-1]} and {like.shape[-1]}"
            )
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or Inf values; clean or mask them before calling")


def check_heads(dim: int, num_heads: int, name: str = "dim") -> None:
    """Checks, when a layer is built, that ``num_heads`` is at least 1 and divides the channel count ``dim`` (whose
    argument name is ``name``)."""
    if num_heads < 1 or dim % num_heads:
        raise ValueError(f"num_heads must be >= 1 and {name}={dim} divisible by it, got num_heads={num_heads}")


def check_seq(x: Tensor, name: str, *, channels: int | None = None, max_len: int | None = None) -> None:
    """Checks that ``x`` is a floating ``(B, L, C)`` token sequence with at least one token.

    Args:
        x: the tensor to check.
        name: its argument name, used in messages.
        channels: the required C, if any.
        max_len: the longest L the caller supports, if any.
    """
    if not _check_batched(x, name, "L", channels):
        return
    if x.shape[1] < 1:
        raise ValueError(f"{name} must hold at least one token, got shape {tuple(x.shape)}")
    if max_len is not None and x.shape[1] > max_len:
        raise ValueError(f"sequence length L={x.shape[1]} exceeds max_len={max_len}: build the layer with a larger one")


def check_mask(
    mask: Tensor | None,
    name: str,
    *,
    batch: int,
    length: int,
    device: torch.device | None = None,
    like_name: str = "",
    nonempty: str = "",
) -> None:
    """Checks that ``mask`` (True = real entry) is a bool ``(batch, length)`` tensor on ``device``; None passes.

    Args:
        mask: the mask to check, or None.
        name: its argument name, used in messages.
        batch: B.
        length: the size of the masked axis (N points, L tokens).
        device: the device of the data it masks, if it must match.
        like_name: the argument name of that data, used in messages.
        nonempty: what a row holds (e.g. ``"cloud"``): if given, every row must keep at least one True entry (a
            reduction and a host sync).
    """
    if mask is None:
        return
    if not isinstance(mask, Tensor):
        raise TypeError(f"{name} must be a bool torch.Tensor of shape ({batch}, {length}), got {type(mask).__name__}")
    if not checks_active():
        return
    if mask.shape != (batch, length) or mask.dtype != torch.bool:
        matching = f" matching {like_name}" if like_name else ""
        raise ValueError(
            f"{name} must be a bool tensor of shape ({batch}, {length}){matching}, got {mask.dtype} {tuple(mask.shape)}"
        )
    if device is not None and mask.device != device:
        raise ValueError(f"{name} is on {mask.device} but {like_name or 'the data'} is on {device}")
    if nonempty and not bool(mask.any(1).all()):
        raise ValueError(f"every {nonempty} needs at least one real entry; {name} has an all-False row")


def check_index(
    idx: Tensor,
    name: str,
    *,
    batch: int,
    device: torch.device,
    shape: tuple[int | str, ...] | None = None,
    dims: str = "",
    bound: int | None = None,
    of: str = "",
) -> None:
    """Checks that ``idx`` is an integer index tensor with a leading batch dim ``batch`` on ``device``.

    Args:
        idx: the tensor to check.
        name: its argument name, used in messages.
        batch: B, the size of its first dim.
        device: the device of the data it indexes.
        shape: its full shape, if fixed: ints, or a letter for a free dim (``(B, M, "K")``); ``dims`` names the dims
            for the message (``"(B, M, K)"``).
        bound: if given, every index must lie in ``[0, bound)`` (a reduction and a host sync); ``of`` says what it
            indexes for the message (``"N=10 inputs"``).
    """
    if not isinstance(idx, Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of integer indices, got {type(idx).__name__}")
    if not checks_active():
        return
    if shape is not None and (
        idx.dim() != len(shape) or any(isinstance(n, int) and idx.shape[i] != n for i, n in enumerate(shape))
    ):
        shown = "(" + ", ".join(map(str, shape)) + ")"
        raise ValueError(f"{name} must be a {dims} = {shown} index tensor, got shape {tuple(idx.shape)}")
    if idx.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"{name} must hold int64 (or int32) indices, got {idx.dtype}")
    if idx.dim() < 1 or idx.shape[0] != batch:
        raise ValueError(f"{name} must have the batch size {batch} as its first dim, got shape {tuple(idx.shape)}")
    if idx.device != device:
        raise ValueError(f"{name} is on {idx.device} but the data is on {device}: move both to one device")
    if bound is not None and idx.numel() and (int(idx.min()) < 0 or int(idx.max()) >= bound):
        raise ValueError(f"{name} must index the {of}, got values in [{int(idx.min())}, {int(idx.max())}]")
