"""tools/bench_vision.py (logic in vision.bench): a tiny run (as a script, read through --json) has the table, ratios
against DeiT measured in the same run, and the Ours-1 target."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.testing import REPO, run_tool, run_tools_batched
from vision.bench import OURS_1


def test_tiny_run_has_deit_baselines_and_ratios(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    argv = ["--batch", "2", "--img-size", "32", "--repeats", "1", "--warmup", "0", "--models", OURS_1,
            "settrans_deit_small_patch16_224", "--json", str(path), "--profile", str(tmp_path / "prof")]  # fmt: skip
    run = run_tool("bench_vision", argv)
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
    assert "  built deit_tiny_patch16_224" in run.stderr  # each model as it is built
    # --profile: each row's inference call under torch.profiler, an op table and a trace each, and a table of them
    assert "## profile, inference (" in run.stdout and f"| {OURS_1} " in run.stdout
    for r in results:
        table = r["profile"]["table"]
        assert table == f"b2-{r['label']}-infer.txt" and r["profile"]["device_ms"] is None  # CPU
        assert (tmp_path / "prof" / table).read_text().startswith(f"b2-{r['label']}-infer: 3 steps")
        assert (tmp_path / "prof" / table.replace(".txt", ".trace.json")).stat().st_size > 0
        assert r["infer_ms"] > 0 and abs(r["infer_ips"] - 2 / (r["infer_ms"] / 1e3)) < 1e-6 * r["infer_ips"]


def test_a_compile_mode_without_compiled_rows_is_refused_by_name() -> None:
    run = run_tool("bench_vision", ["--compile-mode", "reduce-overhead", "--models", OURS_1])
    assert run.returncode == 2
    assert "--compile-mode reduce-overhead needs compiled rows: add --compile (or --compile both)" in run.stderr


def test_capture_is_refused_by_name_off_a_gpu_with_train_steps_or_with_a_cuda_graph_compile_mode() -> None:
    graphs = ["--compile", "--compile-mode", "reduce-overhead"]
    for argv, says in (
        (["--capture", "--no-train"], "--capture times inference calls captured in CUDA graphs: add --device cuda"),
        (["--capture", "--device", "cuda"], "--capture times inference calls only: add --no-train"),
        (["--capture", "--device", "cuda", "--no-train", *graphs], "--capture replaces the CUDA graphs of --compile"),
    ):
        run = run_tool("bench_vision", [*argv, "--models", OURS_1])
        assert run.returncode == 2 and says in run.stderr, run.stderr


@pytest.mark.gpu
def test_captured_rows_on_cuda_replay_each_models_inference(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    argv = ["--device", "cuda", "--amp", "--capture", "--no-train", "--batch", "2", "--img-size", "32", "--repeats",
            "2", "--models", OURS_1, "--json", str(path)]  # fmt: skip
    run = run_tool("bench_vision", argv)
    assert run.returncode == 0, run.stderr
    results = json.loads(path.read_text())["results"]
    assert {r["label"] for r in results} == {f"{OURS_1} captured", "deit_tiny_patch16_224 captured"}
    assert all(r["captured"] and r["infer_ips"] > 0 and "error" not in r for r in results), results
    (target,) = json.loads(path.read_text())["targets"]
    assert target["measured"] is not None and ", inference captured in CUDA graphs" in run.stdout


def test_channels_last_runs_every_model_in_that_format(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    argv = ["--batch", "2", "--img-size", "32", "--repeats", "1", "--warmup", "0", "--models", OURS_1, "--no-train",
            "--channels-last", "--json", str(path)]  # fmt: skip
    run = run_tool("bench_vision", argv)
    assert run.returncode == 0, run.stderr
    assert ", channels last" in run.stdout
    assert json.loads(path.read_text())["args"]["channels_last"] is True


def test_several_batch_sizes_give_a_table_each_and_one_verdict(tmp_path: Path) -> None:
    path = tmp_path / "bench.json"
    argv = ["--batch", "1", "2", "--img-size", "32", "--repeats", "1", "--warmup", "0", "--models", OURS_1,
            "--no-train", "--json", str(path)]  # fmt: skip
    run = run_tool("bench_vision", argv)
    assert run.returncode == 0, run.stderr
    assert "# batch 1 and 2, 32 px" in run.stdout and "## batch 1\n" in run.stdout and "## batch 2\n" in run.stdout
    payload = json.loads(path.read_text())
    assert [(r["batch"], r["model"]) for r in payload["results"]] == [
        (1, "deit_tiny_patch16_224"), (1, OURS_1), (2, "deit_tiny_patch16_224"), (2, OURS_1)
    ]  # fmt: skip
    assert [t["title"] for t in payload["tables"]] == ["batch 1", "batch 2"]
    (target,) = payload["targets"]
    best = {m: max((r for r in payload["results"] if r["model"] == m), key=lambda r: r["infer_ips"]) for m in
            ("deit_tiny_patch16_224", OURS_1)}  # fmt: skip
    assert target["measured"] == best[OURS_1]["infer_ips"] / best["deit_tiny_patch16_224"]["infer_ips"]
    assert target["detail"] == f"(batch {best[OURS_1]['batch']}; DeiT-tiny's {best['deit_tiny_patch16_224']['batch']})"


def test_config_and_set_time_the_configs_model_at_its_image_size(tmp_path: Path) -> None:
    """--config / --set as train_deit.py reads them: configs/vision/small_images.yaml's 32 px model (and its DeiT) is
    what the rows hold; --models or --img-size beside them is refused, and so is an unknown key (no timing checked)."""
    path = tmp_path / "bench.json"
    config = ["--config", str(REPO / "configs" / "vision" / "small_images.yaml")]
    tiny = ["--batch", "1", "--repeats", "1", "--warmup", "0", "--no-train", "--json", str(path)]
    run, models, unknown = run_tools_batched([
        ("bench_vision", [*config, "--set", "depth=3", *tiny]),
        ("bench_vision", [*config, "--models", OURS_1]),
        ("bench_vision", ["--set", "img_sise=32"]),
    ])  # fmt: skip
    assert run.returncode == 0, run.stderr
    payload = json.loads(path.read_text())
    assert [(r["model"], r["img_size"], r["kwargs"]["depth"]) for r in payload["results"]] == [
        ("deit_tiny_patch16_224", 32, 3), (OURS_1, 32, 3)
    ]  # fmt: skip
    assert (
        payload["targets"] == [] and "# batch 1, 32 px" in run.stdout and "small_images.yaml with depth=3" in run.stdout
    )
    assert models.returncode == 2 and "not --models / --img-size" in models.stderr
    assert unknown.returncode == 2 and "img_sise" in unknown.stderr
