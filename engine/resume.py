"""Resume and eval-only: the one way a run is opened again from its checkpoint (``--resume auto|PATH``,
``--eval-only``).

:func:`load_resume` finds the checkpoint (:func:`~engine.checkpoint.resolve_resume`), loads it safely
(:func:`~engine.checkpoint.load_checkpoint`, ``weights_only``), refuses a config that differs from the saved one in a
key that defines the model, the data or the optimization (:func:`check_config_change`: the refusal prints the diff;
the keys in :data:`RESUME_MUTABLE` and the caller's own may change and are logged), and checks that ``best.pt`` is the
checkpoint ``last.pt`` calls the best. :meth:`engine.Trainer.fit` then restores the state it returns::

    state = load_resume("auto", run_dir, config=cfg, mutable=("votes",))
    trainer.fit(state=state)  # None: a fresh start

:func:`engine.run` does exactly this for every CLI, and :func:`load_evaluated` the same for ``--eval-only`` (with
:data:`EVAL_MUTABLE`). The command line (:func:`engine.main`) builds the config of a command that opens a run from the
checkpoint's own config (:func:`saved_config`, then :func:`engine.config.load_config` with ``defaults=``): ``--config``
and ``--set`` apply on top, so ``--resume auto`` and ``--eval-only`` rebuild the trained model and data without
repeating how the run was started, and a changed key is checked as above.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from engine.checkpoint import CheckpointError, check_best_agrees, load_checkpoint, resolve_resume
from engine.config import config_to_dict, load_config
from engine.errors import UsageError

__all__ = [
    "EVAL_MUTABLE",
    "RESUME_MUTABLE",
    "check_config_change",
    "config_diff",
    "load_evaluated",
    "load_resume",
    "open_trained",
    "saved_config",
]

logger = logging.getLogger(__name__)

#: Config keys that may differ between a checkpoint and the run that resumes it (more epochs, workers, logging, where
#: the data lies, whether the training model is compiled).
RESUME_MUTABLE = ("name", "epochs", "workers", "log_every", "eval_batch_size", "data_root", "compile")
#: Config keys that may differ between a checkpoint and an ``--eval-only`` of it: those of resume, and those only
#: training reads (the optimization). A recipe adds its own (``Recipe.eval_mutable``, e.g. test-time votes).
EVAL_MUTABLE = (*RESUME_MUTABLE, "batch_size", "lr", "weight_decay", "warmup_epochs", "grad_clip", "amp")
_MISSING = "<unset>"


def config_diff(saved: dict[str, Any], current: dict[str, Any]) -> dict[str, tuple[Any, Any]]:
    """``{key: (saved, current)}`` for every key whose value differs (a missing key shows as ``<unset>``)."""
    keys = list(dict.fromkeys([*saved, *current]))
    return {
        k: (saved.get(k, _MISSING), current.get(k, _MISSING))
        for k in keys
        if saved.get(k, _MISSING) != current.get(k, _MISSING)
    }


def check_config_change(
    saved: dict[str, Any], current: dict[str, Any], allowed: Sequence[str], path: str | Path, verb: str = "resume"
) -> dict[str, tuple[Any, Any]]:
    """Refuses to open the run saved in ``path`` with a config that differs in a key outside ``allowed``.

    Args:
        saved: The config stored in the checkpoint.
        current: The config of this invocation (both as plain dicts, :func:`engine.config.config_to_dict`).
        allowed: Keys that may change.
        path: The checkpoint (named in the message).
        verb: What is done with the run, for the messages: ``"resume"``, ``"evaluate"``.

    Returns:
        The allowed changes, ``{key: (saved, current)}`` (each is logged).

    Raises:
        UsageError: A key outside ``allowed`` differs; the message lists every such key with both values.
    """
    path = Path(path)
    diff = config_diff(saved, current)
    refused = {k: v for k, v in diff.items() if k not in allowed}
    if refused:
        lines = "; ".join(f"{k}: {a!r} in the checkpoint, {b!r} now" for k, (a, b) in refused.items())
        raise UsageError(
            f"refusing to {verb} {path} with a different config ({lines}). These keys define the model, the data or "
            f"the optimization; only {', '.join(sorted(set(allowed)))} may change when you {verb} a run. The CLIs "
            "start from the run's own config: drop these keys from --set / --config, or start a new run to change them"
        )
    for k, (a, b) in diff.items():
        logger.info("%s: %s changed from %r to %r (allowed)", verb, k, a, b)
    return diff


def _with_defaults(saved: dict[str, Any], config: Any) -> dict[str, Any]:
    """``saved`` plus the default of every field of ``config``'s dataclass it lacks: a checkpoint written before a
    config key existed ran with that key's default, which is not a change."""
    if not (dataclasses.is_dataclass(config) and not isinstance(config, type)):
        return saved
    added = {}
    for f in dataclasses.fields(config):
        if f.name in saved:
            continue
        if f.default is not dataclasses.MISSING:
            added[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            added[f.name] = f.default_factory()
    return {**saved, **config_to_dict(added)}


def saved_config(state: dict[str, Any], path: str | Path) -> dict[str, Any] | None:
    """The config a checkpoint was written with (``state["config"]``), or ``None`` (with a warning) if it holds none.

    Raises:
        CheckpointError: ``config`` is there but is not a mapping.
    """
    saved = state.get("config")
    if saved is None:
        logger.warning("%s holds no config: cannot check that this run's config matches it", path)
        return None
    if not isinstance(saved, dict):
        raise CheckpointError(f"checkpoint {path} is corrupt: its config is a {type(saved).__name__}, not a mapping")
    return saved


def open_trained(
    checkpoint: str | Path, config_cls: type, tool: str, allow_pickle: bool = False
) -> tuple[dict[str, Any], Any]:
    """A trained run's checkpoint and the config it was trained with, for a command that reads it (the viewers): the
    model, data and point count come from that config, not from ``config_cls``'s defaults.

    Args:
        checkpoint: A ``last.pt`` / ``best.pt``.
        config_cls: The recipe's config dataclass.
        tool: The training CLI that writes such checkpoints (for the message), e.g. ``"tools/train_partseg.py"``.
        allow_pickle: As :func:`engine.checkpoint.load_checkpoint`'s.

    Raises:
        UsageError: The checkpoint holds no config.
    """
    state = load_checkpoint(checkpoint, allow_pickle=allow_pickle)
    saved = saved_config(state, checkpoint)
    if not saved:
        raise UsageError(f"{checkpoint} holds no config: expected a checkpoint written by {tool}")
    return state, load_config(config_cls, defaults=saved, defaults_source=f"checkpoint {checkpoint}")


def load_evaluated(
    path: str | Path, config: Any = None, mutable: Sequence[str] = (), allow_pickle: bool = False
) -> dict[str, Any]:
    """The checkpoint ``--eval-only`` evaluates, loaded safely, its config checked against ``config`` as resume does
    (the keys in :data:`EVAL_MUTABLE` and ``mutable`` may differ and are logged).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        CheckpointError: The file cannot be read safely.
        UsageError: The config differs in a key that defines the model or the data (the message has the diff).
    """
    state = load_checkpoint(path, allow_pickle=allow_pickle)
    saved = saved_config(state, path)
    if config is not None and saved is not None:
        saved = _with_defaults(saved, config)
        check_config_change(saved, config_to_dict(config), (*EVAL_MUTABLE, *mutable), path, verb="evaluate")
    return state


def load_resume(
    resume: str | Path | None,
    run_dir: str | Path | None,
    config: Any = None,
    mutable: Sequence[str] = (),
    allow_pickle: bool = False,
) -> dict[str, Any] | None:
    """The checkpoint to resume from, loaded and checked; ``None`` to start fresh.

    Args:
        resume: ``None`` / ``""`` (fresh), ``"auto"`` (``run_dir/last.pt`` if it exists) or a checkpoint path.
        run_dir: The run folder (for ``"auto"``).
        config: This run's config (dataclass or dict); ``None`` skips the comparison with the saved one.
        mutable: Keys beyond :data:`RESUME_MUTABLE` that may change (a recipe's ``resume_mutable``).
        allow_pickle: Load a checkpoint that needs the full unpickler (trusted files only: ``--trust-checkpoint``).

    Raises:
        FileNotFoundError: An explicit path does not exist.
        CheckpointError: The file cannot be read safely, or ``best.pt`` and ``last.pt`` belong to different runs.
        UsageError: The config differs in a key that may not change (:func:`check_config_change`).
    """
    path = resolve_resume(resume, run_dir)
    if path is None:
        return None
    state = load_checkpoint(path, allow_pickle=allow_pickle)
    saved = saved_config(state, path)
    if config is not None and saved is not None:
        check_config_change(_with_defaults(saved, config), config_to_dict(config), (*RESUME_MUTABLE, *mutable), path)
    if path.name == "last.pt":
        check_best_agrees(state, path.parent / "best.pt", allow_pickle=allow_pickle)
    return state
