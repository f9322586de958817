"""FSAT / FAT: FFT cross == brute force, the fold, sparse attention == dense masked reference, truncation, errors."""

from __future__ import annotations

import pytest
import torch

from attention import chunking
from attention.mixers.fsat import (
    EDGE_SETS,
    FourierAttention,
    FourierCross,
    FourierSparseAttention,
    SeparableConvFeatureMap,
    TruncateGrad,
    fold_cross,
    folded_cross,
    pooled_cross,
    pooled_cross_reference,
    sparse_edge_attention,
    sparse_edge_attention_reference,
)


@pytest.mark.parametrize("L", [1, 2, 7, 10, 33])
def test_pooled_cross_matches_brute_force(L: int) -> None:
    g = torch.Generator().manual_seed(L)
    a, b = torch.randn(2, L, 5, generator=g), torch.randn(2, L, 5, generator=g)
    out = pooled_cross(a, b)
    assert out.shape == (2, 2 * L - 1, 5) and out.dtype == torch.float32
    torch.testing.assert_close(out, pooled_cross_reference(a, b), atol=1e-5, rtol=1e-5)
    # and against the definition written out pair by pair
    k = min(2 * L - 2, 3)
    expected = sum(a[:, i] * b[:, k - i] for i in range(max(0, k - L + 1), min(k, L - 1) + 1))
    torch.testing.assert_close(out[:, k], expected, atol=1e-5, rtol=1e-5)


