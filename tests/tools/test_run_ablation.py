"""Ablation tables (engine.ablation, tools/run_ablation.py): rows x seeds trained once and read back, the summary's
mean / std / per-seed values, the command each run equals, partial tables; the three tables' rows build."""

from __future__ import annotations

import json
import math
import shlex
import statistics
from pathlib import Path

import pytest
import torch
import yaml

import engine
import lra
import lra.ablation
import pointcloud.ablation  # noqa: F401  (registers the modelnet table)
from engine import ablation
from engine.ablation import TABLES, Row, Table
from engine.rundir import RunLock
from engine.testing import REPO, run_tool
from lra.testing import TINY_LISTOPS_SETS

TINY_REGIME = (*TINY_LISTOPS_SETS, "min_length=5", "max_args=5", "epochs=1", "eval_batch_size=32", "amp=false")
TINY = Table(
    name="tiny",
    title="tiny table",
    recipe=lra.ListOpsRecipe,
    tool="tools/lra_listops.py",
    metric="test_acc",
    rows=(Row("softmax", "configs/lra/listops_softmax.yaml"), Row("FSAT-2", "configs/lra/listops_fsat_2.yaml")),
    regime=TINY_REGIME,
    description="the tests' regime",
)


def test_a_table_fills_up_over_calls_and_summarizes_every_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    records = ablation.run_table(TINY, [0, 1], tmp_path, max_runs=3)  # seed-major: FSAT-2 seed 1 is left out
    assert [(r["row"], r["seed"]) for r in records] == [("softmax", 0), ("FSAT-2", 0), ("softmax", 1)]
    record = json.loads((tmp_path / "tiny" / "fsat_2" / "seed0" / "ablation.json").read_text())
    assert record["commit"] and record["wall_s"] > 0 and "load_before" in record
    assert record["threads"] == torch.get_num_threads()  # the last digits of a result move with them
    summary = {s["row"]: s for s in ablation.summarize(TINY, records, [0, 1])}
    accs = [r["test_acc"] for r in records if r["row"] == "softmax"]
    assert summary["softmax"]["values"] == accs and summary["softmax"]["mean"] == pytest.approx(statistics.fmean(accs))
    assert summary["softmax"]["std"] == pytest.approx(statistics.stdev(accs))
    assert summary["FSAT-2"]["n"] == 1 and summary["FSAT-2"]["std"] is None
    assert summary["FSAT-2"]["missing_seeds"] == [1]
    md = ablation.write_table(TINY, list(summary.values()), [0, 1], tmp_path, markdown=tmp_path / "t.md")
    assert "Not run yet (1 runs): FSAT-2 seeds [1]." in md and (tmp_path / "t.md").read_text() == md
    assert "| softmax | `listops_softmax.yaml` |" in md.replace("  ", " ").replace("  ", " ")

    calls = []
    real_run = ablation.run
    monkeypatch.setattr(ablation, "run", lambda *a, **k: calls.append(a[1].seed) or real_run(*a, **k))
    again = ablation.run_table(TINY, [0, 1], tmp_path)  # the three finished runs are read back, not retrained
    assert calls == [1] and len(again) == 4
    assert [r["test_acc"] for r in again[:3]] == [r["test_acc"] for r in records]


