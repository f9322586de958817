"""Hydra's scan by the chunked SSD Triton kernels == the chunked PyTorch scan == the dense matrix, outputs and every
gradient (both SSMs' C, B and log decays, the values, the diagonal); and Mamba-2's kernels wired as Hydra calls them.

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess) on CPU tensors; a
``slow`` test compiles them for sm_90 ahead of time; the ``gpu`` tests run them compiled on CUDA.
"""

from __future__ import annotations

import dataclasses
import sys
import types

import pytest
import torch

from attention import backends
from attention.mixers import MatrixMixer, QuasiseparableMatrix, apply_matrix, hydra_factors, quasiseparable_mix
from engine.testing import assert_backends_agree, assert_interpreted, compile_for_sm90, skip_if_interpreted

# The kernels under the Triton interpreter, their ahead-of-time compile and their dispatch follow torch and triton
pytestmark = pytest.mark.torch_compat

_NAMES = ("y", "dc_fwd", "db_fwd", "dc_bwd", "db_bwd", "dv", "dlog_fwd", "dlog_bwd", "ddiag")


def _inputs(B: int, H: int, L: int, N: int, Dv: int, seed: int, device: str = "cpu", dtype=torch.float32):
    """The factors of :func:`quasiseparable_mix` (decays between exp(-1) and 1 per step) and the output weights."""
    g = torch.Generator().manual_seed(seed)
    cb = [torch.randn(B, H, L, N, generator=g) for _ in range(4)]
    v = torch.randn(B, H, L, Dv, generator=g)
    logs = [-torch.rand(B, H, L, generator=g) for _ in range(2)]
    diag, w = torch.randn(B, H, L, generator=g), torch.randn(B, H, L, Dv, generator=g)
    return [t.to(device, dtype) for t in (*cb, v, *logs, diag)], w.to(device)


def _out_and_grads(fn, ins, w):
    ins = [t.detach().clone().requires_grad_() for t in ins]
    out = fn(*ins)
    return [out.detach(), *torch.autograd.grad((out.float() * w).sum(), ins)]


def _reference(ins, w):
    """The chunked PyTorch scan in float64 from the same (rounded) inputs."""
    return _out_and_grads(lambda *a: quasiseparable_mix(*a, chunk=8, backend="torch"), [t.double() for t in ins],
                          w.double())  # fmt: skip


def _assert_all_close(got, ref, rtol: float, what: str) -> None:
    for name, a, b in zip(_NAMES, got, ref):
        a, b = a.double(), b.double()
        atol = rtol * b.abs().max().item()
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{what} {n}: {m}")


def _dense(ins):
    """``M v`` through the dense ``(L, L)`` matrix built entry by entry from the factors (float64)."""
    c_f, b_f, c_b, b_b, v, log_f, log_b, diag = (t.double() for t in ins)
    L = v.shape[2]
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    s_f, s_b = log_f.cumsum(-1), log_b.cumsum(-1)  # s_t = sum_{u <= t} log a_u
    pad = torch.nn.functional.pad
    c_prev, s_prev = pad(c_f, (0, 0, 1, 0))[:, :, :L], pad(s_f, (1, 0))[..., :L]  # row i: C_{i-1}, s_{i-1}
    lower = (s_prev[..., :, None] - s_f[..., None, :]).masked_fill(i <= j, -torch.inf).exp()
    c_next, sb_prev = pad(c_b, (0, 0, 0, 1))[:, :, 1:], pad(s_b, (1, 0))[..., :L]  # row i: C'_{i+1}; s'_{j-1}
    upper = (sb_prev[..., None, :] - s_b[..., :, None]).masked_fill(i >= j, -torch.inf).exp()
    m = (c_prev @ b_f.transpose(-1, -2)) * lower + (c_next @ b_b.transpose(-1, -2)) * upper + torch.diag_embed(diag)
    return m @ v


