"""Triton Cauchy / Vandermonde kernels == the chunked PyTorch path == the dense matrix, outputs and every gradient.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, read when triton is imported, hence a
subprocess) on CPU tensors; the ``gpu`` tests run them compiled on CUDA at L = 1000 in float32 and bfloat16.
"""

from __future__ import annotations

import math

import pytest
import torch

from attention import backends
from attention.mixers import MatrixMixer, cauchy_mix, functional, vandermonde_mix
from engine.testing import assert_interpreted, compile_for_sm90, skip_if_interpreted

# The kernels under the Triton interpreter, their ahead-of-time compile and their dispatch follow torch and triton
pytestmark = pytest.mark.torch_compat


def _inputs(kind: str, B: int, H: int, L: int, D: int, Dv: int, device: str = "cpu", dtype=torch.float32):
    g = torch.Generator().manual_seed(L * D + Dv)
    x, y = torch.rand(B, H, L, D, generator=g), torch.rand(B, H, L, D, generator=g)
    if kind == "cauchy":
        x = x + 0.5  # a_id + b_jd >= 0.5, as CauchyMatrix guarantees
    else:
        x, y = 2 * x - 1, 2 * y - 1
    v, w = torch.randn(B, H, L, Dv, generator=g), torch.randn(B, H, L, Dv, generator=g)
    return [t.to(device=device, dtype=dtype) for t in (x, y, v, w)]


def _dense(kind: str, x, y, v, freq: float):
    """The dense ``(B, H, L, L)`` matrix through ``(B, H, L, L, D)``, in float64: the reference."""
    x, y, v = (t.double() for t in (x, y, v))
    if kind == "cauchy":
        m = (x.unsqueeze(3) + y.unsqueeze(2)).reciprocal().sum(-1)
    else:
        pos = torch.arange(x.shape[2], device=x.device, dtype=torch.float64)
        w = 2 * math.pi * freq
        m = (torch.cos(w * x.unsqueeze(3) * pos[:, None]) - torch.cos(w * y.unsqueeze(2) * pos[:, None, None])).sum(-1)
    return m @ v


def _mix(kind: str, x, y, v, freq: float, backend: str):
    if kind == "cauchy":
        return cauchy_mix(x, y, v, chunk=8, d_group=4, backend=backend)
    return vandermonde_mix(x, y, v, freq, chunk=8, backend=backend)


def _out_and_grads(fn, x, y, v, w):
    x, y, v = (t.detach().clone().requires_grad_() for t in (x, y, v))
    out = fn(x, y, v)
    return [out.detach(), *torch.autograd.grad((out * w.to(out.dtype)).sum(), (x, y, v))]


def _assert_all_close(got, ref, rtol: float, what: str) -> None:
    for name, a, b in zip(("y", "dx", "dy", "dv"), got, ref):
        b = b.to(a.dtype)
        torch.testing.assert_close(
            a, b, rtol=rtol, atol=rtol * b.abs().max().item(), msg=lambda m, n=name: f"{what} {n}: {m}"
        )


