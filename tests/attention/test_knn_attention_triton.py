"""The fused Triton KNN attention == the gather reference, output and every gradient (q, k, v).

Without a GPU the kernels run in Triton's interpreter (``TRITON_INTERPRET=1``, read when triton is imported, hence a
subprocess) on CPU tensors; the ``gpu`` tests run them compiled on CUDA, and a ``slow`` test compiles them for sm_90
ahead of time (what the interpreter never checks: types, layouts, register use).
"""

from __future__ import annotations

from functools import partial

import pytest
import torch

from attention import CentroidAttention, backends, centroid_attention
from engine.testing import assert_interpreted, compile_for_sm90, skip_if_interpreted

# The kernels under the Triton interpreter, their ahead-of-time compile and their dispatch follow torch and triton
pytestmark = pytest.mark.torch_compat

HAS_TRITON = backends.HAS_TRITON


def _inputs(B: int, H: int, M: int, N: int, K: int, D: int, masked: bool, device: str = "cpu", seed: int = 0):
    """q, k, v, idx (a repeated neighbour in one row, the same neighbour in every row of another), mask (with one
    centroid whose neighbours are all padded when ``masked``) and the output's upstream gradient."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, H, n, D, generator=g) for n in (M, N, N))
    idx = torch.randint(0, N, (B, M, K), generator=g)
    idx[0, 0, 1] = idx[0, 0, 0]  # the reference counts a repeated neighbour twice
    idx[-1, -1] = idx[-1, -1, 0]  # and one centroid's K neighbours are one input, K times
    mask = None
    if masked:
        mask = torch.rand(B, N, generator=g) > 0.3
        mask[0, :3] = False
        idx[0, 1, :] = torch.arange(K) % 3  # all of centroid 1's neighbours are padded: the reference's NaN row
    w = torch.randn(B, H, M, D, generator=g)
    return [t.to(device) for t in (q, k, v, idx)], None if mask is None else mask.to(device), w.to(device)


def _out_and_grads(fn, q, k, v, w, dtype: torch.dtype):
    """Output and the gradients of ``sum(out * w)`` with respect to q, k, v, all as float32."""
    q, k, v = (t.to(dtype).detach().clone().requires_grad_() for t in (q, k, v))
    out = fn(q, k, v)
    grads = torch.autograd.grad((out.float() * w).sum(), (q, k, v))
    return [t.detach().float() for t in (out, *grads)]


def _reference(q, k, v, idx, mask, w, dtype: torch.dtype = torch.float64):
    """The plain gather-everything path (``reference=True``), in float64 unless told."""
    fn = lambda a, b, c: centroid_attention(a, b, c, idx, mask=mask, reference=True)  # noqa: E731
    return _out_and_grads(fn, q, k, v, w, dtype)


def _assert_close(got, ref, what: str, rtol: float = 1e-5, errors=None) -> None:
    """Equal within ``rtol`` of each tensor's largest value (at least 1; NaN where the reference has NaN); with
    ``errors`` (the low-precision reference's own errors) within twice those instead."""
    for i, (name, a, b) in enumerate(zip(("out", "dq", "dk", "dv"), got, ref)):
        assert torch.equal(a.isnan(), b.isnan()), f"{what} {name}: NaN where the reference has none, or vice versa"
        a, b = a.nan_to_num(), b.nan_to_num()
        err = (a - b).abs().max().item()
        scale = max(b.abs().max().item(), 1.0)  # (a gradient that is all zeros in exact arithmetic: rounding)
        bound = rtol * scale if errors is None else 2 * errors[i] + 1e-3 * scale
        assert err <= bound, f"{what} {name}: max error {err:.3g} > {bound:.3g}"


def _errors(got, ref) -> list[float]:
    return [(a.nan_to_num() - b.nan_to_num()).abs().max().item() for a, b in zip(got, ref)]


_INTERPRETED = """
import torch
from test_knn_attention_triton import _assert_close, _errors, _inputs, _out_and_grads, _reference
from attention import CentroidAttention, centroid_attention
from attention.kernels.knn_attention_triton import knn_attention_triton

# odd M, N, K; D not a power of two; B > 1 and H > 1; a K split into several online-softmax steps (block_k=2), and
# one in a single step; K > N (neighbours repeat); several heads a program (block_h), with H a multiple of them, and
# not (the last program's extra heads are masked), and more than H's next power of two (counted as that)
cases = [(2, 3, 7, 13, 5, 24, 2, None), (2, 2, 7, 13, 5, 24, None, 2), (1, 2, 3, 4, 9, 8, 4, None),
         (2, 3, 7, 13, 5, 24, 2, 2), (1, 3, 5, 9, 6, 8, None, 4), (1, 2, 3, 4, 9, 8, 4, 8)]
for B, H, M, N, K, D, block_k, block_h in cases:
    for masked in (False, True):
        (q, k, v, idx), mask, w = _inputs(B, H, M, N, K, D, masked)
        what = f"B={{B}} H={{H}} M={{M}} N={{N}} K={{K}} D={{D}} blocks={{block_k}},{{block_h}} mask={{masked}}"
        ref = _reference(q, k, v, idx, mask, w)
        fused = lambda a, b, c: knn_attention_triton(a, b, c, idx, mask, block_k, block_h)  # noqa: E731
        kernel = _out_and_grads(fused, q, k, v, w, torch.float32)
        _assert_close(kernel, ref, what + " float32")
        if block_h is None:
            public = _out_and_grads(lambda a, b, c: centroid_attention(a, b, c, idx, mask=mask, backend="triton"),
                                    q, k, v, w, torch.float32)
            _assert_close(public, ref, what + " backend='triton'")
        # bfloat16: within twice the reference's own bfloat16 error
        low = _reference(q, k, v, idx, mask, w, torch.bfloat16)
        kernel = _out_and_grads(fused, q, k, v, w, torch.bfloat16)
        _assert_close(kernel, ref, what + " bfloat16", errors=_errors(low, ref))

# the layer: attn_backend="triton" == "gather", output and every parameter's gradient, strided (B, H, ., D) views
torch.manual_seed(0)
layer = CentroidAttention(48, num_heads=2, num_neighbors=5, attn_backend="gather").double()
x, u = torch.randn(2, 13, 48, dtype=torch.float64), torch.randn(2, 7, 48, dtype=torch.float64)
mask = torch.ones(2, 13, dtype=torch.bool)
mask[1, 9:] = False
results = []
for form in ("gather", "triton"):
    layer.attn_backend = form
    layer.zero_grad()
    out = layer(x, u, mask=mask)
    out.pow(2).sum().backward()
    results.append([out.detach(), *(p.grad.clone() for p in layer.parameters())])
for a, b in zip(*results):
    torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6)
# a FLOP counter sees the kernel's forward as one operator with the gather path's count
from torch.utils.flop_counter import FlopCounterMode
flops = []
for form in ("gather", "triton"):
    layer.attn_backend = form
    with FlopCounterMode(display=False) as counter:
        layer(x, u, mask=mask)
    flops.append(counter.get_total_flops())
assert flops[0] == flops[1] > 0, flops
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton missing")
def test_triton_knn_attention_under_interpreter_equals_reference() -> None:
    """The kernels' logic on CPU through Triton's interpreter: output and all gradients, float32 and bfloat16, masks
    (an all-padded centroid included), repeated neighbours, several online-softmax steps, and the layer."""
    assert_interpreted(_INTERPRETED.format(), __file__)


def test_triton_knn_attention_limits_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit "triton" that cannot take the input raises naming the limit: the device (CPU without the
    interpreter), the normalization, dropout in training, the head dim; "auto" takes another form for them."""
    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    (q, k, v, idx), _, _ = _inputs(1, 2, 3, 6, 2, 4, masked=False)
    with pytest.raises(ValueError, match=r"runs on cuda \(CPU tensors under TRITON_INTERPRET=1.*got a cpu tensor"):
        centroid_attention(q, k, v, idx, backend="triton")
    monkeypatch.setattr(backends, "_triton_interpreted", lambda: True)  # as if CPU tensors could run it
    with pytest.raises(ValueError, match=r"supports normalize='inputs' only, got 'centroids'"):
        centroid_attention(q, k, v, idx, normalize="centroids", backend="triton")
    with pytest.raises(ValueError, match=r"supports dropout_p == 0 only .*got dropout_p=0.5"):
        centroid_attention(q, k, v, idx, dropout_p=0.5, backend="triton")
    big = torch.zeros(1, 1, 3, 129)
    with pytest.raises(ValueError, match=r"supports D <= 128, got D=129"):
        centroid_attention(big, big, big, torch.zeros(1, 3, 1, dtype=torch.long), backend="triton")
    layer = CentroidAttention(8, num_heads=2, num_neighbors=2, attn_drop=0.1, attn_backend="triton")
    x, u = torch.randn(1, 6, 8), torch.randn(1, 3, 8)
    with pytest.raises(ValueError, match="supports dropout_p == 0 only"):
        layer.train()(x, u)


@pytest.mark.skipif(not HAS_TRITON, reason="triton missing")
def test_triton_knn_attention_block_sizes_are_checked_before_any_launch() -> None:
    """Block sizes that are not powers of two, or heads a program too wide for a tile, raise naming the limit (CPU
    tensors: the check comes before the device's)."""
    from attention.kernels.knn_attention_triton import knn_attention_triton

    (q, k, v, idx), _, _ = _inputs(1, 4, 3, 6, 2, 24, masked=False)
    for kwargs, message in (
        ({"block_h": 3}, "block_h must be a power of two .*got 3"),
        ({"block_k": 6}, "block_k must be a power of two .*got 6"),
        ({"block_h": 32}, r"block_h \* next_pow2\(D\) must be <= 512 .*got block_h=32 with D=24"),
    ):
        with pytest.raises(ValueError, match=message):
            knn_attention_triton(q, k, v, idx, **kwargs)


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TRITON, reason="triton missing")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("masked", [False, True])
def test_triton_knn_attention_on_cuda_equals_reference(dtype: torch.dtype, masked: bool) -> None:
    """Compiled on CUDA: odd sizes, several blocks of neighbours, masks and repeated neighbours; one head a program
    (the switchboard's call) and several (``block_h``, with H a multiple of them and not, D a power of two and not,
    in one step of neighbours and several)."""
    from attention.kernels.knn_attention_triton import knn_attention_triton

    cases = [(2, 3, 257, 1031, 24, 24, None), (1, 4, 300, 1200, 80, 64, None), (2, 2, 65, 130, 33, 128, None)]
    cases += [(2, 4, 257, 1031, 80, 16, 4), (2, 3, 129, 515, 24, 24, 4), (1, 4, 300, 1200, 33, 32, 2)]
    for B, H, M, N, K, D, block_h in cases:
        (q, k, v, idx), mask, w = _inputs(B, H, M, N, K, D, masked, device="cuda")
        ref = _reference(q, k, v, idx, mask, w)
        if block_h is None:
            fused = lambda a, b, c, idx=idx, mask=mask: centroid_attention(a, b, c, idx, mask=mask, backend="triton")  # noqa: E731
        else:
            # several steps of neighbours for every block_h case: K = 80 at D = 16, or 8 a step
            bk = None if K > 64 else 8
            fused = partial(knn_attention_triton, idx=idx, mask=mask, block_k=bk, block_h=block_h)
        got = _out_and_grads(fused, q, k, v, w, dtype)
        what = f"cuda {dtype} B={B} H={H} M={M} N={N} K={K} D={D} block_h={block_h} mask={masked}"
        if dtype == torch.float32:
            _assert_close(got, ref, what, rtol=1e-4)
        else:
            _assert_close(got, ref, what, errors=_errors(_reference(q, k, v, idx, mask, w, dtype), ref))


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TRITON, reason="triton missing")
def test_layer_auto_takes_the_fused_kernel_on_cuda_and_equals_gather_under_amp() -> None:
    torch.manual_seed(0)
    layer = CentroidAttention(128, num_heads=4, num_neighbors=32).cuda()
    x, u = torch.randn(2, 1024, 128, device="cuda"), torch.randn(2, 256, 128, device="cuda")
    shape = {"N": 1024, "K": 32, "D": 32, "normalize": "inputs", "dropout": 0.0, "distinct": True}
    assert backends.resolve("knn_attention", "auto", "cuda", shape, torch.bfloat16) == "triton"
    results = []
    for form in ("auto", "triton", "gather"):
        layer.attn_backend = form
        layer.zero_grad()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = layer(x, u)
        out.float().pow(2).mean().backward()
        results.append([out.float(), *(p.grad.clone() for p in layer.parameters())])
    for a, b in zip(results[0], results[1]):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-3)  # auto is the kernel (up to the atomics' order)
    for a, b in zip(results[1], results[2]):
        torch.testing.assert_close(a, b, rtol=5e-2, atol=5e-3 * b.abs().max().item())


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton missing")
def test_triton_knn_attention_kernels_compile_for_an_h100() -> None:
    """What the interpreter never checks (types, layouts, the loop-carried tensors): compile both kernels for sm_90
    ahead of time, float32 and bfloat16, at the block sizes of K = 32 with D = 16 to 128, one head a program and
    four; no GPU needed (Triton bundles ptxas)."""
    from attention.kernels import knn_attention_triton as ka

    skip_if_interpreted(ka._knn_attn_fwd_kernel)
    for dt in ("fp32", "bf16"):
        fwd = {"q_ptr": dt, "k_ptr": dt, "v_ptr": dt, "idx_ptr": "i64", "mask_ptr": "u8", "out_ptr": dt}
        fwd |= {"out32_ptr": "fp32", "lse_ptr": "fp32"}
        bwd = {**fwd, "out_ptr": "fp32", "g_ptr": dt, "dq_ptr": dt, "dk_ptr": "fp32", "dv_ptr": "fp32"}
        for D, block_h in ((16, 1), (16, 4), (32, 4), (128, 1)):  # heads a program: one, or four
            bk, bh, bd, warps = ka._blocks(32, 4, D, None, block_h)
            for fn, ptrs, extra in ((ka._knn_attn_fwd_kernel, fwd, {"STORE_F32": dt != "fp32"}),
                                    (ka._knn_attn_bwd_kernel, bwd, {})):  # fmt: skip
                consts = {"HAS_MASK": True, "BLOCK_K": bk, "BLOCK_H": bh, "BLOCK_D": bd, **extra}
                sig = {name: f"*{ptrs[name]}" if name in ptrs else "i32" for name in fn.arg_names if name not in consts}
                compile_for_sm90(fn, {**sig, "scale": "fp32"}, consts, warps)
