"""Helpers shared by the test suite (like ``torch_geometric.testing``): run a CLI, kill it, read its run.

Domain-free: what one domain's tests share lives in that package's ``testing`` module (:mod:`vision.testing`).
Nothing in the library imports this module.
"""

from __future__ import annotations

import functools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

from engine.recipe import Recipe
from engine.trainer import TIMING_KEYS

__all__ = [
    "HELP_COLUMNS",
    "NOTEST",
    "REPO",
    "TOOLS",
    "BlobsTask",
    "BlobsTaskConfig",
    "FencedBlock",
    "assert_backends_agree",
    "assert_interpreted",
    "blobs",
    "compile_for_sm90",
    "doc_pages",
    "fenced_blocks",
    "free_port",
    "host_syncs",
    "read_log",
    "run_interpreted",
    "run_python",
    "run_tool",
    "run_tools_batched",
    "skip_if_interpreted",
    "start_tool",
    "stop_after_first_checkpoint",
    "strip_timing",
    "tool_env",
    "tool_process",
    "tools_help",
    "torchrun",
]

REPO = Path(__file__).resolve().parents[1]

# the line right above a fence that the docs' tests leave alone (an HTML comment: invisible on GitHub and the site)
NOTEST = "<!-- notest -->"


class FencedBlock(NamedTuple):
    """One fenced code block of a Markdown file: where it starts (1-based line of the fence), its language, its text,
    and whether the line above the fence is :data:`NOTEST`."""

    path: Path
    line: int
    language: str
    code: str
    notest: bool


def doc_pages() -> list[Path]:
    """The Markdown a user reads: README.md and every page under docs/."""
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def fenced_blocks(path: Path, languages: tuple[str, ...]) -> list[FencedBlock]:
    """The fenced blocks of ``path`` (backtick fences, indented or not) whose language is one of ``languages``."""
    lines = path.read_text().splitlines()
    blocks, i = [], 0
    while i < len(lines):
        m = re.match(r"^(\s*)```\s*([\w+-]*)", lines[i])
        if not m:
            i += 1
            continue
        indent, language, start = m.group(1), m.group(2), i
        i += 1
        body = []
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip())
            i += 1
        i += 1
        if language in languages:
            notest = start > 0 and lines[start - 1].strip() == NOTEST
            blocks.append(FencedBlock(path, start + 1, language, "\n".join(body) + "\n", notest))
    return blocks


# aten ops whose result the host must read (a value, or a data-dependent size): on CUDA each waits for the GPU
SYNC_OPS = frozenset({"_local_scalar_dense", "nonzero", "masked_select", "_unique2", "unique_dim",
                      "unique_consecutive", "equal", "is_nonzero", "repeat_interleave"})  # fmt: skip


# the counter's own frames, never the caller of a sync
_NOT_CALLERS = (__file__, str(REPO / "measure" / "bench.py"))


def blobs(n: int, seed: int, dim: int = 8, classes: int = 3) -> TensorDataset:
    """``n`` standard normal points in ``dim`` dimensions (drawn from ``seed``), each labelled by the argmax of one
    fixed random linear map to ``classes`` scores: a task that a tiny MLP learns in a few steps."""
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed))
    return TensorDataset(x, (x @ torch.randn(dim, classes, generator=torch.Generator().manual_seed(1))).argmax(-1))


@dataclass
class BlobsTaskConfig:
    """The fields the harness and :class:`BlobsTask` read; a test's config subclasses it with its own knobs."""

    name: str = "blobs"
    epochs: int = 3
    batch_size: int = 16
    eval_batch_size: int = 64
    lr: float = 1e-2
    workers: int = 0
    seed: int = 0


