"""The fused FSAT edge-attention kernels == the dense reference, outputs and every gradient (q, k, v, confidences).

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, in a subprocess) on CPU tensors; a
``slow`` test compiles them for sm_90 ahead of time; the ``gpu`` tests run them compiled on CUDA.
"""

from __future__ import annotations

import itertools

import pytest
import torch

from attention import backends
from attention.mixers import FourierSparseAttention, sparse_edge_attention, sparse_edge_attention_reference
from engine.testing import assert_backends_agree, assert_interpreted, compile_for_sm90, skip_if_interpreted

# The kernels under the Triton interpreter, their ahead-of-time compile and their dispatch follow torch and triton
pytestmark = pytest.mark.torch_compat


def _inputs(B: int, H: int, L: int, D: int, E: int, seed: int, device: str = "cpu", dtype=torch.float32):
    """q, k, v, idx, conf, the output weights: absent edges (-1), duplicates, an unreached query and, in batch 1,
    one query that every key's first edge points to (the longest edge list a program walks)."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, L, (B, H, L, E), generator=g)
    idx[..., 0] = idx[..., 1]  # duplicate edges
    idx[0, 0] = torch.where(idx[0, 0] == 0, torch.ones_like(idx[0, 0]), idx[0, 0])  # query 0 of (0, 0) unreached
    if B > 1:
        idx[1, :, :, 0] = L // 2
    conf = torch.rand(B, H, L, E, generator=g) + 0.1
    q, k, v, w = (torch.randn(B, H, L, D, generator=g) for _ in range(4))
    return [*(t.to(device, dtype) for t in (q, k, v)), idx.to(device), conf.to(device), w.to(device)]


def _out_and_grads(fn, q, k, v, idx, conf, w):
    q, k, v, conf = (t.detach().clone().requires_grad_() for t in (q, k, v, conf))
    out = fn(q, k, v, idx, conf)
    return [out.detach(), *torch.autograd.grad((out.float() * w).sum(), (q, k, v, conf))]


def _reference(q, k, v, idx, conf, w):
    """The dense masked reference in float64, from the same (rounded) inputs."""
    ins = [t.double() for t in (q, k, v)]
    return _out_and_grads(lambda a, b, c, i, s: sparse_edge_attention_reference(a, b, c, i, s), *ins, idx,
                          conf.double(), w.double())  # fmt: skip


def _assert_all_close(got, ref, rtol: float, what: str) -> None:
    for name, a, b in zip(("out", "dq", "dk", "dv", "dconf"), got, ref):
        a, b = a.double(), b.double()
        atol = rtol * b.abs().max().item()
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=lambda m, n=name: f"{what} {n}: {m}")


_INTERPRETED = """
import torch
from test_fsat_triton import _assert_all_close, _inputs, _out_and_grads, _reference
from attention.kernels.fsat_triton import sparse_edge_attention_triton
from attention.mixers import FourierSparseAttention, sparse_edge_attention
from engine.testing import assert_backends_agree

# odd L, D not a power of two, several programs (small blocks) and the default ones, B > 1 and H > 1; E = 12: two
# steps of edge slots per key (the second part-masked), and a query of in-degree >= L (many steps of its edges)
for B, H, L, D, E, block in [(2, 3, 37, 10, 6, 8), (2, 2, 129, 16, 8, None), (2, 1, 19, 8, 12, 2)]:
    for dtype, rtol in ((torch.float32, 1e-4), (torch.bfloat16, 2e-2)):
        q, k, v, idx, conf, w = _inputs(B, H, L, D, E, seed=L, dtype=dtype)
        what = f"L={L} D={D} E={E} {dtype}"
        ref = _reference(q, k, v, idx, conf, w)
        kernel = _out_and_grads(lambda *a: sparse_edge_attention_triton(*a, block=block), q, k, v, idx, conf, w)
        assert kernel[0].dtype == dtype and kernel[1].dtype == dtype and kernel[4].dtype == torch.float32
        _assert_all_close(kernel, ref, rtol, what + " triton vs dense")
        public = _out_and_grads(lambda *a: sparse_edge_attention(*a, backend="triton"), q, k, v, idx, conf, w)
        _assert_all_close(public, ref, rtol, what + " backend='triton' vs dense")
        rows = ((torch.arange(B * H) * L).view(B, H, 1, 1) + idx)[idx >= 0]  # the flat query row of every edge
        reached = torch.zeros(B * H * L, dtype=torch.bool).index_fill(0, rows, True).view(B, H, L)
        assert not reached[0, 0, 0] and (kernel[0][~reached] == 0).all()  # documented: unreached queries get 0
    # the confidences' gradient truncated to (-inf, 0] in the kernel, and only that gradient
    q, k, v, idx, conf, w = _inputs(B, H, L, D, E, seed=L)
    ref = _reference(q, k, v, idx, conf, w)
    ref[4] = ref[4].clamp(max=0.0)
    trunc = _out_and_grads(lambda *a: sparse_edge_attention_triton(*a, True, block), q, k, v, idx, conf, w)
    _assert_all_close(trunc, ref, 1e-4, f"L={L} truncated")
    assert (trunc[4] <= 0).all() and (trunc[4] < 0).any()

