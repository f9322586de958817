"""measure.gpu_check (behind tools/gpu_check.py): junit reading, skip reasons, the benches' reports and targets, the
two parts (the whole run is in .ci/run)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from attention.bench import kernel_targets
from engine.testing import run_tool, run_tools_batched
from measure import gpu_check
from measure.bench import target

REPO = Path(__file__).resolve().parents[2]


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


def test_kernel_targets_are_ratios_of_the_same_run_with_verdicts() -> None:
    rows = [{"kernel": "fps", "shape": "B=32", "speedup": 2.5}, {"kernel": "cauchy", "shape": "L=4096", "speedup": 4.0}]
    got = {t["target"].split(" (")[0]: t for t in kernel_targets(rows, "cuda")}
    assert got["Triton fps vs torch"]["met"] is True and got["Triton fps vs torch"]["measured"] == 2.5
    assert got["Triton cauchy vs torch"]["met"] is False and got["Triton cauchy vs torch"]["wanted"] == ">= 5x"
    assert got["Triton vandermonde vs torch"]["met"] is None  # not measured is neither met nor failed
    on_cpu = kernel_targets(rows, "cpu")
    assert all(t["met"] is None for t in on_cpu) and on_cpu[0]["measured"] == 2.5  # CUDA targets: no CPU verdicts


def test_summary_gathers_the_targets_the_sections_reported_in_section_order() -> None:
    fps = target("Triton fps vs torch", 2.5, ">=", 2, device="cuda")
    fsat = target("FSAT time vs SDPA", 0.8, "<", 1, device="cuda", unit="")
    results = {
        "bench_mixers": gpu_check.Result("bench_mixers", targets=[fsat]),
        "kernels": gpu_check.Result("kernels", targets=[fps]),
        "bench_vision": gpu_check.Result("bench_vision", status="timeout", reason="timed out after 240 s"),
        "train_deit": gpu_check.Result("train_deit", status="failed", reason="exit 1"),  # declares no targets
        "bench_centroid": gpu_check.Result("bench_centroid"),  # ok, declares none
    }
    got = gpu_check.gather_targets(results)
    assert [t["target"] for t in got] == ["Triton fps vs torch", "bench_vision's targets", "FSAT time vs SDPA"]
    assert got[1]["met"] is None and got[1]["detail"] == "timeout: timed out after 240 s"


def test_a_bench_section_reads_the_report_it_wrote(tmp_path: Path) -> None:
    """A section runs its command with ``--json <out>/<section>.tool.json`` and takes its rows and targets from it."""
    ctx = gpu_check.Ctx("cpu", True, tmp_path, {}, tmp_path)
    report = {"tool": "t", "results": [1], "targets": [{"target": "x"}]}
    writer = f"import json, sys; json.dump({report!r}, open(sys.argv[-1], 'w'))"
    res = gpu_check.Result("bench_points")
    assert gpu_check.read_report(ctx, res, [sys.executable, "-c", writer], 60)
    assert res.status == "ok" and res.targets == [{"target": "x"}] and res.data == {"tool": "t", "results": [1]}
    silent = gpu_check.Result("bench_points")
    assert not gpu_check.read_report(ctx, silent, [sys.executable, "-c", "pass"], 60)
    assert silent.status == "failed" and "wrote no --json report" in silent.reason


def test_bench_arguments_name_real_options() -> None:
    """Every option gpu_check passes to a bench is in that bench's ``--help``: a renamed flag fails here, not on a
    GPU (the help, not the script's text: shared flags come from package helpers such as
    :func:`measure.bench.add_throughput_arguments`)."""
    helps: dict[str, str] = {}
    for device in ("cpu", "cuda"):
        for quick in (True, False):
            ctx = gpu_check.Ctx(device, quick, Path("."), {}, Path("."), gpu_mem_gib=80.0)
            for name in (s for s in gpu_check.SECTIONS if s.startswith("bench_")):
                if name not in helps:
                    done = run_tool(name, ["--help"], timeout=120)
                    assert done.returncode == 0, done.stderr[-2000:]
                    helps[name] = done.stdout
                for arg in [*gpu_check.bench_args(ctx, name), "--json"]:
                    if arg.startswith("--"):
                        assert re.search(rf"(?<![\w-]){re.escape(arg)}(?![\w-])", helps[name]), f"{name} has no {arg}"


@pytest.mark.slow
def test_bench_arguments_parse() -> None:
    """The values too: each bench's parser takes the whole argument list gpu_check gives it (choices, counts; argparse
    reads every argument before the trailing ``--help`` ends the run), for each device and mode."""
    seen: dict[tuple[str, ...], None] = {}
    for device in ("cpu", "cuda"):
        for quick in (True, False):
            ctx = gpu_check.Ctx(device, quick, Path("."), {}, Path("."), gpu_mem_gib=80.0)
            for name in (s for s in gpu_check.SECTIONS if s.startswith("bench_")):
                seen[(name, *gpu_check.bench_args(ctx, name))] = None
    calls = [(args[0], [*args[1:], "--json", "report.json", "--help"]) for args in seen]
    for args, done in zip(seen, run_tools_batched(calls), strict=True):  # one process: the parsers only
        assert done.returncode == 0, (args, done.stderr[-500:])


def test_the_two_parts_cover_every_section_once_but_env() -> None:
    one, two = gpu_check.PARTS[1], gpu_check.PARTS[2]
    assert set(one) | set(two) == set(gpu_check.SECTIONS)
    assert set(one) & set(two) == {"env"}  # both report the machine and size the capsule bench's budget


def test_part_two_keeps_part_one_and_its_summary_covers_both(tmp_path: Path) -> None:
    """``--part 2`` into part 1's folder: part 1's sections stay, the targets and summary use them, env is redone."""
    out = tmp_path / "gc"
    out.mkdir()
    (out / gpu_check.MARKER).write_text("--device cpu\nwritten by gpu_check\n")  # part 1, killed before its summary
    fps = target("Triton fps vs torch (B=32 N=1024 M=512)", 3.0, ">=", 2, device="cuda")
    gpu_check.write_section(out, gpu_check.Result("kernels", seconds=100.0, targets=[fps]))
    gpu_check.write_section(out, gpu_check.Result("env", reason="part 1's env"))
    skip = [s for s in gpu_check.PARTS[2] if s != "env"]
    no_wheels = tmp_path  # (none: a checkout's .whl may hold wheels for another Python)
    rc = gpu_check.check("cpu", out=out, part=2, wheels=no_wheels, skip=skip)
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    assert list(summary["sections"]) == ["env", "kernels"]  # in the usual order; env from this run
    assert summary["sections"]["env"]["reason"] == "" and summary["sections"]["kernels"]["seconds"] == 100.0
    assert summary["commands"] == ["--device cpu --part 1", "--device cpu --part 2"] and summary["wall_s"] > 100.0
    assert "    python tools/gpu_check.py --device cpu --part 2" in (out / "summary.md").read_text()
    fps = next(t for t in summary["targets"] if t["target"].startswith("Triton fps vs torch ("))
    assert fps["measured"] == 3.0
    with pytest.raises(gpu_check.CheckError, match="no mixing grids"):  # a quick run's folder: not the full grid's
        gpu_check.check("cpu", quick=True, out=out, part=2, wheels=no_wheels, skip=skip)
    # part 1 (or a plain run) clears the folder it wrote before
    assert gpu_check.check("cpu", out=out, part=1, wheels=no_wheels, skip=gpu_check.PARTS[1][1:]) == 0
    assert not (out / "kernels.json").exists()


def test_the_cli_turns_bad_arguments_into_usage_errors(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("not gpu_check's\n")
    run = run_tool("gpu_check", ["--device", "cpu", "--out", str(tmp_path)])
    assert run.returncode == 2 and "holds no earlier gpu_check output" in run.stderr


def test_extra_wheels_for_another_python_or_misnamed_are_left_out(tmp_path: Path) -> None:
    assert not gpu_check.wheel_fits(tmp_path / "pkg-1.0-cp27-cp27mu-manylinux1_x86_64.whl")  # CPython 2.7
    assert gpu_check.wheel_fits(tmp_path / "pure-1.0-py3-none-any.whl")
    assert not gpu_check.wheel_fits(tmp_path / "not-a-wheel-name.whl")
