"""The contract every training CLI shares (they all run on ``engine.run``), one parametrized test per clause.

Covered for ``train_modelnet``, ``train_partseg``, ``train_capsules``, ``train_deit`` and ``lra_listops`` alike: the
main-job smoke run and its run folder, eval-only, resume with an allowed change, SIGKILL + resume bit for bit,
SIGTERM, two gloo processes under torchrun, and every refusal of issue 14: a folder holding a run, a live lock, a
changed config on resume, a checkpoint that needs pickle, bad config values, a batch larger than the data. Defect
numbers refer to issue 14; each test named ``*_defect_N`` fails on the code before it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml
from torch.utils.data import default_collate

import engine
import lra
from capsules.recipe import CapsulesRecipe
from capsules.testing import TINY_CAPSULES_SETS
from engine import Recipe, Trainer
from engine.config import config_help, config_to_dict, load_config
from engine.export import load_exported
from engine.testing import read_log, run_tool, start_tool, stop_after_first_checkpoint, strip_timing, torchrun
from lra.testing import TINY_LISTOPS_SETS
from pointcloud.partseg.recipe import PartSegRecipe
from pointcloud.recipe import ModelNetRecipe
from pointcloud.testing import TINY_MODELNET_SETS, TINY_PARTSEG_SETS
from vision.recipe import DeiTRecipe
from vision.testing import TINY_DEIT_SETS


@dataclass(frozen=True)
class CLI:
    tool: str  # the script in tools/ (run as a subprocess where a test needs a process to kill)
    recipe: type[Recipe]  # what the script runs: engine.main(recipe, argv, report=report), run in process
    tiny: tuple[str, ...]  # the tiny config's KEY=VALUE items of --set
    final_keys: tuple[str, ...]
    epochs_to_kill: int = 4
    report: Callable[[dict], str] | None = None

    @property
    def monitor(self) -> str:
        return self.recipe.monitor

    def main(self, *args: str, sets: tuple[str, ...] = ()) -> dict:
        return engine.main(self.recipe, self.args(*args, sets=sets), report=self.report)

    def args(self, *args: str, sets: tuple[str, ...] = ()) -> list[str]:
        """Options, then :data:`COMMON` and the tiny config's ``--set`` items, then ``sets`` (which win)."""
        return [*args, *COMMON, *self.tiny, *sets]


COMMON = ("--no-progress", "--device", "cpu", "--set")  # every CLI's options; ends inside --set
CLIS = {
    cli.tool: cli
    for cli in (
        CLI(
            "train_modelnet",
            ModelNetRecipe,
            (*TINY_MODELNET_SETS, "model_kwargs.widths=[16,32,32,32]", "model_kwargs.head_dims=[32,32]"),
            ("test_oa", "test_macc", "best_test_oa", "params", "gmacs"),
        ),
        CLI(
            "train_partseg",
            PartSegRecipe,
            TINY_PARTSEG_SETS,
            ("test_instance_miou", "test_class_miou", "class_ious", "best_test_instance_miou", "params", "gmacs"),
        ),
        CLI(
            "train_capsules",
            CapsulesRecipe,
            TINY_CAPSULES_SETS,
            ("chamfer", "part_purity", "chamfer_definition", "first_epoch_test_chamfer", "params"),
        ),
        CLI(
            "train_deit",
            DeiTRecipe,
            TINY_DEIT_SETS,
            ("top1", "top5", "ema_top1", "params", "gmacs", "lr_scaled"),
        ),
        CLI(
            "lra_listops",
            lra.ListOpsRecipe,
            TINY_LISTOPS_SETS,
            ("test_acc", "majority_acc", "mixer", "params"),
            epochs_to_kill=8,
            report=lra.report,
        ),
    )
}
PARAMS = [pytest.param(cli, id=name) for name, cli in CLIS.items()]


@pytest.fixture(autouse=True)
def one_thread():
    """In-process runs use one intra-op thread, like the CLI subprocesses (``engine.testing.tool_env``): a kill and
    resume is bit-exact only when both halves reduce in the same order, and the thread count sets that order."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _usage_error(cli: CLI, capsys: pytest.CaptureFixture, *args: str, sets: tuple[str, ...] = ()) -> str:
    """Runs the CLI in-process, expects exit status 2 and one line on stderr without a traceback; returns it."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        cli.main(*args, sets=sets)
    err = capsys.readouterr().err.strip()
    assert exc.value.code == 2, err
    assert "Traceback" not in err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, err
    return lines[0]


