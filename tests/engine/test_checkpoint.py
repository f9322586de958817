"""Tests for engine.checkpoint: atomic save, clear load errors, resume resolution, RNG state."""

from __future__ import annotations

import os
import pickle
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from engine.checkpoint import (
    CheckpointError,
    get_rng_state,
    load_checkpoint,
    resolve_resume,
    save_checkpoint,
    set_rng_state,
)

# Checkpoint loading (torch.load's weights_only, its refusal messages) changes with the torch version
pytestmark = pytest.mark.torch_compat


def test_round_trip_and_no_temp_files(tmp_path):
    state = {"model": {"w": torch.arange(6.0).reshape(2, 3)}, "epoch": 3, "config": {"lr": 0.1, "dims": [1, 2]}}
    save_checkpoint(state, tmp_path / "last.pt")
    save_checkpoint({**state, "epoch": 4}, tmp_path / "last.pt")  # overwrite
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    loaded = load_checkpoint(tmp_path / "last.pt")
    assert loaded["epoch"] == 4
    assert loaded["config"] == state["config"]
    torch.testing.assert_close(loaded["model"]["w"], state["model"]["w"])


def test_failed_save_keeps_old_file_and_leaves_no_temp(tmp_path):
    path = tmp_path / "last.pt"
    save_checkpoint({"epoch": 1}, path)
    with pytest.raises(Exception):  # noqa: B017 - whatever pickle raises for a local lambda
        save_checkpoint({"epoch": 2, "fn": lambda x: x}, path)
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]
    assert load_checkpoint(path)["epoch"] == 1


def test_missing_checkpoint_names_file(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nothere\.pt"):
        load_checkpoint(tmp_path / "nothere.pt")


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_corrupt_checkpoint_names_file(tmp_path, damage):
    path = tmp_path / "last.pt"
    save_checkpoint({"w": torch.randn(256, 256), "epoch": 1}, path)
    data = path.read_bytes()
    path.write_bytes({"garbage": b"not a checkpoint at all", "truncated": data[: len(data) // 2], "empty": b""}[damage])
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(path) in str(info.value)
    assert "corrupt" in str(info.value)
    assert isinstance(info.value, RuntimeError)


def test_resolve_resume(tmp_path, caplog):
    assert resolve_resume(None, tmp_path) is None
    assert resolve_resume("", tmp_path) is None
    with caplog.at_level("INFO", logger="engine.checkpoint"):
        assert resolve_resume("auto", tmp_path) is None
    assert "starting fresh" in caplog.text
    save_checkpoint({"epoch": 1}, tmp_path / "last.pt")
    assert resolve_resume("auto", tmp_path) == tmp_path / "last.pt"
    other = tmp_path / "other.pt"
    save_checkpoint({"epoch": 1}, other)
    assert resolve_resume(str(other), tmp_path / "elsewhere") == other
    with pytest.raises(FileNotFoundError, match=r"missing\.pt"):
        resolve_resume(str(tmp_path / "missing.pt"), tmp_path)
    with pytest.raises(ValueError, match="run folder"):
        resolve_resume("auto", None)


def test_rng_state_round_trip(tmp_path):
    state = get_rng_state()
    save_checkpoint({"rng": state}, tmp_path / "rng.pt")
    first = (random.random(), np.random.rand(), torch.rand(3))  # noqa: NPY002
    set_rng_state(load_checkpoint(tmp_path / "rng.pt")["rng"])
    second = (random.random(), np.random.rand(), torch.rand(3))  # noqa: NPY002
    assert first[0] == second[0] and first[1] == second[1]
    assert torch.equal(first[2], second[2])


class _Payload:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


def test_a_checkpoint_that_needs_pickle_is_refused_defect_1(tmp_path):
    """Loading never unpickles unless asked: a planted payload does not run, and the message names the file."""
    marker = tmp_path / "payload_ran"
    torch.save({"model": {}, "evil": _Payload(marker)}, tmp_path / "planted.pt")
    with pytest.raises(CheckpointError, match=r"planted\.pt.*--trust-checkpoint"):
        load_checkpoint(tmp_path / "planted.pt")
    assert not marker.exists()
    load_checkpoint(tmp_path / "planted.pt", allow_pickle=True)  # the documented opt-in unpickles (and so runs it)
    assert marker.exists()


def test_saved_state_with_numpy_values_loads_weights_only(tmp_path):
    state = {"rng": get_rng_state(), "metric": np.float64(0.5), "table": np.arange(3), "nested": [np.int64(2)]}
    save_checkpoint(state, tmp_path / "c.pt")
    loaded = torch.load(tmp_path / "c.pt", weights_only=True)
    assert loaded["metric"] == 0.5 and loaded["nested"] == [2] and loaded["table"].tolist() == [0, 1, 2]
    set_rng_state(loaded["rng"])


def test_a_failed_write_says_the_previous_file_is_intact(tmp_path, monkeypatch):
    save_checkpoint({"epoch": 1}, tmp_path / "last.pt")

    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(CheckpointError, match=r"disk full.*--resume auto"):
        save_checkpoint({"epoch": 2}, tmp_path / "last.pt")
    monkeypatch.undo()
    assert load_checkpoint(tmp_path / "last.pt")["epoch"] == 1
    assert not list(tmp_path.glob(".*.tmp"))


class _Shell:
    """Unpickling this would run a shell command (os.system): the classic planted checkpoint."""

    def __reduce__(self):
        return (os.system, ("true",))


class _Custom:
    pass


@pytest.mark.parametrize(
    "payload,blocked",
    [(_Shell(), f"{os.system.__module__}.system"), (_Custom(), f"{__name__}._Custom")],
    ids=["blocked-module", "unlisted-class"],
)
def test_the_pickle_refusal_names_the_blocked_global(tmp_path, payload, blocked):
    torch.save({"model": {}, "extra": payload}, tmp_path / "planted.pt")
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(tmp_path / "planted.pt")
    assert f"it needs {blocked}, which a weights-only load does not allow" in str(info.value)
    assert "--trust-checkpoint" in str(info.value) and "\n" not in str(info.value)


def test_the_pickle_refusal_reads_older_torch_phrasing(tmp_path, monkeypatch):
    save_checkpoint({"epoch": 1}, tmp_path / "c.pt")
    old = (
        "Weights only load failed. Re-running `torch.load` with `weights_only` set to `False` will likely succeed, "
        "but it can result in arbitrary code execution.Do it only if you get the file from a trusted source. "
        "WeightsUnpickler error: Unsupported class mylib.Thing"
    )

    def refuse(*args, **kwargs):
        raise pickle.UnpicklingError(old)

    monkeypatch.setattr(torch, "load", refuse)
    with pytest.raises(CheckpointError, match=r"it needs mylib\.Thing, which a weights-only load"):
        load_checkpoint(tmp_path / "c.pt")


def test_open_trained_takes_the_saved_config_and_refuses_a_checkpoint_without_one(tmp_path):
    from dataclasses import dataclass

    from engine import UsageError, open_trained

    @dataclass
    class Cfg:
        lr: float = 0.1
        name: str = "main"

    torch.save({"model": {}, "config": {"lr": 0.5, "name": "run"}}, tmp_path / "with.pt")
    state, cfg = open_trained(tmp_path / "with.pt", Cfg, "tools/train_x.py")
    assert cfg == Cfg(lr=0.5, name="run") and state["model"] == {}
    torch.save({"model": {}}, tmp_path / "without.pt")
    with pytest.raises(UsageError, match=r"without.pt holds no config: expected a checkpoint written by tools/train_x"):
        open_trained(tmp_path / "without.pt", Cfg, "tools/train_x.py")
