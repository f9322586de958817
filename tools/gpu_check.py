"""One command that checks and benchmarks every CUDA path of the toolkit and writes all tables to one folder.

    python tools/gpu_check.py                          # on a CUDA machine: everything (6.7 minutes on one H100)
    python tools/gpu_check.py --quick                  # smaller grids (4.9 minutes on one H100)
    python tools/gpu_check.py --device cpu --quick     # the harness itself on CPU, as CI runs it (a few minutes)
    python tools/gpu_check.py --part 1; python tools/gpu_check.py --part 2   # the full check in two calls
    python tools/gpu_check.py --only env tests kernels # some sections

Sections, each a subprocess with its own time limit (one failing or timing out does not stop the others):

* ``env``: Python, torch, CUDA, cuDNN, the GPU, triton, and which optional backends import (torch_cluster, pytorch3d,
  fpsample, open3d, trimesh, torch_geometric, onnx, onnxruntime), with the version or the reason they do not;
* ``tests``: every ``gpu``-marked test (the CUDA cases of the equivalence tests: Triton FPS and Cauchy/Vandermonde
  kernels against the reference in float32 and bfloat16, KNN chunking, FSAT's edge paths, the fused capsule layers,
  centroid attention's KNN path); on CUDA also the ``slow`` tests of the Triton kernels (interpreter, sm_90 compile);
  on CPU the ``gpu`` tests are collected and skip, which is what CI checks;
* ``kernels``: the Triton kernels against the torch path they replace, in one process: FPS (B=32, N=1024, M=512)
  and the Cauchy / Vandermonde mixers (L = 4096, forward + backward);
* ``bench_points``, ``bench_centroid``, ``bench_modelnet`` (bf16 AMP on CUDA), ``bench_vision`` (bf16 AMP on CUDA),
  ``bench_mixers`` (softmax attention by matmul and by SDPA/flash as baselines, L up to 16K), ``bench_capsules``
  (the max-batch column against the GPU's memory): the tools/bench_*.py scripts with ``--device``, each printing
  ratios against a baseline measured in the same run;
* ``train_modelnet``, ``train_capsules``, ``train_deit``: each training CLI for a few steps on the embedded synthetic
  data (AMP on CUDA), then resumed from its ``last.pt`` for a second epoch: samples/s, finite losses, checkpoint
  written, resume continued at the right epoch.

The output folder (``--out``, default ``runs/gpu_check/<device>-<quick|full>``) gets ``<section>.md`` (the tables),
``<section>.json`` (the same parsed, plus the tool's own JSON where it writes one), ``<section>.log`` (stdout and
stderr), and ``summary.md`` / ``summary.json``: each section's status and time, and the issue's targets, each a ratio
against its baseline from the same run. The exit status is 1 if a section failed; a section whose optional package
is missing (e.g. trimesh for the synthetic shapes) is "skipped" with the reason.

Carried wheels: a machine without internet can get missing packages as wheel files. If ``--wheels`` (default: the
repo's ``.whl`` folder, when it exists) holds ``*.whl`` files, they are installed with ``pip install --no-index
--no-deps --target`` into a folder under the output folder and put on every section's ``PYTHONPATH`` (see the README,
"Checking on a GPU").
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import logging
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools"
log = logging.getLogger("gpu_check")

# import name -> what is lost without it (the env table's "needed for" column)
OPTIONAL = {
    "triton": "the Triton FPS and Cauchy/Vandermonde kernels",
    "torch_cluster": "the torch-cluster FPS/KNN backend (optional; the torch and Triton paths cover CUDA)",
    "scipy": "torch_cluster's import (torch_cluster.nearest imports scipy.cluster)",
    "pytorch3d": "the pytorch3d FPS/KNN backend (optional)",
    "fpsample": "fpsample's FPS (optional)",
    "numba": "the exact CPU FPS backend (attention/kernels/fps_numba.py; optional)",
    "open3d": "the capsule part-decomposition view (tools/visualize_capsules.py)",
    "trimesh": "the embedded synthetic shapes (train_modelnet, train_capsules, bench_capsules' Chamfer column)",
    "torch_geometric": "the PointNet++ / DGCNN peers",
    "onnx": "ONNX export",
    "onnxruntime": "running exported ONNX models",
    "timm": "the vision models",
    "torchvision": "timm",
    "h5py": "ModelNet40 HDF5 data",
    "tensorboard": "the training CLIs' TensorBoard events",
}
SECTIONS = (
    "env",
    "tests",
    "kernels",
    "bench_points",
    "bench_centroid",
    "bench_modelnet",
    "bench_vision",
    "bench_mixers",
    "bench_capsules",
    "train_modelnet",
    "train_capsules",
    "train_deit",
)
# The full check in two calls of under 10 minutes each (the device tool's per-call limit): ``--part 1``, then
# ``--part 2`` into the same ``--out``; part 2 keeps part 1's sections and the summary covers both.
PARTS = {
    1: ("env", "tests", "kernels", "bench_points", "bench_centroid", "bench_modelnet"),
    2: ("env", "bench_vision", "bench_mixers", "bench_capsules", "train_modelnet", "train_capsules", "train_deit"),
}
MARKER = ".gpu_check"  # the output folder's mark: a later run may clear only a folder that has it
CENTROID_T1 = "centroid_transformer_modelnet40 T=1"
CENTROID_T1_GATHER = f"{CENTROID_T1} gather"  # attn_backend="gather" (on CUDA "auto" takes the masked form here)
POINTNET2 = "pointnet2_ssg_modelnet40"
OURS_1, DEIT_TINY = "centroid_deit_tiny_c6_patch16_224", "deit_tiny_patch16_224"


@dataclass
class Result:
    """What one section left: its status (ok / failed / skipped / timeout), time, tables and notes."""

    name: str
    status: str = "ok"
    seconds: float = 0.0
    reason: str = ""
    commands: list[str] = field(default_factory=list)
    tables: list[dict] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    stdout: str = ""


# --------------------------------------------------------------------------------------------- running and parsing


def parse_markdown_tables(text: str) -> list[dict]:
    """The Markdown tables in ``text`` as ``{"title", "headers", "rows"}``; the title is the nearest ``#`` line above.

    Numbers stay strings as printed (``engine.bench.print_table`` rounds to 3 significant figures); use
    :func:`to_number` to read one.
    """
    tables, title, lines = [], "", text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i].strip()
        if line.startswith("#"):
            title = line.lstrip("#").strip()
        is_table = line.startswith("|") and i + 1 < len(lines) and re.fullmatch(r"\|[-:| ]+\|", lines[i + 1].strip())
        if not is_table:
            i += 1
            continue
        headers = [c.strip() for c in line.strip("|").split("|")]
        rows = []
        i += 2
        while i < len(lines) and lines[i].strip().startswith("|"):
            rows.append([c.strip() for c in lines[i].strip().strip("|").split("|")])
            i += 1
        tables.append({"title": title, "headers": headers, "rows": rows})
    return tables


def to_number(cell: object) -> float:
    try:
        return float(cell)
    except (TypeError, ValueError):
        return math.nan


def table_records(table: dict) -> list[dict]:
    return [dict(zip(table["headers"], row)) for row in table["rows"]]


def missing_optional(text: str) -> str | None:
    """The optional package whose absence ended a section (``No module named 'trimesh'``), if that is what happened."""
    for name in re.findall(r"No module named '([\w.]+)'", text):
        if name.split(".")[0] in OPTIONAL:
            return name.split(".")[0]
    return None


def run_command(
    res: Result, argv: list[str], env: dict, timeout: float, log_file: Path, cwd: Path = REPO
) -> subprocess.CompletedProcess | None:
    """Runs ``argv``, logs its output to ``log_file``, keeps its stdout in ``res.stdout``; sets the status."""
    res.commands.append(" ".join(argv).replace(sys.executable, "python").replace(f"{REPO}{os.sep}", ""))
    t0 = time.perf_counter()
    # its own process group, so that a timeout also ends the processes it started (the benches' isolated children)
    proc = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=os.setpgrp
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        text, err = proc.communicate()
        with log_file.open("a") as f:
            f.write(f"$ {res.commands[-1]}\n{text}\n{err}\n[timed out after {timeout:.0f} s]\n")
        res.stdout += text
        res.status, res.reason = "timeout", f"timed out after {timeout:.0f} s: {res.commands[-1][:120]}"
        return None
    finally:
        res.seconds += time.perf_counter() - t0
    out = subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)
    with log_file.open("a") as f:
        f.write(f"$ {res.commands[-1]}\n{out.stdout}\n{out.stderr}\n[exit {out.returncode}]\n")
    res.stdout += out.stdout
    if out.returncode != 0:
        missing = missing_optional(out.stderr + out.stdout)
        tail = (out.stderr.strip().splitlines() or out.stdout.strip().splitlines() or ["no output"])[-1]
        if missing:
            res.status = "skipped"
            res.reason = f"needs {missing} ({OPTIONAL[missing]}), which does not import here: {tail[:160]}"
        else:
            res.status, res.reason = "failed", f"exit {out.returncode}: {tail[:200]}"
    return out


# ---------------------------------------------------------------------------------------------------- children


def _version(name: str, mod: object) -> str:
    """The module's ``__version__``, else its distribution's (fpsample has no ``__version__``), else ``"?"``."""
    version = getattr(mod, "__version__", None)
    if version is None:
        from importlib import metadata

        try:
            version = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            version = "?"
    return str(version)


def child_env() -> dict:
    """The environment report (run in a subprocess, with the sections' PYTHONPATH)."""
    import torch

    report: dict = {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch": torch.__version__,
        "cuda_runtime": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "cuda_available": torch.cuda.is_available(),
        "gpus": [],
        "packages": {},
    }
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        report["gpus"].append(
            {
                "name": p.name,
                "capability": f"{p.major}.{p.minor}",
                "memory_gib": round(p.total_memory / 2**30, 1),
                "multiprocessors": p.multi_processor_count,
            }
        )
    for name in OPTIONAL:
        try:
            mod = importlib.import_module(name)
            report["packages"][name] = {"ok": True, "version": _version(name, mod)}
        except Exception as e:  # an optional package may fail in any way (missing, ABI, missing system library)
            report["packages"][name] = {"ok": False, "reason": f"{type(e).__name__}: {e}"[:200]}
    sys.path.insert(0, str(REPO))
    from attention import points

    report["point_backends"] = {
        k: getattr(points, k) for k in ("HAS_TORCH_CLUSTER", "HAS_PYTORCH3D", "HAS_TRITON") if hasattr(points, k)
    }
    return report


def _time_ms(fn, device: str, repeats: int) -> float:
    sys.path.insert(0, str(TOOLS))
    from engine.bench import time_fn

    return time_fn(fn, device, repeats=repeats, warmup=2)


def child_kernels(device: str, quick: bool) -> dict:
    """Triton kernels against the torch paths they replace, in one process (ratios of the same run)."""
    import torch

    sys.path.insert(0, str(REPO))
    from attention.mixers import functional
    from attention.points import farthest_point_sample

    cuda = device == "cuda"
    triton_ok = cuda and importlib.util.find_spec("triton") is not None
    why = "" if triton_ok else ("needs CUDA" if not cuda else "triton missing")
    repeats = 5 if quick else 10
    rows = []
    B, N, M = (32, 1024, 512) if cuda else (4, 256, 128)
    x = torch.rand(B, N, 3, device=device, generator=None)
    start = torch.zeros(B, dtype=torch.long, device=device)
    ref_ms = _time_ms(lambda: farthest_point_sample(x, M, start=start, backend="torch"), device, repeats)
    row = {"kernel": "fps", "shape": f"B={B} N={N} M={M}", "torch_ms": ref_ms}
    if triton_ok:
        same = torch.equal(
            farthest_point_sample(x, M, start=start, backend="triton"),
            farthest_point_sample(x, M, start=start, backend="torch"),
        )
        ms = _time_ms(lambda: farthest_point_sample(x, M, start=start, backend="triton"), device, repeats)
        row.update(triton_ms=ms, speedup=ref_ms / ms, same=same)
    rows.append(row)
    L, H, D = (4096, 4, 64) if cuda else (256, 2, 16)
    for kind in ("cauchy", "vandermonde"):
        torch.manual_seed(0)
        q, k, v = (torch.randn(1, H, L, D, device=device, requires_grad=True) for _ in range(3))
        fn = functional.cauchy_mix if kind == "cauchy" else functional.vandermonde_mix

        def step(backend: str, fn=fn, q=q, k=k, v=v) -> None:
            a, b = (q.exp() + 1, k.exp() + 1) if fn is functional.cauchy_mix else (q, k)
            out = fn(a, b, v, backend=backend) if fn is functional.cauchy_mix else fn(a, b, v, 1e-3, backend=backend)
            out.sum().backward()

        ref_ms = _time_ms(lambda step=step: step("torch"), device, repeats)
        row = {"kernel": kind, "shape": f"B=1 H={H} L={L} D={D} fwd+bwd", "torch_ms": ref_ms}
        if triton_ok:
            ms = _time_ms(lambda step=step: step("triton"), device, repeats)
            row.update(triton_ms=ms, speedup=ref_ms / ms)
        rows.append(row)
    for r in rows:
        r.setdefault("triton_ms", None)
        r.setdefault("speedup", None)
        if not triton_ok:
            r["note"] = f"triton not timed: {why}"
    return {"device": device, "rows": rows}


# ---------------------------------------------------------------------------------------------------- sections


@dataclass
class Ctx:
    device: str
    quick: bool
    out: Path
    env: dict
    scratch: Path
    gpu_mem_gib: float | None = None

    def py(self, *args: str) -> list[str]:
        return [sys.executable, *args]

    def timeout(self, quick_s: float, full_s: float) -> float:
        return quick_s if self.quick else full_s


def section_env(ctx: Ctx, res: Result) -> None:
    out = run_command(res, ctx.py(__file__, "--child", "env"), ctx.env, 180, ctx.out / "env.log")
    if out is None or out.returncode != 0:
        return
    report = json.loads(out.stdout.strip().splitlines()[-1])
    res.data = report
    if report["gpus"]:
        ctx.gpu_mem_gib = report["gpus"][0]["memory_gib"]
    rows = [[k, str(report[k])] for k in ("python", "platform", "torch", "cuda_runtime", "cudnn", "cuda_available")]
    for i, g in enumerate(report["gpus"]):
        rows.append([f"gpu {i}", f"{g['name']} (sm {g['capability']}, {g['memory_gib']} GiB)"])
    res.tables.append({"title": "environment", "headers": ["what", "value"], "rows": rows})
    prow = [
        [n, p["version"] if p["ok"] else "-", "yes" if p["ok"] else f"no: {p['reason'][:90]}", OPTIONAL[n]]
        for n, p in report["packages"].items()
    ]
    res.tables.append({"title": "packages", "headers": ["package", "version", "imports", "needed for"], "rows": prow})


def section_tests(ctx: Ctx, res: Result) -> None:
    runs = [("gpu", ["-m", "gpu", "tests"])]
    if ctx.device == "cuda":
        # The Triton kernels under this triton's interpreter and compiled ahead of time for sm_90.
        # quick: only the compile check (the interpreter tests, 30 s, need no GPU: CI runs them with triton 3.6 too)
        which = "compile" if ctx.quick else "interpreter or compile"
        runs.append(("triton-slow", ["-m", "slow", "-k", which, "tests/attention"]))
    for label, args in runs:
        xml = ctx.out / f"tests-{label}.xml"
        argv = ctx.py("-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}", *args)
        out = run_command(res, argv, ctx.env, ctx.timeout(240, 480), ctx.out / "tests.log")
        if res.status == "failed" and out is not None and out.returncode == 1:
            res.reason = f"{label}: test failures (see tests.log)"
        if xml.is_file():
            rows, counts = junit_rows(xml)
            res.data[label] = counts
            res.tables.append({"title": f"pytest {' '.join(args)}", "headers": ["test", "outcome", "s", "message"],
                               "rows": rows})  # fmt: skip
    if ctx.device == "cuda" and res.status == "ok" and res.data.get("gpu", {}).get("passed", 0) == 0:
        res.status, res.reason = "failed", "no gpu test passed on a CUDA device"


def junit_rows(xml: Path) -> tuple[list[list[str]], dict[str, int]]:
    rows, counts = [], {"passed": 0, "failed": 0, "skipped": 0}
    for case in ET.parse(xml).getroot().iter("testcase"):
        outcome, message = "passed", ""
        for tag, name in (("failure", "failed"), ("error", "failed"), ("skipped", "skipped")):
            node = case.find(tag)
            if node is not None:
                outcome, message = name, ((node.get("message") or "").splitlines() or [""])[0][:100]
                break
        counts[outcome] += 1
        test_id = f"{case.get('classname', '').split('.')[-1]}::{case.get('name')}"
        rows.append([test_id, outcome, f"{float(case.get('time') or 0):.2f}", message.replace("|", "/")])
    return rows, counts


def section_kernels(ctx: Ctx, res: Result) -> None:
    argv = ctx.py(__file__, "--child", "kernels", "--device", ctx.device, *(["--quick"] if ctx.quick else []))
    out = run_command(res, argv, ctx.env, ctx.timeout(180, 300), ctx.out / "kernels.log")
    if out is None or out.returncode != 0:
        return
    res.data = json.loads(out.stdout.strip().splitlines()[-1])
    headers = ["kernel", "shape", "torch_ms", "triton_ms", "speedup", "note"]
    rows = [[_cell(r.get(h)) for h in headers] for r in res.data["rows"]]
    res.tables.append({"title": f"Triton kernels vs the torch path on {ctx.device}", "headers": headers, "rows": rows})


def _cell(v: object) -> str:
    if isinstance(v, float):
        return f"{v:.3g}"
    return "-" if v is None else str(v)


def bench_args(ctx: Ctx, name: str) -> list[str]:
    """Each bench's arguments: the full grid, the quick one on CUDA, and a seconds-long one on CPU."""
    cuda, quick, d = ctx.device == "cuda", ctx.quick, ["--device", ctx.device]
    if name == "bench_points":
        if not cuda:
            small = ["--batch", "2", "--points", "256", "--channels", "3", "--repeats", "1", "--threads", "1"]
            return [*d, *small, "--large", "8192", "512", "--clouds", "uniform"]  # one small "large" cloud
        # quick: the target's shape, and one large cloud in the Triton kernel's range (100K runs the torch loop)
        fast = [*d, "--batch", "32", "--points", "1024", "--channels", "3", "64", "--large", "50000", "4096"]
        return fast if quick else [*d, "--repeats", "5"]
    if name == "bench_centroid":
        if not cuda:
            return [*d, "--points", "256", "--dim", "32", "--k", "8", "--repeats", "1"]
        return [*d, "--points", "16384"] if quick else d  # quick: the size where KNN beats dense attention
    if name == "bench_modelnet":
        few = ["centroid_transformer_modelnet40", "centroid_transformer_modelnet40_random", POINTNET2]
        if not cuda:
            return [*d, "--batch", "2", "--points", "128", "--num-centroids", "32", "16", "--steps", "1",
                    "--repeats", "1", "--warmup", "0", "--models", *few[:2]]  # fmt: skip
        # both KNN attention forms: "auto" (masked on CUDA at 1024 points) and the gather form
        both = ["--attn-backends", "auto", "gather"]
        return (
            [*d, "--amp", "--steps", "1", "--repeats", "3", *both, "--models", *few] if quick else [*d, "--amp", *both]
        )
    if name == "bench_vision":
        if not cuda:
            return [*d, "--batch", "2", "--repeats", "1", "--warmup", "0", "--models", DEIT_TINY, OURS_1]
        # throughput in DeiT's sense (a large batch): at batch 64 an H100 runs DeiT-tiny's eager forward in the time
        # its ~200 kernel launches take, so every model of that size measures the same
        amp = [*d, "--amp", "--batch", "512"]
        return [*amp, "--models", DEIT_TINY, OURS_1] if quick else amp
    if name == "bench_mixers":
        if not cuda:
            return [*d, "--lengths", "128", "--dim", "32", "--heads", "2", "--mixers", "fsat", "cauchy"]
        if quick:  # the targets' rows only: FSAT vs SDPA at 16K, Cauchy / Vandermonde at 4K
            targets = ["--mixers", "fsat", "cauchy", "vandermonde", "--max-quadratic-len", "4096"]
            return [*d, "--lengths", "4096", "16384", *targets]
        return [*d, "--lengths", "1024", "2048", "4096", "8192", "16384"]
    if name == "bench_capsules":
        small = ["--models", "pointcaps_routing_small", "pointcaps_centroid_small", "--routing-impls", "einsum"]
        if not cuda:
            return [*d, *small, "--points", "128", "--batch", "2", "--mem-batches", "2", "3", "--train-steps", "2",
                    "--chamfer-points", "64", "--train-per-class", "2", "--repeats", "1", "--warmup", "0"]  # fmt: skip
        budget = ["--budget-gb", f"{math.floor(ctx.gpu_mem_gib or 12)}"]
        return [*d, *budget, *small, "--train-steps", "20"] if quick else [*d, *budget]
    raise ValueError(f"unknown bench {name!r}")


JSON_BENCHES = ("bench_modelnet", "bench_mixers", "bench_capsules")  # the benches that write their own --json


def section_bench(ctx: Ctx, res: Result) -> None:
    argv = ctx.py(str(TOOLS / f"{res.name}.py"), *bench_args(ctx, res.name))
    own_json = ctx.out / f"{res.name}.tool.json"
    if res.name in JSON_BENCHES:
        argv += ["--json", str(own_json)]
    run_command(res, argv, ctx.env, ctx.timeout(240, 600), ctx.out / f"{res.name}.log")
    res.tables = parse_markdown_tables(res.stdout)
    res.data["verdicts"] = [ln.strip() for ln in res.stdout.splitlines() if re.search(r"\b(NOT MET|MET)\b", ln)]
    if own_json.is_file():
        res.data["tool_json"] = own_json.name
    if res.status == "ok" and not res.tables:
        res.status, res.reason = "failed", "printed no table"


# The CPU runs use the tiny settings of the CLIs' tests; on CUDA each CLI trains its default config (the main job's
# model and embedded data) for a limited number of steps per epoch, with AMP.
TINY_CPU = {
    "train_modelnet": ["num_points=64", "num_centroids=[32,16]", "num_neighbors=8", "fuse_dim=64",
                       "synthetic_classes=4", "synthetic_train_per_class=8", "synthetic_test_per_class=4",
                       "batch_size=8", "eval_batch_size=16"],
    "train_capsules": ["num_points=32", "synthetic_classes=[table,airplane]", "synthetic_train_per_class=4",
                       "synthetic_test_per_class=2", "batch_size=4", "eval_batch_size=8"],
    "train_deit": ["img_size=32", "synthetic_image_size=32", "embed_dim=32", "depth=2", "num_heads=2",
                   "centroid_index=1", "synthetic_classes=4", "synthetic_train_per_class=8",
                   "synthetic_val_per_class=4", "batch_size=8", "eval_batch_size=16"],
}  # fmt: skip


def section_train(ctx: Ctx, res: Result) -> None:
    """Epoch 0 for a few steps, then ``--resume auto`` for epoch 1: samples/s, finite losses, checkpoint, resume."""
    cuda = ctx.device == "cuda"
    steps = 2 if not cuda else (20 if ctx.quick else 60)
    run_dir = ctx.scratch / res.name
    common = ["--device", ctx.device, "--output-dir", str(run_dir), "--no-progress"]
    common += ["--max-steps-per-epoch", str(steps)]
    sets = ["--set", "amp=true"] if cuda else ["--set", *TINY_CPU[res.name]]
    script = str(TOOLS / f"{res.name}.py")
    timeout = ctx.timeout(240, 480)
    for epochs in (1, 2):
        resume = ["--resume", "auto"] if epochs == 2 else []
        out = run_command(res, ctx.py(script, *common, *sets, "--epochs", str(epochs), *resume), ctx.env, timeout,
                          ctx.out / f"{res.name}.log")  # fmt: skip
        if out is None or out.returncode != 0:
            return
        if epochs == 1:
            if not (run_dir / "last.pt").is_file():
                res.status, res.reason = "failed", "no last.pt after the first epoch"
                return
            first_ckpt_mtime = (run_dir / "last.pt").stat().st_mtime
    records = [json.loads(x) for x in (run_dir / "log.jsonl").read_text().splitlines() if x.strip()]
    epochs_seen = [r.get("epoch") for r in records]
    losses = [r.get("train_loss") for r in records]
    finite = all(isinstance(v, (int, float)) and math.isfinite(v) for v in losses)
    resumed = epochs_seen == [0, 1] and (run_dir / "last.pt").stat().st_mtime > first_ckpt_mtime
    res.data = {"epochs": epochs_seen, "train_loss": losses, "samples_per_s": [r.get("samples_per_s") for r in records],
                "amp": cuda, "steps_per_epoch": steps, "finite_losses": finite, "resumed": resumed}  # fmt: skip
    rows = [[r.get("epoch"), _cell(r.get("train_loss")), _cell(r.get("samples_per_s"))] for r in records]
    res.tables.append({"title": f"{res.name} on {ctx.device} (amp {cuda}, {steps} steps per epoch; epoch 1 resumed)",
                       "headers": ["epoch", "train_loss", "samples/s"], "rows": rows})  # fmt: skip
    if not finite:
        res.status, res.reason = "failed", f"non-finite train loss: {losses}"
    elif not resumed:
        res.status, res.reason = "failed", f"resume did not continue at epoch 1 (log.jsonl epochs {epochs_seen})"


RUNNERS = {"env": section_env, "tests": section_tests, "kernels": section_kernels}
RUNNERS.update({name: section_bench for name in SECTIONS if name.startswith("bench_")})
RUNNERS.update({name: section_train for name in SECTIONS if name.startswith("train_")})


# ------------------------------------------------------------------------------------------------------ targets


def targets(results: dict[str, Result], device: str) -> list[dict]:
    """The issue's targets, each a ratio of two rows of the same run; ``measured`` is None where a row is missing."""
    out = []

    def add(name: str, want: str, measured: float | None, ok: bool | None, detail: str = "") -> None:
        out.append({"target": name, "wanted": want, "measured": measured, "met": ok, "detail": detail})

    k = results.get("kernels")
    rows = {r["kernel"]: r for r in (k.data.get("rows", []) if k else [])}
    for kernel, want in (("fps", 2.0), ("cauchy", 5.0), ("vandermonde", 5.0)):
        r = rows.get(kernel, {})
        s = r.get("speedup")
        add(f"Triton {kernel} vs torch ({r.get('shape', '-')})", f">= {want}x", s, None if s is None else s >= want,
            r.get("note", ""))  # fmt: skip
    # the issue's FPS target also against torch-cluster's FPS, where its wheel was carried (bench_points' FPS table)
    p = results.get("bench_points")
    fps = [
        r for t in (p.tables if p else []) for r in table_records(t)
        if r.get("backend") == "triton" and (r.get("B"), r.get("N"), r.get("M")) == ("32", "1024", "512")
    ]  # fmt: skip
    s = to_number(fps[0].get("speedup vs cluster")) if fps else None
    name = "Triton fps vs torch-cluster (B=32 N=1024 M=512)"
    if s is None or math.isnan(s):
        add(name, ">= 2.0x", None, None, "torch-cluster not installed" if fps else "row not measured")
    else:
        add(name, ">= 2.0x", s, s >= 2.0)
    m = results.get("bench_modelnet")
    recs = {r.get("model"): r for t in (m.tables if m else []) for r in table_records(t)}
    pn = recs.get(POINTNET2)
    for label, what in ((CENTROID_T1, "centroid T=1"), (CENTROID_T1_GATHER, "centroid T=1, attn_backend=gather,")):
        name = f"{what} train samples/s vs PointNet++ (AMP, 1024 points)"
        ct = recs.get(label)
        if ct and pn:
            ratio = to_number(ct["train samples/s"]) / to_number(pn["train samples/s"])
            ops = f"ops/step {ct['ops/step']} vs {pn['ops/step']}" if "ops/step" in ct else ""
            add(name, ">= 1x", ratio, ratio >= 1, ops)
        else:
            add(name, ">= 1x", None, None, "rows not measured")
    v = results.get("bench_vision")
    recs = {r.get("model"): r for t in (v.tables if v else []) for r in table_records(t)}
    if OURS_1 in recs:
        ratio = to_number(recs[OURS_1]["infer vs DeiT"])
        add("Ours-1 inference images/s vs DeiT-tiny (AMP)", ">= 1.6x", ratio, ratio >= 1.6)
    else:
        add("Ours-1 inference images/s vs DeiT-tiny (AMP)", ">= 1.6x", None, None, "rows not measured")
    mx = results.get("bench_mixers")
    recs = [r for t in (mx.tables if mx else []) for r in table_records(t)]
    fsat = [r for r in recs if r.get("mixer") == "fsat" and to_number(r.get("L")) >= 16384]
    if fsat:
        # the table prints time as a fraction of the baseline's: < 1 is faster than SDPA
        frac = to_number(fsat[-1].get("time vs sdpa"))
        add("FSAT time vs SDPA at L >= 16K (fraction)", "< 1", frac, frac < 1)
    else:
        add("FSAT time vs SDPA at L >= 16K (fraction)", "< 1", None, None, "L = 16384 not measured")
    if device != "cuda":  # measured for the record, but the targets are CUDA figures: no verdict
        for t in out:
            t["met"] = None
            t["detail"] = (t["detail"] + "; " if t["detail"] else "") + "no verdict: the targets are for CUDA"
    return out


# ------------------------------------------------------------------------------------------------------ output


def md_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def write_section(out: Path, res: Result) -> None:
    parts = [f"# {res.name}: {res.status}" + (f" ({res.reason})" if res.reason else ""), ""]
    parts += [f"    {c}" for c in res.commands] + [""]
    if res.name.startswith("bench_") and res.stdout.strip():
        parts.append(res.stdout.strip())  # the bench's own Markdown, headers and verdicts included
    else:
        for t in res.tables:
            parts += [f"## {t['title']}", "", md_table(t["headers"], t["rows"]), ""]
    (out / f"{res.name}.md").write_text("\n".join(parts) + "\n")
    payload = {k: getattr(res, k) for k in ("name", "status", "seconds", "reason", "commands", "tables", "data")}
    (out / f"{res.name}.json").write_text(json.dumps(payload, indent=2, default=str) + "\n")


def write_summary(out: Path, results: dict[str, Result], tgts: list[dict], commands: list[str], wall: float) -> None:
    """``summary.md`` / ``summary.json``: the machine, each section's status and time, the targets; ``commands`` are
    the arguments of the run(s) whose sections these are (both parts for a ``--part 2`` that kept part 1)."""
    mode = ", then ".join(commands)
    env = results.get("env")
    machine = "-"
    if env and env.data:
        gpus = ", ".join(g["name"] for g in env.data["gpus"]) or "no GPU"
        machine = f"{gpus}; torch {env.data['torch']} (CUDA {env.data['cuda_runtime']}); python {env.data['python']}"
    lines = [f"# gpu_check {mode}", "", f"Machine: {machine}. Wall time {wall / 60:.1f} min.", "",
             *[f"    python tools/gpu_check.py {c}" for c in commands], "", "## Sections", ""]  # fmt: skip
    rows = [[r.name, r.status, f"{r.seconds:.0f}", r.reason.replace("|", "/")[:160]] for r in results.values()]
    lines += [md_table(["section", "status", "s", "reason"], rows), "", "## Targets (ratios of the same run)", ""]
    trows = [[t["target"], t["wanted"], _cell(t["measured"]), {True: "MET", False: "NOT MET"}.get(t["met"], "-"),
              t["detail"]] for t in tgts]  # fmt: skip
    lines += [md_table(["target", "wanted", "measured", "verdict", "note"], trows), ""]
    (out / "summary.md").write_text("\n".join(lines))
    summary = {
        "mode": mode,
        "commands": commands,
        "wall_s": wall,
        "sections": {r.name: {"status": r.status, "seconds": r.seconds, "reason": r.reason} for r in results.values()},
        "targets": tgts,
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")


# ------------------------------------------------------------------------------------------------------ main


def _wheel_fits(path: Path) -> bool:
    """Whether this interpreter can install the wheel (its tags); one that cannot is left out with a warning."""
    try:
        from packaging.tags import sys_tags
        from packaging.utils import parse_wheel_filename
    except ImportError:  # no packaging: let pip decide
        return True
    try:
        tags = parse_wheel_filename(path.name)[3]
    except ValueError as e:  # packaging's InvalidWheelFilename
        log.warning("carried wheel %s has no valid wheel name (%s): left out", path.name, e)
        return False
    if tags & set(sys_tags()):
        return True
    log.warning("carried wheel %s is not for this interpreter (Python %s): left out", path.name,
                platform.python_version())  # fmt: skip
    return False


def install_wheels(wheels: Path, site: Path) -> list[str]:
    """Installs the carried ``*.whl`` files of ``wheels`` into ``site`` (no index, no dependencies)."""
    files = [str(p) for p in sorted(wheels.glob("*.whl")) if _wheel_fits(p)]
    if not files:
        return []
    site.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
           "--disable-pip-version-check", "--upgrade", "--target", str(site), *files]  # fmt: skip
    subprocess.run(cmd, check=True)
    return [Path(f).name for f in files]


def load_sections(out: Path, exclude: tuple[str, ...]) -> dict[str, Result]:
    """The sections an earlier run (``--part 1``) left in ``out`` as ``<section>.json``, in the usual order."""
    kept = {}
    for name in SECTIONS:
        path = out / f"{name}.json"
        if name in exclude or not path.is_file():
            continue
        payload = json.loads(path.read_text())
        kept[name] = Result(**{k: payload[k] for k in ("name", "status", "seconds", "reason", "commands", "tables",
                                                       "data")})  # fmt: skip
    return kept


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="smaller grids: about 5 minutes on an H100")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default runs/gpu_check/<device>-<mode>)")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=None, help="run only these sections")
    parser.add_argument("--skip", nargs="+", choices=SECTIONS, default=[], help="leave these sections out")
    half = "one half of the sections (1, then 2 into the same --out: 2 keeps 1's results)"
    parser.add_argument("--part", type=int, choices=sorted(PARTS), default=None, help=half)
    parser.add_argument("--wheels", type=Path, default=None, help="folder of carried *.whl files (default: .whl)")
    parser.add_argument("--child", choices=["env", "kernels"], default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child == "env":
        print(json.dumps(child_env()))
        return 0
    if args.child == "kernels":
        print(json.dumps(child_kernels(args.device, args.quick)))
        return 0
    logging.basicConfig(level=logging.INFO, format="[gpu_check] %(message)s")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            parser.error("--device cuda but torch sees no CUDA device (use --device cpu to check the harness)")

    if args.part and args.only:
        parser.error("--part and --only both choose the sections: give one of them")
    out = args.out or REPO / "runs" / "gpu_check" / f"{args.device}-{'quick' if args.quick else 'full'}"
    mode = f"--device {args.device}" + (" --quick" if args.quick else "")
    earlier: dict[str, Result] = {}
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():  # never clear a folder that gpu_check did not write
            parser.error(f"--out {out} exists and holds no earlier gpu_check output ({MARKER}): choose another")
        if args.part == 2:
            # the marker's first line is the mode of the run that wrote the folder (even one killed mid-way)
            before = (out / MARKER).read_text().splitlines()[:1] or [""]
            if before[0].startswith("--device") and before[0] != mode:
                parser.error(f"--out {out} holds a run with {before[0]!r}, not {mode!r}: no mixing grids")
            earlier = load_sections(out, exclude=PARTS[2])
            log.info("--part 2: keeping %s from %s", ", ".join(earlier) or "nothing", out)
        else:
            shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text(
        f"{mode}\nwritten by tools/gpu_check.py; the next run clears this folder (but --part 2)\n"
    )
    wheels = args.wheels or (REPO / ".whl")
    if args.wheels and not wheels.is_dir():
        parser.error(f"--wheels {args.wheels} is not a folder")
    names = [n for n in (args.only or (PARTS[args.part] if args.part else SECTIONS)) if n not in args.skip]
    if "env" not in names:
        names.insert(0, "env")  # the GPU's memory sizes bench_capsules' budget; the summary names the machine
    results: dict[str, Result] = dict(earlier)
    t_start = time.perf_counter()
    # the scratch folder holds the carried wheels' site-packages and the training runs (checkpoints stay out of --out)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as scratch:
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        paths = [str(REPO)]
        installed = install_wheels(wheels, Path(scratch) / "site") if wheels.is_dir() else []
        if installed:
            log.info("installed carried wheels from %s: %s", wheels, ", ".join(installed))
            paths.insert(0, str(Path(scratch) / "site"))
        env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])
        if args.device == "cpu":
            env.setdefault("OMP_NUM_THREADS", "2")
        ctx = Ctx(args.device, args.quick, out, env, Path(scratch) / "runs")
        for name in names:
            log.info("%s ...", name)
            res = Result(name)
            try:
                RUNNERS[name](ctx, res)
            except Exception as e:  # a broken parser must not lose the other sections' tables
                res.status, res.reason = "failed", f"gpu_check itself: {type(e).__name__}: {e}"
            results[name] = res
            write_section(out, res)
            log.info("%s: %s in %.0f s %s", name, res.status, res.seconds, res.reason)
    tgts = targets(results, args.device)
    results = {n: results[n] for n in SECTIONS if n in results}
    commands = (
        [f"{mode} --part 1", f"{mode} --part 2"] if earlier else [mode + (f" --part {args.part}" if args.part else "")]
    )
    # part 1's time: its sections' (it may have been killed before writing a summary)
    wall = sum(r.seconds for r in earlier.values()) + time.perf_counter() - t_start
    write_summary(out, results, tgts, commands, wall)
    log.info("tables in %s (summary.md)", out)
    return 1 if any(r.status in ("failed", "timeout") for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
