"""The shared test helpers of :mod:`engine.testing` fail where they should."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest
import torch
from torch import nn

from attention import backends
from engine.testing import (
    REPO,
    assert_backends_agree,
    assert_interpreted,
    host_syncs,
    run_interpreted,
    run_python,
    run_tool,
    run_tools_batched,
    tool_env,
    tool_process,
)


class _Scaled(nn.Module):
    """A linear layer whose ``backend`` scales the output: "exact" is the reference, "off" is wrong by 1%."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 3)
        self.backend = "exact"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * (1.01 if self.backend == "off" else 1.0)


def test_assert_backends_agree_compares_outputs_and_every_gradient() -> None:
    torch.manual_seed(0)
    m = _Scaled()
    x = torch.randn(5, 4, requires_grad=True)
    assert_backends_agree(m, x, m, "backend", ("exact", "exact"), 1e-6)
    with pytest.raises(AssertionError):
        assert_backends_agree(m, x, m, "backend", ("exact", "off"), 1e-4)
    assert m.backend == "off"  # the last backend stays set


@pytest.mark.torch_compat
def test_assert_interpreted_wants_a_clean_exit_that_prints_ok(tmp_path) -> None:
    assert_interpreted("import os; assert os.environ['TRITON_INTERPRET'] == '1'; print('ok')", tmp_path / "t.py")
    with pytest.raises(AssertionError):
        assert_interpreted("print('not ok')", tmp_path / "t.py")
    with pytest.raises(AssertionError, match="boom"):
        assert_interpreted("raise SystemExit('boom')", tmp_path / "t.py")


_SHORTCUTS = """
import json

import torch
import triton
import triton.language as tl
from triton.runtime import interpreter


@triton.jit
def _lcg(x):
    return x * 1664525 + 1013904223  # wraps around in int32


@triton.jit
def _kernel(x_ptr, out_ptr, xor_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    y = _lcg(tl.load(x_ptr + offs))
    tl.store(out_ptr + offs, y - 7 * offs)
    tl.store(xor_ptr, tl.xor_sum(y, axis=0))


x = torch.arange(-64, 64, dtype=torch.int32) * 40503
out, xor = torch.empty_like(x), torch.empty(1, dtype=torch.int32)
_kernel[(1,)](x, out, xor, N=128)
options = interpreter.interpreter_builder.options
print(json.dumps([out.tolist(), xor.item(), options.sanitize_overflow]))
"""


@pytest.mark.torch_compat
@pytest.mark.skipif(not backends.HAS_TRITON, reason="triton missing")
def test_interpreter_shortcuts_leave_every_bit_as_it_was(tmp_path) -> None:
    """run_interpreted's three shortcuts (a jit helper's builtins listed once, XOR reduced by NumPy, no int32 overflow
    check that debug-off drops anyway) against the plain interpreter and against NumPy's int32 arithmetic."""
    import json

    import numpy as np

    plain = subprocess.run([sys.executable, "-c", _SHORTCUTS], env={**os.environ, "TRITON_INTERPRET": "1",
                           "PYTHONPATH": str(REPO)}, capture_output=True, text=True, timeout=300)  # fmt: skip
    fast = run_interpreted(_SHORTCUTS, tmp_path, timeout=300)
    assert plain.returncode == 0 and fast.returncode == 0, plain.stderr[-3000:] + fast.stderr[-3000:]
    (out, xor, sanitized), (fast_out, fast_xor, fast_sanitized) = (json.loads(p.stdout) for p in (plain, fast))
    assert (fast_out, fast_xor) == (out, xor)
    assert sanitized and not fast_sanitized  # the overflow check is what the shortcut switched off
    with np.errstate(over="ignore"):
        y = np.arange(-64, 64, dtype=np.int32) * np.int32(40503) * np.int32(1664525) + np.int32(1013904223)
    assert out == (y - 7 * np.arange(128, dtype=np.int32)).tolist()
    assert xor == int(np.bitwise_xor.reduce(y))


@pytest.mark.torch_compat
def test_host_syncs_counts_only_sync_ops_where_they_were_called() -> None:
    x = torch.randn(4)
    found = host_syncs(lambda: (x * 2).sum().item())
    assert list(found.values()) == [1]
    (where,) = found
    assert where.startswith("_local_scalar_dense at tests/engine/test_testing.py:")