_INTERPRETED = """
import torch
from test_ssd_triton import _assert_all_close, _dense, _inputs, _out_and_grads, _reference
from attention.kernels.ssd_triton import quasiseparable_mix_triton
from attention.mixers import MatrixMixer, quasiseparable_mix
from engine.testing import assert_backends_agree

# odd L over several chunks (T = 16, 32) with a partial last one, N and Dv not powers of two, B > 1 and H > 1
for B, H, L, N, Dv, chunk in [(2, 2, 37, 5, 7, 16), (2, 3, 129, 16, 12, None), (1, 2, 70, 24, 40, 32)]:
    for dtype, rtol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        ins, w = _inputs(B, H, L, N, Dv, seed=L, dtype=dtype)
        what = f"L={L} N={N} Dv={Dv} T={chunk} {dtype}"
        ref = _reference(ins, w)
        if dtype == torch.float32:
            torch.testing.assert_close(ref[0], _dense(ins))
            kernel = _out_and_grads(lambda *a: quasiseparable_mix_triton(*a, chunk=chunk), ins, w)
            _assert_all_close(kernel, ref, rtol, what + " triton vs torch")
        public = _out_and_grads(lambda *a: quasiseparable_mix(*a, backend="triton"), ins, w)
        assert all(t.dtype == dtype for t in public)
        _assert_all_close(public, ref, rtol, what + " backend='triton' vs torch")

# the mixers with the kernels == with the chunked scan: every parameter's gradient, both matrices and the static twin
for matrix, static in (("hydra", False), ("quasiseparable", False), ("hydra", True)):
    torch.manual_seed(0)
    m = MatrixMixer(24, 3, matrix=matrix, data_dependent=not static, max_len=45, chunk_size=8, backend="torch")
    with torch.no_grad():  # larger steps and A than at init, so that the decays matter
        (m.gate_param if static else m.gate_bias).add_(torch.randn_like(m.gate_param if static else m.gate_bias))
        m.matrix.A_log.normal_()
    assert_backends_agree(m, torch.randn(2, 45, 24, requires_grad=True), m.matrix, "backend", ("torch", "triton"), 1e-4)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(not backends.HAS_TRITON, reason="triton missing")
def test_ssd_triton_under_interpreter_equals_chunked_scan_and_dense() -> None:
    """The kernels' logic on CPU through Triton's interpreter: forward and every gradient, the Hydra mixers."""
    assert_interpreted(_INTERPRETED, __file__)


@pytest.mark.slow
@pytest.mark.skipif(not backends.HAS_TRITON, reason="triton missing")
def test_ssd_triton_kernels_compile_for_an_h100() -> None:
    """What the interpreter never checks (``tl.dot`` shapes, layouts, types): every kernel compiles for sm_90 at the
    default tiles of the largest supported state and head (N = Dv = 64) and of small ones, without register spills."""
    import triton

    from attention.kernels import ssd_triton as st

    skip_if_interpreted(st._chunk_out_kernel)
    f = "*fp32"
    dims = {"BH": "i32", "L": "i32", "N": "i32", "DV": "i32", "NC": "i32"}
    for N, Dv in ((64, 64), (16, 40)):
        blk = st.scan_blocks(1000, N, Dv)
        tiles = {k: blk[k] for k in ("BLOCK_T", "BLOCK_N", "BLOCK_DV")}
        kernels = [
            *((st._chunk_state_kernel, {"x_ptr": f, "y_ptr": f, "la_ptr": f, "s_ptr": f, "tot_ptr": f, **dims},
               {"BACKWARD": bwd, **tiles}) for bwd in (False, True)),
            *((st._state_pass_kernel, {"s_ptr": f, "tot_ptr": f, "NDV": "i32", "NC": "i32"},
               {"BACKWARD": bwd, "BLOCK": min(1024, triton.next_power_of_2(N * Dv))}) for bwd in (False, True)),
            (st._chunk_out_kernel, {"q_ptr": f, "k_ptr": f, "v_ptr": f, "la_ptr": f, "h_ptr": f, "z_ptr": f, **dims},
             tiles),
            (st._chunk_grad_kernel, {"q_ptr": f, "k_ptr": f, "v_ptr": f, "dy_ptr": f, "la_ptr": f, "h_ptr": f,
                                     "g_ptr": f, "dq_ptr": f, "dk_ptr": f, "dv_ptr": f, **dims}, tiles),
        ]  # fmt: skip
        for fn, sig, consts in kernels:
            usage = compile_for_sm90(fn, sig, consts, blk["num_warps"])
            assert usage is None or usage["spill_bytes"] == 0, (fn.__name__, N, Dv, usage)


def test_triton_scan_on_cpu_without_interpreter_says_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    ins, _ = _inputs(1, 1, 5, 4, 3, seed=0)
    with pytest.raises(ValueError, match=r"runs on cuda \(CPU tensors under TRITON_INTERPRET=1.*got a cpu tensor"):
        quasiseparable_mix(*ins, backend="triton")
    m = MatrixMixer(8, 2, matrix="hydra", backend="triton")
    with pytest.raises(ValueError, match="runs on cuda"):
        m(torch.randn(1, 5, 8))
    with pytest.raises(ValueError, match=r"unknown backend 'fast'; choose one of \['auto', 'torch', 'triton', 'mamba'"):
        QuasiseparableMatrix(8, backend="fast")
    monkeypatch.setattr(backends, "_triton_interpreted", lambda: True)
    big, _ = _inputs(1, 1, 5, 65, 3, seed=0)
    with pytest.raises(ValueError, match=r"backend 'triton' of quasiseparable_mix supports N <= 64, got N=65"):
        quasiseparable_mix(*big, backend="triton")
    monkeypatch.setitem(backends.INSTALLED, "triton", False)
    with pytest.raises(ImportError, match="install triton"):
        quasiseparable_mix(*ins, backend="triton")


def _mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size):
    """Mamba-2's recurrence one step at a time (its ``mamba_chunk_scan_combined``'s contract, one group per head):
    ``h_t = exp(A dt_t) h_{t-1} + dt_t B_t x_t^T``, ``y_t = C_t h_t``; x ``(b, l, h, p)``, dt ``(b, l, h)``."""
    h = x.new_zeros(x.shape[0], x.shape[2], B.shape[-1], x.shape[3])  # (b, h, n, p)
    ys = []
    for t in range(x.shape[1]):
        h = torch.exp(A * dt[:, t])[..., None, None] * h + (dt[:, t, :, None] * B[:, t])[..., None] * x[:, t, :, None]
        ys.append((C[:, t, :, None, :] @ h).squeeze(-2))
    return torch.stack(ys, dim=1)


def test_mamba_backend_calls_mamba2_as_hydra_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """``backend="mamba"`` hands Mamba-2's scan the forward and flipped backward streams (Hydra's own call) and
    shifts, flips and adds the diagonal: a stand-in with Mamba-2's contract gives the chunked scan's outputs and
    gradients. The factored op cannot take it (Mamba-2 needs dt and A apart), and without the package it says what to
    install."""
    with pytest.raises(ImportError, match="mamba-ssm"):
        monkeypatch.setitem(backends.INSTALLED, "mamba_ssm", False)
        MatrixMixer(12, 2, matrix="hydra", backend="mamba").float()(torch.randn(1, 5, 12))
    for name in ("mamba_ssm", "mamba_ssm.ops", "mamba_ssm.ops.triton", "mamba_ssm.ops.triton.ssd_combined"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    sys.modules["mamba_ssm.ops.triton.ssd_combined"].mamba_chunk_scan_combined = _mamba_chunk_scan_combined
    monkeypatch.setitem(backends.INSTALLED, "mamba_ssm", True)
    entry = backends.BACKENDS["quasiseparable_mix"]["mamba"]
    monkeypatch.setitem(backends.BACKENDS["quasiseparable_mix"], "mamba", dataclasses.replace(entry, devices=("cpu",)))
    for matrix in ("hydra", "quasiseparable"):
        torch.manual_seed(0)
        m = MatrixMixer(12, 2, matrix=matrix, chunk_size=4)
        with torch.no_grad():
            m.gate_bias.add_(torch.randn_like(m.gate_bias))
            m.matrix.A_log.normal_()
        x = torch.randn(2, 11, 12, requires_grad=True)
        assert_backends_agree(m, x, m.matrix, "backend", ("torch", "mamba"), 1e-5)
    with pytest.raises(ValueError, match="takes float32, bfloat16 or float16 tensors, got float64"):
        m.double()(x.double())
    ins, _ = _inputs(1, 1, 5, 4, 3, seed=0)
    with pytest.raises(ValueError, match="takes Hydra's dt and A apart: use hydra_mix"):
        quasiseparable_mix(*ins, backend="mamba")


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ssd_triton_on_cuda_equals_chunked_scan(dtype: torch.dtype) -> None:
    ins, w = _inputs(2, 4, 1000, 64, 64, seed=1, device="cuda", dtype=dtype)
    kernel = _out_and_grads(lambda *a: quasiseparable_mix(*a, backend="triton"), ins, w)
    auto = _out_and_grads(lambda *a: quasiseparable_mix(*a, backend="auto"), ins, w)
    for a, b in zip(kernel, auto):
        assert torch.equal(a, b)  # auto took the kernels (which have no atomics: deterministic)
    rtol = 1e-4 if dtype == torch.float32 else 2e-2
    _assert_all_close(kernel, _reference(ins, w), rtol, f"cuda {dtype} triton vs torch")


@pytest.mark.gpu
def test_hydra_layer_on_cuda_takes_the_kernels_and_equals_the_dense_matrix() -> None:
    torch.manual_seed(0)
    m = MatrixMixer(256, 4, matrix="hydra").cuda()
    x = torch.randn(2, 777, 256, device="cuda")
    q, k, v, g = m.inputs(x)
    factors = hydra_factors(q, k, g, m.matrix.A_log, m.matrix.state_dim)
    ref = apply_matrix(m.materialize(x).double(), v.double())
    out = quasiseparable_mix(*factors[:4], v, *factors[4:], backend="auto")
    torch.testing.assert_close(out.double(), ref, rtol=1e-4, atol=1e-4 * ref.abs().max().item())
