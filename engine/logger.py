"""Run records and console logging: ``log.jsonl`` + TensorBoard scalars per run, and ``setup_logging`` for CLIs.

:class:`RunLogger` appends one JSON object per line to ``run_dir/log.jsonl`` (flushed per line, so a killed run
keeps every finished record) and mirrors the numeric entries as TensorBoard scalars under ``run_dir/tb``. Every
record carries an ``epoch`` key (0-based). When a run resumes at epoch ``k`` (``k`` epochs completed),
:meth:`RunLogger.truncate_from` drops the records with ``epoch >= k`` and TensorBoard purges its events from step
``k`` on, so that the log of a killed-and-resumed run equals that of an uninterrupted run.

The library only ever uses ``logging.getLogger(__name__)``; :func:`setup_logging` is what a CLI calls once to send
those messages to ``run_dir/train.log`` and to the console through ``tqdm.write`` (progress bars stay intact).
"""

from __future__ import annotations

import json
import logging
import math
import numbers
import sys
from pathlib import Path
from types import TracebackType
from typing import IO, Any

import numpy as np
import torch
from tqdm import tqdm

from measure.atomic import atomic_write_text

__all__ = ["RunLogger", "TqdmHandler", "dumps_json", "read_records", "setup_logging", "to_jsonable", "write_json"]

logger = logging.getLogger(__name__)

LOG_NAME = "log.jsonl"
TB_DIR = "tb"


def to_jsonable(value: Any) -> Any:
    """Converts tensors and NumPy values to Python numbers/lists, recursively through dicts, lists and tuples."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu()
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, Path):
        return str(value)
    return value


def _finite_or_none(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite_or_none(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite_or_none(v) for v in value]
    return value


def dumps_json(obj: Any, indent: int | None = None) -> str:
    """Strict JSON (RFC 8259) of ``obj``: tensors and NumPy values become numbers, and NaN / +-inf become ``null``.

    Python's ``json`` writes bare ``NaN`` / ``Infinity`` by default, which most other parsers reject; every JSON file
    and line the toolkit writes (``log.jsonl``, ``final_metrics.json``, ``eval_metrics.json``) goes through here, so a
    metric that could not be computed (e.g. part purity of an empty patch) reads as ``null``.
    """
    return json.dumps(_finite_or_none(to_jsonable(obj)), indent=indent, allow_nan=False)


def read_records(run_dir: str | Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/log.jsonl``, one per epoch (empty if the file does not exist)."""
    path = Path(run_dir) / LOG_NAME
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def write_json(path: str | Path, obj: Any) -> Path:
    """Writes ``obj`` as indented strict JSON (:func:`dumps_json`) to ``path``, atomically; returns the path."""
    atomic_write_text(path, dumps_json(obj, indent=2) + "\n")
    return Path(path)