class BlobsTask(Recipe):
    """The training harness's test recipe on :func:`blobs`: Adam at ``cfg.lr``, cross-entropy, and the eval set's
    ``val_loss`` and ``val_acc``. A test's subclass gives its group, config class (a :class:`BlobsTaskConfig`),
    datasets and model."""

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.Adam(model.parameters(), lr=self.cfg.lr)

    def loss(self, model: nn.Module, batch: Any) -> tuple[torch.Tensor, dict]:
        x, y = batch
        return F.cross_entropy(model(x), y), {}

    def evaluate(self, model: nn.Module) -> dict[str, torch.Tensor]:
        x, y = self.eval_set.tensors
        logits = model(x)
        return {"val_loss": F.cross_entropy(logits, y), "val_acc": (logits.argmax(-1) == y).float().mean()}


def host_syncs(fn: Any) -> dict[str, int]:
    """``{"op at file:line": count}`` of the :data:`SYNC_OPS` that ``fn()`` dispatches, on any device.

    A CPU stand-in for ``torch.cuda.set_sync_debug_mode("error")``, not a replacement: it sees the ops dispatched,
    so it misses syncs made inside another op (boolean-mask indexing ``x[mask]`` runs its ``nonzero`` below the
    dispatcher) and copies to the host (``.cpu()``, ``.tolist()``); ``repeat_interleave`` counts even with an int
    repeat, where it would not sync. The ``gpu`` tests with the sync debug mode are the real check.
    """
    import traceback
    from collections import Counter

    from measure.bench import OpCounter

    found: Counter = Counter()

    def where(func: Any, args: tuple, kwargs: dict, out: object) -> None:
        name = func.overloadpacket.__name__
        if name in SYNC_OPS:
            ours = [f for f in traceback.extract_stack() if f.filename.startswith(str(REPO)) and "site-packages"
                    not in f.filename and f.filename not in _NOT_CALLERS]  # fmt: skip
            at = f"{Path(ours[-1].filename).relative_to(REPO)}:{ours[-1].lineno}" if ours else "?"
            found[f"{name} at {at}"] += 1

    with OpCounter(on_op=where):
        fn()
    return dict(found)


def strip_timing(record: dict[str, Any]) -> dict[str, Any]:
    """``record`` without the wall-time keys (:data:`engine.TIMING_KEYS`) that differ between identical runs."""
    return {k: v for k, v in record.items() if k not in TIMING_KEYS}