def _snapshot(run: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(run.iterdir()) if p.is_file() and p.name != "train.log"}


class _Payload:
    """Unpickling this creates a file: what a planted checkpoint could do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (Path.touch, (self.marker,))


# --------------------------------------------------------------------------------------------------------------------
# Main job, run folder, eval-only, allowed resume
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("cli", PARAMS)
def test_smoke_run_folder_eval_only_and_resume_with_more_epochs(cli: CLI, tmp_path: Path) -> None:
    run = tmp_path / "run"
    first = cli.main("--epochs", "1", "--output-dir", str(run))
    for name in ("config.yaml", "log.jsonl", "last.pt", "best.pt", "final_metrics.json", "train.log"):
        assert (run / name).is_file(), name
    assert not (run / "run.lock").exists(), "the lock outlived the run"
    assert first["epochs"] == 1
    # more epochs is an allowed change on resume; the log continues and config.yaml records the new value
    final = cli.main("--epochs", "2", "--resume", "auto", "--output-dir", str(run))
    log = read_log(run)
    assert [r["epoch"] for r in log] == [0, 1]
    assert "epochs: 2" in (run / "config.yaml").read_text()
    assert "resume: epochs changed from 1 to 2 (allowed)" in (run / "train.log").read_text()
    written = json.loads((run / "final_metrics.json").read_text(), parse_constant=float)
    assert written["epochs"] == 2 == final["epochs"]
    for key in cli.final_keys:
        assert key in written, key
    # checkpoints load without pickle; best.pt holds the epoch last.pt calls the best
    last = torch.load(run / "last.pt", weights_only=True)
    best = torch.load(run / "best.pt", weights_only=True)
    assert last["epoch"] == 2 and best["epoch"] == last["best_epoch"] and best["best_metric"] == last["best_metric"]
    best_record = log[best["epoch"] - 1]
    assert best_record[cli.monitor] == pytest.approx(last["best_metric"])
    # eval-only on best.pt reproduces that epoch's evaluation and leaves the training files alone
    before = _snapshot(run)
    ev = cli.main("--eval-only", "--output-dir", str(run))
    assert ev[cli.monitor] == pytest.approx(best_record[cli.monitor], rel=1e-5, abs=1e-6)
    assert json.loads((run / "eval_metrics.json").read_text())["epochs"] == best["epoch"]
    after = _snapshot(run)
    after.pop("eval_metrics.json")
    assert after == before


@pytest.mark.parametrize("cli", PARAMS)
def test_help_lists_every_config_key_with_its_default_and_meaning(cli: CLI, capsys) -> None:
    cls = cli.recipe.config_cls
    entries = config_help(cls)
    assert [e.name for e in entries] == [f.name for f in dataclasses.fields(cls)]
    assert not [e.name for e in entries if not e.meaning], f"{cls.__name__}: keys without a meaning comment"
    with pytest.raises(SystemExit) as exc:
        engine.main(cli.recipe, ["--help"])
    assert exc.value.code == 0
    text = capsys.readouterr().out
    shown = dict(re.findall(r"^    (\w+)=(.*?)(?:  |$)", text, flags=re.MULTILINE))
    assert list(shown) == [e.name for e in entries]
    # each default as --set would take it, e.g. scale=[0.5, 1.0]
    assert {k: yaml.safe_load(v) for k, v in shown.items()} == config_to_dict(cls())
    flat = " ".join(text.split())
    for e in entries:
        assert " ".join(e.meaning.split()) in flat, e.name


@pytest.mark.parametrize("cli", PARAMS)
def test_every_cli_trains_through_torch_compile_by_one_config_key(cli: CLI) -> None:
    """``--set compile=<mode>`` reaches engine.run's Trainer in every training CLI (tests/engine/test_compile.py checks
    what it does); an unknown mode is refused."""
    cls = cli.recipe.config_cls
    assert "compile" in {f.name for f in dataclasses.fields(cls)}, f"{cls.__name__} has no compile key"
    assert load_config(cls, overrides=["compile=reduce-overhead"]).compile == "reduce-overhead"
    with pytest.raises(ValueError, match="compile"):
        load_config(cls, overrides=["compile=fastest"])


def _lrs(run: Path) -> list[float]:
    """The lr of every epoch of ``run``, then the lr its last scheduler step left (where the schedule ends)."""
    last = torch.load(run / "last.pt", weights_only=True)
    return [r["lr"] for r in read_log(run)] + [last["optimizer"]["param_groups"][0]["lr"]]


@pytest.mark.parametrize("cli", PARAMS)
def test_resume_with_more_epochs_stretches_the_rest_of_the_lr_schedule(
    cli: CLI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Stopped after 2 of 4 epochs and resumed with --epochs 8: the lr goes on from where it was, keeps decaying and
    ends at the schedule's end value at epoch 8 (it used to jump up, or for timm's cosine, sit at min_lr)."""
    cli.main("--epochs", "4", "--output-dir", str(tmp_path / "ref"))
    ref = _lrs(tmp_path / "ref")
    run_epoch = Trainer._run_epoch

    def stop_after_two(self: Trainer, epoch: int) -> None:
        run_epoch(self, epoch)
        if self.epoch == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(Trainer, "_run_epoch", stop_after_two)
    with pytest.raises(SystemExit):
        cli.main("--epochs", "4", "--output-dir", str(tmp_path / "run"))
    monkeypatch.undo()
    cli.main("--epochs", "8", "--resume", "auto", "--output-dir", str(tmp_path / "run"))
    lrs = _lrs(tmp_path / "run")
    assert len(lrs) == 9 and lrs[:3] == ref[:3]  # the same run up to the stop
    steps = np.diff(lrs)
    peak = int(np.argmax(ref))  # after the warm-up
    assert (steps[peak:] < 0).all(), lrs  # still decaying in every epoch: no jump up, no flat tail
    assert np.abs(steps).max() <= np.abs(np.diff(ref)).max() * (1 + 1e-9), (lrs, ref)  # no step beyond the schedule's
    assert lrs[-1] == pytest.approx(ref[-1], rel=1e-6)  # ends at the end value, at the new last epoch


