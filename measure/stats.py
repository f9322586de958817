"""Model statistics: parameter counts and multiply-accumulates counted by ``torch.utils.flop_counter``.

``FlopCounterMode`` counts the FLOPs of every matmul-like aten op that actually runs, attention matmuls included,
so models with different token counts are compared fairly. One MAC is two FLOPs; element-wise ops (norms,
activations, softmax) are not counted, as in the papers' GMAC figures.

``scaled_dot_product_attention`` runs as its math form (two batched matmuls) while counting: not every torch
version's counter knows every fused kernel (torch 2.11 counts nothing for the CPU flash kernel, which timm's
attention picks, and so missed DeiT-tiny's attention: 1.07 instead of 1.25 GMACs).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

__all__ = ["ModelFamily", "check_against_paper", "count_gmacs", "count_params", "measure_model", "stats_report"]


def count_params(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of parameters (shared parameters counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


@torch.no_grad()
def count_gmacs(model: nn.Module | Callable, *inputs: torch.Tensor) -> float:
    """GMACs of one forward pass on ``inputs`` (in eval mode; the model's mode is restored)."""
    was_training = getattr(model, "training", False)
    if isinstance(model, nn.Module):
        model.eval()
    try:
        with sdpa_kernel(SDPBackend.MATH), FlopCounterMode(display=False) as counter:
            model(*inputs)
    finally:
        if isinstance(model, nn.Module):
            model.train(was_training)
    return counter.get_total_flops() / 2e9


@dataclass(frozen=True)
class ModelFamily:
    """How to measure the models of one package against its paper (``tools/model_stats.py`` reads one per package).

    Attributes:
        list_models: registered model names; an empty list skips the family with ``note``.
        build: builds a model by name (default settings, eval-ready).
        example_input: one batch-1 input for a model, given the requested points per cloud (None: the default).
        describe: the input, for the table's heading, given the same points argument.
        paper: model name -> (params in M, GMACs), either ``None`` where the paper gives none.
        checks: model name -> (relative params tolerance, relative GMACs tolerance) for ``--check``.
        edge_gmacs: a context manager over a model that evaluates an alternative count (e.g.
            :func:`attention.edge_projection`, KNN attention's key/value projections per edge); when given, the paper's
            GMACs are compared with that count.
        note: why the family may have no models.
    """

    list_models: Callable[[], list[str]]
    build: Callable[[str], nn.Module]
    example_input: Callable[[int | None], torch.Tensor]
    describe: Callable[[int | None], str]
    paper: dict[str, tuple[float | None, float | None]] = field(default_factory=dict)
    checks: dict[str, tuple[float, float]] = field(default_factory=dict)
    edge_gmacs: Callable[[nn.Module], contextlib.AbstractContextManager] | None = None
    note: str = ""


def _ratio(ours: float | None, paper: float | None) -> float | None:
    return ours / paper if ours is not None and paper else None


def measure_model(family: str, fam: ModelFamily, name: str, points: int | None = None) -> dict:
    """Params (M) and GMACs of one model, with the paper's numbers and the ratios ours / paper; a model that fails
    to build or run gets an ``error`` entry instead of hiding the others."""
    paper_params, paper_gmacs = fam.paper.get(name, (None, None))
    row: dict = {"family": family, "model": name, "params_m": None, "gmacs": None}
    try:
        torch.manual_seed(0)
        model = fam.build(name)
        x = fam.example_input(points)
        row["input"] = list(x.shape)
        row["params_m"] = count_params(model) / 1e6
        row["gmacs"] = count_gmacs(model, x)
        if fam.edge_gmacs is not None:
            with fam.edge_gmacs(model):
                row["gmacs_edge"] = count_gmacs(model, x)
    except Exception as e:
        row["error"] = f"{type(e).__name__}: {e}"
    compared = row.get("gmacs_edge") if fam.edge_gmacs is not None else row["gmacs"]
    row.update(
        paper_params_m=paper_params,
        params_ratio=_ratio(row["params_m"], paper_params),
        paper_gmacs=paper_gmacs,
        gmacs_ratio=_ratio(compared, paper_gmacs),
    )
    return row


def check_against_paper(families: dict[str, ModelFamily], results: list[dict]) -> list[str]:
    """The models in a family's ``checks`` whose numbers are off the paper's tolerance, each with measured and
    expected values."""
    failures = []
    for r in results:
        fam = families[r["family"]]
        tols = fam.checks.get(r["model"])
        if tols is None:
            continue
        if "error" in r:
            failures.append(f"{r['model']}: could not be measured ({r['error']})")
            continue
        gmacs = ("GMACs (per-edge k/v)", "gmacs_edge") if fam.edge_gmacs is not None else ("GMACs", "gmacs")
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


def stats_report(
    families: dict[str, ModelFamily], models: list[str] | None = None, points: int | None = None, check: bool = False
) -> tuple[list[dict], str]:
    """Measures every registered model of ``families`` (or only ``models``): the rows and one Markdown table per family.

    Raises:
        ValueError: an unknown model name, or ``check`` with a subset of models that leaves a checked one out.
    """
    from .bench import markdown_table

    def fmt(v: float | None) -> object:
        return "-" if v is None else v

    registered = {f: fam.list_models() for f, fam in families.items()}
    every = [n for names in registered.values() for n in names]
    if models is not None and (unknown := sorted(set(models) - set(every))):
        raise ValueError(f"unknown models {unknown}; registered: {every}")
    checked = [n for f in registered for n in families[f].checks if n in registered[f]]
    if check and models is not None and not set(checked) <= set(models):
        raise ValueError(f"--check needs {checked} measured: keep them in --models")
    results: list[dict] = []
    text = []
    for family, names in registered.items():
        fam = families[family]
        if not names:
            text.append(f"## {family}: skipped, {fam.note or 'no registered models'}")
            continue
        names = [n for n in names if models is None or n in models]
        if not names:
            continue
        rows = [measure_model(family, fam, n, points) for n in names]
        results += rows
        edge = fam.edge_gmacs is not None
        table = markdown_table(
            ["model", "params (M)", "paper params (M)", "ratio", "GMACs", *["GMACs per-edge k/v"][:edge],
             "paper GMACs", "ratio"],
            [
                [r["model"], fmt(r["params_m"]), fmt(r["paper_params_m"]), fmt(r["params_ratio"]),
                 fmt(r["gmacs"]), *[fmt(r.get("gmacs_edge"))][:edge], fmt(r["paper_gmacs"]), fmt(r["gmacs_ratio"])]
                for r in rows
            ],
        )  # fmt: skip
        errors = "".join(f"\n\nerror: {r['model']}: {r['error']}" for r in rows if "error" in r)
        text.append(f"## {family}: {fam.describe(points)}\n\n{table}{errors}")
    return results, "\n\n".join(text)
