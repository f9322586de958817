"""The GPU check behind ``tools/gpu_check.py``: every CUDA path of the toolkit checked and benchmarked, all tables
in one folder (:func:`check`).

Sections, each a subprocess with its own time limit (one failing or timing out does not stop the others):

* ``env``: Python, torch, CUDA, cuDNN, the GPU, triton, and which optional backends import (torch_cluster, pytorch3d,
  fpsample, open3d, trimesh, torch_geometric, onnx, onnxruntime), with the version or the reason they do not;
* ``tests``: every ``gpu``-marked test (the CUDA cases of the equivalence tests: Triton FPS and Cauchy/Vandermonde
  kernels against the reference in float32 and bfloat16, KNN chunking, FSAT's edge paths, the fused capsule layers,
  centroid attention's KNN path); on CUDA also the ``slow`` tests of the Triton kernels (interpreter, sm_90 compile);
  on CPU the ``gpu`` tests are collected and skip, which is what CI checks;
* ``kernels``: the Triton kernels against the torch path they replace, in one process: FPS (B=32, N=1024, M=512)
  and the Cauchy / Vandermonde mixers (L = 4096, forward + backward);
* ``bench_points``, ``bench_centroid``, ``bench_knn_attention`` (the fused KNN-attention kernel's heads per program
  at the ModelNet40 model's shapes), ``bench_modelnet`` (bf16 AMP on CUDA), ``bench_vision`` (bf16 AMP on CUDA),
  ``bench_mixers`` (softmax attention by matmul and by SDPA/flash as baselines, L up to 16K), ``bench_capsules``
  (the max-batch column against the GPU's memory): the tools/bench_*.py scripts with ``--device``, each printing
  ratios against a baseline measured in the same run, and each writing ``--json`` with its rows and its own targets;
* ``train_modelnet``, ``train_capsules``, ``train_deit``: each training CLI for a few steps on the embedded synthetic
  data (AMP on CUDA), then resumed from its ``last.pt`` for a second epoch: samples/s, finite losses, checkpoint
  written, resume continued at the right epoch.

The output folder (``--out``, default ``runs/gpu_check/<device>-<quick|full>``) gets ``<section>.md`` (the tables),
``<section>.json`` (the section's status, tables and data), ``<section>.tool.json`` (a bench's own ``--json``),
``<section>.log`` (stdout and stderr), and ``summary.md`` / ``summary.json``: each section's status and time, and
the targets the benches declared (:func:`measure.bench.target`), each a ratio against its baseline from the same
run. The exit status is 1 if a section failed; a section whose optional package is missing (e.g. trimesh for the
synthetic shapes) is "skipped" with the reason.

Extra wheels: a machine without internet access can install missing packages from wheel files. If ``--wheels``
(default: the repo's ``.whl`` folder, when it exists) holds ``*.whl`` files, they are installed with ``pip install
--no-index --no-deps --target`` into a folder under the output folder and put on every section's ``PYTHONPATH`` (see
docs/gpu.md).
"""

from __future__ import annotations

import importlib
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["MARKER", "OPTIONAL", "PARTS", "SECTIONS", "CheckError", "Ctx", "Result", "bench_args", "check",
           "env_report", "gather_targets", "junit_rows", "missing_optional", "read_report", "wheel_fits",
           "write_section"]  # fmt: skip

REPO = Path(__file__).resolve().parents[1]
TOOLS = REPO / "tools"
log = logging.getLogger(__name__)