def read_log(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``run_dir/log.jsonl``, parsed strictly (a bare ``NaN`` fails)."""
    lines = (Path(run_dir) / "log.jsonl").read_text().splitlines()
    return [json.loads(line, parse_constant=_reject_constant) for line in lines if line.strip()]


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-standard JSON constant {name}")


def tool_env(display: bool = True) -> dict[str, str]:
    """The environment for a CLI subprocess: this checkout first on ``PYTHONPATH``, one thread; ``display=False``
    hides an X or Wayland display, so that viewers render PNGs instead of opening windows."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    if not display:
        env = {k: v for k, v in env.items() if k not in ("DISPLAY", "WAYLAND_DISPLAY")}
    return env


# The tools' processes are forked from a process that has already imported the heavy third-party packages (a "fork
# server", as multiprocessing's forkserver start method): each is still a process of its own, with its own PID,
# arguments, environment, folder, pipes, signals and exit status, as ``python tools/<name>.py`` gives, without paying
# for importing torch, torchvision, timm and torch_geometric again (seconds a process on a small CPU, most of the time
# of a short CLI test). The toolkit's own modules are imported in the child, as a fresh process would.
_FORK_SERVER = r"""
import atexit, importlib, json, os, runpy, selectors, signal, socket, sys, traceback
for name in sys.argv[2].split(","):
    try:
        importlib.import_module(name)
    except Exception:
        pass  # a package that does not import here is imported (and fails) in the tool, as without the server
control = socket.socket(fileno=int(sys.argv[1]))
selector = selectors.DefaultSelector()
selector.register(control, selectors.EVENT_READ)


def child(request, fds, call):
    code = 0
    try:
        # nothing of the server's stays open in the tool: its sockets, the selector and the other children's pidfds
        others = [(k.fd, k.data[1]) for k in selector.get_map().values() if k.data]
        selector.close()
        for pidfd, other in others:
            os.close(pidfd)
            other.close()
        control.close()
        call.close()
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        for fd in set(fds):
            if fd > 2:
                os.close(fd)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD):
            signal.signal(sig, signal.SIG_DFL)
        os.environ.clear()
        os.environ.update(request["env"])
        os.chdir(request["cwd"])
        if "OMP_NUM_THREADS" in request["env"]:
            import torch
            torch.set_num_threads(int(request["env"]["OMP_NUM_THREADS"]))
        argv = request["argv"]
        try:
            if argv[0] == "-c":  # python -c CODE args: sys.argv is ["-c", args...] and the folder comes first
                sys.argv, sys.path[0] = ["-c", *argv[2:]], ""
                exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
            else:
                sys.argv, sys.path[0] = list(argv), os.path.dirname(argv[0])
                runpy.run_path(argv[0], run_name="__main__")
        except SystemExit as e:
            if e.code is None or isinstance(e.code, int):
                code = e.code or 0
            else:
                print(e.code, file=sys.stderr)
                code = 1
        except KeyboardInterrupt:  # as the interpreter ends on one: the traceback, then killed by SIGINT
            traceback.print_exc()
            code = -signal.SIGINT
        except BaseException:
            traceback.print_exc()
            code = 1
        atexit._run_exitfuncs()
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        if code < 0:
            signal.signal(-code, signal.SIG_DFL)
            os.kill(os.getpid(), -code)
    finally:
        os._exit(code & 0xFF)


while True:
    for key, _ in selector.select():
        if key.fileobj is control:
            message, fds, _, _ = socket.recv_fds(control, 1 << 20, 4)
            if not message:
                sys.exit(0)  # the test process has gone
            call = socket.socket(fileno=fds[3])
            pid = os.fork()
            if pid == 0:
                child(json.loads(message), fds[:3], call)
            for fd in set(fds[:3]):
                os.close(fd)
            call.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            selector.register(os.pidfd_open(pid), selectors.EVENT_READ, (pid, call))
        else:
            pid, call = key.data
            selector.unregister(key.fd)
            os.close(key.fd)
            status = os.waitpid(pid, 0)[1]
            try:
                call.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
            except OSError:
                pass  # the test no longer waits for it
            call.close()
"""

#: What the fork server imports before it forks a tool: the third-party packages, whose import is the cost.
FORK_SERVER_PRELOAD = ("torch", "torchvision", "timm", "torch_geometric", "numpy", "yaml", "tqdm")
#: Environment variables that a tool reads when it runs, not when these packages are imported: calls whose
#: environments differ only in these share a fork server; any other difference gets a server started with it.
FORK_SERVER_LAZY_ENV = ("DISPLAY", "WAYLAND_DISPLAY", "COLUMNS", "LINES", "PYTEST_CURRENT_TEST", "CENTROID_TEST_FORK")


class _ForkServer:
    """A process that has imported :data:`FORK_SERVER_PRELOAD` with ``env`` and forks the tools' processes."""

    def __init__(self, env: dict[str, str]) -> None:
        self.control, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        with theirs:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", _FORK_SERVER, str(theirs.fileno()), ",".join(FORK_SERVER_PRELOAD)],
                env=env, pass_fds=[theirs.fileno()], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )  # fmt: skip

    def fork(self, argv: list[str], env: dict[str, str], cwd: str, fds: list[int]) -> socket.socket:
        """Forks ``python argv...`` with ``fds`` as its stdin, stdout and stderr; returns the call's socket, which
        gets ``{"pid": ...}`` at once and ``{"returncode": ...}`` when the child ends."""
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        with theirs:
            request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
            socket.send_fds(self.control, [request], [*fds, theirs.fileno()])
        return mine


