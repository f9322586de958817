"""Distributed data parallel: process-group setup from torchrun's environment, and DDP wrapping.

``torchrun --nproc_per_node N tools/train_modelnet.py ...`` sets ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
``MASTER_ADDR`` and ``MASTER_PORT``; :func:`init_distributed` reads them and returns a :class:`DistributedContext`.
Without ``WORLD_SIZE`` (a plain ``python tools/...`` call) or with ``WORLD_SIZE=1`` it is a single process and no
process group is created, so every collective of the context is a cheap no-op.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

__all__ = ["DistributedContext", "init_distributed", "resolve_device", "unwrap", "wrap_ddp"]

logger = logging.getLogger(__name__)

TEARDOWN_SETTLE_S = 0.1
"""Seconds :meth:`DistributedContext.destroy` releases the GIL after destroying the group (see there)."""


@dataclass
class DistributedContext:
    """Where this process stands in a (possibly single-process) run.

    Attributes:
        rank: Global rank, 0 for the main process.
        world_size: Number of processes.
        local_rank: Rank on this machine (selects the GPU).
        device: The device this process trains on.
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def is_main(self) -> bool:
        """True on rank 0, the only rank that writes files and shows progress bars."""
        return self.rank == 0

    @property
    def is_distributed(self) -> bool:
        """True when a process group with more than one process is active."""
        return self.world_size > 1 and dist.is_available() and dist.is_initialized()

    def barrier(self) -> None:
        """Waits for all ranks (no-op in a single process)."""
        if self.is_distributed:
            if dist.get_backend() == "nccl" and self.device.type == "cuda":
                dist.barrier(device_ids=[self.device.index or 0])
            else:
                dist.barrier()

    def all_reduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        """Sums ``tensor`` over ranks in place and returns it (unchanged in a single process)."""
        if self.is_distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
        return tensor

    def all_gather_object(self, obj: Any) -> list[Any]:
        """Returns ``[obj of rank 0, obj of rank 1, ...]`` (``[obj]`` in a single process); obj must pickle."""
        if not self.is_distributed:
            return [obj]
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, obj)
        return gathered

    def destroy(self, barrier: bool = True) -> None:
        """Destroys the process group if this context created one; call it once per rank at the end of the run.

        Args:
            barrier: Meet all ranks first (the normal end of a run). Pass ``False`` after an error, when a peer may
                be stuck elsewhere and a barrier would hang until the timeout.

        Two teardown races of gloo are handled here (both show as ``terminate called without an active
        exception``, then SIGABRT at exit, after the run has finished and written its files):

        * a rank that tears down gloo while its peer still sends (e.g. while rank 0 writes its files) aborts the
          peer; the barrier keeps every rank in the group until all are done;
        * gloo's barrier work keeps the collectives still in flight when it was issued, so the tensors of the
          ``all_gather_object`` before it are freed by a gloo worker thread when that thread drops the barrier
          work, which can be after ``barrier()`` has returned. Those are Python tensors: the thread needs the GIL,
          and if the interpreter is already finalizing, the thread is killed and the process aborts. The threads
          cannot be joined here: they live as long as the group, and a ``DistributedDataParallel`` wrapper keeps
          the group alive even after the wrapper and its model are deleted and collected (torch 2.15).
          Releasing the GIL for :data:`TEARDOWN_SETTLE_S` lets the threads finish. This makes the race unlikely,
          not impossible: a thread kept off the CPU for longer can still hit it.
        """
        if self.is_distributed and dist.is_initialized():
            if barrier:
                self.barrier()
            dist.destroy_process_group()
            time.sleep(TEARDOWN_SETTLE_S)


def resolve_device(device: str | torch.device = "auto", local_rank: int = 0) -> torch.device:
    """Maps ``"auto"`` to ``cuda:<local_rank>`` when CUDA is available, else ``cpu``; ``"cuda"`` gets the index too."""
    if isinstance(device, torch.device):
        return device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        if not torch.cuda.is_available():
            raise ValueError("device='cuda' requested but CUDA is not available; use device='cpu' or 'auto'")
        return torch.device("cuda", local_rank)
    try:
        return torch.device(device)
    except RuntimeError as e:
        raise ValueError(f"device must be 'auto', 'cpu', 'cuda' or 'cuda:N', got {device!r}") from e


def _env_int(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        raise ValueError(f"WORLD_SIZE is set but {name} is not: launch with torchrun, which sets both")
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"environment variable {name} must be an integer, got {value!r}") from None


def init_distributed(device: str | torch.device = "auto", backend: str | None = None) -> DistributedContext:
    """Sets up this process from torchrun's environment variables.

    Args:
        device: ``"auto"`` (``cuda:<LOCAL_RANK>`` if available, else ``cpu``), ``"cpu"``, ``"cuda"`` or ``"cuda:N"``.
        backend: Process-group backend; default ``nccl`` on CUDA, ``gloo`` otherwise.

    Returns:
        The context. A single process (``WORLD_SIZE`` unset or 1) gets rank 0 and no process group.
    """
    world_size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world_size <= 1:
        ctx = DistributedContext(device=resolve_device(device, 0))
        if ctx.device.type == "cuda":
            torch.cuda.set_device(ctx.device)
        return ctx
    rank = _env_int("RANK")
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    dev = resolve_device(device, local_rank)
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    if backend is None:
        backend = "nccl" if dev.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend=backend, init_method="env://", rank=rank, world_size=world_size)
    logger.info("initialized process group: rank %d/%d, backend %s, device %s", rank, world_size, backend, dev)
    return DistributedContext(rank=rank, world_size=world_size, local_rank=local_rank, device=dev)


def wrap_ddp(model: nn.Module, ctx: DistributedContext, **ddp_kwargs: Any) -> nn.Module:
    """Wraps ``model`` (already on ``ctx.device``) in DDP; returns it unchanged for a single process.

    Args:
        model: The model.
        ctx: The distributed context.
        **ddp_kwargs: Passed to ``DistributedDataParallel`` (e.g. ``find_unused_parameters=True``).
    """
    if ctx.world_size <= 1 or isinstance(model, DistributedDataParallel):
        return model
    if not ctx.is_distributed:
        raise RuntimeError(f"world_size is {ctx.world_size} but no process group is initialized: use init_distributed")
    device_ids = None
    if ctx.device.type == "cuda":
        device_ids = [ctx.device.index if ctx.device.index is not None else ctx.local_rank]
    return DistributedDataParallel(model, device_ids=device_ids, **ddp_kwargs)


def unwrap(model: nn.Module) -> nn.Module:
    """Returns the module inside DDP / DataParallel / ``torch.compile`` wrappers (the one to save and evaluate)."""
    while True:
        if isinstance(model, (DistributedDataParallel, nn.DataParallel)):
            model = model.module
        elif hasattr(model, "_orig_mod") and isinstance(model._orig_mod, nn.Module):
            model = model._orig_mod
        else:
            return model
