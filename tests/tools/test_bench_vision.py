"""tools/bench_vision.py: a tiny run (as a script, read through --json) has the table, ratios against DeiT measured in
the same run, and the Ours-1 target (vision.bench)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from engine.testing import REPO, tool_env
from vision.bench import OURS_1, ours_target, registered


def test_tiny_run_has_deit_baselines_and_ratios(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    argv = ["--batch", "2", "--img-size", "32", "--repeats", "1", "--warmup", "0", "--models", OURS_1,
            "settrans_deit_small_patch16_224", "--json", str(path)]  # fmt: skip
    run = subprocess.run([sys.executable, str(REPO / "tools" / "bench_vision.py"), *argv], env=tool_env(),
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    payload = json.loads(path.read_text())
    results = payload["results"]
    assert {"deit_tiny_patch16_224", "deit_small_patch16_224"} <= {r["model"] for r in results}
    by = {r["model"]: r for r in results}
    assert by["deit_tiny_patch16_224"]["infer_vs_deit"] == 1.0
    assert by[OURS_1]["infer_ips"] > 0 and by[OURS_1]["gmacs"] > 0
    (target,) = payload["targets"]
    assert target["measured"] == by[OURS_1]["infer_vs_deit"] and target["wanted"] == ">= 1.4x"
    assert (
        "infer vs DeiT" in run.stdout and "target: Ours-1 inference images/s vs DeiT-tiny on CPU >= 1.4x" in run.stdout
    )


def test_ours_target_is_per_device_and_needs_the_row() -> None:
    rows = [{"model": OURS_1, "infer_vs_deit": 1.5}]
    assert ours_target(rows, "cpu")["met"] is True
    on_gpu = ours_target(rows, "cuda")
    assert on_gpu["wanted"] == ">= 1.6x" and on_gpu["met"] is False
    assert ours_target([], "cuda")["met"] is None


def test_registered_lists_every_vision_model() -> None:
    names = registered()
    assert "centroid_deit_tiny_c6_patch16_224" in names and "linformer_deit_small_patch16_224" in names
    assert len(names) == 10
