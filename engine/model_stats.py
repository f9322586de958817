"""Parameters and GMACs of registered models next to a paper's numbers: the library of ``tools/model_stats.py``.

Each domain package declares how its models are measured as one :class:`Family` (``pointcloud.stats``,
``capsules.stats``, ``vision.stats``): its registered names, a builder, one batch-1 input, the paper's numbers and
the tolerances ``--check`` holds them to. :func:`measure` counts one model (params by :func:`engine.count_params`,
GMACs per sample by :func:`engine.count_gmacs`), :func:`check` compares the measured rows with the paper, and
:func:`main` is the command line: one Markdown table per family, ``--json``, ``--check``. A model appears as soon as
its package registers it; a family that registers none is skipped with its ``note``.

A family may name a second count, ``per_edge``: a context manager that swaps the model's KNN attention for its
per-edge twin (keys and values projected per (centroid, neighbour) edge), when the paper's GMACs follow that count.
The table then shows both, and ``ratio`` and ``--check`` compare the paper with the per-edge one.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field

import torch
from torch import nn

from engine.atomic import atomic_write_text
from engine.bench import describe_machine, print_table
from engine.stats import count_gmacs, count_params

__all__ = ["Family", "check", "main", "measure"]


@dataclass(frozen=True)
class Family:
    """How to measure the models of one package.

    Attributes:
        list_models: registered model names; an empty list skips the family with ``note``.
        build: builds a model by name (default settings, eval-ready).
        example_input: one batch-1 input for a model, from ``--points`` (``None`` when not given).
        describe: the input, for the table's heading, from ``--points``.
        paper: model name -> (params in M, GMACs), either ``None`` where the paper gives none.
        checks: model name -> (relative params tolerance, relative GMACs tolerance) for ``--check``.
        per_edge: also count GMACs inside this context manager (KNN attention's key/value projections evaluated per
            edge, :func:`attention.edge_projection`), and compare that count with the paper's.
        note: why the family may have no models.
    """

    list_models: Callable[[], list[str]]
    build: Callable[[str], nn.Module]
    example_input: Callable[[int | None], torch.Tensor]
    describe: Callable[[int | None], str]
    paper: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    checks: dict[str, tuple[float, float]] = field(default_factory=dict)
    per_edge: Callable[[nn.Module], AbstractContextManager] | None = None
    note: str = ""


def _ratio(ours: float | None, paper: float | None) -> float | None:
    return ours / paper if ours is not None and paper else None


def measure(family: str, fam: Family, name: str, points: int | None = None) -> dict:
    """Params (M) and GMACs of one model of ``fam`` (named ``family`` in the row), with the paper's numbers and the
    ratios ours / paper. A model that fails to build or run gets an ``error`` instead of numbers."""
    paper_params, paper_gmacs = fam.paper.get(name, (None, None))
    row: dict = {"family": family, "model": name, "params_m": None, "gmacs": None}
    try:
        torch.manual_seed(0)
        model = fam.build(name)
        x = fam.example_input(points)
        row["input"] = list(x.shape)
        row["params_m"] = count_params(model) / 1e6
        row["gmacs"] = count_gmacs(model, x)
        if fam.per_edge is not None:
            with fam.per_edge(model):
                row["gmacs_edge"] = count_gmacs(model, x)
    except Exception as e:  # one broken (e.g. just-registered) model must not hide the others
        row["error"] = f"{type(e).__name__}: {e}"
    compared = row.get("gmacs_edge") if fam.per_edge is not None else row["gmacs"]
    row.update(
        paper_params_m=paper_params,
        params_ratio=_ratio(row["params_m"], paper_params),
        paper_gmacs=paper_gmacs,
        gmacs_ratio=_ratio(compared, paper_gmacs),
    )
    return row


def check(families: dict[str, Family], results: list[dict]) -> list[str]:
    """Failures of ``--check``: models in a family's ``checks`` whose numbers are off the paper's tolerance."""
    failures = []
    for r in results:
        fam = families[r["family"]]
        tols = fam.checks.get(r["model"])
        if tols is None:
            continue
        if "error" in r:
            failures.append(f"{r['model']}: could not be measured ({r['error']})")
            continue
        gmacs = ("GMACs (per-edge k/v)", "gmacs_edge") if fam.per_edge is not None else ("GMACs", "gmacs")
        for label, key, unit, tol in (("params", "params_m", " M", tols[0]), (*gmacs, "", tols[1])):
            ours, paper = r[key], r["paper_gmacs" if key.startswith("gmacs") else f"paper_{key}"]
            if paper is None:
                continue
            lo, hi = paper * (1 - tol), paper * (1 + tol)
            if not lo <= ours <= hi:
                failures.append(
                    f"{r['model']}: {label} measured {ours:.3f}{unit}, expected the paper's {paper}{unit} +-{tol:.0%} "
                    f"= [{lo:.3f}, {hi:.3f}] (ratio {ours / paper:.3f})"
                )
    return failures


def _fmt(v: float | None) -> object:
    return "-" if v is None else v


def main(families: dict[str, Family], argv: list[str] | None = None, description: str | None = None) -> list[dict]:
    """The command line of ``tools/model_stats.py`` over ``families``; returns the measured rows.

    Prints one Markdown table per family; exits 2 on a usage error and with the failures' message under ``--check``.
    """
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--family", default="all", choices=[*families, "all"])
    parser.add_argument("--points", type=int, default=None, help="points per cloud (default: 1024; capsules 2048)")
    parser.add_argument("--models", nargs="+", default=None, help="only these registered names")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--check", action="store_true", help="exit 1 if a checked model is outside the tolerance")
    args = parser.parse_args(argv)
    if args.check and args.points not in (None, 1024):
        parser.error("--check compares with the paper's numbers at 1024 points: drop --points")

    registered = {f: families[f].list_models() for f in (families if args.family == "all" else [args.family])}
    if args.models is not None:
        unknown = sorted(set(args.models) - {n for names in registered.values() for n in names})
        if unknown:
            parser.error(f"unknown models {unknown}; registered: {[n for names in registered.values() for n in names]}")
    checked = [n for f in registered for n in families[f].checks if n in registered[f]]
    if args.check and args.models is not None and not set(checked) <= set(args.models):
        parser.error(f"--check needs {checked} measured: keep them in --models")

    print(f"# model_stats: {describe_machine('cpu')}")
    print("# GMACs per sample by torch.utils.flop_counter (matmuls incl. attention; not element-wise, gather/scatter)")
    results: list[dict] = []
    for family, names in registered.items():
        fam = families[family]
        if not names:
            print(f"\n## {family}: skipped, {fam.note or 'no registered models'}")
            continue
        names = [n for n in names if args.models is None or n in args.models]
        if not names:
            continue
        rows = [measure(family, fam, n, args.points) for n in names]
        results += rows
        print(f"\n## {family}: {fam.describe(args.points)}\n")
        edge = fam.per_edge is not None
        print_table(
            ["model", "params (M)", "paper params (M)", "ratio", "GMACs", *["GMACs per-edge k/v"][:edge],
             "paper GMACs", "ratio"],
            [
                [r["model"], _fmt(r["params_m"]), _fmt(r["paper_params_m"]), _fmt(r["params_ratio"]),
                 _fmt(r["gmacs"]), *[_fmt(r.get("gmacs_edge"))][:edge], _fmt(r["paper_gmacs"]), _fmt(r["gmacs_ratio"])]
                for r in rows
            ],
        )  # fmt: skip
        for r in rows:
            if "error" in r:
                print(f"\nerror: {r['model']}: {r['error']}")
    if args.json:
        payload = {"tool": "model_stats", "machine": describe_machine("cpu"), "results": results}
        atomic_write_text(args.json, json.dumps(payload, indent=2) + "\n")
    if args.check:
        failures = check(families, results)
        if failures:
            raise SystemExit("model_stats --check FAILED:\n  " + "\n  ".join(failures))
        print(f"\ncheck: ok ({', '.join(checked) or 'no checked model registered'})")
    return results