def test_batched_tools_behave_as_their_own_processes() -> None:
    """Each call of the batched runner gets its own argv, exit status, stdout and stderr, as ``python tools/x.py``
    would: a help text, an argparse error (2) and an error the script raises after parsing, in that order."""
    calls = [("run_ablation", ["--help"]), ("run_ablation", ["--table", "nope"]),
             ("run_ablation", ["--table", "modelnet", "--plan", "--seeds", "0"])]  # fmt: skip
    got = run_tools_batched(calls)
    assert [d.returncode for d in got] == [0, 2, 2]
    assert got[0].stdout.startswith("usage: run_ablation.py") and not got[0].stderr
    assert "invalid choice: 'nope'" in got[1].stderr and not got[1].stdout
    assert "--seeds N >= 1" in got[2].stderr
    alone = run_tool("run_ablation", ["--help"])
    assert (alone.returncode, alone.stdout) == (0, got[0].stdout)


_PROBE = """
import os, signal, sys, time
sockets = []
for fd in os.listdir("/proc/self/fd"):
    try:
        sockets += [fd] if os.readlink(f"/proc/self/fd/{fd}").startswith("socket:") else []
    except FileNotFoundError:  # the listing's own descriptor
        pass
print(os.getcwd(), os.environ.get("PROBE"), sys.argv[1:], sys.path[0], sockets, "torch" in sys.modules)
sys.stderr.write("to stderr\\n")
what = sys.argv[1]
if what == "sleep":
    print("ready", flush=True)
    time.sleep(60)
if what == "interrupt":
    raise KeyboardInterrupt
if what == "raise":
    raise ValueError("boom")
sys.exit(int(what))
"""


@pytest.mark.parametrize("fork", [True, False], ids=["forked", "fresh interpreter"])
def test_tool_processes_behave_as_python_script_does(tmp_path, monkeypatch, fork: bool) -> None:
    """A process from the fork server and one from ``python script`` give the same argv, folder, environment, pipes,
    exit status (an exit code, an exception, a KeyboardInterrupt, a signal) and timeouts; the server's sockets are not
    left open in the child, and only the third-party packages it preloads are imported before the script runs."""
    monkeypatch.setenv("CENTROID_TEST_FORK", "1" if fork else "0")
    script = tmp_path / "probe.py"
    script.write_text(_PROBE)
    env = {**tool_env(), "DISPLAY": ":99", "PROBE": "x"}  # PROBE: a server of its own; DISPLAY: the same server
    done = run_python([str(script), "3"], env=env, cwd=tmp_path)
    assert done.stdout.split("\n")[0] == f"{tmp_path} x ['3'] {tmp_path} [] {fork}"
    assert (done.returncode, done.stderr) == (3, "to stderr\n")
    failed = run_python([str(script), "raise"])
    assert (
        failed.returncode == 1 and failed.stderr.rstrip().endswith("ValueError: boom") and "Traceback" in failed.stderr
    )
    interrupted = run_python([str(script), "interrupt"])
    assert interrupted.returncode == -signal.SIGINT and interrupted.stderr.rstrip().endswith("KeyboardInterrupt")
    proc = tool_process([str(script), "sleep"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().endswith("\n") and proc.stdout.readline() == "ready\n"
    assert proc.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        proc.wait(timeout=0.2)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == -signal.SIGTERM
    with pytest.raises(subprocess.TimeoutExpired):
        run_python([str(script), "sleep"], timeout=0.5)


def test_a_forked_tool_prints_what_a_fresh_one_does(monkeypatch) -> None:
    forked = run_tool("run_ablation", ["--table", "modelnet", "--plan", "--seeds", "0"])
    monkeypatch.setenv("CENTROID_TEST_FORK", "0")
    fresh = run_tool("run_ablation", ["--table", "modelnet", "--plan", "--seeds", "0"])
    assert (forked.returncode, forked.stdout, forked.stderr) == (fresh.returncode, fresh.stdout, fresh.stderr)
    assert forked.returncode == 2 and "--seeds N >= 1" in forked.stderr


def test_one_fork_server_per_environment_and_the_lazy_variables_share_one(monkeypatch) -> None:
    """Calls whose environments differ only in what the preloaded packages never read (a display, the terminal's width)
    share a server; any other difference gets a server started with that environment, so nothing imported under
    another environment reaches the tool."""
    monkeypatch.setenv("CENTROID_TEST_FORK", "1")
    parent = [sys.executable, "-c", "import os; print(os.getppid())"][1:]

    def server(**extra: str) -> str:
        return run_python(parent, env={**tool_env(), **extra}).stdout

    assert server() == server(COLUMNS="80", DISPLAY=":1") != server(TORCH_LOGS="+dynamo")
    assert server() != str(os.getpid()) + "\n"  # forked by a server, not started by this process
