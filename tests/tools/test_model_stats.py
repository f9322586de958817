"""tools/model_stats.py (logic in measure.stats, paper numbers in each package's ``stats``): the pointcloud table,
paper columns, --check (per-edge GMACs against the paper), --json."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

import capsules.stats
import pointcloud.stats
import vision.stats
from engine.testing import run_tool
from measure.stats import check_against_paper, stats_report
from pointcloud import model as pc_model
from pointcloud.testing import TinyPeer

FAMILIES = {"pointcloud": pointcloud.stats.FAMILY, "capsules": capsules.stats.FAMILY, "vision": vision.stats.FAMILY}

CT = "centroid_transformer_modelnet40"
TINY = "tiny_peer_modelnet40"


@pytest.fixture
def tiny_peer(monkeypatch: pytest.MonkeyPatch) -> str:
    """A model registered after model_stats was imported: it must show up on its own."""
    monkeypatch.setitem(pc_model.MODELS, TINY, TinyPeer)
    return TINY


def _rows(out: str) -> dict[str, list[str]]:
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in out.splitlines() if line.startswith("| ")]
    return {c[0]: c for c in cells}


def test_pointcloud_table_with_paper_columns(tmp_path: Path) -> None:
    path = tmp_path / "stats.json"
    argv = ["--family", "pointcloud", "--models", CT, f"{CT}_random", "--json", str(path)]
    run = run_tool("model_stats", argv)
    assert run.returncode == 0, run.stderr
    out = run.stdout
    results = json.loads(path.read_text())["results"]
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
    bad = run_tool("model_stats", ["--models", "no_such_model"])
    assert bad.returncode == 2 and "unknown models ['no_such_model']" in bad.stderr


def test_check_passes_on_defaults_and_fails_naming_values(monkeypatch: pytest.MonkeyPatch) -> None:
    fams = {"pointcloud": FAMILIES["pointcloud"]}
    (r,), _ = stats_report(fams, [CT], check=True)  # the defaults meet the paper
    assert check_against_paper(fams, [r]) == []
    assert r["gmacs_edge"] == pytest.approx(5.4, rel=0.25) and r["params_m"] == pytest.approx(4.1, rel=0.15)
    # Fewer neighbours take the per-edge count out of the tolerance; the message names measured and expected values.
    monkeypatch.setitem(pc_model.MODELS, CT, lambda **kw: pc_model.CentroidTransformer(num_neighbors=8, **kw))
    (r,), _ = stats_report(fams, [CT], check=True)
    (msg,) = check_against_paper(fams, [r])
    assert f"GMACs (per-edge k/v) measured {r['gmacs_edge']:.3f}" in msg
    assert "5.4 +-25% = [4.050, 6.750]" in msg
    with pytest.raises(ValueError, match="--check needs"):
        stats_report(fams, [f"{CT}_random"], check=True)


def test_new_model_appears_and_check_passes(tiny_peer: str) -> None:
    paper = {tiny_peer: (160 / 1e6, 1024 * 3 * 40 / 1e9)}
    fam = dataclasses.replace(FAMILIES["pointcloud"], paper=paper, checks={tiny_peer: (0.01, 0.01)}, edge_gmacs=None)
    (r,), tables = stats_report({"pointcloud": fam}, [tiny_peer], check=True)
    assert r["params_ratio"] == pytest.approx(1.0) and r["gmacs_ratio"] == pytest.approx(1.0)
    assert tiny_peer in _rows(tables) and check_against_paper({"pointcloud": fam}, [r]) == []


def test_family_without_models_is_skipped() -> None:
    empty = dataclasses.replace(FAMILIES["pointcloud"], list_models=list, note="nothing yet")
    assert stats_report({"empty": empty}) == ([], "## empty: skipped, nothing yet")


def test_every_family_lists_its_models_and_rejects_unknown_ones(tiny_peer: str) -> None:
    assert tiny_peer in FAMILIES["pointcloud"].list_models()  # registered after the family was made
    assert "centroid_deit_tiny_c6_patch16_224" in FAMILIES["vision"].list_models()
    assert "pointcaps_routing_small" in FAMILIES["capsules"].list_models()
    results, _ = stats_report(FAMILIES, [tiny_peer])
    assert [r["model"] for r in results] == [tiny_peer]
    with pytest.raises(ValueError, match=r"unknown models \['no_such_model'\]"):
        stats_report(FAMILIES, ["no_such_model"])