_SERVERS: dict[tuple[int, frozenset], _ForkServer] = {}
_MAX_SERVERS = 3  # per test process: a test that changes the environment gets its own, the oldest is closed


def _fork_server(env: dict[str, str]) -> _ForkServer | None:
    """A fork server of this process for ``env`` (one per environment, up to :data:`_MAX_SERVERS`, started with it),
    or ``None`` where ``CENTROID_TEST_FORK=0`` or the platform lacks Linux's pidfd and fd passing."""
    if os.environ.get("CENTROID_TEST_FORK", "1") == "0" or not hasattr(os, "pidfd_open"):
        return None
    key = (os.getpid(), frozenset((k, v) for k, v in env.items() if k not in FORK_SERVER_LAZY_ENV))
    server = _SERVERS.pop(key, None)
    if server is None or server.proc.poll() is not None:
        server = _ForkServer(env)
    _SERVERS[key] = server  # the most recently used last
    mine = [k for k in _SERVERS if k[0] == os.getpid()]
    for old in mine[: max(0, len(mine) - _MAX_SERVERS)]:
        _SERVERS.pop(old).control.close()  # the server sees the end of its socket and exits
    return server


class _Forked(subprocess.Popen):
    """A :class:`subprocess.Popen` whose child the fork server forks instead of ``fork + exec``: the same pipes,
    ``pid``, signals, ``poll``, ``wait`` and ``communicate``; its exit status comes from the server."""

    def __init__(self, server: _ForkServer, *args: Any, **kwargs: Any) -> None:
        self._server, self._buffer = server, b""
        super().__init__(*args, **kwargs)

    def _execute_child(self, args, executable, preexec_fn, close_fds, pass_fds, cwd, env, startupinfo, creationflags,
                       shell, p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite, *rest):  # fmt: skip
        fds = [fd if fd != -1 else default for fd, default in zip((p2cread, c2pwrite, errwrite), (0, 1, 2))]
        self._call = self._server.fork(list(args[1:]), dict(env), os.fspath(cwd or os.getcwd()), fds)
        self.pid = self._message(None)["pid"]
        self._child_created = True
        self._close_pipe_fds(p2cread, p2cwrite, c2pread, c2pwrite, errread, errwrite)

    def _message(self, timeout: float | None) -> dict[str, Any]:
        self._call.settimeout(timeout)
        while b"\n" not in self._buffer:
            data = self._call.recv(4096)
            if not data:
                raise RuntimeError(f"the fork server ended before reporting on process {self.pid}")
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return json.loads(line)

    def _internal_poll(self, _deadstate: int | None = None, **_: Any) -> int | None:
        if self.returncode is None:
            try:
                self.returncode = self._message(0)["returncode"]
            except (BlockingIOError, TimeoutError, RuntimeError):
                if _deadstate is not None:
                    self.returncode = _deadstate
        return self.returncode

    def _wait(self, timeout: float | None) -> int:
        if self.returncode is None:
            try:
                self.returncode = self._message(timeout)["returncode"]
            except TimeoutError:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode


def tool_process(argv: list[str], env: dict[str, str] | None = None, **popen: Any) -> subprocess.Popen:
    """``subprocess.Popen([sys.executable, *argv], env=env, **popen)`` for a Python script (``argv[0]``, or ``-c
    CODE``), forked from a fork server started with ``env`` (default :func:`tool_env`): a process of its own, without
    importing torch again."""
    env = tool_env() if env is None else env
    server = _fork_server(env)
    cmd = [sys.executable, *argv]
    return subprocess.Popen(cmd, env=env, **popen) if server is None else _Forked(server, cmd, env=env, **popen)