# --------------------------------------------------------------------------------------------------------------------
# Commands that open a run read its config: eval-only, resume, export
# --------------------------------------------------------------------------------------------------------------------

BARE = ("--no-progress", "--device", "cpu")  # no --set: everything the run needs comes from its checkpoint


@pytest.mark.parametrize("cli", PARAMS)
def test_eval_only_resume_and_export_rebuild_a_set_run_without_its_sets(cli: CLI, tmp_path: Path, capsys) -> None:
    """The run is started entirely with --set (the tiny config); the commands that open it repeat none of it."""
    run = tmp_path / "run"
    cli.main("--epochs", "1", "--output-dir", str(run))
    best = torch.load(run / "best.pt", weights_only=True)
    trained = read_log(run)[best["epoch"] - 1][cli.monitor]
    ev = engine.main(cli.recipe, [*BARE, "--eval-only", "--output-dir", str(run)], report=cli.report)
    assert ev[cli.monitor] == pytest.approx(trained, rel=1e-5, abs=1e-6)  # the trained model on its own test set
    # a key that defines the model or the data is refused with the diff; an evaluation-only key is applied
    capsys.readouterr()
    with pytest.raises(SystemExit) as exc:
        engine.main(cli.recipe, [*BARE, "--eval-only", "--output-dir", str(run), "--set", "seed=5"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "refusing to evaluate" in err and "seed: 0 in the checkpoint, 5 now" in err
    engine.main(cli.recipe, [*BARE, "--eval-only", "--output-dir", str(run), "--set", "eval_batch_size=3"])
    # --resume auto continues the run with its own config (more epochs is the allowed change)
    resumed = engine.main(cli.recipe, [*BARE, "--epochs", "2", "--resume", "auto", "--output-dir", str(run)])
    assert resumed["epochs"] == 2 and [r["epoch"] for r in read_log(run)] == [0, 1]
    # export without flags: the trained model, its recorded constructor keywords, identical outputs
    done = run_tool("export_weights", [str(run / "best.pt"), "--out", str(tmp_path / "export")])
    assert done.returncode == 0, done.stderr[-3000:]
    exported = load_exported(tmp_path / "export")
    state = torch.load(run / "best.pt", weights_only=True)
    cfg = engine.load_config(cli.recipe.config_cls, defaults=state["config"])
    recipe = cli.recipe(cfg, engine.DistributedContext())
    recipe.train_set, recipe.eval_set = recipe.build_datasets()
    model = recipe.build_model().eval()
    model.load_state_dict(state["model"])
    inputs = default_collate([recipe.eval_set[i] for i in range(2)])[:-1]  # a sample's last item is its target
    with torch.no_grad():
        assert torch.equal(exported(*inputs), model(*inputs))
    meta = json.loads((tmp_path / "export" / "config.json").read_text())
    assert meta["model_args"] == recipe.model_spec()[1] == state["model_spec"]["kwargs"]


# --------------------------------------------------------------------------------------------------------------------
# Refusals (each a user error: exit 2, one line, nothing in the run folder changed)
# --------------------------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def finished_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One finished 1-epoch run per CLI, shared by the refusal tests (which must leave it unchanged)."""
    return {}


def _finished(cli: CLI, finished_runs: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    if cli.tool not in finished_runs:
        run = tmp_path_factory.mktemp(cli.tool) / "run"
        cli.main("--epochs", "1", "--output-dir", str(run))
        finished_runs[cli.tool] = run
    return finished_runs[cli.tool]


@pytest.mark.parametrize("cli", PARAMS)
def test_rerun_into_a_finished_run_is_refused_defect_4(cli, finished_runs, tmp_path_factory, capsys) -> None:
    run = _finished(cli, finished_runs, tmp_path_factory)
    before = _snapshot(run)
    line = _usage_error(cli, capsys, "--epochs", "1", "--output-dir", str(run))
    assert "already holds a run" in line and "--resume auto" in line and "--overwrite" in line
    assert _snapshot(run) == before


@pytest.mark.parametrize("cli", PARAMS)
def test_resume_with_a_changed_config_is_refused_with_the_diff_defect_3(
    cli, finished_runs, tmp_path_factory, capsys
) -> None:
    run = _finished(cli, finished_runs, tmp_path_factory)
    before = _snapshot(run)
    line = _usage_error(
        cli, capsys, "--epochs", "2", "--resume", "auto", "--output-dir", str(run), sets=("lr=0.000123",)
    )
    assert "refusing to resume" in line and "lr:" in line and "0.000123" in line
    assert _snapshot(run) == before  # config.yaml does not claim the refused lr


@pytest.mark.parametrize("cli", PARAMS)
def test_a_live_lock_is_refused_naming_the_pid_defect_5(cli, finished_runs, tmp_path_factory, capsys) -> None:
    run = tmp_path_factory.mktemp("locked") / "run"
    run.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (run / "run.lock").write_text(f"{holder.pid} {os.uname().nodename}\n")
        line = _usage_error(cli, capsys, "--epochs", "1", "--output-dir", str(run))
        assert f"in use by process {holder.pid}" in line
        assert not (run / "config.yaml").exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("cli", PARAMS)
def test_a_planted_pickle_checkpoint_is_refused_defect_1(cli, finished_runs, tmp_path_factory, capsys) -> None:
    run = _finished(cli, finished_runs, tmp_path_factory)
    planted = tmp_path_factory.mktemp("planted")
    marker = planted / "payload_ran"
    state = torch.load(run / "last.pt", weights_only=True)
    state["extra_state"] = {"evil": _Payload(marker)}
    torch.save(state, planted / "last.pt")
    torch.save(state, planted / "best.pt")
    (planted / "config.yaml").write_text((run / "config.yaml").read_text())
    for args in (["--resume", "auto", "--epochs", "2"], ["--eval-only"]):
        line = _usage_error(cli, capsys, *args, "--output-dir", str(planted))
        assert "refused" in line and ("last.pt" in line or "best.pt" in line)
        assert "--trust-checkpoint" in line
    assert not marker.exists(), "the checkpoint's payload ran"


@pytest.mark.parametrize("cli", PARAMS)
def test_bad_values_are_refused_before_training_defect_8(cli, tmp_path, capsys) -> None:
    line = _usage_error(cli, capsys, "--output-dir", str(tmp_path / "a"), sets=("batch_size=0",))
    assert "batch_size must be >= 1, got 0" in line
    assert "lr must be" in _usage_error(cli, capsys, "--output-dir", str(tmp_path / "b"), sets=("lr=-1",))
    line = _usage_error(cli, capsys, "--output-dir", str(tmp_path / "c"), sets=("batch_size=4096",))
    assert "exceeds" in line and "4096" in line
    line = _usage_error(cli, capsys, "--output-dir", str(tmp_path / "d"), sets=("no_such_key=1",))
    assert "unknown config key" in line
    for folder in ("a", "b", "c", "d"):
        assert not (tmp_path / folder / "log.jsonl").exists()
    with pytest.raises(ValueError, match="batch_size"):  # --debug: the exception itself, with its traceback
        cli.main("--debug", "--output-dir", str(tmp_path / "e"), sets=("batch_size=0",))


# --------------------------------------------------------------------------------------------------------------------
# Kills, signals, DDP (subprocesses: slow)
# --------------------------------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("cli", PARAMS)
def test_sigkill_then_resume_is_bit_exact(cli: CLI, tmp_path: Path) -> None:
    epochs = str(cli.epochs_to_kill)
    ref = cli.main("--epochs", epochs, "--output-dir", str(tmp_path / "ref"))
    run = tmp_path / "killed"
    proc = start_tool(cli.tool, cli.args("--epochs", epochs, "--output-dir", str(run)))
    stop_after_first_checkpoint(proc, run, signal.SIGKILL)
    assert 1 <= torch.load(run / "last.pt", weights_only=True)["epoch"] < cli.epochs_to_kill
    (run / ".last.pt.planted.tmp").write_bytes(b"x" * 1000)  # as a kill inside torch.save leaves behind
    # the killed process's lock is stale: taken over
    resumed = cli.main("--epochs", epochs, "--resume", "auto", "--output-dir", str(run))
    assert not list(run.glob(".*.tmp")), "temp files of the killed run were not removed"
    assert strip_timing(resumed) == strip_timing(ref)
    assert [strip_timing(r) for r in read_log(run)] == [strip_timing(r) for r in read_log(tmp_path / "ref")]
    a = torch.load(tmp_path / "ref" / "last.pt", weights_only=True)["model"]
    b = torch.load(run / "last.pt", weights_only=True)["model"]
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("cli", PARAMS)
def test_signal_ends_with_one_line_and_the_conventional_status_defect_6(cli: CLI, sig: int, tmp_path: Path) -> None:
    run = tmp_path / "run"
    proc = start_tool(cli.tool, cli.args("--epochs", str(cli.epochs_to_kill), "--output-dir", str(run)))
    err = stop_after_first_checkpoint(proc, run, sig)
    assert proc.returncode == 128 + sig, err[-2000:]
    assert "Traceback" not in err
    last_line = err.strip().splitlines()[-1]
    assert last_line.startswith("interrupted at epoch ") and f"--resume auto --output-dir {run}" in last_line
    assert not list(run.glob(".*.tmp")) and not (run / "run.lock").exists()
    torch.load(run / "last.pt", weights_only=True)  # complete


@pytest.mark.slow
@pytest.mark.parametrize("cli", PARAMS)
def test_torchrun_two_gloo_processes(cli: CLI, tmp_path: Path) -> None:
    out = torchrun(cli.tool, cli.args("--epochs", "1", "--output-dir", str(tmp_path)))
    assert out.returncode == 0, out.stderr[-3000:]
    assert "rank 0/2, backend gloo" in out.stderr
    assert json.loads((tmp_path / "final_metrics.json").read_text())["epochs"] == 1
    assert torch.load(tmp_path / "last.pt", weights_only=True)["epoch"] == 1
    # a second torchrun into the same folder is refused on every rank, with status 2 and no hang
    again = torchrun(cli.tool, cli.args("--epochs", "1", "--output-dir", str(tmp_path)))
    assert again.returncode != 0 and "already holds a run" in again.stderr


def test_default_output_folder_is_new_per_run_and_latest_points_to_it(tmp_path, monkeypatch) -> None:
    """Without --output-dir: runs/<group>/<name>/<timestamp>, a new one per run; latest names the newest."""
    cli = CLIS["lra_listops"]
    monkeypatch.chdir(tmp_path)
    cli.main("--epochs", "1")
    cli.main("--epochs", "1")
    parent = tmp_path / "runs" / "lra_listops" / "main"
    runs = sorted(p for p in parent.iterdir() if not p.is_symlink())
    assert len(runs) == 2 and all((p / "final_metrics.json").is_file() for p in runs)
    assert (parent / "latest").resolve() == max(runs, key=lambda p: p.stat().st_mtime).resolve()
    # --resume auto without --output-dir continues the latest run
    out = cli.main("--epochs", "2", "--resume", "auto")
    assert out["epochs"] == 2 and len([p for p in parent.iterdir() if not p.is_symlink()]) == 2
