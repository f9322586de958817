"""Tests for engine.logger: JSONL records, truncation on resume, TensorBoard files, setup_logging."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from engine.logger import RunLogger, read_records, setup_logging, write_json


def test_log_writes_flushed_json_lines(tmp_path):
    with RunLogger(tmp_path / "run") as run:
        run.log({"epoch": 0, "train_loss": torch.tensor(0.5), "acc": np.float32(0.25), "n": np.int64(3), "tag": "x"})
        # flushed per line: readable while the logger is still open
        assert read_records(tmp_path / "run") == [{"epoch": 0, "train_loss": 0.5, "acc": 0.25, "n": 3, "tag": "x"}]
        run.log({"epoch": 1, "train_loss": 0.25})
    assert [r["epoch"] for r in read_records(tmp_path / "run")] == [0, 1]
    assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "run" / "tb").iterdir())


def test_truncate_from_drops_later_epochs_and_partial_lines(tmp_path):
    run = RunLogger(tmp_path, tensorboard=False)
    for epoch in range(5):
        run.log({"epoch": epoch, "loss": float(epoch)})
    run.log({"note": "no epoch key"})
    run.close()
    with open(tmp_path / "log.jsonl", "a", encoding="utf-8") as f:
        f.write('{"epoch": 5, "lo')  # killed mid-write
    run = RunLogger(tmp_path, tensorboard=False, resume_epoch=2)
    assert [r.get("epoch") for r in run.read()] == [0, 1, None]
    run.log({"epoch": 2, "loss": 2.0})
    run.truncate_from(0)
    assert run.read() == [{"note": "no epoch key"}]
    run.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.jsonl"]


def test_write_json_is_atomic_and_readable(tmp_path):
    path = write_json(tmp_path / "final_metrics.json", {"val_acc": torch.tensor(0.75), "epochs": 4})
    assert json.loads(path.read_text(encoding="utf-8")) == {"val_acc": 0.75, "epochs": 4}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["final_metrics.json"]


def test_disabled_logger_is_a_no_op(tmp_path):
    run = RunLogger(tmp_path / "run", enabled=False, resume_epoch=0)
    run.log({"epoch": 0, "loss": 1.0})
    assert run.read() == []
    run.truncate_from(0)
    run.close()
    assert not (tmp_path / "run").exists()


@pytest.fixture
def restore_root_logger():
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    yield
    for handler in list(root.handlers):
        if handler not in handlers:
            root.removeHandler(handler)
            handler.close()
    root.setLevel(level)
    logging.captureWarnings(False)


def test_setup_logging(tmp_path, restore_root_logger, capsys):
    setup_logging(tmp_path, rank=0)
    setup_logging(tmp_path, rank=0)  # idempotent: no duplicated handlers
    logging.getLogger("engine.test").info("hello %d", 1)
    assert (tmp_path / "train.log").read_text(encoding="utf-8").count("hello 1") == 1
    assert capsys.readouterr().err.count("hello 1") == 1
    setup_logging(tmp_path / "rank1", rank=1)
    logging.getLogger("engine.test").info("quiet")
    logging.getLogger("engine.test").warning("loud")
    err = capsys.readouterr().err
    assert "quiet" not in err and "[rank 1]" in err and "loud" in err
    assert not (tmp_path / "rank1").exists()


def test_nan_and_inf_are_written_as_null_defect_7(tmp_path):
    """log.jsonl and the JSON files are strict JSON: NaN / inf become null (they were written as bare NaN)."""
    from engine import dumps_json

    def strict(text):
        return json.loads(text, parse_constant=lambda name: pytest.fail(f"non-standard JSON constant {name}"))

    value = {"a": float("nan"), "b": [float("inf"), 1.5], "c": torch.tensor(float("-inf")), "d": np.float32("nan")}
    assert strict(dumps_json(value)) == {"a": None, "b": [None, 1.5], "c": None, "d": None}
    assert strict(write_json(tmp_path / "m.json", value).read_text())["a"] is None
    with RunLogger(tmp_path, tensorboard=False) as run:
        run.log({"epoch": 0, "loss": float("nan")})
    write_json(tmp_path / "final_metrics.json", {"purity": float("nan")})
    assert strict((tmp_path / "log.jsonl").read_text()) == {"epoch": 0, "loss": None}
    assert strict((tmp_path / "final_metrics.json").read_text()) == {"purity": None}