# import name -> what is lost without it (the env table's "needed for" column)
OPTIONAL = {
    "triton": "the Triton FPS and Cauchy/Vandermonde kernels",
    "torch_cluster": "the torch-cluster FPS/KNN backend (optional; the torch and Triton paths cover CUDA)",
    "scipy": "torch_cluster's import (torch_cluster.nearest imports scipy.cluster)",
    "pytorch3d": "the pytorch3d FPS/KNN/Chamfer backends (optional; its wheel loads with torch 2.11 and 2.12 only)",
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
# a package whose compiled extension is a module of its own, imported too: a wheel built for another torch imports,
# but its extension does not load (an undefined symbol)
_EXTENSIONS = {"pytorch3d": "pytorch3d._C"}

SECTIONS = (
    "env",
    "tests",
    "kernels",
    "bench_points",
    "bench_centroid",
    "bench_knn_attention",
    "bench_modelnet",
    "bench_vision",
    "bench_mixers",
    "bench_capsules",
    "train_modelnet",
    "train_capsules",
    "train_deit",
)
# The full check in two shorter runs, for machines that limit a job's length: ``--part 1``, then
# ``--part 2`` into the same ``--out``; part 2 keeps part 1's sections and the summary covers both.
PARTS = {
    1: ("env", "tests", "kernels", "bench_points", "bench_centroid", "bench_knn_attention", "bench_modelnet"),
    2: ("env", "bench_vision", "bench_mixers", "bench_capsules", "train_modelnet", "train_capsules", "train_deit"),
}
# Seconds a bench section may take (quick, full), beyond the default (240, 600): the benches whose compiled rows
# compile in untimed warm-ups, one graph per model, batch size, length and mode (tens of graphs in a quick run).
BENCH_TIMEOUTS = {"bench_mixers": (480, 900), "bench_modelnet": (480, 900), "bench_vision": (480, 600)}
MARKER = ".gpu_check"  # the output folder's mark: a later run may clear only a folder that has it
POINTNET2 = "pointnet2_ssg_modelnet40"
OURS_1, DEIT_TINY = "centroid_deit_tiny_c6_patch16_224", "deit_tiny_patch16_224"


@dataclass
class Result:
    """What one section left: its status (ok / failed / skipped / timeout), time, tables, notes and the targets its
    bench declared (:func:`measure.bench.target`)."""

    name: str
    status: str = "ok"
    seconds: float = 0.0
    reason: str = ""
    commands: list[str] = field(default_factory=list)
    tables: list[dict] = field(default_factory=list)
    data: dict = field(default_factory=dict)
    targets: list[dict] = field(default_factory=list)
    stdout: str = ""


# ------------------------------------------------------------------------------------------------------ running


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


# ---------------------------------------------------------------------------------------------- environment


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


def env_report() -> dict:
    """The environment report: Python, torch, CUDA, cuDNN, the GPUs, and which :data:`OPTIONAL` packages import
    (run in a subprocess, with the sections' ``PYTHONPATH``)."""
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
            if name in _EXTENSIONS:
                importlib.import_module(_EXTENSIONS[name])
            report["packages"][name] = {"ok": True, "version": _version(name, mod)}
        except Exception as e:  # an optional package may fail in any way (missing, ABI, missing system library)
            report["packages"][name] = {"ok": False, "reason": f"{type(e).__name__}: {e}"[:200]}
    return report


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
    out = run_command(res, ctx.py(str(TOOLS / "gpu_check.py"), "--child", "env"), ctx.env, 180, ctx.out / "env.log")
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
        # quick: only the compile check (the interpreter tests need no GPU: CI runs them)
        which = "compile" if ctx.quick else "interpreter or compile"
        runs.append(("triton-slow", ["-m", "slow", "-k", which, "tests/attention"]))
    for label, args in runs:
        xml = ctx.out / f"tests-{label}.xml"
        argv = ctx.py("-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}", *args)
        out = run_command(res, argv, ctx.env, ctx.timeout(420, 600), ctx.out / "tests.log")
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
    """The Triton kernels against the torch paths they replace (:func:`attention.bench.triton_kernels`)."""
    argv = ctx.py(str(TOOLS / "gpu_check.py"), "--child", "kernels", "--device", ctx.device,
                  *(["--quick"] if ctx.quick else []))  # fmt: skip
    if not read_report(ctx, res, argv, ctx.timeout(180, 300)):
        return
    headers = ["kernel", "shape", "torch_ms", "triton_ms", "speedup", "note"]
    rows = [[_cell(r.get(h)) for h in headers] for r in res.data["rows"]]
    res.tables.append({"title": f"Triton kernels vs the torch path on {ctx.device}", "headers": headers, "rows": rows})


def read_report(ctx: Ctx, res: Result, argv: list[str], timeout: float) -> bool:
    """Runs ``argv --json <out>/<section>.tool.json`` and reads that report: its rows into ``res.data``, its
    targets into ``res.targets``. False where the command failed or wrote no report (``res`` says why)."""
    report = ctx.out / f"{res.name}.tool.json"
    report.unlink(missing_ok=True)
    out = run_command(res, [*argv, "--json", str(report)], ctx.env, timeout, ctx.out / f"{res.name}.log")
    if out is None or out.returncode != 0:
        return False
    if not report.is_file():
        res.status, res.reason = "failed", f"wrote no --json report ({report.name})"
        return False
    payload = json.loads(report.read_text())
    res.data = {k: v for k, v in payload.items() if k != "targets"}
    res.targets = payload.get("targets", [])
    return True


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
        # batch 1 too: a single cloud's search is split among programs (triton-split against triton-1split)
        fast = [*d, "--batch", "1", "32", "--points", "1024", "--channels", "3", "64", "--large", "50000", "4096"]
        return fast if quick else [*d, "--batch", "1", "8", "32", "--repeats", "5"]
    if name == "bench_centroid":
        if not cuda:
            return [*d, "--points", "256", "--dim", "32", "--k", "8", "--repeats", "1"]
        # quick: both ends of the fused KNN step's target range (N = 1K-16K against SDPA)
        return [*d, "--points", "1024", "16384"] if quick else d
    if name == "bench_knn_attention":
        # CUDA: the ModelNet40 model's four shapes at batch 32 (the kernel at 1, 2 and 4 heads a program); CPU: the
        # gather path at one small shape (the kernel's rows say why they are not timed)
        return d if cuda else [*d, "--shape", "S", "64", "256", "8", "4", "16", "--repeats", "1"]
    if name == "bench_modelnet":
        few = ["centroid_transformer_modelnet40", "centroid_transformer_modelnet40_random", POINTNET2]
        if not cuda:
            return [*d, "--batch", "2", "--points", "128", "--num-centroids", "32", "16", "--steps", "1",
                    "--repeats", "1", "--warmup", "0", "--models", *few[:2]]  # fmt: skip
        # the KNN attention forms: "auto" (the fused kernels on CUDA), gather, and masked (auto's choice before the
        # fused kernel), at both batch sizes of the PointNet++ target; compiled: auto (the kernels inside the
        # compiled graph; quick: with CUDA graphs too, T = 1 only) and, in the full run, masked
        forms = ["--attn-backends", "auto", "gather", "masked", "--batch", "32", "128"]
        if quick:
            compiled = ["--compile", "auto", "--compile-mode", "default", "reduce-overhead"]
            return [*d, "--amp", "--steps", "1", "--repeats", "3", *forms, *compiled, "--models", *few]
        return [*d, "--amp", *forms, "--compile", "auto", "masked"]
    if name == "bench_vision":
        if not cuda:
            return [*d, "--batch", "2", "--repeats", "1", "--warmup", "0", "--models", DEIT_TINY, OURS_1]
        # throughput in DeiT's sense (each model at its best batch): at small batches a fast GPU runs DeiT-tiny's
        # eager forward in the time its ~200 kernel launches take, so every model of that size would measure the same
        amp = [*d, "--amp", "--batch", "512", "2048"]
        # the target's pair eager and compiled, each inference call captured whole in a CUDA graph (the rows time
        # the GPU's work, not the host's), channels-last (a fast stem convolution for both); its verdict takes the
        # better mode. The full run: every model eager, train steps too
        pair = ["--compile", "both", "--capture", "--no-train", "--channels-last", "--models", DEIT_TINY, OURS_1]
        return [*amp, *pair] if quick else amp
    if name == "bench_mixers":
        if not cuda:  # a compiled row (tens of seconds to compile on CPU) and the skipped line of a torch row; in one
            # process (a fresh one per row imports torch again, five times the section's time)
            mixers = ["fsat", "fsat-torch", "fsat-compiled", "hydra", "cauchy"]
            return [*d, "--lengths", "128", "--dim", "32", "--heads", "2", "--mixers", *mixers, "--isolate", "no"]
        if quick:  # the targets' rows only: FSAT and Hydra (the kernels eager, compiled, in CUDA graphs compiled and
            # captured; FSAT's compiled step captured too, for its 4K target: one more compile per shape, Hydra's
            # would be six more) against SDPA from 4K to 16K at B = 1 and 8, Cauchy / Vandermonde at 4K
            mixers = ["fsat", "fsat-torch", "fsat-fused-compiled", "fsat-fused-graphs", "fsat-fused-captured",
                      "fsat-fused-compiled-captured", "hydra", "hydra-torch", "hydra-fused-compiled",
                      "hydra-fused-graphs", "hydra-fused-captured", "cauchy", "vandermonde"]  # fmt: skip
            lengths = ["--lengths", "4096", "8192", "16384", "--batch", "1", "8"]
            return [*d, *lengths, "--mixers", *mixers, "--max-quadratic-len", "4096"]
        # every mixer but the compiled torch paths, whose compiles (one per mixer and length) would not fit the
        # section's time (`tools/bench_mixers.py --device cuda` alone runs them); the compiled kernels, which the
        # targets read, as in the quick run
        mixers = ["fsat", "fsat-torch", "fsat-fused-compiled", "fsat-fused-graphs", "fsat-fused-captured",
                  "fsat-fused-compiled-captured", "fat", "linear", "lowrank", "toeplitz", "hydra", "hydra-torch",
                  "hydra-fused-compiled", "hydra-fused-graphs", "hydra-fused-captured", "cauchy",
                  "vandermonde"]  # fmt: skip
        return [*d, "--lengths", "1024", "2048", "4096", "8192", "16384", "--mixers", *mixers]
    if name == "bench_capsules":
        small = ["--models", "pointcaps_routing_small", "pointcaps_centroid_small", "--routing-impls", "einsum"]
        if not cuda:
            return [*d, *small, "--points", "128", "--batch", "2", "--mem-batches", "2", "3", "--train-steps", "2",
                    "--chamfer-points", "64", "--train-per-class", "2", "--repeats", "1", "--warmup", "0"]  # fmt: skip
        budget = ["--budget-gb", f"{math.floor(ctx.gpu_mem_gib or 12)}"]
        return [*d, *budget, *small, "--train-steps", "20"] if quick else [*d, *budget]
    raise ValueError(f"unknown bench {name!r}")


def section_bench(ctx: Ctx, res: Result) -> None:
    """A ``tools/bench_*.py`` script: its printed tables go to ``<section>.md``, its ``--json`` report (rows and
    targets) to ``<section>.tool.json`` and the summary."""
    argv = ctx.py(str(TOOLS / f"{res.name}.py"), *bench_args(ctx, res.name))
    if read_report(ctx, res, argv, ctx.timeout(*BENCH_TIMEOUTS.get(res.name, (240, 600)))):
        res.data = {"tool_json": f"{res.name}.tool.json", "machine": res.data.get("machine")}


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


def gather_targets(results: dict[str, Result]) -> list[dict]:
    """The targets every section's report declared, in section order; a bench section that ended without its
    report stands for its targets with one row, no verdict, and the reason."""
    out = []
    for name in SECTIONS:
        res = results.get(name)
        if res is None:
            continue
        out += res.targets
        reports = name == "kernels" or name.startswith("bench_")
        if reports and not res.targets and res.status != "ok":
            out.append({"target": f"{name}'s targets", "wanted": "-", "measured": None, "met": None,
                        "verdict": "no verdict", "detail": f"{res.status}: {res.reason}"[:160]})  # fmt: skip
    return out


# ------------------------------------------------------------------------------------------------------ output


def md_table(headers: list[str], rows: list[list]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


RESULT_KEYS = ("name", "status", "seconds", "reason", "commands", "tables", "data", "targets")


def write_section(out: Path, res: Result) -> None:
    """``<section>.md`` (a bench's own printed Markdown, else the section's tables) and ``<section>.json``."""
    parts = [f"# {res.name}: {res.status}" + (f" ({res.reason})" if res.reason else ""), ""]
    parts += [f"    {c}" for c in res.commands] + [""]
    if res.name.startswith("bench_") and res.stdout.strip():
        parts.append(res.stdout.strip())  # the bench's own Markdown, headers and verdicts included
    else:
        for t in res.tables:
            parts += [f"## {t['title']}", "", md_table(t["headers"], t["rows"]), ""]
    (out / f"{res.name}.md").write_text("\n".join(parts) + "\n")
    payload = {k: getattr(res, k) for k in RESULT_KEYS}
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


def wheel_fits(path: Path) -> bool:
    """Whether this interpreter can install the wheel (its tags); one that cannot is left out with a warning."""
    try:
        from packaging.tags import sys_tags
        from packaging.utils import parse_wheel_filename
    except ImportError:  # no packaging: let pip decide
        return True
    try:
        tags = parse_wheel_filename(path.name)[3]
    except ValueError as e:  # packaging's InvalidWheelFilename
        log.warning("extra wheel %s has no valid wheel name (%s): left out", path.name, e)
        return False
    if tags & set(sys_tags()):
        return True
    log.warning("extra wheel %s is not for this interpreter (Python %s): left out", path.name,
                platform.python_version())  # fmt: skip
    return False


def install_wheels(wheels: Path, site: Path) -> list[str]:
    """Installs the ``*.whl`` files of ``wheels`` into ``site`` (no index, no dependencies)."""
    files = [str(p) for p in sorted(wheels.glob("*.whl")) if wheel_fits(p)]
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
        kept[name] = Result(**{k: payload[k] for k in RESULT_KEYS if k in payload})
    return kept


class CheckError(ValueError):
    """Arguments :func:`check` cannot run with (the CLI turns it into a usage error)."""


def check(
    device: str = "cuda",
    quick: bool = False,
    out: Path | None = None,
    only: Sequence[str] | None = None,
    skip: Sequence[str] = (),
    part: int | None = None,
    wheels: Path | None = None,
) -> int:
    """Runs the sections (``only``, or ``PARTS[part]``, or all; less ``skip``) on ``device`` and writes their files
    and the summary into ``out`` (default ``runs/gpu_check/<device>-<quick|full>``).

    Returns:
        The exit status: 1 if a section failed or timed out, else 0.

    Raises:
        CheckError: CUDA asked for but absent, ``part`` with ``only``, an ``out`` folder that gpu_check did not write
            or that holds another mode's part 1, ``wheels`` that is not a folder.
    """
    if device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise CheckError("--device cuda but torch sees no CUDA device (use --device cpu to check the harness)")
    if part and only:
        raise CheckError("--part and --only both choose the sections: give one of them")
    if wheels is not None and not wheels.is_dir():
        raise CheckError(f"--wheels {wheels} is not a folder")
    out = out or REPO / "runs" / "gpu_check" / f"{device}-{'quick' if quick else 'full'}"
    mode = f"--device {device}" + (" --quick" if quick else "")
    earlier: dict[str, Result] = {}
    if out.exists() and any(out.iterdir()):
        if not (out / MARKER).is_file():  # never clear a folder that gpu_check did not write
            raise CheckError(f"--out {out} exists and holds no earlier gpu_check output ({MARKER}): choose another")
        if part == 2:
            # the marker's first line is the mode of the run that wrote the folder (even one killed mid-way)
            before = (out / MARKER).read_text().splitlines()[:1] or [""]
            if before[0].startswith("--device") and before[0] != mode:
                raise CheckError(f"--out {out} holds a run with {before[0]!r}, not {mode!r}: no mixing grids")
            earlier = load_sections(out, exclude=PARTS[2])
            log.info("--part 2: keeping %s from %s", ", ".join(earlier) or "nothing", out)
        else:
            shutil.rmtree(out)
    wheels = wheels or (REPO / ".whl")
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text(
        f"{mode}\nwritten by tools/gpu_check.py; the next run clears this folder (but --part 2)\n"
    )
    names = [n for n in (only or (PARTS[part] if part else SECTIONS)) if n not in skip]
    if "env" not in names:
        names.insert(0, "env")  # the GPU's memory sizes bench_capsules' budget; the summary names the machine
    results: dict[str, Result] = dict(earlier)
    t_start = time.perf_counter()
    # the scratch folder holds the extra wheels' site-packages and the training runs (checkpoints stay out of --out)
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as scratch:
        ctx = Ctx(device, quick, out, section_env_vars(device, wheels, Path(scratch)), Path(scratch) / "runs")
        for name in names:
            log.info("%s ...", name)
            res = Result(name)
            try:
                RUNNERS[name](ctx, res)
            except Exception as e:  # a broken section must not lose the other sections' tables
                res.status, res.reason = "failed", f"gpu_check itself: {type(e).__name__}: {e}"
            results[name] = res
            write_section(out, res)
            log.info("%s: %s in %.0f s %s", name, res.status, res.seconds, res.reason)
    results = {n: results[n] for n in SECTIONS if n in results}
    commands = [f"{mode} --part 1", f"{mode} --part 2"] if earlier else [mode + (f" --part {part}" if part else "")]
    # part 1's time: its sections' (it may have been killed before writing a summary)
    wall = sum(r.seconds for r in earlier.values()) + time.perf_counter() - t_start
    write_summary(out, results, gather_targets(results), commands, wall)
    log.info("tables in %s (summary.md)", out)
    return 1 if any(r.status in ("failed", "timeout") for r in results.values()) else 0


def section_env_vars(device: str, wheels: Path, scratch: Path) -> dict:
    """The sections' environment: this checkout and the extra wheels (installed into ``scratch``) first on
    ``PYTHONPATH``, unbuffered output, two threads on CPU unless ``OMP_NUM_THREADS`` says otherwise."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    paths = [str(REPO)]
    installed = install_wheels(wheels, scratch / "site") if wheels.is_dir() else []
    if installed:
        log.info("installed extra wheels from %s: %s", wheels, ", ".join(installed))
        paths.insert(0, str(scratch / "site"))
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [os.environ.get("PYTHONPATH")])])
    if device == "cpu":
        env.setdefault("OMP_NUM_THREADS", "2")
    return env
