"""tools/gpu_check.py: table parsing, junit reading, skip reasons, targets (the whole run is in .ci/run)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tools"))
import gpu_check  # noqa: E402

BENCH_OUTPUT = """# bench_mixers on cuda: torch 2.11.0, NVIDIA H100
# B=1, C=256, H=4, one forward + backward

| L     | mixer            | ms   | peak MB | time vs matmul | memory vs matmul | time vs sdpa | memory vs sdpa |
|-------|------------------|------|---------|----------------|------------------|--------------|----------------|
| 16384 | attention-sdpa   | 10.0 | 100     | 0.1            | 0.01             | 1            | 1              |
| 16384 | fsat             | 8.00 | 50      | 0.08           | 0.005            | 0.8          | 0.5            |

target: something >= 1.6x: NOT MET (1.20x)
"""


def test_markdown_tables_are_parsed_with_their_titles() -> None:
    (table,) = gpu_check.parse_markdown_tables(BENCH_OUTPUT)
    assert table["title"] == "B=1, C=256, H=4, one forward + backward"
    assert table["headers"][:3] == ["L", "mixer", "ms"]
    records = gpu_check.table_records(table)
    assert [r["mixer"] for r in records] == ["attention-sdpa", "fsat"]
    assert gpu_check.to_number(records[1]["time vs sdpa"]) == 0.8
    assert gpu_check.to_number("-") != gpu_check.to_number("-")  # NaN for cells that are not numbers


def test_missing_optional_package_is_a_skip_reason_and_other_errors_are_not() -> None:
    assert gpu_check.missing_optional("ModuleNotFoundError: No module named 'trimesh'") == "trimesh"
    assert gpu_check.missing_optional("ModuleNotFoundError: No module named 'torch_cluster._C'") == "torch_cluster"
    assert gpu_check.missing_optional("ModuleNotFoundError: No module named 'attention'") is None
    assert gpu_check.missing_optional("RuntimeError: CUDA error") is None


def test_junit_rows_count_outcomes(tmp_path: Path) -> None:
    xml = tmp_path / "t.xml"
    xml.write_text(
        '<testsuites><testsuite name="pytest">'
        '<testcase classname="tests.attention.test_points" name="test_a" time="0.5"/>'
        '<testcase classname="tests.attention.test_points" name="test_b" time="0.1">'
        '<failure message="assert 1 == 2&#10;more">trace</failure></testcase>'
        '<testcase classname="tests.capsules.test_model" name="test_c" time="0">'
        '<skipped message="needs a CUDA device (marked gpu)"/></testcase>'
        "</testsuite></testsuites>"
    )
    rows, counts = gpu_check.junit_rows(xml)
    assert counts == {"passed": 1, "failed": 1, "skipped": 1}
    assert rows[1] == ["test_points::test_b", "failed", "0.10", "assert 1 == 2"]
    assert rows[2][1:] == ["skipped", "0.00", "needs a CUDA device (marked gpu)"]


def _result(name: str, tables: list[dict] | None = None, data: dict | None = None) -> gpu_check.Result:
    return gpu_check.Result(name, tables=tables or [], data=data or {})


def test_targets_are_ratios_of_the_same_run_with_verdicts() -> None:
    kernels = {"rows": [{"kernel": "fps", "shape": "B=32", "speedup": 2.5}, {"kernel": "cauchy", "speedup": 4.0}]}
    modelnet = {
        "title": "",
        "headers": ["model", "ops/step", "train samples/s"],
        "rows": [
            [gpu_check.CENTROID_T1, "1434", "300"],
            [gpu_check.CENTROID_T1_GATHER, "1138", "500"],
            [gpu_check.POINTNET2, "511", "200"],
        ],
    }
    vision = {"title": "", "headers": ["model", "infer vs DeiT"], "rows": [[gpu_check.OURS_1, "1.5"]]}
    points = {
        "title": "Farthest point sampling",
        "headers": ["B", "N", "M", "backend", "ms", "speedup vs cluster"],
        "rows": [["32", "1024", "512", "torch", "90", "0.02"], ["32", "1024", "512", "triton", "0.7", "2.6"]],
    }
    results = {
        "kernels": _result("kernels", data=kernels),
        "bench_modelnet": _result("bench_modelnet", [modelnet]),
        "bench_vision": _result("bench_vision", [vision]),
        "bench_points": _result("bench_points", [points]),
        "bench_mixers": _result("bench_mixers", gpu_check.parse_markdown_tables(BENCH_OUTPUT)),
    }
    got = {t["target"].split(" (")[0]: t for t in gpu_check.targets(results, "cuda")}
    assert got["Triton fps vs torch"]["met"] is True and got["Triton fps vs torch"]["measured"] == 2.5
    assert got["Triton cauchy vs torch"]["met"] is False
    assert got["Triton vandermonde vs torch"]["met"] is None  # not measured is neither met nor failed
    assert got["Triton fps vs torch-cluster"]["measured"] == 2.6 and got["Triton fps vs torch-cluster"]["met"]
    points["rows"][1][-1] = "nan"  # no torch-cluster: no verdict, and the reason
    cluster = next(t for t in gpu_check.targets(results, "cuda") if "torch-cluster" in t["target"])
    assert cluster["met"] is None and cluster["detail"] == "torch-cluster not installed"
    assert got["centroid T=1 train samples/s vs PointNet++"]["measured"] == pytest.approx(1.5)
    assert got["centroid T=1 train samples/s vs PointNet++"]["detail"] == "ops/step 1434 vs 511"
    assert got["centroid T=1, attn_backend=gather, train samples/s vs PointNet++"]["measured"] == pytest.approx(2.5)
    assert got["Ours-1 inference images/s vs DeiT-tiny"]["met"] is False
    assert got["FSAT time vs SDPA at L >= 16K"]["measured"] == 0.8 and got["FSAT time vs SDPA at L >= 16K"]["met"]
    on_cpu = gpu_check.targets(results, "cpu")
    assert all(t["met"] is None for t in on_cpu) and on_cpu[0]["measured"] == 2.5  # CUDA targets: no CPU verdicts


def test_bench_arguments_name_real_options() -> None:
    """Every option gpu_check passes to a bench is in that bench's parser: a renamed flag fails here, not on a GPU."""
    for device in ("cpu", "cuda"):
        for quick in (True, False):
            ctx = gpu_check.Ctx(device, quick, Path("."), {}, Path("."), gpu_mem_gib=80.0)
            for name in (s for s in gpu_check.SECTIONS if s.startswith("bench_")):
                source = (REPO / "tools" / f"{name}.py").read_text()
                for arg in gpu_check.bench_args(ctx, name):
                    if arg.startswith("--"):
                        assert f'"{arg}"' in source, f"{name} has no option {arg}"


