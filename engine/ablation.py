"""Ablation tables: each row of a paper's table trained with several seeds in one fixed regime, summarized as the mean,
the spread and every seed's value, written as Markdown and JSON (``tools/run_ablation.py``).

A :class:`Table` names its recipe, the metric it reports, the regime (``key=value`` items applied to every row on top
of the row's config) and its rows (a config file and the row's own items). Each (row, seed) trains in
``<out>/<table>/<row>/seed<seed>``, exactly as its :func:`command` would from the command line. A run that finished
(``final_metrics.json``) is read back instead of retrained and a stopped one resumes (``--resume auto``), so a table
fills up over several invocations (``max_runs``); rows without a run are listed with their commands. Each run folder
also gets ``ablation.json``: the commit the run was trained at (``+dirty`` with uncommitted changes to tracked files),
the load average before and after it, its wall time and the CPU threads it ran with (``torch.get_num_threads()``, as
``OMP_NUM_THREADS`` sets them: the last digits of a result move with them); the table names every commit its runs come
from.

A run folder holds checkpoints; its result is one small JSON. With a ``records`` folder, every finished run's final
metrics and record are also kept as ``<records>/<table>/<row>/seed<seed>.json``, and a run found there counts as
finished: a table can then be continued, merged from several machines, or regenerated (``plan=True``) from the
records alone, without the run folders.

Every result read (from a run folder or the records) is checked before it counts: its ``table`` / ``row`` / ``seed``
keys, where present, and its command's run folder name its path; its command equals the table's for that row and
seed (wherever and on whatever device it ran, and at whatever commit: a table's runs may come from several); its
metric is a finite number in the table's range. One that does not fit is left out and listed with the reason, and its
seed counts as missing. A kept record is only ever rewritten by its own run (same command, commit and metric): a run
folder that holds another run is an error, never a silent replacement.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shlex
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.config import load_config
from engine.errors import UsageError
from engine.logger import read_records
from engine.recipe import Recipe
from engine.run import RunOptions, run
from measure.atomic import atomic_write_text
from measure.bench import git_commit, markdown_table

__all__ = [
    "REPO",
    "TABLES",
    "Row",
    "Table",
    "ablate",
    "command",
    "curves_svg",
    "git_commit",
    "record_path",
    "register_table",
    "run_table",
    "summarize",
    "write_table",
]

_logger = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[1]  # the configs' paths are relative to it
RECORD = "ablation.json"


@dataclass(frozen=True)
class Row:
    """One row of an ablation table.

    Attributes:
        label: the row's name in the paper's table (``"FSAT-No Trunc."``).
        config: its config file, relative to the repository root.
        overrides: ``key=value`` items of this row only (applied after the table's regime).
    """

    label: str
    config: str
    overrides: tuple[str, ...] = ()


@dataclass(frozen=True)
class Table:
    """An ablation table: rows of one recipe, trained in one regime, compared on one metric.

    Attributes:
        name: short name (``--table``) and folder name.
        title: the table's heading.
        recipe: the :class:`~engine.recipe.Recipe` every row trains with.
        tool: the training script whose command line a row's run equals (``tools/lra_listops.py``).
        metric: the final-metrics key to compare (``test_acc``).
        rows: the rows, in the paper's order.
        regime: ``key=value`` items applied to every row, on top of its config.
        description: the regime in words, and why (printed above the table).
        prepare: called with the output folder before any run (e.g. to write a data set every row reads, once:
            it must return at once when that is done); returns more ``key=value`` items for every row.
        metric_range: the metric's possible values (accuracies in %); a record outside them does not fit.
        columns: other final metrics shown beside the metric, each as its mean over the seeds that fit (none where one
            of those runs lacks it).
        digits: decimals of the metric, its spread and the ``columns`` in the table.
    """

    name: str
    title: str
    recipe: type[Recipe]
    tool: str
    metric: str
    rows: tuple[Row, ...]
    regime: tuple[str, ...] = ()
    description: str = ""
    prepare: Callable[[Path], tuple[str, ...]] | None = field(default=None, compare=False)
    metric_range: tuple[float, float] = (0.0, 100.0)
    columns: tuple[str, ...] = ()
    digits: int = 2


TABLES: dict[str, Table] = {}  # by name; the domain packages' ``ablation`` modules register theirs


def register_table(table: Table) -> Table:
    """Adds ``table`` to :data:`TABLES` under its name (a second table of the same name is an error)."""
    if table.name in TABLES and TABLES[table.name] is not table:
        raise ValueError(f"an ablation table named {table.name!r} is already registered")
    TABLES[table.name] = table
    return table


def _slug(label: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", label.lower().replace("+", " plus ")).strip("_")


def run_dir(table: Table, row: Row, seed: int, out_dir: str | Path) -> Path:
    """``<out_dir>/<table>/<row>/seed<seed>``."""
    return Path(out_dir) / table.name / _slug(row.label) / f"seed{seed}"


def _items(table: Table, row: Row, seed: int, extra: Sequence[str]) -> list[str]:
    return [*table.regime, *extra, *row.overrides, f"seed={seed}"]


def command(
    table: Table, row: Row, seed: int, out_dir: str | Path, extra: Sequence[str] = (), device: str = "cpu"
) -> str:
    """The command line that trains ``row`` with ``seed`` into its folder (what :func:`run_table` runs in process)."""
    items = " ".join(shlex.quote(i) for i in _items(table, row, seed, extra))
    folder = shlex.quote(str(run_dir(table, row, seed, out_dir)))
    options = f"--device {device} --resume auto --output-dir {folder}"
    return f"python {table.tool} --config {row.config} {options} --set {items}"


def _load() -> float:
    return round(os.getloadavg()[0], 2)


def record_path(table: Table, row: Row, seed: int, records: str | Path) -> Path:
    """``<records>/<table>/<row>/seed<seed>.json``: a finished run's final metrics and :data:`RECORD`, in one file."""
    return Path(records) / table.name / _slug(row.label) / f"seed{seed}.json"


def _load_json(path: Path) -> Any:
    """``path``'s JSON; a file that is not JSON (truncated, edited) is a :class:`UsageError` that names it."""
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UsageError(f"{path} is not valid JSON ({e}): restore it or move it away") from None


def _read(folder: Path) -> dict[str, Any] | None:
    done = folder / "final_metrics.json"
    if not done.is_file():
        return None
    metrics = _load_json(done)
    if not isinstance(metrics, dict):
        raise UsageError(f"{done} holds no metrics (a JSON object was expected): restore it or move it away")
    record = folder / RECORD
    try:
        # the learning curve (every epoch's log record: train loss and accuracy, the eval metrics, samples/s) travels
        # with the result, so a kept record shows whether the run had converged
        curve = {"curve": read_records(folder)}
    except json.JSONDecodeError as e:
        raise UsageError(f"{folder / 'log.jsonl'} is not valid JSON lines ({e}): restore it or move it away") from None
    return {**metrics, **curve, **(_load_json(record) if record.is_file() else {})}


def _read_kept(path: Path) -> dict[str, Any] | None:
    if not path.is_file():
        return None
    record = _load_json(path)
    if not isinstance(record, dict):
        raise UsageError(f"{path} holds no record (a JSON object was expected): restore it or move it away")
    return record


def _metric_problem(table: Table, value: Any) -> str | None:
    """Why ``value`` cannot be the table's metric (``None`` if it can)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return f"{table.metric} {value!r} is not a finite number"
    lo, hi = table.metric_range
    if not lo <= value <= hi:
        return f"{table.metric} {value!r} is outside {lo:g}-{hi:g}"
    return None


def _regime(line: str) -> list[str] | None:
    """``line``'s words with what depends on where the run was trained left out: the device, and the root of its run
    folder (``--output-dir`` keeps ``<table>/<row>/seed<N>``; items under that root, like ``data_root``, keep the
    rest). ``None`` if ``line`` is no run of an ablation table."""
    try:
        words = shlex.split(line)
        folder = Path(words[words.index("--output-dir") + 1])
    except (ValueError, IndexError):
        return None
    if len(folder.parts) < 3:
        return None
    root = str(folder.parents[2])
    out = []
    for before, word in zip(["", *words], words):
        if before == "--device":
            continue
        if before == "--output-dir":
            word = "/".join(folder.parts[-3:])
        key, sep, value = word.partition("=")
        if sep and value.startswith(root + os.sep):
            word = f"{key}=<out>{value[len(root) :]}"
        out.append(word)
    return out


def _words_apart(a: str, b: str) -> tuple[str, str]:
    """The words of command ``a`` that ``b`` lacks, and those of ``b`` that ``a`` lacks."""
    wa, wb = a.split(), b.split()
    return " ".join(w for w in wa if w not in wb) or "(nothing)", " ".join(w for w in wb if w not in wa) or "(nothing)"


def _misfit(
    table: Table, row: Row, seed: int, record: dict[str, Any], out_dir: str | Path, extra: Sequence[str] = ()
) -> str | None:
    """Why ``record`` cannot stand for ``row`` trained with ``seed`` in ``table``'s regime (``None`` if it can).

    Checked: the record's ``table`` / ``row`` / ``seed`` keys, if any; its command, which must be the one the table
    runs for that row and seed (its run folder's root and its device may differ, its commit is not compared: a
    table's runs may come from several commits); its metric, a finite number in ``table.metric_range``.
    """
    for key, want in (("table", table.name), ("row", row.label), ("seed", seed)):
        if key in record and record[key] != want:
            return f"its {key} is {record[key]!r}, not {want!r}"
    if not isinstance(record.get("command"), str):
        return "it names no command, so its regime is unknown"
    have, want = _regime(record["command"]), _regime(command(table, row, seed, out_dir, extra))
    if have != want:
        if have is None:
            return f"its command is no run of an ablation table: {record['command']}"
        only_have, only_want = _words_apart(" ".join(have), " ".join(want))
        return f"its command has {only_have} where the table runs {only_want}"
    return _metric_problem(table, record.get(table.metric))


def _differences(kept: dict[str, Any], result: dict[str, Any], metric: str) -> list[str]:
    """What tells the kept record's run from the run folder's: its command, commit or metric (kept value first)."""
    out = []
    for key in ("command", "commit", metric):
        a, b = kept.get(key, "missing"), result.get(key, "missing")
        if a != b:
            if key == "command" and isinstance(a, str) and isinstance(b, str):
                a, b = _words_apart(a, b)
            out.append(f"{key} {a} against {b}")
    return out


def _check_request(table: Table, seeds: Sequence[int], rows: Sequence[str] | None, max_runs: int | None) -> None:
    if rows is not None:
        unknown = sorted(set(rows) - {r.label for r in table.rows})
        if unknown:
            choices = [r.label for r in table.rows]
            raise UsageError(f"unknown rows {unknown} of table {table.name!r}; choose from {choices}")
    if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
        raise UsageError(f"seeds must be distinct and at least 0, and at least one (--seeds N >= 1), got {list(seeds)}")
    if max_runs is not None and max_runs < 0:
        raise UsageError(f"max_runs (--max-runs) must be at least 0 (0: train none), got {max_runs}")


def run_table(
    table: Table,
    seeds: Sequence[int],
    out_dir: str | Path,
    extra: Sequence[str] = (),
    device: str = "cpu",
    rows: Sequence[str] | None = None,
    max_runs: int | None = None,
    records: str | Path | None = None,
    plan: bool = False,
) -> list[dict[str, Any]]:
    """Trains every (row, seed) of ``table`` that has no finished run in ``out_dir`` (or in ``records``) yet; returns
    one record per finished run (read back or new) with the row's label, the seed and the run's final metrics, and
    one per result that does not fit (see the module's docstring) with the row's label, the seed, ``path`` and
    ``refused`` (the reason) and no metrics.

    Args:
        table: the table.
        seeds: the seeds of every row.
        out_dir: the folder of every table's runs.
        extra: ``key=value`` items for every row (what ``table.prepare`` returned).
        device: ``--device`` of every run.
        rows: labels of the rows to run (default: all); the others are only read back.
        max_runs: train at most this many new runs in this call (0: none, only read back).
        records: folder of the runs' kept records (:func:`record_path`): read as finished runs, and every finished run
            of ``out_dir`` is written there (or refreshed: only by the same run).
        plan: train nothing and write nothing into ``records``: only read back.

    Raises:
        UsageError: An unknown row, no seeds, a negative ``max_runs``, a file that is not JSON, a run folder whose run
            is not the kept record's (command, commit or metric differ), or a run folder locked by another process.
    """
    _check_request(table, seeds, rows, max_runs)
    if plan:
        max_runs = 0
    out_dir = Path(out_dir)
    finished, trained = [], 0
    commit = git_commit() or "unknown"  # the code this process imported, whatever the checkout becomes while it trains
    for seed in seeds:  # seed-major: one seed of every row first, so a partial table compares all rows
        for row in table.rows:
            folder = run_dir(table, row, seed, out_dir)
            kept = record_path(table, row, seed, records) if records is not None else None
            result = _read(folder)
            kept_result = _read_kept(kept) if kept is not None else None
            if result is not None and kept_result is not None:
                differ = _differences(kept_result, result, table.metric)
                if differ:
                    raise UsageError(
                        f"{folder} holds another run than the kept record {kept} (kept against run folder: "
                        f"{'; '.join(differ)}): a kept record is never replaced by another run; move the run folder "
                        "or the record away"
                    )
            source = folder / "final_metrics.json" if result is not None else kept
            if result is None:
                result = kept_result
            wanted = rows is None or row.label in rows
            if result is None and wanted and (max_runs is None or trained < max_runs):
                cfg = load_config(table.recipe.config_cls, REPO / row.config, _items(table, row, seed, extra))
                _logger.info("%s: %s, seed %d -> %s", table.name, row.label, seed, folder)
                load_before, start = _load(), time.perf_counter()
                try:
                    run(table.recipe, cfg, RunOptions(output_dir=folder, resume="auto", device=device, progress=False))
                except UsageError as e:  # e.g. another runner holds the folder: say which run it is
                    # the folder is this runner's, under its --out: name the flag the user has
                    message = str(e).replace("--output-dir", "--out")
                    raise UsageError(f"{table.name}, {row.label!r}, seed {seed}: {message}") from e
                record = {
                    "commit": commit,
                    "load_before": load_before,
                    "load_after": _load(),
                    "wall_s": round(time.perf_counter() - start, 3),
                    "threads": torch.get_num_threads(),
                    "command": command(table, row, seed, out_dir, extra, device),
                }
                atomic_write_text(folder / RECORD, json.dumps(record, indent=1) + "\n")
                trained += 1
                result, source = _read(folder), folder / "final_metrics.json"
            if result is None:
                continue
            reason = _misfit(table, row, seed, result, out_dir, extra)
            if reason is not None:
                # a misfit is not retrained over: its file stays until someone looks at it
                _logger.warning("%s does not fit %s, %r, seed %d: %s", source, table.name, row.label, seed, reason)
                finished.append({"row": row.label, "seed": seed, "path": str(source), "refused": reason})
                continue
            if kept is not None and source != kept and not plan and result != kept_result:
                # the same run (checked above) or a first record: the run folder's may add to it (the curve)
                kept.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_text(kept, json.dumps(result, indent=1, sort_keys=True) + "\n")
            finished.append({**result, "row": row.label, "seed": seed})
    return finished


def _spread(values: list[float]) -> float | None:
    return statistics.stdev(values) if len(values) > 1 else None


def summarize(table: Table, records: Sequence[dict[str, Any]], seeds: Sequence[int]) -> list[dict[str, Any]]:
    """Per row: the metric's mean, sample standard deviation (n - 1; None for one seed), every seed's value, the
    means of the table's ``columns`` (``None`` where a run lacks one), the parameter count, the mean training time
    and wall time per run, the load averages, the commits, the records that do not fit (``refused``: seed, path,
    reason; a metric that is no finite number in range among them) and the seeds without a run that fits
    (``missing_seeds``)."""
    out = []
    for row in table.rows:
        runs, refused = [], []
        for r in sorted((r for r in records if r["row"] == row.label), key=lambda r: r["seed"]):
            reason = r["refused"] if "refused" in r else _metric_problem(table, r.get(table.metric))
            if reason is None:
                runs.append(r)
            else:
                refused.append({"seed": r["seed"], "path": r.get("path"), "reason": reason})
        values = [float(r[table.metric]) for r in runs]
        out.append({
            "row": row.label,
            "config": row.config,
            "n": len(values),
            "seeds": [r["seed"] for r in runs],
            "values": values,
            "mean": statistics.fmean(values) if values else None,
            "std": _spread(values),
            "columns": {key: _mean_of(runs, key) for key in table.columns},
            "params": runs[0].get("params") if runs else None,
            "train_min": statistics.fmean(r["train_time_s"] for r in runs) / 60 if runs else None,
            "wall_min": statistics.fmean(r["wall_s"] for r in runs if "wall_s" in r) / 60
            if any("wall_s" in r for r in runs) else None,
            "load": sorted({r[k] for r in runs for k in ("load_before", "load_after") if k in r}),
            "commits": sorted({r.get("commit", "unknown") for r in runs}),
            "refused": refused,
            "missing_seeds": [s for s in seeds if s not in {r["seed"] for r in runs}],
        })  # fmt: skip
    return out


def _mean_of(runs: Sequence[dict[str, Any]], key: str) -> float | None:
    values = [r.get(key) for r in runs]
    ok = values and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in values)
    return statistics.fmean(values) if ok else None


def _fmt(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def write_table(
    table: Table,
    summary: Sequence[dict[str, Any]],
    seeds: Sequence[int],
    out_dir: str | Path,
    extra: Sequence[str] = (),
    markdown: str | Path | None = None,
    json_path: str | Path | None = None,
    device: str = "cpu",
) -> str:
    """The table as Markdown (the regime, one line per row, the commits, each row's command, the runs still
    missing); written to ``markdown`` and, with every run's values, to ``json_path`` when given. Returns the
    Markdown."""
    digits = table.digits
    headers = [
        "row", "config", f"{table.metric} mean", "std", "n", "per seed", *(f"{c} mean" for c in table.columns),
        "params", "train min / run", "load avg",
    ]  # fmt: skip
    lines = []
    for s in summary:
        per_seed = ", ".join(f"{seed}: {v:.{digits}f}" for seed, v in zip(s["seeds"], s["values"])) or "not run"
        columns = [_fmt(s.get("columns", {}).get(c), digits) for c in table.columns]
        params = f"{s['params'] / 1e3:.0f} K" if s["params"] is not None else "-"
        load = "-" if not s["load"] else f"{min(s['load']):.1f}-{max(s['load']):.1f}"
        row = next(r for r in table.rows if r.label == s["row"])
        config = " ".join([f"`{Path(s['config']).name}`", *(f"`{o}`" for o in row.overrides)])
        lines.append([s["row"], config, _fmt(s["mean"], digits), _fmt(s["std"], digits), s["n"], per_seed, *columns,
                      params, _fmt(s["train_min"], 1), load])  # fmt: skip
    commits = sorted({c for s in summary for c in s["commits"]})
    text = [f"### {table.title}", "", table.description, "", markdown_table(headers, lines), ""]
    text.append(f"Seeds {list(seeds)}; commits of the runs: {', '.join(commits) if commits else 'none yet'}.")
    placeholder = Row("<row>", "<config>")
    template = command(table, placeholder, 0, out_dir, extra, device).replace("seed=0", "seed=<N>")
    template = template.replace(
        shlex.quote(str(run_dir(table, placeholder, 0, out_dir))), f"{out_dir}/{table.name}/<row>/seed<N>"
    )
    text += ["", "Each run is:", "", "```bash", template, "```", ""]
    text += ["with `<row>` / `<config>`: " + "; ".join(f"`{_slug(r.label)}` / `{r.config}`" + "".join(
        f" `{o}`" for o in r.overrides) for r in table.rows) + " (a row's own items follow its config's name: they go "
        "after the table's items)."]  # fmt: skip
    refused = [(s["row"], r) for s in summary for r in s.get("refused", ())]
    if refused:
        head = f"{len(refused)} record does not fit" if len(refused) == 1 else f"{len(refused)} records do not fit"
        text += ["", f"Left out ({head}; such a seed counts as missing until its file is moved away or replaced): "]
        text[-1] += "; ".join(f"{row} seed {r['seed']} (`{r['path']}`): {r['reason']}" for row, r in refused) + "."
    # a seed held by a record that does not fit is not retrained over (see run_table), so it is not listed as to run
    held = {(row, r["seed"]) for row, r in refused}
    missing = {s["row"]: [n for n in s["missing_seeds"] if (s["row"], n) not in held] for s in summary}
    missing = {row: v for row, v in missing.items() if v}
    if missing:
        runs = sum(len(v) for v in missing.values())
        text += ["", f"Not run yet ({runs} runs): " + "; ".join(f"{r} seeds {v}" for r, v in missing.items()) + "."]
        text.append(f"They run with `python tools/run_ablation.py --table {table.name} --seeds {max(seeds) + 1}`.")
    md = "\n".join(text) + "\n"
    if markdown is not None:
        atomic_write_text(Path(markdown), md)
    if json_path is not None:
        commands = {r.label: command(table, r, 0, out_dir, extra, device) for r in table.rows}
        payload = {"table": table.name, "title": table.title, "metric": table.metric, "columns": list(table.columns),
                   "regime": list(table.regime),
                   "seeds": list(seeds), "rows": list(summary), "commands": commands}  # fmt: skip
        atomic_write_text(Path(json_path), json.dumps(payload, indent=1) + "\n")
    return md


_COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22",
            "#17becf")  # fmt: skip


def curves_svg(table: Table, records: Sequence[dict[str, Any]], rows: Sequence[str] | None = None) -> str:
    """The learning curves of ``records`` (each with its ``curve``) as an SVG line chart: per row, the mean over its
    seeds of the table's metric (solid; in % of its range, so a metric in 0-1 is drawn x 100) and of the training
    accuracy (dashed, ``train_acc``, where every run records it) against the epoch.

    Args:
        table: the table (its rows' order and metric).
        records: finished runs (:func:`run_table`), with their per-epoch ``curve``.
        rows: labels of the rows to draw (default: every row with a curve).
    """
    series: list[tuple[str, list[float], list[float]]] = []
    scale = 100.0 / table.metric_range[1]  # drawn in % of the metric's range (accuracies are in % already)
    for row in table.rows:
        if rows is not None and row.label not in rows:
            continue
        curves = [r["curve"] for r in records if r["row"] == row.label and r.get("curve")]
        if not curves:
            continue
        epochs = min(len(c) for c in curves)
        mean = [statistics.fmean(scale * float(c[e].get(table.metric) or 0.0) for c in curves) for e in range(epochs)]
        has_train = all("train_acc" in c[e] for c in curves for e in range(epochs))
        train = [statistics.fmean(float(c[e]["train_acc"]) for c in curves) for e in range(epochs)] if has_train else []
        series.append((f"{row.label} (n={len(curves)})", mean, train))
    if not series:
        raise ValueError(f"no learning curve among the records of table {table.name!r}")
    width, height, left, right, top, bottom = 900, 440, 56, 390, 20, 44
    epochs = max(len(m) for _, m, _ in series)
    # the axis starts below the values after the first quarter of training; earlier ones sit on the axis
    lo = min(min(m[epochs // 4 :] + t[epochs // 4 :], default=0.0) for _, m, t in series)
    lo = max(0.0, math.floor(min(lo, 100.0) / 10.0) * 10.0)

    def xy(e: int, v: float) -> str:
        x = left + (width - left - right) * (e / max(epochs - 1, 1))
        y = top + (height - top - bottom) * (1.0 - (max(v, lo) - lo) / (100.0 - lo))
        return f"{x:.1f},{y:.1f}"

    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" '
           f'font-size="12"><rect width="100%" height="100%" fill="white"/>']  # fmt: skip
    for tick in range(int(lo), 101, 10):
        out.append(f'<line x1="{left}" x2="{width - right}" y1="{xy(0, tick).split(",")[1]}" '
                   f'y2="{xy(0, tick).split(",")[1]}" stroke="#ddd"/>')  # fmt: skip
        out.append(f'<text x="{left - 6}" y="{xy(0, tick).split(",")[1]}" text-anchor="end" dy="4">{tick}</text>')
    for e in range(epochs):
        x = xy(e, lo).split(",")[0]
        out.append(f'<text x="{x}" y="{height - bottom + 16}" text-anchor="middle">{e + 1}</text>')
    out.append(f'<text x="{(left + width - right) / 2}" y="{height - 8}" text-anchor="middle">epoch</text>')
    out.append(f'<text x="14" y="{(top + height - bottom) / 2}" transform="rotate(-90 14 '
               f'{(top + height - bottom) / 2})" text-anchor="middle">%</text>')  # fmt: skip
    for i, (label, metric, train) in enumerate(series):
        colour = _COLOURS[i % len(_COLOURS)]
        for values, dash in ((metric, ""), (train, ' stroke-dasharray="5,4"')):
            if not values:
                continue
            points = " ".join(xy(e, v) for e, v in enumerate(values))
            out.append(f'<polyline fill="none" stroke="{colour}" stroke-width="1.8"{dash} points="{points}"/>')
        y = top + 16 * i + 8
        out.append(f'<line x1="{width - right + 12}" x2="{width - right + 36}" y1="{y}" y2="{y}" stroke="{colour}" '
                   f'stroke-width="2"/>')  # fmt: skip
        text = label.replace("&", "&amp;").replace("<", "&lt;")
        out.append(f'<text x="{width - right + 42}" y="{y + 4}">{text}</text>')
    y = top + 16 * len(series) + 16
    solid = table.metric if scale == 1.0 else f"{table.metric} x {scale:g}"
    dashed = "; dashed: train_acc" if any(train for _, _, train in series) else ""
    out.append(f'<text x="{width - right + 12}" y="{y}">solid: {solid}{dashed}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def ablate(
    table: Table,
    seeds: Sequence[int],
    out_dir: str | Path,
    device: str = "cpu",
    rows: Sequence[str] | None = None,
    max_runs: int | None = None,
    markdown: str | Path | None = None,
    json_path: str | Path | None = None,
    records: str | Path | None = None,
    plan: bool = False,
    curves: str | Path | None = None,
) -> str:
    """Prepares ``table``, trains its missing runs (at most ``max_runs``; 0: none; ``plan``: none, and nothing is
    written into ``records``), and writes the table (:func:`write_table`) from every finished run in ``out_dir`` and
    ``records``, and with ``curves`` the runs' learning curves as an SVG (:func:`curves_svg`). Returns the Markdown."""
    _check_request(table, seeds, rows, max_runs)  # before prepare, which may write a data set
    out_dir = Path(out_dir)
    extra = table.prepare(out_dir) if table.prepare is not None else ()
    finished = run_table(table, seeds, out_dir, extra, device, rows, max_runs, records, plan)
    if curves is not None:
        atomic_write_text(Path(curves), curves_svg(table, finished))
    return write_table(table, summarize(table, finished, seeds), seeds, out_dir, extra, markdown, json_path, device)