def test_kept_records_stand_for_runs_whose_folders_are_gone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run finished on one machine continues the table on another from its kept record alone."""
    kept = tmp_path / "records"
    (first,) = ablation.run_table(TINY, [0], tmp_path / "a", rows=["softmax"], records=kept)
    path = ablation.record_path(TINY, TINY.rows[0], 0, kept)
    assert path == kept / "tiny" / "softmax" / "seed0.json"
    assert json.loads(path.read_text()) == {k: v for k, v in first.items() if k not in ("row", "seed")}

    calls = []
    real_run = ablation.run
    monkeypatch.setattr(ablation, "run", lambda *a, **k: calls.append(a[1].seed) or real_run(*a, **k))
    again = ablation.run_table(TINY, [0], tmp_path / "b", records=kept)  # fresh folder: softmax is not retrained
    assert calls == [0] and [r["row"] for r in again] == ["softmax", "FSAT-2"]
    assert again[0] == first and (kept / "tiny" / "fsat_2" / "seed0.json").is_file()
    assert not (tmp_path / "b" / "tiny" / "softmax").exists()

    md = ablation.ablate(TINY, [0], tmp_path / "c", max_runs=0, records=kept)
    assert f"0: {first['test_acc']:.2f}" in md and "Not run yet" not in md

    t1 = ablation.record_path(TABLES["modelnet"], TABLES["modelnet"].rows[0], 0, kept)
    t1.parent.mkdir(parents=True)
    t1_command = ablation.command(TABLES["modelnet"], TABLES["modelnet"].rows[0], 0, "elsewhere")
    t1.write_text(json.dumps({"test_oa": 61.25, "params": 1000, "train_time_s": 60.0, "commit": "abc1234",
                              "command": t1_command}))  # fmt: skip
    argv = ["--table", "modelnet", "--plan", "--seeds", "1", "--out", str(tmp_path / "d"), "--records", str(kept)]
    out = run_tool("run_ablation", argv)
    assert out.returncode == 0, out.stderr
    assert "0: 61.25" in out.stdout and "Not run yet (8 runs)" in out.stdout and "abc1234" in out.stdout


def test_a_run_equals_its_printed_command(tmp_path: Path) -> None:
    """The command a table lists for a row, run through the training CLI, gives the in-process run's metrics."""
    row = TINY.rows[1]
    (record,) = ablation.run_table(TINY, [0], tmp_path / "table", rows=[row.label])
    argv = shlex.split(ablation.command(TINY, row, 0, tmp_path / "cli"))
    assert argv[:2] == ["python", "tools/lra_listops.py"] and argv[argv.index("--config") + 1] == row.config
    argv[argv.index("--config") + 1] = str(REPO / row.config)
    out = engine.main(lra.ListOpsRecipe, [*argv[2:], "--no-progress"])
    assert out["test_acc"] == record["test_acc"] and out["test_loss"] == pytest.approx(record["test_loss"])
    with pytest.raises(ValueError, match=r"unknown rows \['FSAT-3'\] of table 'tiny'"):
        ablation.run_table(TINY, [0], tmp_path, rows=["FSAT-3"])


@pytest.mark.parametrize("name", sorted(TABLES))
def test_every_row_of_the_tables_builds_in_its_regime(name: str) -> None:
    table = TABLES[name]
    extra = ("data_root=unused",) if table.prepare is not None else ()
    for row in table.rows:
        items = [*table.regime, *extra, *row.overrides, "seed=0"]
        cfg = engine.load_config(table.recipe.config_cls, REPO / row.config, items)
        table.recipe.validate(cfg)
        if name.startswith("modelnet"):
            from pointcloud.recipe import build_model

            points = 1024 if name == "modelnet" else 256
            assert cfg.num_points == points and cfg.synthetic_classes == 13 and cfg.dataset == "synthetic"
            model = build_model(cfg, num_classes=13)
            for item in row.overrides:  # a lever reaches the config, and through it the model's constructor
                key, value = item.split("=")
                if not key.startswith("model_kwargs."):
                    assert getattr(cfg, key) == yaml.safe_load(value), (row.label, key)
                    continue
                key = key.removeprefix("model_kwargs.")
                assert cfg.model_kwargs[key] == yaml.safe_load(value), (row.label, key)
                if key == "sa_pos_encoding":  # the twins' and the centroid model's SA blocks alike
                    assert model.blocks[0].attn.pos_encoding is yaml.safe_load(value), row.label
            if cfg.model.startswith("centroid_transformer"):
                assert model.num_neighbors == (cfg.num_neighbors or 24)
        elif name == "capsules":  # each row is its config as the guide runs it
            assert cfg.dataset == "synthetic_parts" and cfg.num_points == 256 and cfg.epochs in (10, 20, 60)
            model = table.recipe(cfg, ctx=None).build_model()
            assert model.decoder_type == cfg.decoder and (cfg.model == "pointcaps_routing_small") == (
                "routing" in row.label
            )
        else:
            assert cfg.seq_len == 256 and cfg.epochs == 4
            model = table.recipe(cfg, ctx=None).build_model()
            assert model.pos.shape[1] == 256 and model.blocks[0].mixer is not None
    assert len({ablation.run_dir(table, r, 0, "o") for r in table.rows}) == len(table.rows)  # one folder per row


