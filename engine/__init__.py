"""The one training harness shared by the CLIs: config loading, the run orchestration, the epoch loop, checkpoints,
logging and DDP.

Nothing here is specific to point clouds, capsules or images. A recipe (:class:`Recipe`) declares the domain parts
(datasets, model, optimizer, loss, evaluation); :func:`run` does the rest, and :func:`main` is the command line every
training CLI shares (``tools/train_modelnet.py`` is ``engine.main(ModelNetRecipe)``). The run folder holds
``config.yaml``, ``log.jsonl``, ``tb/``, ``best.pt``, ``last.pt`` and ``final_metrics.json``; ``--resume auto``
continues a killed run bit for bit. Rules: :mod:`engine.rundir` (folders), :mod:`engine.checkpoint` (trust).
"""

from engine.checkpoint import (
    CheckpointError,
    check_best_agrees,
    get_rng_state,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
    set_rng_state,
    unwrap_state_dict,
)
from engine.config import (
    add_config_args,
    add_overrides_arg,
    config_from_args,
    config_to_dict,
    load_config,
    load_yaml_with_base,
    parse_overrides,
    save_config,
)
from engine.data import DATA_ROOT_ENV, data_root, locate
from engine.distributed import DistributedContext, init_distributed, resolve_device, unwrap, wrap_ddp
from engine.errors import UsageError
from engine.interrupt import Interrupted
from engine.logger import RunLogger, TqdmHandler, dumps_json, setup_logging, to_jsonable, write_json
from engine.recipe import NONFINITE_OK, Recipe, check_config, collect_model_kwargs, split_batch, validate_common
from engine.registry import ModelRegistry, create_by_name, create_with_kwargs, find_registry
from engine.resume import (
    EVAL_MUTABLE,
    RESUME_MUTABLE,
    check_config_change,
    config_diff,
    load_evaluated,
    load_resume,
    open_trained,
    saved_config,
)
from engine.run import RunOptions, add_checkpoint_flags, load_run_config, main, run, user_errors, write_metrics
from engine.schedule import EpochLR, StretchOnResume, epoch_lr_schedule
from engine.trainer import COMPILE_MODES, TIMING_KEYS, CompileMode, NonFiniteLossError, Trainer, derive_seed, to_device
from measure.atomic import atomic_open, atomic_write_text
from measure.stats import count_gmacs, count_params

__all__ = [
    "COMPILE_MODES",
    "DATA_ROOT_ENV",
    "EVAL_MUTABLE",
    "NONFINITE_OK",
    "RESUME_MUTABLE",
    "TIMING_KEYS",
    "CheckpointError",
    "CompileMode",
    "DistributedContext",
    "EpochLR",
    "Interrupted",
    "ModelRegistry",
    "NonFiniteLossError",
    "Recipe",
    "RunLogger",
    "RunOptions",
    "StretchOnResume",
    "TqdmHandler",
    "Trainer",
    "UsageError",
    "add_checkpoint_flags",
    "add_config_args",
    "add_overrides_arg",
    "atomic_open",
    "atomic_write_text",
    "check_best_agrees",
    "check_config",
    "check_config_change",
    "collect_model_kwargs",
    "config_diff",
    "config_from_args",
    "config_to_dict",
    "count_gmacs",
    "count_params",
    "create_by_name",
    "create_with_kwargs",
    "data_root",
    "derive_seed",
    "dumps_json",
    "epoch_lr_schedule",
    "find_registry",
    "get_rng_state",
    "init_distributed",
    "load_checkpoint",
    "load_config",
    "load_evaluated",
    "load_resume",
    "load_run_config",
    "load_yaml_with_base",
    "locate",
    "main",
    "open_trained",
    "parse_overrides",
    "resolve_device",
    "resolve_resume",
    "run",
    "save_checkpoint",
    "save_config",
    "saved_config",
    "set_rng_state",
    "setup_logging",
    "split_batch",
    "to_device",
    "to_jsonable",
    "unwrap",
    "unwrap_state_dict",
    "user_errors",
    "validate_common",
    "wrap_ddp",
    "write_json",
    "write_metrics",
]
