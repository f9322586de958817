"""measure.bench: the op counter (the aten-op count that stands for a GPU's launch cost, host syncs), targets, timing
and tables."""

from __future__ import annotations

import copy
import subprocess
import types

import pytest
import torch
import torch.nn.functional as F

from measure import bench as benchutil


@pytest.mark.torch_compat
def test_count_aten_ops_counts_forward_backward_views_and_syncs() -> None:
    x = torch.randn(4, 3, requires_grad=True)
    # forward view, mul, sum; backward: ones_like for the seed gradient, expand, mul, view, detach for x.grad
    ops, views = benchutil.count_aten_ops(lambda: x.view(12).mul(2.0).sum().backward())
    assert (ops, views) == (8, 4)  # torch 2.11 and 2.15 alike
    sync_ops, _ = benchutil.count_aten_ops(lambda: x.sum().item())
    assert sync_ops == 2  # sum + _local_scalar_dense


@pytest.mark.torch_compat
def test_count_aten_ops_sees_chunking() -> None:
    """More chunks, more ops: what the KNN attention's chunk budget changes."""
    x = torch.randn(64, 8)

    def chunked(n: int) -> None:
        for part in x.chunk(n):
            F.relu(part).sum()

    one, _ = benchutil.count_aten_ops(lambda: chunked(1))
    eight, _ = benchutil.count_aten_ops(lambda: chunked(8))
    assert eight > 7 * one // 2 and eight - one >= 14


def test_run_config_in_process_turns_an_exception_into_the_rows_error() -> None:
    def measure(cfg: dict) -> dict:
        if cfg["fail"]:
            raise RuntimeError("CUDA out of memory (pretend)")
        return {"ms": 1.0}

    assert benchutil.run_config(measure, {"fail": False}, isolate=False) == {"ms": 1.0}
    assert benchutil.run_config(measure, {"fail": True}, isolate=False) == {
        "error": "RuntimeError: CUDA out of memory (pretend)"
    }
    assert benchutil.isolate_configs("auto", "cpu") and not benchutil.isolate_configs("auto", "cuda")
    assert benchutil.isolate_configs("yes", "cuda") and not benchutil.isolate_configs("no", "cpu")


def test_only_a_resident_set_measure_gets_the_fixed_mmap_threshold(monkeypatch: pytest.MonkeyPatch) -> None:
    """The threshold makes every allocation above 64 KiB a fresh mapping: right for the resident set, slow for the
    timing of allocation-heavy steps, so the child gets it only when asked."""
    seen = []

    def fake_run(cmd: list, **kw: object) -> object:
        seen.append((kw["env"] or {}).get("MALLOC_MMAP_THRESHOLD_"))
        return types.SimpleNamespace(returncode=0, stdout='{"ms": 1.0}\n', stderr="")

    monkeypatch.setattr(benchutil.subprocess, "run", fake_run)
    monkeypatch.delenv("MALLOC_MMAP_THRESHOLD_", raising=False)
    benchutil.run_config(dict, {}, isolate=True)
    benchutil.run_config(dict, {}, isolate=True, rss=True)
    assert seen == [None, "65536"]


def test_run_isolated_imports_the_measure_function_by_name_in_a_fresh_process() -> None:
    """The child returns the function's dict through JSON; its exception becomes the row's error; a function the
    child cannot import by name is refused before anything runs."""
    assert benchutil.run_config(dict, {"ms": 1.5, "rows": [1, 2]}, isolate=True) == {"ms": 1.5, "rows": [1, 2]}
    failed = benchutil.run_isolated(int, {"ms": 1.0})  # int(dict) raises TypeError in the child
    assert failed["error"].startswith("TypeError: int() argument must be")

    def local(cfg: dict) -> dict:
        return cfg

    with pytest.raises(ValueError, match="module-level function of an importable module"):
        benchutil.run_isolated(local, {})