# q, k, v read in place as the layer's views (heads split off its projections, k and v interleaved in one tensor;
# a value tensor without a contiguous last dimension is copied), the output and every gradient laid out as (B, L, H, D)
B, H, L, D, E = 2, 3, 37, 10, 6
q, k, v, idx, conf, w = _inputs(B, H, L, D, E, seed=4)
ref = _reference(q, k, v, idx, conf, w)
q_blhd = q.transpose(1, 2).contiguous().requires_grad_()
kv = torch.stack([k, v], 2).transpose(1, 3).contiguous().requires_grad_()  # (B, L, 2, H, D), as FSAT's kv(c)
ks, vs = (t.transpose(1, 2) for t in kv.unbind(2))
assert ks.stride() == (L * 2 * H * D, D, 2 * H * D, 1)
out = sparse_edge_attention_triton(q_blhd.transpose(1, 2), ks, vs, idx, conf, block=8)
dout = torch.autograd.grad(out, (q_blhd, kv), w.to(out.dtype), retain_graph=True)
got = [out.detach(), dout[0].transpose(1, 2), *(t.transpose(1, 2) for t in dout[1].unbind(2))]
_assert_all_close(got, ref[:4], 1e-4, "strided inputs")
qv = q.detach().requires_grad_()
out = sparse_edge_attention_triton(qv, k, v.transpose(-1, -2).contiguous().transpose(-1, -2), idx, conf)
(dq,) = torch.autograd.grad(out, qv, w)  # the gradient as the kernel wrote it
assert out.transpose(1, 2).is_contiguous() and dq.transpose(1, 2).is_contiguous()
_assert_all_close([out.detach(), dq], ref[:2], 1e-4, "strided values")

# the FSAT layer with the kernel == with the CSR products, training mode (random edges), every parameter's gradient
torch.manual_seed(0)
m = FourierSparseAttention(24, num_heads=3, max_len=41, num_edges=2, edge_backend="csr")
x = torch.randn(2, 41, 24, requires_grad=True)
assert_backends_agree(m, x, m, "edge_backend", ("csr", "triton"), 1e-4, seed=5)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(not backends.HAS_TRITON, reason="triton missing")
def test_fsat_triton_under_interpreter_equals_dense_reference() -> None:
    """The kernels' logic on CPU through Triton's interpreter: forward, every gradient, the truncation, the layer."""
    assert_interpreted(_INTERPRETED, __file__)


@pytest.mark.slow
@pytest.mark.skipif(not backends.HAS_TRITON, reason="triton missing")
def test_fsat_triton_kernels_compile_for_an_h100() -> None:
    """What the interpreter never checks: both kernels compile for sm_90 at the default tiles of D = 64 and 128 with
    E = 4 and 8 edges a key (FSAT's default in inference and in training), in float32 and bf16, and fit the registers
    (no spills, read off the cubin)."""
    from attention.kernels import fsat_triton as ft

    skip_if_interpreted(ft._edge_fwd_kernel)
    for D, E in itertools.product((64, 128), (4, 8)):
        for t in ("fp32", "bf16"):
            blk = ft.edge_blocks(D, E)
            rows = {"q_ptr": f"*{t}", "k_ptr": f"*{t}", "v_ptr": f"*{t}"}
            sizes = {"N": "i32", "H": "i32", "L": "i32", "D": "i32", "E": "i32"}
            fwd_strides = {f"s{t}{d}": "i32" for t in "qkvo" for d in "bhl"}
            bwd_strides = {f"s{t}{d}": "i32" for t in "qkvged" for d in "bhl"}
            fwd = {**rows, "conf_ptr": "*fp32", "crow_ptr": "*i32", "order_ptr": "*i64", "out_ptr": f"*{t}",
                   "lse_ptr": "*fp32", **sizes, **fwd_strides, "qk_scale": "fp32"}  # fmt: skip
            bwd = {**rows, "idx_ptr": "*i64", "conf_ptr": "*fp32", "do_ptr": f"*{t}", "lse_ptr": "*fp32",
                   "delta_ptr": "*fp32", "dq_ptr": "*fp32", "dk_ptr": f"*{t}", "dv_ptr": f"*{t}", "dconf_ptr": "*fp32",
                   **sizes, **bwd_strides, "qk_scale": "fp32", "sm_scale": "fp32"}  # fmt: skip
            tiles = {"BLOCK_E": blk["BLOCK_E"], "BLOCK_D": blk["BLOCK_D"]}
            for fn, sig, consts in (
                (ft._edge_fwd_kernel, fwd, {"BLOCK_Q": blk["BLOCK_Q"], **tiles}),
                (ft._edge_bwd_kernel, bwd, {"TRUNCATE": True, "BLOCK_K": blk["BLOCK_K"], **tiles}),
            ):
                usage = compile_for_sm90(fn, sig, consts, blk["num_warps"])
                assert usage is None or usage["spill_bytes"] == 0, (fn.__name__, D, E, t, usage)