def test_pooled_cross_gradients_match_reference() -> None:
    a = torch.randn(2, 9, 4, dtype=torch.float64, requires_grad=True)
    b = torch.randn(2, 9, 4, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 17, 4)
    ga = torch.autograd.grad((pooled_cross(a, b) * w).sum(), (a, b))
    gr = torch.autograd.grad((pooled_cross_reference(a, b) * w).sum(), (a, b))
    for x, y in zip(ga, gr):
        torch.testing.assert_close(x.double(), y.double(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("L", [1, 2, 5, 8, 9, 33])
def test_folded_cross_matches_the_two_step_reference(L: int) -> None:
    """The one-op fold (its hand-written backward) against the O(L^2) cross folded by hand: outputs, both gradients
    (float64, and gradcheck's finite differences), odd and power-of-two lengths (where the transform is exactly 2L)."""
    g = torch.Generator().manual_seed(L)
    a = torch.randn(2, L, 3, dtype=torch.float64, generator=g).requires_grad_()
    b = torch.randn(2, L, 3, dtype=torch.float64, generator=g).requires_grad_()
    ref = fold_cross(pooled_cross_reference(a, b), a, b)
    out = folded_cross(a, b)
    assert out.dtype == torch.float64 and out.is_contiguous()
    torch.testing.assert_close(out, ref)
    w = torch.randn(ref.shape, dtype=torch.float64, generator=g)
    for x, y in zip(torch.autograd.grad((out * w).sum(), (a, b)), torch.autograd.grad((ref * w).sum(), (a, b))):
        torch.testing.assert_close(x, y)
    assert torch.autograd.gradcheck(folded_cross, tuple(t[:1, :, :2].detach().requires_grad_() for t in (a, b)))


@pytest.mark.torch_compat
def test_folded_cross_under_tracers_and_torch_func_is_the_two_step_form() -> None:
    """torch.func transforms and torch.jit.trace see the two-step form (plain aten ops): the same values, and
    torch.func.grad's gradient equals autograd's through the op; a second backward through the op is exact."""
    g = torch.Generator().manual_seed(3)
    a, b, w = (torch.randn(2, 9, 3, dtype=torch.float64, generator=g) for _ in range(3))
    loss = lambda a_, b_: (folded_cross(a_, b_) * w).sum()  # noqa: E731
    a_req = a.clone().requires_grad_()
    torch.testing.assert_close(torch.func.grad(loss)(a, b), torch.autograd.grad(loss(a_req, b), a_req)[0])
    cross = FourierCross(3).double()
    traced = torch.jit.trace(cross, (a,), check_trace=False)
    torch.testing.assert_close(traced(b), cross(b))
    b_req = b.clone().requires_grad_()  # and a second backward, through the backward's own ops
    assert torch.autograd.gradgradcheck(folded_cross, (a_req[:1, :5], b_req[:1, :5]))


def test_folded_cross_keeps_float32_and_the_inputs_gradient_dtypes() -> None:
    a = torch.randn(2, 40, 8).bfloat16().requires_grad_()
    b = torch.randn(2, 40, 8).bfloat16().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = folded_cross(a, b)
    assert out.dtype == torch.float32
    torch.testing.assert_close(out, fold_cross(pooled_cross(a, b), a, b), atol=1e-4, rtol=1e-4)
    w = torch.randn(out.shape)
    ga = torch.autograd.grad((out * w).sum(), (a, b))
    a64, b64 = a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    gr = torch.autograd.grad((fold_cross(pooled_cross_reference(a64, b64), a64, b64) * w).sum(), (a64, b64))
    for x, y in zip(ga, gr):  # summed in float32, rounded to bf16 once: within one bf16 rounding of float64's
        assert x.dtype == torch.bfloat16
        torch.testing.assert_close(x.double(), y, atol=1e-3, rtol=2**-8)
    with pytest.raises(ValueError, match="same shape"):
        folded_cross(torch.randn(1, 4, 2), torch.randn(1, 5, 2))


@pytest.mark.torch_compat
@pytest.mark.slow
def test_folded_cross_under_torch_compile_equals_eager() -> None:
    """Under torch.compile the op takes its functional form (inductor's tracing of ``out=`` can drop the out
    tensor's strides, and the Linear layers before it then fail to view their gradient): the same outputs and
    gradients."""
    torch.manual_seed(7)
    cross = FourierCross(16).double()
    x = torch.randn(2, 37, 16, dtype=torch.float64, requires_grad=True)
    compiled = torch.compile(cross, fullgraph=True, dynamic=False)
    out, out_c = cross(x), compiled(x)
    torch.testing.assert_close(out_c, out)
    w = torch.randn(out.shape, dtype=torch.float64)
    torch.testing.assert_close(torch.autograd.grad((out_c * w).sum(), x), torch.autograd.grad((out * w).sum(), x))


@pytest.mark.parametrize("L", [1, 6, 9])
def test_fold_matches_definition(L: int) -> None:
    a, b = torch.randn(2, L, 3), torch.randn(2, L, 3)
    c = fold_cross(pooled_cross(a, b), a, b)
    # row i gathers every pair (p, q), p + q in {2i, 2i+1}, except p = q = i
    expected = torch.zeros(2, L, 3)
    for p in range(L):
        for q in range(L):
            i = (p + q) // 2
            if not (p == q == i):
                expected[:, i] += a[:, p] * b[:, q]
    torch.testing.assert_close(c, expected, atol=1e-5, rtol=1e-5)


def _edges(B: int, H: int, L: int, E: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(-1, L, (B, H, L, E), generator=g)  # -1: absent edge; duplicates happen
    idx[..., 0] = idx[..., 1]  # force duplicate edges
    if L > 1:
        idx[0, 0, :, :] = torch.where(idx[0, 0] == 0, torch.ones_like(idx[0, 0]), idx[0, 0])  # query 0 unreached
    conf = torch.rand(B, H, L, E, generator=g, dtype=torch.float64) + 0.1
    return idx, conf


@pytest.mark.parametrize("backend, rows_per_chunk", [("gather", 3), ("gather", None), ("csr", None), ("auto", None)])
@pytest.mark.parametrize("L", [1, 13])
def test_sparse_attention_matches_dense_reference(
    L: int, backend: str, rows_per_chunk: int | None, monkeypatch
) -> None:
    """Both edge backends (CSR products; chunked gather / scatter) == the dense masked reference, all gradients."""
    B, H, D, E = 2, 3, 5, 6
    if rows_per_chunk:  # several chunks of key rows in the gather / scatter functions
        monkeypatch.setitem(chunking.CHUNK_BUDGETS, "fsat_edges", {"default": rows_per_chunk * E * D * 8})
    idx, conf = _edges(B, H, L, E, seed=L)
    q, k, v = (torch.randn(B, H, L, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
    conf.requires_grad_(True)
    w = torch.randn(B, H, L, D, dtype=torch.float64)
    out = sparse_edge_attention(q, k, v, idx, conf, backend=backend)
    ref = sparse_edge_attention_reference(q, k, v, idx, conf)
    torch.testing.assert_close(out, ref)
    g1 = torch.autograd.grad((out * w).sum(), (q, k, v, conf))
    g2 = torch.autograd.grad((ref * w).sum(), (q, k, v, conf))
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)
    if L > 1:
        reached = torch.zeros(B, H, L, dtype=torch.bool)
        for b_, h_, j, e in (idx >= 0).nonzero().tolist():
            reached[b_, h_, idx[b_, h_, j, e]] = True
        assert not reached[0, 0, 0]
        assert torch.equal(out[~reached], torch.zeros_like(out[~reached]))  # documented: unreached queries get 0


def test_sparse_attention_backends_agree_in_float32_and_reject_unknown_names() -> None:
    B, H, L, D, E = 2, 4, 50, 16, 8
    idx, conf = _edges(B, H, L, E, seed=3)
    q, k, v = (torch.randn(B, H, L, D, requires_grad=True) for _ in range(3))
    outs, grads = [], []
    for backend in ("csr", "gather"):
        out = sparse_edge_attention(q, k, v, idx, conf.float(), backend=backend)
        outs.append(out)
        grads.append(torch.autograd.grad(out.square().sum(), (q, k, v)))
    torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-4)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # bf16 q / k / v: the CSR path computes in float32
        out = sparse_edge_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), idx, conf.float(), backend="csr")
    assert out.dtype == torch.bfloat16 and torch.isfinite(out.float()).all()
    with pytest.raises(ValueError, match=r"unknown backend 'dense' for fsat_edges; choose one of \['auto', 'csr'"):
        sparse_edge_attention(q, k, v, idx, conf, backend="dense")
    with pytest.raises(ValueError, match="unknown edge_backend"):
        FourierSparseAttention(16, num_heads=2, edge_backend="dense")


@pytest.mark.parametrize("edge_backend", ["csr", "gather"])
def test_fsat_module_equals_dense_reference_on_its_edges(edge_backend: str) -> None:
    torch.manual_seed(0)
    m = FourierSparseAttention(24, num_heads=3, max_len=11, num_edges=2, edge_backend=edge_backend).double()
    x = torch.randn(2, 11, 24, dtype=torch.float64, requires_grad=True)
    torch.manual_seed(5)
    out = m(x)
    # the same forward with the dense reference on the same (seeded) random edges
    torch.manual_seed(5)
    B, L, C = x.shape
    c = m.cross(x)
    q = m.q(x).view(B, L, 3, 8).transpose(1, 2)
    k, v = m.kv(c).view(B, L, 2, 3, 8).permute(2, 0, 3, 1, 4).unbind(0)
    idx, conf = m.edges(c)
    assert idx.shape == (2, 3, 11, 4)  # M predicted + M random in training
    ref = m.proj(sparse_edge_attention_reference(q, k, v, idx, conf).transpose(1, 2).reshape(B, L, C))
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(out)
    g1 = torch.autograd.grad((out * w).sum(), [x, *m.parameters()], allow_unused=True)
    g2 = torch.autograd.grad((ref * w).sum(), [x, *m.parameters()], allow_unused=True)
    for a, b in zip(g1, g2):
        torch.testing.assert_close(a, b)
    assert m.index_head.weight.grad is None and g1[-3] is not None  # the index head learns through the confidences


def test_truncate_grad_clamps_to_non_positive() -> None:
    x = torch.randn(10, requires_grad=True)
    g = torch.linspace(-1, 1, 10)
    (TruncateGrad.apply(x) * g).sum().backward()
    torch.testing.assert_close(x.grad, g.clamp(max=0))
    assert (x.grad <= 0).all() and (x.grad < 0).any()


def test_fsat_index_head_sees_only_the_clamped_confidence_gradient() -> None:
    torch.manual_seed(1)
    m = FourierSparseAttention(16, num_heads=2, max_len=9, num_edges=3).double().eval()
    c = m.cross(torch.randn(2, 9, 16, dtype=torch.float64)).detach()
    _, conf = m.edges(c)
    g = torch.randn_like(conf)  # an upstream gradient of both signs
    got = torch.autograd.grad(conf, m.index_head.weight, g)[0]
    raw = _predicted_confidences(m, c)  # the density written out, through autograd
    torch.testing.assert_close(conf, raw)
    want = torch.autograd.grad(raw, m.index_head.weight, g.clamp(max=0), retain_graph=True)[0]
    unclamped = torch.autograd.grad(raw, m.index_head.weight, g)[0]
    torch.testing.assert_close(got, want)
    assert not torch.allclose(got, unclamped)


@pytest.mark.torch_compat
def test_fsat_edges_under_torch_compile_equal_eager() -> None:
    """The confidences' op compiled: the same indices, confidences and index-head gradient (torch 2.11's compiled
    backward read a saved tensor made by an in-place op as zeros)."""
    torch.manual_seed(4)
    m = FourierSparseAttention(16, num_heads=2, max_len=9, num_edges=3).double().eval()
    c = m.cross(torch.randn(2, 9, 16, dtype=torch.float64)).detach()
    g = -torch.rand(2, 2, 9, 3, dtype=torch.float64)  # negative: kept by the truncation
    (idx, conf), (idx_c, conf_c) = m.edges(c), torch.compile(m.edges, fullgraph=True, dynamic=False)(c)
    assert torch.equal(idx_c, idx)
    torch.testing.assert_close(conf_c, conf)
    want = torch.autograd.grad(conf, m.index_head.weight, g)[0]
    assert want.abs().sum() > 0
    torch.testing.assert_close(torch.autograd.grad(conf_c, m.index_head.weight, g)[0], want)


@pytest.mark.torch_compat
def test_gather_edges_under_torch_compile_equal_eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """The gather path compiled (what "auto" takes on CPU under torch.compile), over several chunks of key rows: the
    same output and gradients (torch 2.11's compiled backward was wrong after an in-place index_add_)."""
    g = torch.Generator().manual_seed(5)
    B, H, L, D, E = 2, 2, 9, 4, 3
    q, k, v = (torch.randn(B, H, L, D, generator=g, dtype=torch.float64).requires_grad_() for _ in range(3))
    idx = torch.randint(-1, L, (B, H, L, E), generator=g)
    conf = (torch.rand(B, H, L, E, generator=g, dtype=torch.float64) + 0.1).requires_grad_()
    w = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)
    monkeypatch.setitem(chunking.CHUNK_BUDGETS, "fsat_edges", {"default": 5 * E * D * 8})  # 5 key rows a chunk

    def step(fn):
        out = fn(q, k, v, idx, conf)
        return [out, *torch.autograd.grad((out * w).sum(), (q, k, v, conf))]

    edges = lambda *a: sparse_edge_attention(*a, backend="gather")  # noqa: E731
    got, want = step(torch.compile(edges, fullgraph=True, dynamic=False)), step(edges)
    for a, b in zip(got, want, strict=True):
        torch.testing.assert_close(a, b)