@pytest.mark.torch_compat
def test_one_counter_counts_ops_by_name_and_shows_each_to_a_hook() -> None:
    """:class:`measure.bench.OpCounter` is what count_aten_ops and engine.testing.host_syncs both use."""
    seen = []
    x = torch.randn(3, 2)
    with benchutil.OpCounter(on_op=lambda func, args, kwargs, out: seen.append((func.overloadpacket.__name__, out))):
        y = x.mul(2.0).sum()
        y.item()
    assert [name for name, _ in seen] == ["mul", "sum", "_local_scalar_dense"]
    assert seen[1][1] is not None and float(seen[2][1]) == float(y)  # the hook sees each op's result


def test_targets_carry_a_verdict_or_say_why_not() -> None:
    met = benchutil.target("a vs b", 2.5, ">=", 2, device="cuda", on="cuda")
    assert (met["met"], met["verdict"], met["wanted"], met["detail"]) == (True, "MET", ">= 2x", "")
    assert benchutil.target("a vs b", 0.8, "<", 1, device="cpu", unit="")["wanted"] == "< 1"
    missed = benchutil.target("a vs b", 1.5, ">=", 2, device="cpu")
    assert missed["met"] is False and missed["verdict"] == "NOT MET"
    for measured in (None, float("nan")):  # a baseline missing: no verdict, and the reason
        t = benchutil.target("a vs b", measured, ">=", 2, device="cuda", detail="b not installed")
        assert t["measured"] is None and t["met"] is None and t["detail"] == "b not installed"
    elsewhere = benchutil.target("a vs b", 2.5, ">=", 2, device="cpu", on="cuda")
    assert elsewhere["measured"] == 2.5 and elsewhere["met"] is None
    assert elsewhere["detail"] == "no verdict: the target is for CUDA"
    assert benchutil.format_target(met) == "target: a vs b >= 2x: MET (2.5)"
    with pytest.raises(ValueError, match="op must be one of"):
        benchutil.target("a vs b", 1.0, "=>", 2, device="cpu")


def test_round_robin_times_one_call_of_every_fn_per_round() -> None:
    calls = []
    fns = [lambda: calls.append("a"), lambda: calls.append("b")]
    times = benchutil.time_round_robin(fns, "cpu", repeats=3, warmup=1)
    assert calls == ["a", "b"] + ["a", "b"] * 3 and [len(t) for t in times] == [3, 3]
    assert all(ms >= 0 for t in times for ms in t)


def test_markdown_table_rounds_floats_and_pads_columns() -> None:
    text = benchutil.markdown_table(["name", "x"], [["a", 1.23456], ["bbb", 1234.5]])
    assert text.splitlines() == ["| name | x    |", "|------|------|", "| a    | 1.23 |", "| bbb  | 1234 |"]
    assert benchutil.markdown_table(["x"], [[float("nan")]]).splitlines()[-1] == "| - |"  # not measured


def test_git_commit_marks_code_changes_but_not_reports_written_into_docs(tmp_path) -> None:
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "report.json").write_text("{}\n")
    (tmp_path / "model.py").write_text("x = 1\n")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "first")
    head = benchutil.git_commit(tmp_path)
    assert head and "+" not in head
    (tmp_path / "docs" / "report.json").write_text('{"ms": 1}\n')  # a bench's report: still the same code
    assert benchutil.git_commit(tmp_path) == head
    (tmp_path / "model.py").write_text("x = 2\n")
    assert benchutil.git_commit(tmp_path) == head + "+dirty"
    assert benchutil.git_commit(tmp_path / "missing") is None


def test_profile_step_writes_an_op_table_and_a_trace_per_row(tmp_path) -> None:
    lin = torch.nn.Linear(8, 8)
    x = torch.randn(4, 8)
    step = lambda: lin(x).relu().sum().backward()  # noqa: E731
    summary = benchutil.profile_step(step, "cpu", tmp_path / "prof", "row-1", steps=2)
    assert summary == {"device_ms": None, "device_activities": None, "table": "row-1.txt"}  # no GPU activity on CPU
    text = (tmp_path / "prof" / "row-1.txt").read_text()
    assert text.startswith("row-1: 2 steps") and "aten::addmm" in text and "Self CPU" in text
    trace = (tmp_path / "prof" / "row-1.trace.json").read_text()
    assert "aten::addmm" in trace and '"traceEvents"' in trace


