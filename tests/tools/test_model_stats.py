"""tools/model_stats.py (``engine.model_stats.main`` over each package's family): the pointcloud table, paper
columns, --check (per-edge GMACs against the paper), --json."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import capsules.stats
import pointcloud.stats
import vision.stats
from engine import model_stats
from engine.testing import run_tool
from pointcloud import model as pc_model
from pointcloud.testing import TinyPeer

# what tools/model_stats.py measures
FAMILIES = {"pointcloud": pointcloud.stats.FAMILY, "capsules": capsules.stats.FAMILY, "vision": vision.stats.FAMILY}

CT = "centroid_transformer_modelnet40"
TINY = "tiny_peer_modelnet40"


@pytest.fixture
def tiny_peer(monkeypatch: pytest.MonkeyPatch) -> str:
    """A model registered after the families were declared: it must show up on its own."""
    monkeypatch.setitem(pc_model.MODELS, TINY, TinyPeer)
    return TINY


def _rows(out: str) -> dict[str, list[str]]:
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("| ")]
    return {c[0]: c for c in cells}


def test_pointcloud_table_with_paper_columns(tmp_path: Path) -> None:
    """The script itself: its table on stdout, its --json, exit status 0."""
    path = tmp_path / "stats.json"
    run = run_tool("model_stats", ["--family", "pointcloud", "--models", CT, f"{CT}_random", "--json", str(path)])
    assert run.returncode == 0, run.stderr[-3000:]
    out, results = run.stdout, json.loads(path.read_text())["results"]
    by_name = {r["model"]: r for r in results}
    assert set(by_name) == {CT, f"{CT}_random"}
    for r in results:
        assert r["params_m"] > 0 and r["gmacs"] > 0 and r["input"] == [1, 1024, 3]
    ct = by_name[CT]
    assert ct["paper_params_m"] == 4.1 and ct["paper_gmacs"] == 5.4
    assert ct["params_ratio"] == pytest.approx(ct["params_m"] / 4.1)
    # The paper is compared with the per-edge count; ours projects per point and costs a fraction of it.
    assert ct["gmacs_ratio"] == pytest.approx(ct["gmacs_edge"] / 5.4)
    assert 0.1 * ct["gmacs_edge"] < ct["gmacs"] < 0.5 * ct["gmacs_edge"]
    assert by_name[f"{CT}_random"]["params_ratio"] is None  # the paper gives no twin numbers
    rows = _rows(out)
    assert rows["model"] == [
        "model", "params (M)", "paper params (M)", "ratio", "GMACs", "GMACs per-edge k/v", "paper GMACs", "ratio"
    ]  # fmt: skip
    assert rows[CT][2] == "4.1" and rows[CT][6] == "5.4" and float(rows[CT][3]) > 0
    assert rows[CT][4] == f"{ct['gmacs']:.3g}"  # the table prints 3 significant digits
    assert rows[f"{CT}_random"][2:4] == ["-", "-"]


def test_check_passes_on_defaults_and_fails_naming_values(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    (r,) = model_stats.main(FAMILIES, ["--family", "pointcloud", "--models", CT, "--check", "--json", str(path)])
    assert json.loads(path.read_text())["results"] == json.loads(json.dumps([r]))  # the defaults meet the paper
    assert r["gmacs_edge"] == pytest.approx(5.4, rel=0.25) and r["params_m"] == pytest.approx(4.1, rel=0.15)
    # Fewer neighbours take the per-edge count out of the tolerance; the message names measured and expected values.
    monkeypatch.setitem(pc_model.MODELS, CT, lambda **kw: pc_model.CentroidTransformer(num_neighbors=8, **kw))
    with pytest.raises(SystemExit) as exc:
        model_stats.main(FAMILIES, ["--family", "pointcloud", "--models", CT, "--check", "--json", str(path)])
    msg = str(exc.value.code)
    gmacs = json.loads(path.read_text())["results"][0]["gmacs_edge"]
    assert "FAILED" in msg and f"GMACs (per-edge k/v) measured {gmacs:.3f}" in msg
    assert "5.4 +-25% = [4.050, 6.750]" in msg


def test_new_model_appears_and_check_passes(tiny_peer: str, capsys: pytest.CaptureFixture[str]) -> None:
    paper = {tiny_peer: (160 / 1e6, 1024 * 3 * 40 / 1e9)}
    fam = dataclasses.replace(FAMILIES["pointcloud"], paper=paper, checks={tiny_peer: (0.01, 0.01)})
    (r,) = model_stats.main(
        {**FAMILIES, "pointcloud": fam}, ["--family", "pointcloud", "--models", tiny_peer, "--check"]
    )
    assert r["params_ratio"] == pytest.approx(1.0) and r["gmacs_ratio"] == pytest.approx(1.0)
    out = capsys.readouterr().out
    assert tiny_peer in _rows(out) and "check: ok" in out


def test_family_without_models_is_skipped(capsys: pytest.CaptureFixture[str]) -> None:
    empty = dataclasses.replace(FAMILIES["pointcloud"], list_models=list, note="nothing yet")
    assert model_stats.main({**FAMILIES, "empty": empty}, ["--family", "empty"]) == []
    assert "## empty: skipped, nothing yet" in capsys.readouterr().out


def test_placeholders_skipped_and_unknown_model_rejected(tiny_peer: str, capsys: pytest.CaptureFixture[str]) -> None:
    results = model_stats.main(FAMILIES, ["--models", tiny_peer])  # --family all
    out = capsys.readouterr().out
    assert [r["model"] for r in results] == [tiny_peer]
    for family in ("capsules", "vision"):
        if not FAMILIES[family].list_models():
            assert f"## {family}: skipped" in out
    with pytest.raises(SystemExit) as exc:
        model_stats.main(FAMILIES, ["--models", "no_such_model"])
    assert exc.value.code == 2