def test_fsat_confidences_and_their_gradient_with_random_edges_and_a_short_sequence() -> None:
    """Training edges (predicted + random, each random one scored against its paired prediction) on a sequence
    shorter than max_len: the confidences and the index head's gradient equal the density written out through
    autograd, truncation included, and indices past the sequence are dropped."""
    torch.manual_seed(2)
    L, L_max, M = 7, 12, 3
    m = FourierSparseAttention(16, num_heads=2, max_len=L_max, num_edges=M, num_random=5).double().train()
    c = m.cross(torch.randn(2, L, 16, dtype=torch.float64)).detach()
    torch.manual_seed(3)
    idx, conf = m.edges(c)
    torch.manual_seed(3)
    rand = torch.randint(0, L, (2, 2, L, 5))
    i_bar = (torch.sigmoid(m.index_head(c)) * L_max).view(2, L, 2, M).transpose(1, 2)
    mean = torch.cat([i_bar, i_bar[..., torch.arange(5) % M]], -1)
    positions = torch.cat([i_bar.detach().floor().clamp_max(L_max - 1), rand.double()], -1)
    raw = torch.exp(-((positions - mean) ** 2) / (2 * L_max)) / (2 * torch.pi * L_max) ** 0.5
    torch.testing.assert_close(conf, raw)
    assert torch.equal(idx, torch.where(positions < L, positions.long(), -1))
    g = torch.randn_like(conf)
    got = torch.autograd.grad(conf, m.index_head.weight, g)[0]
    torch.testing.assert_close(got, torch.autograd.grad(raw, m.index_head.weight, g.clamp(max=0))[0])