def run_python(argv: list[str], env: dict[str, str] | None = None, timeout: float = 300,
               cwd: str | Path | None = None) -> subprocess.CompletedProcess:  # fmt: skip
    """``python argv...`` to the end (:func:`tool_process`), stdout and stderr captured as text, as
    ``subprocess.run(..., capture_output=True, text=True, timeout=timeout)`` returns them."""
    with tool_process(argv, env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as proc:
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def start_tool(name: str, args: list[str]) -> subprocess.Popen:
    """Starts ``python tools/<name>.py args`` with its stderr captured as text."""
    argv = [str(REPO / "tools" / f"{name}.py"), *args]
    return tool_process(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def run_tool(name: str, args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    """Runs ``python tools/<name>.py args`` to the end, stdout and stderr captured as text: for tests of the script
    itself (its printed output, exit status, files), where the library behind it is tested in process."""
    return run_python([str(REPO / "tools" / f"{name}.py"), *args], timeout=timeout)


# Runs each (script, argv) of a JSON list on stdin as ``python script argv`` would, in this one process, and prints
# one JSON result per call: the import of torch and the toolkit is paid once for all of them.
_BATCH_RUNNER = r"""
import contextlib, io, json, runpy, sys, traceback
results = []
for script, args in json.loads(sys.stdin.read()):
    out, err, code = io.StringIO(), io.StringIO(), 0
    sys.argv, sys.path[0] = [script, *args], script.rpartition("/")[0]  # as `python script args` sets them
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(script, run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        if not isinstance(e.code, (int, type(None))):
            err.write(f"{e.code}\n")
    except BaseException:
        code = 1
        err.write(traceback.format_exc())
    results.append({"returncode": code, "stdout": out.getvalue(), "stderr": err.getvalue()})
sys.__stdout__.write(json.dumps(results))
"""


def run_tools_batched(
    calls: list[tuple[str, list[str]]], env: dict[str, str] | None = None, timeout: float = 600
) -> list[subprocess.CompletedProcess]:
    """Runs ``python tools/<name>.py args`` for every ``(name, args)`` of ``calls`` in one fresh process, one after the
    other, each as its own ``__main__`` with its own ``sys.argv``, stdout and stderr: for calls that end in the
    argument parser (``--help``, a bad value), where a process per call would mostly pay for importing torch.

    Returns one :class:`subprocess.CompletedProcess` per call, in order (``returncode`` the ``SystemExit`` code, 1 for
    an exception, whose traceback ends its ``stderr``); ``env`` adds to :func:`tool_env`."""
    jobs = [(str(REPO / "tools" / f"{name}.py"), list(args)) for name, args in calls]
    env = {**tool_env(), **(env or {})}
    done = subprocess.run([sys.executable, "-c", _BATCH_RUNNER], input=json.dumps(jobs), env=env, capture_output=True,
                          text=True, timeout=timeout)  # fmt: skip
    assert done.returncode == 0, f"the batched tool runner failed: {done.stderr[-3000:]}"
    results = json.loads(done.stdout)
    return [
        subprocess.CompletedProcess([sys.executable, script, *args], r["returncode"], r["stdout"], r["stderr"])
        for (script, args), r in zip(jobs, results, strict=True)
    ]


TOOLS = tuple(sorted(p.stem for p in (REPO / "tools").glob("*.py")))
HELP_COLUMNS = 120  # the source's line length: argparse wraps its help to COLUMNS - 2


@functools.cache
def tools_help() -> dict[str, subprocess.CompletedProcess]:
    """Every tool's ``--help`` as a terminal of :data:`HELP_COLUMNS` columns shows it, by name: one batched process
    (:func:`run_tools_batched`) the first time a test asks, then cached for the test session."""
    results = run_tools_batched([(name, ["--help"]) for name in TOOLS], env={"COLUMNS": str(HELP_COLUMNS)})
    return dict(zip(TOOLS, results, strict=True))


def stop_after_first_checkpoint(
    proc: subprocess.Popen, run_dir: Path, sig: int = signal.SIGKILL, timeout: float = 300
) -> str:
    """Sends ``sig`` to ``proc`` once ``run_dir`` has a ``last.pt`` and a log line; returns its stderr.

    Raises:
        AssertionError: The run ended before it could be stopped (make it longer) or never wrote a checkpoint.
    """
    deadline = time.time() + timeout
    run_dir = Path(run_dir)
    while time.time() < deadline and proc.poll() is None:
        log = run_dir / "log.jsonl"
        if (run_dir / "last.pt").is_file() and log.is_file() and log.read_text().strip():
            break
        time.sleep(0.01)
    assert proc.poll() is None, "the run ended before it could be stopped: make it longer"
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=120)
    return err


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def torchrun(name: str, args: list[str], nproc: int = 2, timeout: float = 300) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node nproc tools/<name>.py args`` on CPU (gloo), output captured."""
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), str(REPO / "tools" / f"{name}.py"), *args,
    ]  # fmt: skip
    return subprocess.run(cmd, env=tool_env(), capture_output=True, text=True, timeout=timeout)


# Run first in every interpreted script, two shortcuts in Triton's interpreter that leave every result's bits as they
# were. (1) It reduces element by element in Python when it does not know the combine function; tl.sort's bitonic
# network reduces with XOR (tl.standard.xor_sum) at every stage, which made the sort-based kernels (the KNN lists) take
# seconds a call on a few points; XOR is exact, associative and commutative, so NumPy's reduction gives the same bits.
# (2) Every call of a jit helper inside a kernel lists all members of triton.language (inspect.getmembers) to find the
# builtins to patch, most of an interpreted kernel's time; the builtins' names are listed once instead, and each call
# patches those still unpatched, as before. (3) Every integer +, - and * of a kernel also computes an int32 overflow
# check in int64 and hands it to device_assert, which drops it unless the options' debug is set, never the case in the
# interpreter: about half of an interpreted kernel's time, for a check that cannot fire; it is switched off while debug
# is off. Each is skipped where the interpreter's layout differs.
INTERPRETER_PRELUDE = """
def _interpreter_shortcuts():
    import dataclasses
    import inspect

    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    patch_builtin, patch_attr = getattr(interpreter, "_patch_builtin", None), getattr(interpreter, "_patch_attr", None)
    if patch_attr is not None and list(inspect.signature(patch_builtin).parameters) == ["pkg", "builder", "scope"]:
        # listed now, before any kernel has patched them
        pkgs = [tl, tl.core, tl.tensor, tl.math, getattr(tl.core, "tensor_descriptor_base", None)]
        names = {p: [n for n, m in inspect.getmembers(p) if tl.core.is_builtin(m)] for p in pkgs if p is not None}

        def _patch_builtin(pkg, builder, scope):
            if pkg not in names:
                return patch_builtin(pkg, builder, scope)
            for name in names[pkg]:
                member = getattr(pkg, name)
                if tl.core.is_builtin(member):
                    patch_attr(pkg, name, member, builder, scope)

        interpreter._patch_builtin = _patch_builtin

    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if dataclasses.is_dataclass(options) and getattr(options, "sanitize_overflow", False) and not options.debug:
        builder.options = dataclasses.replace(options, sanitize_overflow=False)

    ops, xor = getattr(interpreter, "ReduceOps", None), getattr(tl.standard, "_xor_combine", None)
    if ops is None or xor is None or not hasattr(ops, "apply_impl"):
        return  # another interpreter layout: keep its own reduction
    generic = ops.apply_impl

    def apply_impl(self, input):
        if self.combine_fn is not xor or len(input) != 1:
            return generic(self, input)
        data = input[0].handle.data
        if self.axis is None:
            out = np.bitwise_xor.reduce(data.reshape(-1))
            out = out.reshape((1,) * data.ndim) if self.keep_dims else out.item()
        else:
            out = np.bitwise_xor.reduce(data, axis=self.axis, keepdims=self.keep_dims)
        return self.to_tensor(out, input[0].dtype)

    ops.apply_impl = apply_impl


_interpreter_shortcuts()
del _interpreter_shortcuts
"""


def run_interpreted(script: str, test_dir: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    """Runs ``script`` in a fresh Python under Triton's interpreter (``TRITON_INTERPRET=1``, which triton reads when it
    is imported, hence a process of its own), where Triton kernels run on CPU tensors. ``test_dir`` (a test file's
    folder, whose helpers the script imports) and this checkout lead the child's ``PYTHONPATH``."""
    path = os.pathsep.join([str(test_dir), str(REPO), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": path}
    return subprocess.run([sys.executable, "-c", INTERPRETER_PRELUDE + script], env=env, capture_output=True, text=True,
                          timeout=timeout)  # fmt: skip


def assert_interpreted(script: str, test_file: str | Path, timeout: float = 900) -> None:
    """Asserts that ``script`` runs under Triton's interpreter (:func:`run_interpreted`, with ``test_file``'s folder on
    the path for its helpers) and ends by printing ``ok``: the scaffold of every test that checks a Triton kernel on
    CPU against its reference."""
    out = run_interpreted(script, Path(test_file).resolve().parent, timeout=timeout)
    assert out.returncode == 0, out.stderr[-5000:]
    assert out.stdout.strip().splitlines()[-1:] == ["ok"], out.stdout[-2000:]


def assert_backends_agree(
    module: nn.Module,
    x: torch.Tensor,
    owner: object,
    attr: str,
    backends: tuple[str, ...],
    rtol: float,
    seed: int | None = None,
) -> None:
    """Asserts that ``module(x)`` and the gradients of ``out.square().sum()`` with respect to ``x`` and every
    parameter agree (``rtol``, and an absolute tolerance of ``rtol`` times the largest value) whichever of
    ``backends`` ``owner.attr`` is set to; ``seed`` reseeds before each forward, for a module that draws random
    numbers (e.g. random edges in training mode)."""
    results = []
    for backend in backends:
        setattr(owner, attr, backend)
        if seed is not None:
            torch.manual_seed(seed)
        out = module(x)
        results.append([out, *torch.autograd.grad(out.square().sum(), [x, *module.parameters()])])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(b, a, rtol=rtol, atol=rtol * a.abs().max().item())


def skip_if_interpreted(kernel: Any) -> None:
    """Skips the calling test when ``kernel`` cannot be compiled ahead of time: its module was imported under
    ``TRITON_INTERPRET=1``, which makes every ``triton.jit`` function an interpreter function."""
    import pytest
    import triton

    if not isinstance(kernel, triton.runtime.JITFunction):
        pytest.skip("the kernel module was imported under TRITON_INTERPRET=1")


def compile_for_sm90(
    fn: Any, signature: dict[str, str], constexprs: dict[str, Any], num_warps: int, enable_fp_fusion: bool = True
) -> dict | None:
    """Compiles the Triton kernel ``fn`` for an H100 (sm_90) ahead of time, without a GPU (Triton bundles ptxas), so
    that what the interpreter never checks (``tl.dot`` shapes, layouts, types) fails on CPU too. ``signature`` gives
    the type of every argument that is not one of ``constexprs``; ``num_warps`` and ``enable_fp_fusion`` are the
    launch's.

    Returns:
        ``{"registers", "spill_bytes"}`` per thread, read off the cubin with the ``cuobjdump`` that triton bundles, or
        None where it bundles none.
    """
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    sig = {**signature, **dict.fromkeys(constexprs, "constexpr")}
    options = {"num_warps": num_warps, "enable_fp_fusion": enable_fp_fusion}
    compiled = triton.compile(ASTSource(fn, sig, constexprs), target=GPUTarget("cuda", 90, 32), options=options)
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    if not tool.is_file():
        return None
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([str(tool), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    fields = dict(re.findall(r"(REG|STACK|LOCAL):(\d+)", usage))
    return {"registers": int(fields["REG"]), "spill_bytes": int(fields["STACK"]) + int(fields["LOCAL"])}
