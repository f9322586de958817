"""The one training harness shared by the CLIs: config loading, the epoch loop, checkpoints, logging and DDP.

Nothing here is specific to point clouds, capsules or images. A CLI (``tools/train_*.py``) loads its config
dataclass with :func:`load_config`, calls :func:`setup_logging` and :func:`init_distributed`, builds its model,
optimizer and loaders, and hands them to :class:`Trainer` with a ``loss_fn`` and an ``evaluate_fn``; the run folder
then holds ``config.yaml``, ``log.jsonl``, ``tb/``, ``last.pt``, ``best.pt`` and ``final_metrics.json``, and
``Trainer.fit(resume="auto")`` continues a killed run bit for bit.
"""

from engine.atomic import atomic_open, atomic_write_text
from engine.checkpoint import (
    CheckpointError,
    get_rng_state,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
    set_rng_state,
)
from engine.config import (
    add_config_args,
    config_from_args,
    config_to_dict,
    load_config,
    load_yaml_with_base,
    parse_overrides,
    save_config,
)
from engine.distributed import DistributedContext, init_distributed, resolve_device, unwrap, wrap_ddp
from engine.logger import RunLogger, TqdmHandler, setup_logging, to_jsonable
from engine.stats import count_gmacs, count_params
from engine.trainer import TIMING_KEYS, NonFiniteLossError, Trainer, derive_seed, epoch_lr_schedule, to_device

__all__ = [
    "TIMING_KEYS",
    "CheckpointError",
    "DistributedContext",
    "NonFiniteLossError",
    "RunLogger",
    "TqdmHandler",
    "Trainer",
    "add_config_args",
    "atomic_open",
    "atomic_write_text",
    "config_from_args",
    "config_to_dict",
    "count_gmacs",
    "count_params",
    "derive_seed",
    "epoch_lr_schedule",
    "get_rng_state",
    "init_distributed",
    "load_checkpoint",
    "load_config",
    "load_yaml_with_base",
    "parse_overrides",
    "resolve_device",
    "resolve_resume",
    "save_checkpoint",
    "save_config",
    "set_rng_state",
    "setup_logging",
    "to_device",
    "to_jsonable",
    "unwrap",
    "wrap_ddp",
]