def _predicted_confidences(m: FourierSparseAttention, c: torch.Tensor) -> torch.Tensor:
    """The Gaussian density of the predicted edges written out: N(floor(I_bar) | I_bar, L_max), (B, H, L, M)."""
    B, L, _ = c.shape
    i_bar = torch.sigmoid(m.index_head(c)) * m.max_len  # (B, L, H M)
    i_bar = i_bar.view(B, L, m.num_heads, m.num_edges).transpose(1, 2)
    d = i_bar.detach().floor().clamp_max(m.max_len - 1) - i_bar
    return torch.exp(-(d**2) / (2 * m.max_len)) / (2 * torch.pi * m.max_len) ** 0.5


def test_no_truncation_passes_the_confidence_gradient_unclipped() -> None:
    """truncate_grad=False (FSAT-No Trunc.): the index head gets the full gradient of the confidences, positive
    parts included; the default clips them, so a positive upstream gradient leaves it with nothing."""
    torch.manual_seed(7)
    plain = FourierSparseAttention(16, num_heads=2, max_len=9, num_edges=3, truncate_grad=False).double().eval()
    clipped = FourierSparseAttention(16, num_heads=2, max_len=9, num_edges=3).double().eval()
    clipped.load_state_dict(plain.state_dict())
    assert plain.truncate_grad is False and clipped.truncate_grad is True
    c = plain.cross(torch.randn(2, 9, 16, dtype=torch.float64)).detach()
    g = torch.rand(2, 2, 9, 3, dtype=torch.float64) + 0.1  # positive: all clipped away by the truncation
    w = plain.index_head.weight
    got = torch.autograd.grad(plain.edges(c)[1], w, g)[0]
    ref = torch.autograd.grad(_predicted_confidences(plain, c), w, g)[0]
    torch.testing.assert_close(got, ref)
    assert got.abs().sum() > 0
    assert torch.equal(torch.autograd.grad(clipped.edges(c)[1], clipped.index_head.weight, g)[0], torch.zeros_like(w))
    torch.testing.assert_close(clipped.edges(c)[1], plain.edges(c)[1])  # same forward