class RunLogger:
    """Writes the per-run record: ``log.jsonl`` and TensorBoard scalars (metrics files: :func:`write_json`).

    Args:
        run_dir: The run folder (created if needed).
        enabled: ``False`` (non-zero ranks) turns every method into a no-op and creates nothing.
        tensorboard: Also write TensorBoard events to ``run_dir/tb`` (skipped with a warning if tensorboard is
            not installed).
        resume_epoch: If given, calls ``truncate_from(resume_epoch)`` right away.
    """

    def __init__(
        self,
        run_dir: str | Path,
        enabled: bool = True,
        tensorboard: bool = True,
        resume_epoch: int | None = None,
    ) -> None:
        self.run_dir = Path(run_dir)
        self.enabled = enabled
        self.tensorboard = tensorboard
        self._file: IO[str] | None = None
        self._writer: Any = None
        self._purge_step: int | None = None
        if enabled:
            self.run_dir.mkdir(parents=True, exist_ok=True)
            if resume_epoch is not None:
                self.truncate_from(resume_epoch)

    @property
    def log_path(self) -> Path:
        return self.run_dir / LOG_NAME

    def log(self, record: dict[str, Any], step: int | None = None) -> None:
        """Appends ``record`` as one JSON line and writes its numeric entries as TensorBoard scalars.

        Args:
            record: Flat dict; tensors and NumPy scalars are converted to numbers. Should hold ``epoch``.
            step: TensorBoard step; defaults to ``record["epoch"]``.
        """
        if not self.enabled:
            return
        record = to_jsonable(record)
        if self._file is None:
            self._file = open(self.log_path, "a", encoding="utf-8")  # kept open for the run; see close()
        self._file.write(dumps_json(record) + "\n")
        self._file.flush()
        if step is None:
            step = record.get("epoch")
        writer = self._tb_writer()
        if writer is not None and step is not None:
            for key, value in record.items():
                if key == "epoch" or isinstance(value, bool) or not isinstance(value, numbers.Real):
                    continue
                writer.add_scalar(key, value, int(step))
            writer.flush()

    def truncate_from(self, epoch: int) -> None:
        """Drops the ``log.jsonl`` records with ``epoch >= epoch`` (records without ``epoch`` are kept).

        A partial last line, left by a run killed mid-write, is dropped too. TensorBoard events from step
        ``epoch`` on are purged when the event writer is next opened.
        """
        if not self.enabled:
            return
        self._close_file()
        self._purge_step = int(epoch)
        if self._writer is not None:  # reopen with purge_step
            self._writer.close()
            self._writer = None
        if not self.log_path.is_file():
            return
        kept, dropped = [], 0
        for line in self.log_path.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                dropped += 1
                continue
            if isinstance(record, dict) and isinstance(record.get("epoch"), int) and record["epoch"] >= epoch:
                dropped += 1
                continue
            kept.append(line)
        if dropped:
            logger.info("dropped %d record(s) with epoch >= %d from %s", dropped, epoch, self.log_path)
            atomic_write_text(self.log_path, "".join(line + "\n" for line in kept))

    def read(self) -> list[dict[str, Any]]:
        """Returns the records of ``log.jsonl`` (empty if disabled or missing)."""
        if not self.enabled or not self.log_path.is_file():
            return []
        if self._file is not None:
            self._file.flush()
        return read_records(self.run_dir)

    def _tb_writer(self) -> Any:
        if not self.tensorboard or self._writer is not None:
            return self._writer
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            logger.warning("tensorboard is not installed: TensorBoard events are not written (pip install tensorboard)")
            self.tensorboard = False
            return None
        self._writer = SummaryWriter(log_dir=str(self.run_dir / TB_DIR), purge_step=self._purge_step)
        self._purge_step = None
        return self._writer

    def _close_file(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def close(self) -> None:
        """Closes the JSONL file and the TensorBoard writer; safe to call twice."""
        self._close_file()
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()


class TqdmHandler(logging.Handler):
    """A logging handler that prints through ``tqdm.write`` so that it does not break progress bars."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            tqdm.write(self.format(record), file=sys.stderr)
        except Exception:
            self.handleError(record)


_HANDLER_FLAG = "_engine_setup_logging"


def setup_logging(run_dir: str | Path | None = None, rank: int = 0, level: int = logging.INFO) -> None:
    """Configures the root logger for a CLI; calling it again replaces the handlers it added before.

    Args:
        run_dir: If given (and ``rank == 0``), also log to ``run_dir/train.log`` (appended across resumes).
        rank: Process rank; non-zero ranks log warnings and errors only, prefixed with their rank.
        level: Level for rank 0.
    """
    root = logging.getLogger()
    for handler in [h for h in root.handlers if getattr(h, _HANDLER_FLAG, False)]:
        root.removeHandler(handler)
        handler.close()
    prefix = f"[rank {rank}] " if rank != 0 else ""
    fmt = logging.Formatter(f"%(asctime)s {prefix}%(levelname)s %(name)s: %(message)s", datefmt="%Y-%m-%d %H:%M:%S")
    handlers: list[logging.Handler] = [TqdmHandler()]
    if run_dir is not None and rank == 0:
        Path(run_dir).mkdir(parents=True, exist_ok=True)
        handlers.append(logging.FileHandler(Path(run_dir) / "train.log", encoding="utf-8"))
    for handler in handlers:
        handler.setFormatter(fmt)
        setattr(handler, _HANDLER_FLAG, True)
        root.addHandler(handler)
    root.setLevel(level if rank == 0 else max(level, logging.WARNING))
    logging.captureWarnings(True)
