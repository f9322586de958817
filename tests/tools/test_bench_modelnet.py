"""tools/bench_modelnet.py at a tiny size: rows for T = 1, 2, 3 and the twins, ratios, verdict, peers, --json."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from engine.testing import load_tool
from pointcloud import model as pc_model

REPO = Path(__file__).resolve().parents[2]
bench_modelnet = load_tool("bench_modelnet")

CT = "centroid_transformer_modelnet40"
TINY = "tiny_peer_modelnet40"


class TinyPeer(nn.Module):
    def __init__(self, num_classes: int = 40) -> None:
        super().__init__()
        self.fc = nn.Linear(3, num_classes)

    def forward(self, points: torch.Tensor) -> torch.Tensor:
        return self.fc(points).amax(1)


def test_tiny_bench(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    monkeypatch.setitem(pc_model.MODELS, TINY, TinyPeer)
    path = tmp_path / "bench.json"
    argv = ["--points", "128", "--batch", "2", "--repeats", "1", "--warmup", "1", "--num-centroids", "64", "32"]
    results = bench_modelnet.main([*argv, "--models", CT, f"{CT}_random", TINY, "--json", str(path)])
    labels = [r["label"] for r in results]
    assert labels == [f"{CT} T=1", f"{CT} T=2", f"{CT} T=3", f"{CT}_random", TINY]
    for r in results:
        assert r["params_m"] > 0 and r["gmacs"] > 0 and r["train_sps"] > 0 and r["infer_sps"] > 0
        assert r["train_ms_rounds"] == [r["train_ms"]]  # --repeats 1: one timed round
        assert r["ops_per_step"] > r["kernel_ops_per_step"] > 0
    by = {r["label"]: r for r in results}
    assert by[f"{CT}_random"]["train_vs_random"] == 1.0
    assert by[f"{CT} T=1"]["paper_train_vs_random"] == pytest.approx(60 / 312)
    assert by[f"{CT} T=2"]["gmacs"] > by[f"{CT} T=1"]["gmacs"]  # one more attention step
    assert by[TINY]["num_steps"] is None and by[TINY]["paper_train_sps"] is None
    assert by[f"{CT} T=2"]["ops_per_step"] > by[f"{CT} T=1"]["ops_per_step"] > by[TINY]["ops_per_step"]

    out = capsys.readouterr().out
    header, *table = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line[:2] == "| "]
    assert {"train vs random", "paper vs random", "infer samples/s"} <= set(header)
    rows = {r[0]: dict(zip(header, r)) for r in table}
    assert list(rows) == labels
    assert rows[f"{CT} T=1"]["paper vs random"] == "0.192" and rows[TINY]["paper vs random"] == "-"
    assert float(rows[f"{CT} T=1"]["train vs random"]) > 0
    assert "target: centroid (T=1) train throughput >= 0.5x the random twin's:" in out
    assert json.loads(path.read_text())["results"][0]["label"] == f"{CT} T=1"


def test_default_models_include_registered_peers(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(pc_model.MODELS, TINY, TinyPeer)
    models = bench_modelnet.default_models()
    assert models[:4] == [CT, f"{CT}_random", f"{CT}_fps", f"{CT}_kmeans"] and models[-1] == TINY
    rows = bench_modelnet.plan(models, [1, 2, 3], [64, 32])
    assert [r[2] for r in rows[:6]] == [1, 2, 3, 0, 0, 0]
    assert rows[0][3] == {"num_classes": 40, "num_centroids": (64, 32), "num_steps": 1, "attn_backend": "auto"}
    assert rows[-1][3] == {"num_classes": 40}  # peers get no centroid knobs
    both = bench_modelnet.plan([CT, TINY], [1], None, ["auto", "masked"])
    assert [r[0] for r in both] == [f"{CT} T=1", f"{CT} T=1 masked", TINY]
    assert both[1][3]["attn_backend"] == "masked"
    chunks = bench_modelnet.plan([CT], [1], None, ["auto"], [16])
    assert [r[0] for r in chunks] == [f"{CT} T=1", f"{CT} T=1 chunks 16 MiB"]
    assert chunks[1][3]["_chunk_mb"] == 16 and chunks[1][3]["attn_backend"] == "gather"


def test_chunk_budget_sets_every_default_within_and_restores_them(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``--chunk-mb`` row really runs at its budget: the budgets its forward's chunking asked for (the backward
    reuses the forward's chunk rows)."""
    import attention.centroid.functional as functional
    from attention.chunking import chunk_budget

    def defaults() -> tuple[int, int, int, int]:
        return tuple(chunk_budget(op, d) for op in ("knn_attention", "knn") for d in ("cpu", "cuda"))

    before = defaults()
    budgets = []
    real = functional.chunk_rows
    spy = lambda n, row, budget: budgets.append(budget) or real(n, row, budget)  # noqa: E731
    monkeypatch.setattr(functional, "chunk_rows", spy)
    model = pc_model.create_model(CT, num_centroids=(32, 16), num_neighbors=8)
    x = torch.rand(2, 64, 3)
    with bench_modelnet.chunk_budget(1):
        assert defaults() == (2**20,) * 4
        model(x).sum().backward()
    assert budgets and set(budgets) == {2**20}
    assert defaults() == before


@pytest.mark.parametrize("argv", [["--amp"], ["--models", "no_such_model"], ["--batch", "1"], ["--chunk-mb", "0"]])
def test_bad_flags(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        bench_modelnet.main(argv)
    assert exc.value.code == 2