def test_random_only_edges_have_no_predicted_edge() -> None:
    """edges="random" (FSAT-Only Ir): only random query positions, in training and in inference, each scored against
    the prediction it is paired with; with every prediction at the last position, the predicted sets hold only it."""
    L, M = 12, 4
    torch.manual_seed(8)
    m = FourierSparseAttention(8, num_heads=2, max_len=L, num_edges=M, num_random=6, edges="random")
    with torch.no_grad():
        m.index_head.bias.fill_(10.0)  # sigmoid ~ 1: every predicted position is L - 1
    c = m.cross(torch.randn(3, L, 8))
    for mode in (m.train, m.eval):
        mode()
        idx, conf = m.edges(c)
        assert idx.shape == (3, 2, L, 6)
        assert (idx != L - 1).float().mean() > 0.8  # uniform over L positions, not the prediction
        pair = torch.arange(6) % M
        i_bar = (torch.sigmoid(m.index_head(c)) * L).view(3, L, 2, M).transpose(1, 2)[..., pair]
        expected = torch.exp(-((idx - i_bar) ** 2) / (2 * L)) / (2 * torch.pi * L) ** 0.5
        torch.testing.assert_close(conf, expected)
    predicted = FourierSparseAttention(8, num_heads=2, max_len=L, num_edges=M).eval()
    predicted.load_state_dict(m.state_dict())
    assert (predicted.edges(c)[0] == L - 1).all()
    torch.manual_seed(1)
    a = m(torch.ones(1, L, 8))
    torch.manual_seed(1)
    assert torch.equal(a, m(torch.ones(1, L, 8)))  # stochastic inference, repeatable under a seed