def test_tables_are_registered_once_by_name() -> None:
    assert {"fsat", "sam", "modelnet"} <= set(TABLES) and TABLES["fsat"] is lra.ablation.FSAT_TABLE
    with pytest.raises(ValueError, match="an ablation table named 'fsat' is already registered"):
        ablation.register_table(TINY.__class__(**{**TINY.__dict__, "name": "fsat"}))


def test_the_sam_table_pairs_every_class_with_its_twin() -> None:
    labels = [r.label for r in TABLES["sam"].rows]
    for name in lra.ablation.SAM_CLASSES:
        assert labels.index(f"{name}_static") == labels.index(name) + 1
    assert labels[-2:] == ["dense", "dft"] and len(labels) == 2 * len(lra.ablation.SAM_CLASSES) + 2


def test_listops_data_are_written_once_in_lra_format(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(lra.ablation, "DATA", {**lra.ablation.DATA, "train_size": 12, "val_size": 3, "test_size": 5})
    (item,) = lra.ablation.prepare_data(tmp_path)
    folder = Path(item.removeprefix("data_root="))
    sizes = {
        f: len(lra.data.read_listops_tsv(folder / f)) for f in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv")
    }
    assert sizes == {"basic_train.tsv": 12, "basic_val.tsv": 3, "basic_test.tsv": 5}
    train = lra.data.read_listops_tsv(folder / "basic_train.tsv")
    assert all(128 <= len(tokens) <= 256 for tokens, _ in train)
    stamp = (folder / "basic_train.tsv").stat().st_mtime_ns
    assert lra.ablation.prepare_data(tmp_path) == (item,) and (folder / "basic_train.tsv").stat().st_mtime_ns == stamp


def test_cli_plan_writes_the_table_without_training(tmp_path: Path) -> None:
    out = run_tool("run_ablation", ["--table", "modelnet", "--plan", "--seeds", "2", "--out", str(tmp_path)])
    assert out.returncode == 0, out.stderr
    md = (tmp_path / "modelnet.md").read_text()
    assert out.stdout.strip() == md.strip()
    assert "Not run yet (18 runs)" in md and "--table modelnet --seeds 2" in md
    assert json.loads((tmp_path / "modelnet.json").read_text())["commands"]["DGCNN"].startswith(
        "python tools/train_modelnet.py --config configs/pointcloud/modelnet40_dgcnn.yaml"
    )
    assert not (tmp_path / "modelnet").exists()


# --------------------------------------------------------------------------------------------------------------------
# Kept records are checked before they are used and never replaced by another run (issue 50, items 2 and 3). These
# plant files instead of training: the modelnet table never trains with max_runs=0.
# --------------------------------------------------------------------------------------------------------------------

MODELNET = TABLES["modelnet"]
T1 = MODELNET.rows[0]
DOCS_RECORDS = REPO / "docs" / "ablations" / "records"


def _plant(path: Path, record: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))
    return path


def _docs_record(row: Row = T1, seed: int = 0) -> dict:
    return json.loads(ablation.record_path(MODELNET, row, seed, DOCS_RECORDS).read_text())


