"""capsules.bench (behind tools/bench_capsules.py): its rows, the settings it refuses, and its targets from the
ratios of one run."""

from __future__ import annotations

import pytest

from capsules import bench

ROUTING, CENTROID = bench.PAIRS["small"]


def test_entries_give_the_routing_models_one_row_per_impl() -> None:
    rows = bench.entries([ROUTING, CENTROID], ["einsum", "reference"], "torch", {"num_primary": 8})
    assert [(r["model"], r["impl"]) for r in rows] == [(ROUTING, "einsum"), (ROUTING, "reference"), (CENTROID, "-")]
    assert rows[1]["kwargs"] == {"primary_backend": "torch", "num_primary": 8, "routing_impl": "reference"}
    assert rows[2]["kwargs"] == {"primary_backend": "torch", "num_primary": 8}


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"models": ["pointcaps_tiny"]}, "unknown models ['pointcaps_tiny']"),
        ({"mem_batches": [4, 2]}, "and B1 < B2"),
        ({"batch": 1}, "--batch and --mem-batches need >= 2 clouds"),
    ],
)
def test_bad_settings(settings: dict, message: str) -> None:
    kwargs = {"models": [CENTROID], "device": "cpu", "batch": 2, "mem_batches": [2, 4], **settings}
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        bench.check_settings(**kwargs)


def _row(model: str, impl: str, params_m: float, max_batch: int, chamfer: float | None = None) -> dict:
    row = {"model": model, "impl": impl, "params_m": params_m, "max_batch": max_batch}
    row |= {"paper_max_batch": bench.PAPER[model][2]}
    return row | ({"chamfer": chamfer} if chamfer is not None else {})


def test_targets_compare_the_centroid_model_with_each_routing_impl() -> None:
    einsum, reference = _row(ROUTING, "einsum", 18.0, 20, 2e-3), _row(ROUTING, "reference", 18.0, 5)
    centroid = _row(CENTROID, "-", 0.5, 90, 1e-3)
    centroid["vs_routing"] = {
        "einsum": {"params": 0.5 / 18.0, "max_batch": 4.5, "chamfer": 0.5},
        "reference": {"params": 0.5 / 18.0, "max_batch": 18.0},
    }
    got = bench.targets([einsum, reference, centroid], "cpu", train_steps=3)
    assert [t["target"] for t in got] == [
        "small vs einsum routing: max batch",
        "small vs einsum routing: params",
        "small vs einsum routing: Chamfer after 3 steps",
        "small vs reference routing: max batch",
        "small vs reference routing: params",
    ]
    assert all(t["met"] for t in got)
    assert got[0]["detail"] == "90 vs 20; paper 2.64x" and got[2]["detail"] == "0.001 vs 0.002"
    assert bench.targets([einsum, reference], "cpu", train_steps=3) == []  # no centroid row: nothing to compare


def test_chamfer_backend_rows_time_every_installed_backend_against_dense_and_chunked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """bench_points' Chamfer table: one row per installed backend and size, each ratio against the dense reference and
    the chunked search of the same run, the same nearest indices; the dense reference sits out above its byte cap."""
    rows = bench.chamfer_backend_rows("cpu", [2], [40], repeats=1)
    by = {r[3]: dict(zip(bench.CHAMFER_HEADERS, r)) for r in rows}
    assert {"dense", "chunked", "knn_torch"} <= set(by) and all(r[:3] == [2, 40, 3] for r in rows)
    assert by["dense"]["speedup vs dense"] == 1.0 and by["chunked"]["speedup vs chunked"] == 1.0
    assert all(r["same indices"] == "yes" and r["ms"] > 0 for r in by.values())
    monkeypatch.setattr(bench, "CHAMFER_DENSE_MAX_BYTES", 2 * 40 * 40 * 3 * 4 - 1)
    rows = bench.chamfer_backend_rows("cpu", [2], [40], repeats=1)
    assert "dense" not in {r[3] for r in rows} and all(r[5] != r[5] for r in rows)  # NaN: no dense row to divide by
