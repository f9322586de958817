"""Tests for engine.rundir: the reuse rule, the lock (live and stale holders), temp-file clean-up, default folders."""

from __future__ import annotations

import errno
import multiprocessing
import os
import socket
import subprocess
import sys
import time

import pytest

from engine import UsageError, rundir
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


def _contend(barrier, folder, trials, holders, overlaps, taken):
    """One of the processes of the race below: each trial, take the lock at the same moment as the others."""
    for trial in range(trials):
        barrier.wait()
        lock = RunLock(folder / str(trial))
        try:
            lock.acquire()
        except UsageError:
            barrier.wait()
            continue
        with holders.get_lock():
            holders.value += 1
            taken.value += 1
            if holders.value > 1:
                overlaps.value += 1
        time.sleep(0.002)  # hold it while the others try
        with holders.get_lock():
            holders.value -= 1
        lock.release()
        barrier.wait()


@pytest.mark.serial
@pytest.mark.skipif(not hasattr(os, "fork"), reason="the race needs fork to start its processes fast")
@pytest.mark.parametrize("mechanism", ["flock", "link"])
def test_lock_has_one_holder_when_processes_race_for_it(tmp_path, monkeypatch, mechanism):
    if mechanism == "link":
        monkeypatch.setattr(rundir, "fcntl", None)  # the fallback for platforms without flock
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    trials, procs = 200, 6
    for trial in range(1, trials, 2) if mechanism == "flock" else ():  # half the trials take over a stale lock
        (tmp_path / str(trial)).mkdir()
        (tmp_path / str(trial) / "run.lock").write_text(f"{dead.pid} {socket.gethostname()}\n")
    mp = multiprocessing.get_context("fork")
    barrier = mp.Barrier(procs)
    holders, overlaps, taken = mp.Value("i", 0), mp.Value("i", 0), mp.Value("i", 0)
    workers = [
        mp.Process(target=_contend, args=(barrier, tmp_path, trials, holders, overlaps, taken)) for _ in range(procs)
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
    assert [w.exitcode for w in workers] == [0] * procs
    assert overlaps.value == 0
    assert taken.value >= trials  # someone took each lock, the stale ones too
    assert not list(tmp_path.glob("*/run.lock")), "every holder released its lock"


def test_without_flock_the_lock_file_is_published_whole_and_a_stale_one_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(rundir, "fcntl", None)
    with RunLock(tmp_path) as lock:
        assert lock.path.read_text() == f"{os.getpid()} {socket.gethostname()}\n"
        with pytest.raises(UsageError, match=f"in use by process {os.getpid()}"):
            RunLock(tmp_path).acquire()
    assert [p.name for p in tmp_path.iterdir()] == []  # no lock, no temp file
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "run.lock").write_text(f"{dead.pid} {socket.gethostname()}\n")
    with pytest.raises(UsageError, match=rf"process {dead.pid}, which no longer runs .*delete the lock file"):
        RunLock(tmp_path).acquire()


def test_a_file_system_without_flock_falls_back_to_the_lock_file(tmp_path, monkeypatch, caplog):
    class NoFlock:
        LOCK_EX, LOCK_NB = 2, 4

        @staticmethod
        def flock(fd, operation):
            raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(rundir, "fcntl", NoFlock)
    with caplog.at_level("WARNING"), RunLock(tmp_path) as lock:
        assert "no flock" in caplog.text
        assert lock.path.read_text().split()[0] == str(os.getpid())
        with pytest.raises(UsageError, match=f"in use by process {os.getpid()}"):
            RunLock(tmp_path).acquire()
    assert not lock.path.exists()


def test_a_lock_file_naming_a_live_process_is_respected_without_its_flock(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / "run.lock").write_text(f"{holder.pid} {socket.gethostname()}\n")
        with pytest.raises(UsageError, match=f"in use by process {holder.pid}"):
            RunLock(tmp_path).acquire()
        assert (tmp_path / "run.lock").read_text().split()[0] == str(holder.pid)
    finally:
        holder.kill()
        holder.wait()