def test_predicted_only_edges_are_deterministic_in_training() -> None:
    """edges="predicted" (FSAT-Only Ip): no random edge, in training either."""
    torch.manual_seed(9)
    m = FourierSparseAttention(16, num_heads=2, max_len=10, num_edges=3, edges="predicted").train()
    x = torch.randn(2, 10, 16)
    idx, _ = m.edges(m.cross(x))
    assert idx.shape == (2, 2, 10, 3) and m.num_random == 0
    torch.manual_seed(1)
    a = m(x)
    torch.manual_seed(2)
    assert torch.equal(a, m(x))
    default = FourierSparseAttention(16, num_heads=2, max_len=10, num_edges=3).train()
    assert default.edges(default.cross(x))[0].shape == (2, 2, 10, 6)  # predicted + random
    with pytest.raises(ValueError, match='edges="predicted" has no random edges'):
        FourierSparseAttention(16, num_heads=2, max_len=10, edges="predicted", num_random=2)
    with pytest.raises(ValueError, match=r"unknown edges 'all'; choose one of \['predicted\+random'"):
        FourierSparseAttention(16, num_heads=2, max_len=10, edges="all")
    with pytest.raises(ValueError, match='edges="random" needs num_random >= 1'):
        FourierSparseAttention(16, num_heads=2, max_len=10, edges="random", num_random=0)
    assert EDGE_SETS == ("predicted+random", "random", "predicted")