def test_the_two_parts_cover_every_section_once_but_env() -> None:
    one, two = gpu_check.PARTS[1], gpu_check.PARTS[2]
    assert set(one) | set(two) == set(gpu_check.SECTIONS)
    assert set(one) & set(two) == {"env"}  # both report the machine and size the capsule bench's budget


def test_part_two_keeps_part_one_and_its_summary_covers_both(tmp_path: Path) -> None:
    """``--part 2`` into part 1's folder: part 1's sections stay, the targets and summary use them, env is redone."""
    out = tmp_path / "gc"
    out.mkdir()
    (out / gpu_check.MARKER).write_text("--device cpu\nwritten by gpu_check\n")  # part 1, killed before its summary
    kernels = {"rows": [{"kernel": "fps", "shape": "B=32 N=1024 M=512", "speedup": 3.0}]}
    gpu_check.write_section(out, gpu_check.Result("kernels", seconds=100.0, data=kernels))
    gpu_check.write_section(out, gpu_check.Result("env", reason="part 1's env"))
    skip = [s for s in gpu_check.PARTS[2] if s != "env"]
    no_wheels = ["--wheels", str(tmp_path)]  # (none: a checkout's .whl may hold wheels for another Python)
    rc = gpu_check.main(["--device", "cpu", "--part", "2", "--out", str(out), *no_wheels, "--skip", *skip])
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["sections"]) == ["env", "kernels"]  # in the usual order; env from this run
    assert summary["sections"]["env"]["reason"] == "" and summary["sections"]["kernels"]["seconds"] == 100.0
    assert summary["commands"] == ["--device cpu --part 1", "--device cpu --part 2"] and summary["wall_s"] > 100.0
    assert "    python tools/gpu_check.py --device cpu --part 2" in (out / "summary.md").read_text()
    fps = next(t for t in summary["targets"] if t["target"].startswith("Triton fps vs torch ("))
    assert fps["measured"] == 3.0
    with pytest.raises(SystemExit):  # a quick run's folder does not take the full grid's second part
        gpu_check.main(["--device", "cpu", "--quick", "--part", "2", "--out", str(out), *no_wheels, "--skip", *skip])
    # part 1 (or a plain run) clears the folder it wrote before
    assert gpu_check.main(["--device", "cpu", "--part", "1", "--out", str(out), *no_wheels, "--skip",
                           *gpu_check.PARTS[1][1:]]) == 0  # fmt: skip
    assert not (out / "kernels.json").exists()


def test_carried_wheels_for_another_python_or_misnamed_are_left_out(tmp_path: Path) -> None:
    assert not gpu_check._wheel_fits(tmp_path / "pkg-1.0-cp27-cp27mu-manylinux1_x86_64.whl")  # CPython 2.7
    assert gpu_check._wheel_fits(tmp_path / "pure-1.0-py3-none-any.whl")
    assert not gpu_check._wheel_fits(tmp_path / "not-a-wheel-name.whl")
