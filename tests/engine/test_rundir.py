"""Tests for engine.rundir: the reuse rule, the lock (live and stale holders), temp-file clean-up, default folders."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from engine import UsageError
from engine.rundir import (
    RunLock,
    clean_temp_files,
    default_run_dir,
    latest_run_dir,
    prepare_run_dir,
    update_latest,
)


def test_a_folder_holding_a_run_is_only_reused_with_resume_or_overwrite(tmp_path):
    prepare_run_dir(tmp_path, resume=False, overwrite=False)  # empty: fine
    (tmp_path / "log.jsonl").write_text("{}\n")
    (tmp_path / "train.log").write_text("a failed start-up leaves only this\n")
    with pytest.raises(UsageError, match=r"already holds a run \(log\.jsonl\)"):
        prepare_run_dir(tmp_path, resume=False, overwrite=False)
    prepare_run_dir(tmp_path, resume=True, overwrite=False)
    assert (tmp_path / "log.jsonl").exists()
    (tmp_path / "tb").mkdir()
    prepare_run_dir(tmp_path, resume=False, overwrite=True)
    assert not (tmp_path / "log.jsonl").exists() and not (tmp_path / "tb").exists()


def test_lock_names_a_live_holder_and_takes_over_a_stale_one(tmp_path, caplog):
    with RunLock(tmp_path) as lock:
        assert lock.path.read_text().split()[0] == str(os.getpid())
        with pytest.raises(UsageError, match=f"in use by process {os.getpid()}"):
            RunLock(tmp_path).acquire()
    assert not (tmp_path / "run.lock").exists()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "run.lock").write_text(f"{dead.pid} {os.uname().nodename}\n")
    with caplog.at_level("WARNING"), RunLock(tmp_path):
        assert "stale lock" in caplog.text
    (tmp_path / "run.lock").write_text("123 some-other-host\n")
    with pytest.raises(UsageError, match="some-other-host"):
        RunLock(tmp_path).acquire()


def test_temp_files_of_a_killed_run_are_removed(tmp_path):
    (tmp_path / ".last.pt.abc123.tmp").write_bytes(b"x" * 100)
    (tmp_path / "last.pt").write_bytes(b"keep")
    assert [p.name for p in clean_temp_files(tmp_path)] == [".last.pt.abc123.tmp"]
    assert [p.name for p in tmp_path.iterdir()] == ["last.pt"]


def test_default_folders_are_new_and_latest_follows(tmp_path):
    a = default_run_dir("g", "n", tmp_path)
    a.mkdir(parents=True)
    b = default_run_dir("g", "n", tmp_path)
    assert a != b and a.parent == b.parent == tmp_path / "g" / "n"
    assert latest_run_dir("g", "n", tmp_path) is None
    update_latest(a)
    assert latest_run_dir("g", "n", tmp_path) == a.resolve()
    b.mkdir()
    update_latest(b)
    assert latest_run_dir("g", "n", tmp_path) == b.resolve()