def test_separable_conv_feature_map_is_depthwise_then_pointwise() -> None:
    """feature_map="separable" (FSAT+DConv-5): a per-channel kernel-5 conv (same padding), then a C x C mix."""
    torch.manual_seed(10)
    C, K = 6, 5
    f = SeparableConvFeatureMap(C, kernel_size=K).double()
    assert f.depthwise.weight.shape == (C, 1, K) and f.depthwise.bias.shape == (C,)
    assert f.pointwise.weight.shape == (C, C) and f.pointwise.bias.shape == (C,)
    x = torch.randn(2, 9, C, dtype=torch.float64)
    padded = torch.nn.functional.pad(x, (0, 0, K // 2, K // 2))  # zeros before and after the sequence
    w = f.depthwise.weight[:, 0]  # (C, K)
    depthwise = sum(padded[:, t : t + 9] * w[:, t] for t in range(K)) + f.depthwise.bias  # (B, L, C)
    torch.testing.assert_close(f(x), depthwise @ f.pointwise.weight.T + f.pointwise.bias)
    m = FourierSparseAttention(12, num_heads=2, max_len=16, feature_map="separable", kernel_size=5)
    assert isinstance(m.cross.f1, SeparableConvFeatureMap) and m.cross.f1.depthwise.kernel_size == (5,)
    assert m(torch.randn(2, 16, 12)).shape == (2, 16, 12)
    with pytest.raises(ValueError, match="kernel_size must be odd"):
        SeparableConvFeatureMap(4, kernel_size=4)


def test_fsat_eval_is_deterministic_and_uses_predicted_edges_only() -> None:
    torch.manual_seed(2)
    m = FourierSparseAttention(16, num_heads=2, max_len=12, num_edges=4).eval()
    x = torch.randn(3, 12, 16)
    torch.manual_seed(10)
    a = m(x)
    torch.manual_seed(11)
    b = m(x)
    assert torch.equal(a, b)
    idx, _ = m.edges(m.cross(x))
    assert idx.shape == (3, 2, 12, 4)
    m.train()
    torch.manual_seed(10)
    c1 = m(x)
    torch.manual_seed(11)
    c2 = m(x)
    assert not torch.equal(c1, c2)  # random edges in training


def test_short_sequences_drop_edges_past_the_end() -> None:
    torch.manual_seed(3)
    m = FourierSparseAttention(8, num_heads=1, max_len=50, num_edges=4).eval()
    with torch.no_grad():
        m.index_head.bias.fill_(3.0)  # sigmoid ~ 0.95 -> predicted positions ~ 47 > L
    idx, _ = m.edges(m.cross(torch.randn(1, 10, 8)))
    assert (idx == -1).all()
    assert torch.equal(m(torch.randn(1, 10, 8)), m.proj.bias.expand(1, 10, 8))


@pytest.mark.parametrize("cls", [FourierSparseAttention, FourierAttention])
@pytest.mark.parametrize("feature_map", ["mlp", "conv", "separable"])
def test_bf16_autocast_is_finite(cls: type, feature_map: str) -> None:
    torch.manual_seed(4)
    kw = {"max_len": 64} if cls is FourierSparseAttention else {}
    m = cls(32, num_heads=4, feature_map=feature_map, **kw)
    x = torch.randn(2, 64, 32, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = m.cross.f1(x)
        assert pooled_cross(a, a).dtype == torch.float32
        out = m(x)
    assert torch.isfinite(out).all()
    out.float().sum().backward()
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in m.parameters() if p.grad is not None)


def test_fat_is_attention_from_x_to_the_cross() -> None:
    torch.manual_seed(6)
    m = FourierAttention(12, num_heads=2).double()
    x = torch.randn(2, 7, 12, dtype=torch.float64)
    c = m.cross(x)
    q = m.q(x).view(2, 7, 2, 6).transpose(1, 2)
    k, v = m.kv(c).view(2, 7, 2, 2, 6).permute(2, 0, 3, 1, 4).unbind(0)
    att = torch.softmax(q @ k.transpose(-1, -2) / 6**0.5, -1)
    torch.testing.assert_close(m(x), m.proj((att @ v).transpose(1, 2).reshape(2, 7, 12)))
    cross = FourierCross(12)
    assert cross(x.float()).shape == (2, 7, 12)


def test_bad_inputs_raise_clear_errors() -> None:
    m = FourierSparseAttention(8, num_heads=2, max_len=10)
    with pytest.raises(ValueError, match="exceeds max_len=10"):
        m(torch.randn(1, 11, 8))
    with pytest.raises(ValueError, match=r"must be \(B, L, 8\), got a 2-d tensor"):
        m(torch.randn(11, 8))
    with pytest.raises(ValueError, match=r"must be \(B, L, 8\)"):
        m(torch.randn(1, 5, 9))
    with pytest.raises(ValueError, match="attn_mask"):
        m(torch.randn(1, 5, 8), attn_mask=torch.ones(5, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="unknown feature_map"):
        FourierAttention(8, feature_map="fft")
    with pytest.raises(ValueError, match="divisible"):
        FourierAttention(10, num_heads=3)
    with pytest.raises(ValueError, match="num_heads must be >= 1"):
        FourierAttention(10, num_heads=0)
    with pytest.raises(ValueError, match="num_heads must be >= 1"):
        FourierSparseAttention(10, num_heads=0)
    with pytest.raises(ValueError, match="same shape"):
        pooled_cross(torch.randn(1, 4, 2), torch.randn(1, 5, 2))
    with pytest.raises(ValueError, match="query positions < L"):
        sparse_edge_attention(
            *(torch.randn(1, 1, 3, 2) for _ in range(3)), torch.full((1, 1, 3, 1), 3), torch.ones(1, 1, 3, 1)
        )


# CUDA cases of the equivalence tests (run by tools/gpu_check.py; skipped without a GPU).


@pytest.mark.gpu
@pytest.mark.parametrize("backend", ["gather", "csr", "auto"])
def test_sparse_attention_on_cuda_equals_dense_reference(backend: str) -> None:
    """FSAT's edge paths on CUDA (float64, odd L, absent and duplicate edges) against the reference, all gradients."""
    B, H, L, D, E = 2, 3, 63, 5, 6
    idx, conf = _edges(B, H, L, E, seed=1)
    q, k, v = (torch.randn(B, H, L, D, dtype=torch.float64) for _ in range(3))
    w = torch.randn(B, H, L, D, dtype=torch.float64)
    ins = [t.cuda().requires_grad_(True) for t in (q, k, v, conf)]
    out = sparse_edge_attention(*ins[:3], idx.cuda(), ins[3], backend=backend)
    ref = sparse_edge_attention_reference(*ins[:3], idx.cuda(), ins[3])
    torch.testing.assert_close(out, ref)
    for a, b in zip(torch.autograd.grad((out * w.cuda()).sum(), ins), torch.autograd.grad((ref * w.cuda()).sum(), ins)):
        torch.testing.assert_close(a, b)


@pytest.mark.gpu
@pytest.mark.parametrize("edge_backend", ["csr", "gather"])
def test_fsat_on_cuda_equals_cpu_and_bf16_autocast_is_finite(edge_backend: str) -> None:
    torch.manual_seed(0)
    m = FourierSparseAttention(24, num_heads=3, max_len=37, num_edges=2, edge_backend=edge_backend).double().eval()
    x = torch.randn(2, 37, 24, dtype=torch.float64)
    out = m(x)  # eval: the predicted edges only, deterministic
    torch.testing.assert_close(m.cuda()(x.cuda()).cpu(), out)
    m.float().train()
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = m(x.float().cuda().requires_grad_(True))
    y.float().sum().backward()
    assert bool(torch.isfinite(y.float()).all())
    assert all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in m.parameters())
