"""tools/bench_modelnet.py (logic in pointcloud.bench, tested in tests/pointcloud/test_bench.py) as a script: a usage
error, the table, the verdicts and --json."""

from __future__ import annotations

import json
from pathlib import Path

from engine.testing import run_tool

CT = "centroid_transformer_modelnet40"


def test_cli_prints_the_table_and_targets_and_writes_json(tmp_path: Path) -> None:
    """The script: a usage error exits 2; a run prints the table and the verdicts and writes --json."""
    bad = run_tool("bench_modelnet", ["--batch", "1"])
    assert bad.returncode == 2 and "--batch must be >= 2" in bad.stderr
    path = tmp_path / "bench.json"
    argv = ["--points", "64", "--batch", "2", "--repeats", "1", "--warmup", "0", "--num-centroids", "32", "16",
            "--steps", "1", "--models", CT, f"{CT}_random", "--json", str(path),
            "--profile", str(tmp_path / "p")]  # fmt: skip
    run = run_tool("bench_modelnet", argv)
    assert run.returncode == 0, run.stderr
    assert (
        "| model" in run.stdout and "target: centroid T=1 train samples/s vs the random twin's >= 0.5x:" in run.stdout
    )
    assert "## profile, train step, batch 2" in run.stdout  # --profile: each row's train step, a table and a trace
    for name in (f"b2-{CT}_T=1", f"b2-{CT}_random"):
        assert (tmp_path / "p" / f"{name}.txt").is_file() and (tmp_path / "p" / f"{name}.trace.json").is_file()
    payload = json.loads(path.read_text())
    assert payload["tool"] == "bench_modelnet" and payload["results"][0]["label"] == f"{CT} T=1"
    assert payload["results"][0]["profile"]["table"] == f"b2-{CT}_T=1.txt"
    assert [t["target"].split(" (")[0] for t in payload["targets"]] == [
        "centroid T=1 train samples/s vs the random twin's",
        "centroid T=1 train samples/s vs PointNet++",
        "centroid T=1, attn_backend=gather, train samples/s vs PointNet++",
    ]
    assert "batch" not in payload["targets"][1]["target"]  # one batch size: the verdicts as before


def test_cli_times_every_row_at_each_batch_size(tmp_path: Path) -> None:
    """``--batch 2 3``: one table per batch size, each row with its batch in --json, each verdict naming it."""
    path = tmp_path / "bench.json"
    argv = ["--points", "64", "--batch", "2", "3", "--repeats", "1", "--warmup", "0", "--num-centroids", "32", "16",
            "--steps", "1", "--models", CT, f"{CT}_random", "--json", str(path)]  # fmt: skip
    run = run_tool("bench_modelnet", argv)
    assert run.returncode == 0, run.stderr
    assert "## batch 2" in run.stdout and "## batch 3" in run.stdout
    payload = json.loads(path.read_text())
    rows = [(r["batch"], r["label"]) for r in payload["results"]]
    assert rows == [(b, label) for b in (2, 3) for label in (f"{CT} T=1", f"{CT}_random")]
    assert [t["title"] for t in payload["tables"]] == ["batch 2", "batch 3"]
    names = [t["target"] for t in payload["targets"]]
    assert names[0] == "centroid T=1 train samples/s vs the random twin's at batch 2" and len(names) == 6
    assert names[4] == "centroid T=1 train samples/s vs PointNet++ (batch 3, 64 points)"
    assert run_tool("bench_modelnet", ["--batch", "2", "1"]).returncode == 2  # every batch size is checked


def test_cli_variant_rows_build_the_centroid_model_with_their_keywords(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    argv = ["--points", "64", "--batch", "2", "--repeats", "1", "--warmup", "0", "--num-centroids", "32", "16",
            "--steps", "1", "--models", CT, "--json", str(path),
            "--variant", "CA pos. enc.:ca_pos_encoding=true,layer_scale=0.0",
            "T2 xyz:num_steps=2,ca_neighbors=xyz"]  # fmt: skip
    run = run_tool("bench_modelnet", argv)
    assert run.returncode == 0, run.stderr
    rows = {r["label"]: r for r in json.loads(path.read_text())["results"]}
    assert list(rows) == [f"{CT} T=1", f"{CT} CA pos. enc.", f"{CT} T2 xyz"]
    assert rows[f"{CT} T2 xyz"]["num_steps"] == 2
    assert rows[f"{CT} CA pos. enc."]["params_m"] > rows[f"{CT} T=1"]["params_m"]  # the encodings' and gamma's
    bad = run_tool("bench_modelnet", ["--variant", "no-colon"])
    assert bad.returncode == 2 and "LABEL:key=value" in bad.stderr


def test_parse_variant_reads_values_as_yaml() -> None:
    from pointcloud.bench import parse_variant

    assert parse_variant("a b:x=true,y=0.0,z=xyz, w = 3") == ("a b", {"x": True, "y": 0.0, "z": "xyz", "w": 3})