def _files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_the_docs_records_fit_their_table(tmp_path: Path) -> None:
    """Records trained at several commits and run folders (runs/ablation, runs/ablation_b) all fit: only the regime
    counts, not where or when a run was trained."""
    before = _files(DOCS_RECORDS)
    md = ablation.ablate(MODELNET, [0, 1, 2], tmp_path, max_runs=0, records=DOCS_RECORDS, plan=True)
    assert "Not run yet" not in md and "do not fit" not in md
    assert _files(DOCS_RECORDS) == before


def test_plan_never_replaces_a_kept_record_with_another_run(tmp_path: Path) -> None:
    """The probe: another run's final_metrics.json in OUT/modelnet/t_1/seed0 rewrote the kept record, under --plan."""
    rec, out = tmp_path / "rec", tmp_path / "out"
    _plant(ablation.record_path(MODELNET, T1, 0, rec), _docs_record())
    _plant(ablation.run_dir(MODELNET, T1, 0, out) / "final_metrics.json", {"test_oa": 33.33, "train_time_s": 1.0})
    before = _files(rec)
    for plan in (["--plan"], ["--max-runs", "0"]):
        argv = ["--table", "modelnet", *plan, "--seeds", "3", "--out", str(out), "--records", str(rec)]
        res = run_tool("run_ablation", argv)
        assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
        (line,) = res.stderr.strip().splitlines()
        assert str(ablation.record_path(MODELNET, T1, 0, rec)) in line and "commit" in line and "test_oa" in line
        assert _files(rec) == before


def test_plan_writes_no_record_and_the_same_run_refreshes_its_record(tmp_path: Path) -> None:
    """A run folder holding the kept record's own run (same command and commit) refreshes it (here: adds the learning
    curve), except under plan, which writes nothing into the records."""
    rec, out = tmp_path / "rec", tmp_path / "out"
    kept = _docs_record()
    path = _plant(ablation.record_path(MODELNET, T1, 0, rec), kept)
    folder = ablation.run_dir(MODELNET, T1, 0, out)
    run_keys = ("commit", "load_before", "load_after", "wall_s", "command")
    _plant(folder / "final_metrics.json", {k: v for k, v in kept.items() if k not in run_keys})
    _plant(folder / ablation.RECORD, {k: kept[k] for k in run_keys})
    (folder / "log.jsonl").write_text(json.dumps({"epoch": 1, "test_oa": 50.0}) + "\n")
    before = _files(rec)
    (first,) = [r for r in ablation.run_table(MODELNET, [0], out, max_runs=0, records=rec, plan=True) if "test_oa" in r]
    assert first["curve"] == [{"epoch": 1, "test_oa": 50.0}] and _files(rec) == before
    ablation.run_table(MODELNET, [0], out, max_runs=0, records=rec)
    assert json.loads(path.read_text()) == {**kept, "curve": [{"epoch": 1, "test_oa": 50.0}]}


def _tampered(change: str) -> dict:
    record = _docs_record()
    if change == "command":  # another regime
        record["command"] = record["command"].replace("lr=0.002", "lr=0.01")
    elif change == "other seed's run":
        record["command"] = _docs_record(seed=1)["command"]
    elif change == "no command":
        del record["command"]
    else:
        key, value = change.split("=", 1)
        record[key] = json.loads(value)
    return record


TAMPERED = {
    "test_oa=100.5": "test_oa 100.5 is outside 0-100",
    "test_oa=-1": "test_oa -1 is outside 0-100",
    "test_oa=NaN": "test_oa nan is not a finite number",
    'test_oa="92.7"': "test_oa '92.7' is not a finite number",
    'row="T = 2"': "its row is 'T = 2'",
    "seed=7": "its seed is 7",
    'table="fsat"': "its table is 'fsat'",
    "command": "lr=0.01",
    "other seed's run": "seed=1",
    "no command": "it names no command",
}