_INTERPRETED = """
import torch
from test_mixers_triton import _assert_all_close, _dense, _inputs, _mix, _out_and_grads
from attention.kernels.mixers_triton import cauchy_mix_triton, vandermonde_mix_triton

# odd L with tiles smaller than L (several tiles, masked tails), D not a power of two, Dv != D
for B, H, L, D, Dv, block in [(1, 2, 37, 10, 7, 16), (2, 1, 70, 16, 12, 32)]:
    for kind in ("cauchy", "vandermonde"):
        freq = 1.0 / L
        x, y, v, w = _inputs(kind, B, H, L, D, Dv)
        ref = _out_and_grads(lambda a, b, c: _dense(kind, a, b, c, freq), x, y, v, w)
        chunked = _out_and_grads(lambda a, b, c: _mix(kind, a, b, c, freq, "torch"), x, y, v, w)
        public = _out_and_grads(lambda a, b, c: _mix(kind, a, b, c, freq, "triton"), x, y, v, w)
        if kind == "cauchy":
            kernel = _out_and_grads(lambda a, b, c: cauchy_mix_triton(a, b, c, block, 16), x, y, v, w)
        else:
            kernel = _out_and_grads(lambda a, b, c: vandermonde_mix_triton(a, b, c, freq, block, 16), x, y, v, w)
        what = f"{{kind}} L={{L}} D={{D}} Dv={{Dv}}"
        _assert_all_close(chunked, ref, 1e-4, what + " torch vs dense")
        _assert_all_close(kernel, ref, 1e-4, what + " triton (small tiles) vs dense")
        _assert_all_close(kernel, chunked, 1e-4, what + " triton (small tiles) vs torch")
        _assert_all_close(public, chunked, 1e-4, what + " backend='triton' vs torch")
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(not functional.HAS_TRITON, reason="triton missing")
def test_triton_mixers_under_interpreter_equal_chunked_and_dense() -> None:
    """The kernels' logic on CPU through Triton's interpreter: forward and all gradients, Cauchy and Vandermonde."""
    assert_interpreted(_INTERPRETED.format(), __file__)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("kind", ["cauchy", "vandermonde"])
def test_triton_mixers_on_cuda_equal_chunked_and_dense(kind: str, dtype: torch.dtype) -> None:
    B, H, L, D, Dv = 2, 2, 1000, 24, 40
    freq = 1.0 / L
    x, y, v, w = _inputs(kind, B, H, L, D, Dv, device="cuda", dtype=dtype)
    triton_ = _out_and_grads(lambda a, b, c: _mix(kind, a, b, c, freq, "triton"), x, y, v, w)
    auto = _out_and_grads(lambda a, b, c: _mix(kind, a, b, c, freq, "auto"), x, y, v, w)
    chunked = _out_and_grads(lambda a, b, c: _mix(kind, a, b, c, freq, "torch"), x, y, v, w)
    ref = _out_and_grads(lambda a, b, c: _dense(kind, a, b, c, freq), x, y, v, w)
    assert all(t.dtype == dtype for t in triton_)
    for a, b in zip(triton_, auto):
        assert torch.equal(a, b)  # auto picked the kernel
    # both paths compute in float32 from the same (rounded) inputs: they differ by float32 summation order, plus one
    # bf16 rounding of the results
    rtol = 1e-4 if dtype == torch.float32 else 2e-2
    _assert_all_close(triton_, chunked, rtol, f"{kind} {dtype} triton vs torch")
    _assert_all_close(triton_, ref, rtol, f"{kind} {dtype} triton vs dense")


@pytest.mark.gpu
@pytest.mark.skipif(not functional.HAS_TRITON, reason="triton missing")
def test_auto_picks_triton_on_cuda_where_it_applies() -> None:
    t = torch.zeros(1, 1, 3, 16, device="cuda")
    for op in ("cauchy_mix", "vandermonde_mix"):
        assert functional._mix_backend(op, "auto", t, t) == "triton"
        assert functional._mix_backend(op, "auto", t.bfloat16(), t.bfloat16()) == "triton"
        assert functional._mix_backend(op, "auto", t.double(), t.double()) == "torch"  # the reference's float64
        big = torch.zeros(1, 1, 3, 65, device="cuda")
        assert functional._mix_backend(op, "auto", big, t) == functional._mix_backend(op, "auto", t, big) == "torch"
        assert functional._mix_backend(op, "torch", t, t) == "torch"


def test_triton_backend_on_cpu_without_interpreter_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """The device is a limit (ValueError naming it); a missing package an ImportError saying what to install."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    x, y, v, _ = _inputs("cauchy", 1, 1, 5, 4, 3)
    for kind in ("cauchy", "vandermonde"):
        with pytest.raises(ValueError, match=r"runs on cuda \(CPU tensors under TRITON_INTERPRET=1.*got a cpu tensor"):
            _mix(kind, x, y, v, 0.2, "triton")
    m = MatrixMixer(8, 2, matrix="cauchy", backend="triton")
    with pytest.raises(ValueError, match="runs on cuda"):
        m(torch.randn(1, 5, 8))
    monkeypatch.setitem(backends.INSTALLED, "triton", False)
    with pytest.raises(ImportError, match="install triton"):
        _mix("cauchy", x, y, v, 0.2, "triton")