def test_profile_rows_put_device_time_beside_the_timed_step() -> None:
    results = [
        {"N": 1, "ms": 2.0, "profile": {"device_ms": 0.5, "device_activities": 12.0, "table": "a.txt"}},
        {"N": 2, "ms": 1.0},  # not profiled: no row
        {"N": 3, "train_ms": 4.0, "profile": {"device_ms": None, "device_activities": None, "table": "c.txt"}},
    ]
    rows = benchutil.profile_rows(results, lambda r: f"N={r['N']}")
    assert rows == [["N=1", 2.0, 0.5, 0.25, 12.0, "a.txt"], ["N=3", "-", "-", "-", "-", "c.txt"]]
    assert benchutil.profile_rows(results[2:], lambda r: "x", ms_key="train_ms")[0][:2] == ["x", 4.0]
    assert len(benchutil.PROFILE_HEADERS) == len(rows[0])


def test_device_totals_count_the_gpus_activities_not_annotated_spans() -> None:
    """A compiled graph's ``## Call CompiledFxGraph ##`` span lies on the GPU timeline over its kernels: counting it
    would add the kernels twice and the gaps between them, and make a launch-bound step look GPU-bound."""
    from torch.autograd import DeviceType

    def event(device: DeviceType, us: float, annotation: bool = False) -> types.SimpleNamespace:
        return types.SimpleNamespace(device_type=device, device_time_total=us, is_user_annotation=annotation)

    events = [event(DeviceType.CPU, 500.0), event(DeviceType.CUDA, 10.0), event(DeviceType.CUDA, 5.0),
              event(DeviceType.CUDA, 40.0, annotation=True)]  # fmt: skip
    assert benchutil.device_totals(events) == (15.0, 2)


def test_a_failing_profile_costs_the_row_its_profile_not_its_timing(tmp_path) -> None:
    def step() -> None:
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    summary = benchutil.profile_step(step, "cpu", tmp_path, "row")
    assert summary == {"error": "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"}
    rows = benchutil.profile_rows([{"ms": 1.5, "profile": summary}], lambda r: "row")
    assert rows == [["row", 1.5, "-", "-", "-", "error: RuntimeError: CUPTI_ERROR_NOT_INITIALIZED"]]


@pytest.mark.torch_compat
@pytest.mark.gpu
def test_profile_step_on_cuda_sums_the_kernels_of_a_step(tmp_path) -> None:
    x = torch.randn(512, 512, device="cuda")
    step = lambda: (x @ x).relu_()  # noqa: E731
    step()
    summary = benchutil.profile_step(step, "cuda", tmp_path, "mm", steps=4)
    assert summary["device_activities"] >= 2 and 0 < summary["device_ms"] < 50  # a matmul and a relu per step
    assert "Self CUDA" in (tmp_path / "mm.txt").read_text()
    compiled = torch.compile(lambda: (x @ x).relu())  # its graph runs inside an annotated span on the GPU timeline
    compiled(), compiled()
    summary = benchutil.profile_step(compiled, "cuda", tmp_path, "mm-compiled", steps=4)
    assert 1 <= summary["device_activities"] <= 3 and 0 < summary["device_ms"] < 50  # the kernels, not the span