def test_triton_edges_on_cpu_without_interpreter_say_what_to_do(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    q, k, v, idx, conf, _ = _inputs(1, 1, 5, 4, 2, seed=0)
    with pytest.raises(ValueError, match=r"runs on cuda \(CPU tensors under TRITON_INTERPRET=1.*got a cpu tensor"):
        sparse_edge_attention(q, k, v, idx, conf, backend="triton")
    m = FourierSparseAttention(8, num_heads=2, max_len=5, edge_backend="triton")
    with pytest.raises(ValueError, match="runs on cuda"):
        m(torch.randn(1, 5, 8))
    monkeypatch.setattr(backends, "_triton_interpreted", lambda: True)
    big = torch.zeros(1, 1, 5, 129)
    with pytest.raises(ValueError, match=r"backend 'triton' of fsat_edges supports D <= 128, got D=129"):
        sparse_edge_attention(big, big, big, idx, conf, backend="triton")
    monkeypatch.setitem(backends.INSTALLED, "triton", False)
    with pytest.raises(ImportError, match="install triton"):
        sparse_edge_attention(q, k, v, idx, conf, backend="triton")


@pytest.mark.skipif(not backends.HAS_TRITON, reason="triton missing")
def test_fsat_operators_refuse_rows_they_cannot_read_in_place() -> None:
    """The operators read rows through strides: a strided last dimension is an error naming the layout (the autograd
    Function copies such a tensor first)."""
    from attention.kernels.fsat_triton import group_edges_by_query

    q, k, v, idx, conf, _ = _inputs(1, 2, 5, 4, 2, seed=0)
    crow, order = group_edges_by_query(idx)
    bad = v.transpose(-1, -2).contiguous().transpose(-1, -2)
    with pytest.raises(ValueError, match=r"contiguous last dimension and int32 offsets, got a \(1, 2, 5, 4\) tensor"):
        torch.ops.attention.fsat_edges_fwd(q, k, bad, conf.reshape(-1), crow, order, None)


def test_fsat_kernel_is_not_taken_under_deterministic_algorithms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The queries' gradients are float32 atomic sums in no fixed order: with deterministic algorithms on, "auto"
    takes gather and an explicit request says why."""
    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    shape = {"D": 64, "E": 8}
    assert backends.resolve("fsat_edges", "auto", "cuda", shape, torch.float32) == "triton"
    monkeypatch.setattr(torch, "are_deterministic_algorithms_enabled", lambda: True)
    assert backends.resolve("fsat_edges", "auto", "cuda", shape, torch.float32) == "gather"
    with pytest.raises(ValueError, match=r"float32 atomics .*use_deterministic_algorithms\(True\)"):
        backends.resolve("fsat_edges", "triton", "cuda", shape, torch.float32)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fsat_triton_on_cuda_equals_dense_reference(dtype: torch.dtype) -> None:
    B, H, L, D, E = 2, 4, 1000, 64, 8
    q, k, v, idx, conf, w = _inputs(B, H, L, D, E, seed=1, device="cuda", dtype=dtype)
    kernel = _out_and_grads(lambda *a: sparse_edge_attention(*a, backend="triton"), q, k, v, idx, conf, w)
    auto = _out_and_grads(lambda *a: sparse_edge_attention(*a, backend="auto"), q, k, v, idx, conf, w)
    assert torch.equal(kernel[0], auto[0])  # auto took the kernel (the forward is deterministic)
    for a, b in zip(kernel[2:], auto[2:]):  # dk, dv, dconf are deterministic too; dq sums by atomic adds
        assert torch.equal(a, b)
    rtol = 1e-4 if dtype == torch.float32 else 2e-2
    _assert_all_close(kernel, _reference(q, k, v, idx, conf, w), rtol, f"cuda {dtype} triton vs dense")


@pytest.mark.gpu
def test_fsat_layer_on_cuda_takes_the_kernel_and_equals_gather() -> None:
    torch.manual_seed(0)
    m = FourierSparseAttention(256, num_heads=4, max_len=777, edge_backend="gather").cuda()
    x = torch.randn(2, 777, 256, device="cuda", requires_grad=True)
    assert_backends_agree(m, x, m, "edge_backend", ("gather", "auto"), 1e-4, seed=5)