def test_backend_choice_and_fallbacks(monkeypatch: pytest.MonkeyPatch) -> None:
    installed = functional.HAS_TRITON
    x, y, v, _ = _inputs("cauchy", 1, 2, 9, 4, 3)
    with pytest.raises(
        ValueError, match=r"unknown backend 'cuda' for cauchy_mix; choose one of \['auto', 'torch', 'triton'\]"
    ):
        cauchy_mix(x, y, v, backend="cuda")
    with pytest.raises(ValueError, match="unknown backend"):
        MatrixMixer(8, 2, matrix="vandermonde", backend="fast")
    # auto on CPU is the chunked path (even under the interpreter), with or without triton installed
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for has in (True, False):
        monkeypatch.setitem(backends.INSTALLED, "triton", has)
        assert functional._mix_backend("cauchy_mix", "auto", x, v) == "torch"
        torch.testing.assert_close(cauchy_mix(x, y, v), cauchy_mix(x, y, v, backend="torch"), rtol=0, atol=0)
    if installed:  # heads beyond the kernel's registers: "auto" falls back, an explicit "triton" says why not
        monkeypatch.delenv("TRITON_INTERPRET")  # (the kernel module imported here must stay compilable)
        monkeypatch.setattr(backends, "_triton_interpreted", lambda: True)
        monkeypatch.setitem(backends.INSTALLED, "triton", True)
        big = torch.zeros(1, 1, 3, 65)
        for kind in ("cauchy", "vandermonde"):
            with pytest.raises(ValueError, match=r"backend 'triton' of \w+_mix supports D <= 64, got D=65"):
                _mix(kind, big, big, v[:, :1, :3], 0.2, "triton")
    # the kwarg reaches the mixer's matrix, and "torch" is the chunked path
    m = MatrixMixer(8, 2, matrix="cauchy", backend="torch")
    assert m.matrix.backend == "torch"
    xin = torch.randn(1, 7, 8)
    torch.testing.assert_close(m(xin), m.forward_reference(xin), atol=1e-5, rtol=1e-5)


@pytest.mark.slow
@pytest.mark.skipif(not functional.HAS_TRITON, reason="triton missing")
def test_triton_mixer_kernels_compile_for_an_h100() -> None:
    """What the interpreter never checks (``tl.dot`` shapes, layouts, types): compile every kernel for sm_90 ahead of
    time, at the block sizes and warps of the gpu test's shapes; no GPU needed (Triton bundles ptxas)."""
    from attention.kernels import mixers_triton as mt

    skip_if_interpreted(mt._mix_fwd_kernel)
    blk = mt._blocks(1000, 24, 40, None, None)
    ptr = {"x_ptr": "*fp32", "y_ptr": "*fp32", "v_ptr": "*fp32"}
    fwd = dict(BLOCK_M=blk["fwd_m"], BLOCK_N=blk["fwd_n"])
    bwd = dict(BLOCK_M=blk["bwd_m"], BLOCK_N=blk["bwd_n"], BLOCK_D=blk["BLOCK_D"])
    kernels = [
        (mt._mix_fwd_kernel, {**ptr, "out_ptr": "*fp32"}, fwd, 4),
        (mt._mix_bwd_rows_kernel, {**ptr, "g_ptr": "*fp32", "gx_ptr": "*fp32"}, bwd, blk["bwd_warps"]),
        (
            mt._mix_bwd_cols_kernel,
            {**ptr, "g_ptr": "*fp32", "gy_ptr": "*fp32", "gv_ptr": "*fp32"},
            bwd,
            blk["bwd_warps"],
        ),
    ]
    for kind in (0, 1):
        for fn, sig, consts, num_warps in kernels:
            consts = {**consts, "KIND": kind, "BLOCK_DV": blk["BLOCK_DV"]}
            compile_for_sm90(fn, {**sig, "L": "i32", "D": "i32", "DV": "i32", "f": "fp32"}, consts, num_warps)