@pytest.mark.torch_compat
@pytest.mark.gpu
def test_capture_call_replays_an_inference_call_on_each_new_batch() -> None:
    """capture_call: an eager and a compiled no-grad call under bf16 autocast, captured once, give the call's output
    on every new batch copied in (channels-last input kept) from a replay, not a call (fn runs only in the warm-up and
    the capture; the output is the captured tensor), and a batch of another shape or layout is refused, as is a
    capture under an outer autocast that caches casts."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 4, 4), torch.nn.Flatten(), torch.nn.Linear(8 * 4 * 4, 5))
    model = model.cuda().eval().to(memory_format=torch.channels_last)

    def infer(fwd, x):
        with torch.no_grad(), torch.autocast("cuda", torch.bfloat16):
            return fwd(x)

    batch = lambda: torch.randn(6, 3, 16, 16, device="cuda").contiguous(memory_format=torch.channels_last)  # noqa: E731
    for fwd in (model, torch.compile(model, dynamic=False)):
        calls = []

        def counted(x, fwd=fwd, calls=calls):
            calls.append(1)
            return infer(fwd, x)

        graphed = benchutil.capture_call(counted, batch(), warmup=2)
        outs = []
        for _ in range(3):
            x = batch()
            outs.append(graphed(x))
            torch.testing.assert_close(outs[-1].clone(), infer(model, x))
        assert len(calls) == 3 and all(o is outs[0] for o in outs)  # 2 warm-up calls and the capture, then replays
        assert outs[0].dtype == torch.bfloat16
        with pytest.raises(ValueError, match="a captured call takes tensors of"):
            graphed(torch.randn(5, 3, 16, 16, device="cuda"))
        with pytest.raises(ValueError, match="a captured call takes tensors of"):
            graphed(batch().contiguous())  # the same shape in another memory format
    with torch.autocast("cuda", torch.bfloat16), pytest.raises(RuntimeError, match="enter autocast inside fn"):
        benchutil.capture_call(model, batch())


def test_capture_call_refuses_a_capture_without_warm_up_or_of_non_tensors_before_touching_a_gpu() -> None:
    with pytest.raises(ValueError, match="needs warmup >= 1"):
        benchutil.capture_call(torch.nn.Identity(), torch.zeros(1), warmup=0)
    with pytest.raises(TypeError, match=r"takes tensors as sample_args, got \['Tensor', 'int'\]"):
        benchutil.capture_call(torch.nn.Identity(), torch.zeros(1), 3)


@pytest.mark.torch_compat
@pytest.mark.gpu
def test_captured_graphs_replay_the_eager_step_of_the_fused_layers() -> None:
    """capture_graphs: the KNN centroid step (the fused kernels: search and attention), FSAT's edge kernel and Hydra's
    scan, captured whole (their input checks stand aside during the capture) and replayed on new inputs, give the
    eager layer's output and gradients; so do FSAT and Hydra wrapped by torch.compile (the bench's
    -fused-compiled-captured rows: the wrapper compiles in the capture's warm-up steps)."""
    from attention import CentroidAttention, build_mixer

    torch.manual_seed(0)
    layers = {
        "knn": (CentroidAttention(64, 2, num_neighbors=16, attn_backend="triton"), (4, 512, 64), (4, 128, 64)),
        "fsat": (build_mixer("fsat", 64, 2, max_len=256, edge_backend="triton").eval(), (2, 256, 64)),
        "hydra": (build_mixer("hydra", 64, 2, backend="triton"), (2, 256, 64)),
    }
    for name, compiled in (("knn", False), ("fsat", False), ("hydra", False), ("fsat", True), ("hydra", True)):
        layer, *shapes = layers[name]
        layer = layer.cuda()
        args = [torch.randn(s, device="cuda", requires_grad=True) for s in shapes]
        twin = copy.deepcopy(layer)
        graphed = benchutil.capture_graphs(torch.compile(twin, dynamic=False) if compiled else twin, *args)
        tol = 1e-3 if compiled else 1e-4  # inductor may sum in another order
        new = [torch.randn(s, device="cuda", requires_grad=True) for s in shapes]  # replayed on other values
        out = layer(*new)
        out.square().sum().backward()
        want = [out.detach(), *(a.grad for a in new), *(p.grad for p in layer.parameters())]
        for a in new:
            a.grad = None
        out = graphed(*new)
        assert type(out.grad_fn).__name__ == "GraphedBackward", name  # a replay, not an eager run
        out.square().sum().backward()
        got = [out.detach(), *(a.grad for a in new), *(p.grad for p in graphed.parameters())]
        for p in layer.parameters():
            p.grad = None
        for w, g in zip(want, got, strict=True):
            torch.testing.assert_close(g, w, rtol=tol, atol=tol, msg=lambda m, name=name: f"{name}: {m}")