@pytest.mark.parametrize("source", ["records", "run folder"])
@pytest.mark.parametrize("change", list(TAMPERED))
def test_records_that_do_not_fit_are_listed_and_their_seed_is_missing(tmp_path: Path, change: str, source: str) -> None:
    """A record is checked against its path (table, row, seed), the table's regime (its command) and its metric's
    range; one that does not fit is listed with the reason, and its seed counts as missing."""
    record = _tampered(change)
    if source == "records":
        path = _plant(ablation.record_path(MODELNET, T1, 0, tmp_path / "rec"), record)
    else:
        path = _plant(ablation.run_dir(MODELNET, T1, 0, tmp_path / "out") / "final_metrics.json", record)
    md = ablation.ablate(MODELNET, [0], tmp_path / "out", max_runs=0, records=tmp_path / "rec")
    finished = ablation.run_table(MODELNET, [0], tmp_path / "out", max_runs=0, records=tmp_path / "rec")
    (t1,) = [s for s in ablation.summarize(MODELNET, finished, [0]) if s["row"] == T1.label]
    assert t1["n"] == 0 and t1["values"] == [] and t1["missing_seeds"] == [0]
    assert [(r["seed"], r["path"]) for r in t1["refused"]] == [(0, str(path))]
    assert TAMPERED[change] in t1["refused"][0]["reason"]
    assert "1 record does not fit" in md and str(path) in md and TAMPERED[change] in md


def test_a_nan_metric_counts_its_seed_as_missing() -> None:
    """summarize alone: a run without a finite metric is no value of the row (it was dropped silently, not missing)."""
    good = {"row": T1.label, "seed": 1, "test_oa": 90.0, "train_time_s": 1.0}
    nan = {**good, "seed": 0, "test_oa": math.nan}
    (t1,) = [s for s in ablation.summarize(MODELNET, [nan, good], [0, 1]) if s["row"] == T1.label]
    assert t1["seeds"] == [1] and t1["values"] == [90.0] and t1["missing_seeds"] == [0]


def _truncate(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(_docs_record())[:40])
    return path


@pytest.mark.parametrize(
    "case",
    ["--rows nope", "--seeds 0", "--max-runs -1", "truncated record", "truncated run folder", "locked row"],
)
def test_bad_inputs_are_one_line_errors(tmp_path: Path, case: str) -> None:
    """Each ends with exit status 2 and one line that names what to fix, before anything trains."""
    rec, out = tmp_path / "rec", tmp_path / "out"
    argv = ["--table", "modelnet", "--seeds", "1", "--out", str(out), "--records", str(rec), "--max-runs", "0"]
    lock = None
    if case.startswith("--"):
        flag, value = case.split()
        argv += [flag, value]
        expected = {"--rows": "'nope'", "--seeds": "--seeds", "--max-runs": "--max-runs"}[flag]
    elif case == "truncated record":
        expected = str(_truncate(ablation.record_path(MODELNET, T1, 0, rec)))
    elif case == "truncated run folder":
        expected = str(_truncate(ablation.run_dir(MODELNET, T1, 0, out) / "final_metrics.json"))
    else:  # a second runner on the same row: this process holds the run folder's lock
        folder = ablation.run_dir(MODELNET, T1, 0, out)
        lock = RunLock(folder).acquire()
        argv = ["--table", "modelnet", "--seeds", "1", "--out", str(out), "--rows", T1.label, "--max-runs", "1"]
        expected = str(folder)
    try:
        res = run_tool("run_ablation", argv)
    finally:
        if lock is not None:
            lock.release()
    assert res.returncode == 2 and "Traceback" not in res.stderr, res.stderr
    (line,) = [ln for ln in res.stderr.splitlines() if ln.startswith("error:")]
    assert expected in line, line
    if case == "--rows nope":
        assert all(r.label in line for r in MODELNET.rows)
    if case == "locked row":  # the runner's own flag, not the training CLI's
        assert "--out" in line and "--output-dir" not in line, line
    assert not (out / "modelnet" / "t_1" / "seed0" / "log.jsonl").exists()
