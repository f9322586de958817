"""Centroid attention: math invariants, inits, blocks, masks, bad input."""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close
from torch.utils.flop_counter import FlopCounterMode

from attention import (
    CENTROID_INITS,
    CentroidAttention,
    CentroidBlock,
    SelfAttentionBlock,
    attention_step_reference,
    build_centroid_init,
    centroid_attention,
    edge_projection,
    feature_neighbors,
    gather,
    masked_knn_attention,
)


def test_identity_init_one_step_is_self_attention_plus_skip() -> None:
    layer = CentroidAttention(24, num_heads=3, norm_layer=None, qkv_bias=True).eval()
    x = torch.randn(2, 33, 24)
    assert_close(layer(x, x), attention_step_reference(layer, x, x))
    # and against torch's own MultiheadAttention with the same weights
    mha = nn.MultiheadAttention(24, 3, bias=True, batch_first=True).eval()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([layer.q.weight, layer.kv.weight]))
        mha.in_proj_bias.copy_(torch.cat([layer.q.bias, layer.kv.bias]))
        mha.out_proj.weight.copy_(layer.proj.weight)
        mha.out_proj.bias.copy_(layer.proj.bias)
    assert_close(layer(x, x), x + mha(x, x, x, need_weights=False)[0], atol=1e-5, rtol=1e-5)


def test_t_steps_are_repeated_updates() -> None:
    layer = CentroidAttention(16, num_heads=2, num_steps=3, norm_layer=None).eval()
    x, u = torch.randn(2, 40, 16), torch.randn(2, 10, 16)
    expected = u
    for _ in range(3):
        expected = attention_step_reference(layer, x, expected)
    assert_close(layer(x, u), expected)


@pytest.mark.parametrize("normalize", ["inputs", "centroids"])
@pytest.mark.parametrize("steps", [1, 2])
def test_knn_with_k_equal_n_equals_dense(normalize: str, steps: int) -> None:
    torch.manual_seed(1)
    dense = CentroidAttention(20, num_heads=4, num_steps=steps, normalize=normalize)
    sparse = CentroidAttention(20, num_heads=4, num_neighbors=31, num_steps=steps, normalize=normalize)
    sparse.load_state_dict(dense.state_dict())
    x = torch.randn(3, 31, 20, requires_grad=True)
    u = torch.randn(3, 7, 20, requires_grad=True)
    out_d = dense(x, u)
    out_s = sparse(x, u)
    assert_close(out_s, out_d, atol=1e-5, rtol=1e-5)
    g = torch.randn_like(out_d)
    grads_d = torch.autograd.grad(out_d, [x, u, *dense.parameters()], g)
    grads_s = torch.autograd.grad(out_s, [x, u, *sparse.parameters()], g)
    for a, b in zip(grads_s, grads_d):
        assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_knn_attends_only_to_nearest_inputs() -> None:
    """Changing an input outside every centroid's K nearest leaves the output unchanged."""
    layer = CentroidAttention(8, num_heads=2, num_neighbors=4, norm_layer=None).eval()
    x = torch.randn(1, 50, 8)
    u = x[:, :5].clone()
    _, idx = torch.cdist(u, x).topk(4, largest=False)
    far = sorted(set(range(50)) - set(idx.flatten().tolist()))[0]
    x2 = x.clone()
    x2[0, far] += 0.01  # small enough not to enter any neighbourhood
    assert_close(layer(x, u), layer(x2, u))


def test_functional_knn_equals_dense_masked_reference() -> None:
    """The KNN path equals dense attention with every non-neighbour masked out (softmax over inputs)."""
    B, H, M, N, D, K = 2, 3, 6, 29, 5, 7
    q, k, v = torch.randn(B, H, M, D), torch.randn(B, H, N, D), torch.randn(B, H, N, D)
    idx = torch.stack([torch.stack([torch.randperm(N)[:K] for _ in range(M)]) for _ in range(B)])
    allowed = torch.zeros(B, M, N, dtype=torch.bool).scatter_(2, idx, True)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=allowed[:, None])
    assert_close(centroid_attention(q, k, v, idx), ref, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("normalize", ["inputs", "centroids"])
@pytest.mark.parametrize("chunk_bytes", [1, 5 * 1680, None])  # a centroid row is 7*3*5*8 = 840 B: 3 chunks
@pytest.mark.parametrize("masked", [False, True])
def test_chunked_knn_path_equals_reference(normalize: str, chunk_bytes: int | None, masked: bool) -> None:
    """The chunked gather (recomputed in backward) == gathering everything at once: outputs and every gradient."""
    B, H, M, N, D, K = 2, 3, 13, 63, 5, 7
    q = torch.randn(B, H, M, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, N, D, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, H, N, D, dtype=torch.float64, requires_grad=True)
    idx = torch.randint(0, N, (B, M, K))
    mask = (torch.rand(B, N) > 0.2) if masked else None
    if mask is not None:
        mask[:, idx[:, :, 0]] = True  # every centroid keeps a real neighbour
    kw = {"mask": mask, "normalize": normalize}
    ref = centroid_attention(q, k, v, idx, reference=True, **kw)
    out = centroid_attention(q, k, v, idx, chunk_bytes=chunk_bytes, **kw)
    assert_close(out, ref)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        assert_close(a, b)


@pytest.mark.torch_compat
@pytest.mark.parametrize("chunk_bytes", [1, None])  # one centroid row per chunk; all rows in one chunk
def test_flop_counter_counts_the_chunked_products_as_the_reference_einsums(chunk_bytes: int | None) -> None:
    """The chunked products are counted by their registered formulas, 2 B M K H D FLOPs each, as the reference's
    einsums are; counting changes neither the output nor the path that runs."""
    B, H, M, N, D, K = 2, 3, 13, 63, 5, 7
    q, k, v = (torch.randn(B, H, n, D) for n in (M, N, N))
    idx = torch.randint(0, N, (B, M, K))
    flops, outs = {}, {}
    for reference in (False, True):
        with FlopCounterMode(display=False) as counter:
            outs[reference] = centroid_attention(q, k, v, idx, chunk_bytes=chunk_bytes, reference=reference)
        flops[reference] = counter.get_flop_counts()["Global"]
    assert flops[True] == {torch.ops.aten.bmm: 2 * 2 * B * M * K * H * D}
    assert flops[False] == {
        torch.ops.attention.gather_dot: 2 * B * M * K * H * D,
        torch.ops.attention.gather_weighted_sum: 2 * B * M * K * H * D,
    }
    assert torch.equal(outs[False], centroid_attention(q, k, v, idx, chunk_bytes=chunk_bytes))
    assert_close(outs[False], outs[True])


@pytest.mark.torch_compat
@pytest.mark.parametrize("normalize", ["inputs", "centroids"])
@pytest.mark.parametrize("masked", [False, True])
def test_edge_projection_is_the_same_function_with_k_times_the_projection_macs(normalize: str, masked: bool) -> None:
    torch.manual_seed(0)
    B, N, M, C, K = 2, 37, 11, 30, 5
    layer = CentroidAttention(C, num_heads=3, num_neighbors=K, num_steps=2, normalize=normalize, qkv_bias=True)
    x, u = torch.randn(B, N, C, dtype=torch.float64), torch.randn(B, M, C, dtype=torch.float64)
    layer = layer.double()
    mask = torch.rand(B, N) > 0.3 if masked else None

    def run(per_edge: bool) -> tuple[torch.Tensor, list[torch.Tensor]]:
        xi, ui = x.clone().requires_grad_(), u.clone().requires_grad_()
        layer.zero_grad()
        with edge_projection(layer) if per_edge else contextlib.nullcontext():
            out = layer(xi, ui, mask=mask)
        out.square().sum().backward()
        return out, [xi.grad, ui.grad, *(p.grad for p in layer.parameters())]

    (out, grads), (out_e, grads_e) = run(False), run(True)
    assert_close(out_e, out)
    for g_e, g in zip(grads_e, grads):
        assert_close(g_e, g)
    # The count: per step, the k/v projection runs on M * K gathered inputs instead of the N inputs once.
    flops = {}
    for per_edge in (False, True):
        counter = FlopCounterMode(display=False)
        with torch.no_grad(), counter, edge_projection(layer) if per_edge else contextlib.nullcontext():
            layer(x, u, mask=mask)
        flops[per_edge] = counter.get_total_flops() / 2
    assert flops[True] - flops[False] == (2 * M * K - N) * B * C * 2 * C  # 2 steps, one projection of N inputs
    # The swap is scoped: outside the context the layer is the core's class again.
    assert type(layer) is CentroidAttention


@pytest.mark.parametrize(
    "kwargs", [{}, {"sa_pos_encoding": True, "ca_pos_encoding": True, "ca_neighbors": "xyz", "layer_scale": 0.5}]
)
def test_per_edge_evaluation_gives_the_same_logits(kwargs: dict) -> None:
    from pointcloud import create_model  # the model whose GMACs tools/model_stats.py sets next to the paper's

    torch.manual_seed(0)
    # position encodings: per-edge keys and values plus delta, against the layer's per-head factored form
    model = create_model("centroid_transformer_modelnet40", num_neighbors=6, **kwargs).eval()
    points = torch.randn(2, 64, 3)
    with torch.no_grad():
        ref = model(points)
        with edge_projection(model):
            assert_close(model(points), ref, rtol=1e-4, atol=1e-4)


def test_default_chunk_budget_is_per_device_and_read_when_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """16 MiB on CPU, 256 MiB on CUDA (where a chunk costs its kernel launches, not its bytes); either can be set."""
    import attention.centroid.functional as functional
    from attention import chunking

    assert chunking.chunk_budget("knn_attention", torch.device("cpu")) == 16 * 2**20
    assert chunking.chunk_budget("knn_attention", torch.device("cuda", 0)) == 256 * 2**20
    budgets = []
    real = functional.chunk_rows
    spy = lambda n, row, budget: budgets.append(budget) or real(n, row, budget)  # noqa: E731
    monkeypatch.setattr(functional, "chunk_rows", spy)
    q, k, v = (torch.randn(1, 2, n, 4, requires_grad=True) for n in (3, 9, 9))
    idx = torch.randint(0, 9, (1, 3, 4))
    # a row: K * H * D float32 = 128 B; 2 per chunk
    monkeypatch.setitem(chunking.CHUNK_BUDGETS, "knn_attention", {"default": 2 * 128})
    out = centroid_attention(q, k, v, idx)
    assert budgets == [256]
    assert_close(out, centroid_attention(q, k, v, idx, reference=True))


def _distinct_neighbours(B: int, M: int, N: int, K: int) -> torch.Tensor:
    """Each row K distinct inputs, as the KNN searches return them."""
    return torch.rand(B, M, N).argsort(-1)[..., :K]


@pytest.mark.parametrize("normalize", ["inputs", "centroids"])
@pytest.mark.parametrize("masked", [False, True])
def test_masked_knn_path_equals_reference(normalize: str, masked: bool) -> None:
    """backend="masked" (dense products under the neighbour mask) == the gather-everything reference."""
    B, H, M, N, D, K = 2, 3, 13, 63, 5, 7
    q = torch.randn(B, H, M, D, dtype=torch.float64, requires_grad=True)
    k = torch.randn(B, H, N, D, dtype=torch.float64, requires_grad=True)
    v = torch.randn(B, H, N, D, dtype=torch.float64, requires_grad=True)
    idx = _distinct_neighbours(B, M, N, K)
    mask = (torch.rand(B, N) > 0.2) if masked else None
    if mask is not None:
        mask[:, idx[:, :, 0]] = True  # every centroid keeps a real neighbour
    kw = {"mask": mask, "normalize": normalize}
    ref = centroid_attention(q, k, v, idx, reference=True, **kw)
    out = centroid_attention(q, k, v, idx, backend="masked", **kw)
    assert_close(out, ref)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        assert_close(a, b)


def test_masked_knn_path_counts_a_repeated_index_once() -> None:
    """The documented difference: a neighbour listed twice is one edge of the mask (two of the gather path)."""
    q, k, v = (torch.randn(1, 2, n, 4, dtype=torch.float64) for n in (3, 9, 9))
    idx = torch.tensor([[[1, 1, 4], [2, 5, 5], [0, 3, 8]]])
    deduplicated = torch.tensor([[[1, 4], [2, 5], [0, 3]]])
    out = masked_knn_attention(q, k, v, idx)
    assert_close(out[:, :, :2], centroid_attention(q, k, v, deduplicated, reference=True)[:, :, :2])
    assert not torch.allclose(out[:, :, :2], centroid_attention(q, k, v, idx, reference=True)[:, :, :2])


REPEATS = r"backend 'masked' of knn_attention counts a neighbour index listed twice in a row once.*backend='gather'"


def test_explicit_masked_form_refuses_a_repeated_neighbor() -> None:
    """backend="masked" cannot count a neighbour listed twice as the other forms do: it says so and names the form
    that can, instead of returning another value; distinct rows still run it, and "auto" takes gather."""
    q, k, v = (torch.randn(1, 2, n, 4, dtype=torch.float64) for n in (3, 9, 9))
    idx = torch.tensor([[[1, 1, 4], [2, 5, 6], [0, 3, 8]]])  # the first row lists input 1 twice
    with pytest.raises(ValueError, match=REPEATS):
        centroid_attention(q, k, v, idx, backend="masked")
    assert_close(centroid_attention(q, k, v, idx), centroid_attention(q, k, v, idx, reference=True))
    distinct = torch.tensor([[[1, 7, 4], [2, 5, 6], [0, 3, 8]]])
    assert_close(
        centroid_attention(q, k, v, distinct, backend="masked"), centroid_attention(q, k, v, distinct, reference=True)
    )
    layer = CentroidAttention(8, num_heads=2, attn_backend="masked").double()
    x, u = torch.randn(1, 9, 8, dtype=torch.float64), torch.randn(1, 3, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=REPEATS):
        layer(x, u, neighbor_idx=idx)
    layer(x, u, neighbor_idx=distinct)


def test_auto_never_takes_the_masked_form_for_a_repeated_neighbor(monkeypatch: pytest.MonkeyPatch) -> None:
    """With "masked" first in the order and N / K within its limit, "auto" takes it for distinct rows only: a
    caller's idx is checked (one sort along K) while input checks run, and unknown (gather) with them off."""
    from attention import backends, input_checks
    from attention.centroid import functional as fn
    from attention.centroid import layer as layer_module

    monkeypatch.setitem(backends.AUTO_ORDER, ("knn_attention", "cpu"), ("masked", "gather"))
    seen = []
    real = fn.masked_knn_attention
    monkeypatch.setattr(fn, "masked_knn_attention", lambda *a, **kw: seen.append(1) or real(*a, **kw))
    monkeypatch.setattr(layer_module, "masked_knn_attention", fn.masked_knn_attention)
    q, k, v = (torch.randn(1, 2, n, 4, dtype=torch.float64) for n in (3, 9, 9))
    repeated = torch.tensor([[[1, 1, 4], [2, 5, 6], [0, 3, 8]]])
    distinct = torch.tensor([[[1, 7, 4], [2, 5, 6], [0, 3, 8]]])
    assert_close(centroid_attention(q, k, v, repeated), centroid_attention(q, k, v, repeated, reference=True))
    assert seen == []
    centroid_attention(q, k, v, distinct)
    assert seen == [1]
    with input_checks(False):  # nothing checked: the caller's idx may repeat one
        centroid_attention(q, k, v, distinct)
    assert seen == [1]
    layer = CentroidAttention(8, num_heads=2).double()
    x, u = torch.randn(1, 9, 8, dtype=torch.float64), torch.randn(1, 3, 8, dtype=torch.float64)
    seen.clear()
    layer(x, u, neighbor_idx=repeated)
    assert seen == []
    layer(x, u, neighbor_idx=distinct)
    assert seen == [1]


@pytest.mark.torch_compat
def test_auto_knn_attention_form_by_device_and_inputs_per_neighbor(monkeypatch: pytest.MonkeyPatch) -> None:
    """ "auto": on CUDA the fused kernel for any N / K (repeated neighbours too); without triton masked up to
    MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR, gather above, on CPU and for an unknown N / K (a caller's idx); explicit names
    are kept."""
    from attention import backends

    cuda, cpu, limit = torch.device("cuda"), torch.device("cpu"), backends.MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR

    def form(backend: str, device: torch.device, N: float, K: int = 1, distinct: bool = True) -> str:
        shape = {"N": N, "K": K, "D": 32, "dropout": 0.0, "distinct": distinct, "normalize": "inputs"}
        return backends.resolve("knn_attention", backend, device, shape, torch.float32)

    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    assert form("auto", cuda, limit) == form("auto", cuda, 16 * limit) == "triton"
    assert form("auto", cuda, 4, distinct=False) == "triton"  # it counts a repeated neighbour twice, as gather
    assert form("auto", cpu, 1) == "gather"
    monkeypatch.setitem(backends.INSTALLED, "triton", False)
    assert form("auto", cuda, limit) == "masked"
    assert form("auto", cuda, 1024, 24) == "masked"  # the point model's first stage
    assert form("auto", cuda, limit + 0.5) == "gather"
    assert form("auto", cuda, 4, distinct=False) == "gather"  # a caller's idx may repeat a neighbour
    assert form("auto", cpu, 1) == "gather"
    assert form("masked", cpu, 1) == "masked"
    assert form("gather", cuda, 1) == "gather"


@pytest.mark.torch_compat
@pytest.mark.parametrize("where", ["functional", "layer"])
def test_auto_knn_attention_uses_the_call_inputs_per_neighbor(where: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The layer sizes "auto" by its call's N / K; the functional with a caller's idx that repeats a neighbour stays
    on gather (CPU made to prefer "masked")."""
    from attention import backends
    from attention.centroid import functional as fn
    from attention.centroid import layer as layer_module

    monkeypatch.setitem(backends.AUTO_ORDER, ("knn_attention", "cpu"), ("masked", "gather"))
    B, H, M, N, C, K = 2, 2, 8, 30, 16, 5
    seen = []
    real = fn.masked_knn_attention
    monkeypatch.setattr(fn, "masked_knn_attention", lambda *a, **kw: seen.append(1) or real(*a, **kw))
    monkeypatch.setattr(layer_module, "masked_knn_attention", fn.masked_knn_attention)
    torch.manual_seed(0)
    layer = CentroidAttention(C, num_heads=H, num_neighbors=K).double()
    x, u = torch.randn(B, N, C, dtype=torch.float64), torch.randn(B, M, C, dtype=torch.float64)
    q, k, v = (torch.randn(B, H, n, 4, dtype=torch.float64) for n in (M, N, N))
    idx = torch.randint(0, N, (B, M, K))
    idx[..., 1] = idx[..., 0]  # a repeated neighbour in every row
    centroids = CentroidAttention(C, num_heads=H, num_neighbors=K, normalize="centroids").double()
    for limit, layer_used in ((N / K, [1]), (N / K - 0.5, [])):
        monkeypatch.setattr(backends, "MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR", limit)
        seen.clear()
        if where == "layer":
            layer(x, u)
            assert seen == layer_used, limit
            centroids(x, u)  # timed for normalize="inputs" only: "centroids" stays on gather
            assert seen == layer_used, limit
        else:
            centroid_attention(q, k, v, idx)
            assert seen == [], limit


@pytest.mark.torch_compat
@pytest.mark.parametrize("normalize", ["inputs", "centroids"])
def test_layer_attn_backends_agree_and_trace(normalize: str) -> None:
    torch.manual_seed(0)
    layers = {
        name: CentroidAttention(16, num_heads=2, num_neighbors=5, normalize=normalize, attn_backend=name).double()
        for name in ("gather", "masked")
    }
    layers["masked"].load_state_dict(layers["gather"].state_dict())
    x, u = torch.randn(2, 30, 16, dtype=torch.float64), torch.randn(2, 8, 16, dtype=torch.float64)
    assert_close(layers["masked"](x, u), layers["gather"](x, u))
    traced = torch.fx.symbolic_trace(layers["masked"], concrete_args={"mask": None, "neighbor_idx": None})
    assert_close(traced(x, u), layers["gather"](x, u))
    with pytest.raises(ValueError, match=r"unknown attn_backend 'dense'.*'gather', 'masked'"):
        CentroidAttention(16, num_heads=2, num_neighbors=5, attn_backend="dense")


def test_chunked_knn_path_equals_reference_wide_heads() -> None:
    """D = 60 and a ragged last chunk (rows = 4 of M = 13)."""
    B, H, M, N, D, K = 1, 2, 13, 63, 60, 6
    q, k, v = (torch.randn(B, H, n, D, dtype=torch.float64, requires_grad=True) for n in (M, N, N))
    idx = torch.randint(0, N, (B, M, K))
    rows_bytes = 4 * B * K * H * D * 8
    out = centroid_attention(q, k, v, idx, chunk_bytes=rows_bytes)
    ref = centroid_attention(q, k, v, idx, reference=True)
    assert_close(out, ref)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        assert_close(a, b)


def test_chunked_knn_path_bf16_gradients_match_reference() -> None:
    B, H, M, N, D, K = 1, 2, 9, 31, 60, 5
    q, k, v = (torch.randn(B, H, n, D, dtype=torch.bfloat16, requires_grad=True) for n in (M, N, N))
    idx = torch.randint(0, N, (B, M, K))
    out = centroid_attention(q, k, v, idx, chunk_bytes=100)
    ref = centroid_attention(q, k, v, idx, reference=True)
    assert out.dtype == torch.bfloat16
    assert_close(out, ref, atol=2e-2, rtol=2e-2)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        assert_close(a, b, atol=5e-2, rtol=5e-2)


def test_chunked_knn_path_bf16_matches_fp32() -> None:
    B, H, M, N, D, K = 1, 2, 9, 31, 8, 5
    q, k, v = (torch.randn(B, H, n, D, requires_grad=True) for n in (M, N, N))
    idx = torch.randint(0, N, (B, M, K))
    out32 = centroid_attention(q, k, v, idx, chunk_bytes=100)
    out16 = centroid_attention(q.bfloat16(), k.bfloat16(), v.bfloat16(), idx, chunk_bytes=100)
    assert out16.dtype == torch.bfloat16
    assert_close(out16.float(), out32, atol=5e-2, rtol=5e-2)
    out16.float().sum().backward()
    assert all(t.grad is not None and bool(torch.isfinite(t.grad).all()) for t in (q, k, v))


def test_chunked_knn_path_bf16_scatter_accumulates_in_float32() -> None:
    """Every centroid picks all N = 5 inputs (300 edges per key): the key and value gradients, scattered over those
    edges, match the float64 reference of the same bf16 inputs to about bf16 rounding (within 1% of their largest
    entry, which an accumulation in bf16 misses by 2-3%). The query gradient sums only K terms."""
    torch.manual_seed(0)
    B, H, M, N, D, K = 2, 2, 300, 5, 60, 5
    q, k, v = (torch.randn(B, H, n, D).bfloat16() for n in (M, N, N))
    idx = torch.stack([torch.randperm(N)[:K] for _ in range(B * M)]).view(B, M, K)
    g = torch.randn(B, H, M, D).bfloat16()
    low = [t.clone().requires_grad_(True) for t in (q, k, v)]
    high = [t.double().requires_grad_(True) for t in (q, k, v)]
    out = centroid_attention(*low, idx, chunk_bytes=4 * K * H * D * 2)  # 150 chunks of 4 centroid rows
    ref = centroid_attention(*high, idx, reference=True)
    assert out.dtype == torch.bfloat16
    assert_close(out.double(), ref, atol=3e-2, rtol=2e-2)
    grads = zip(torch.autograd.grad(out, low, g), torch.autograd.grad(ref, high, g.double()), (2e-2, 1e-2, 1e-2))
    for a, b, tol in grads:
        scale = b.abs().amax()
        assert_close(a.double() / scale, b / scale, atol=tol, rtol=0)


def test_centroid_normalization_is_soft_assignment() -> None:
    """normalize='centroids': weights are a softmax over centroids per input, then each row sums to one."""
    B, H, M, N, D = 1, 1, 4, 9, 3
    q, k, v = torch.randn(B, H, M, D), torch.randn(B, H, N, D), torch.randn(B, H, N, D)
    a = (q @ k.transpose(-1, -2) / D**0.5).softmax(dim=-2)
    a = a / (a.sum(-1, keepdim=True) + 1e-6)
    assert_close(centroid_attention(q, k, v, normalize="centroids"), a @ v)


def test_outputs_are_permutation_invariant_in_the_inputs() -> None:
    x, u = torch.randn(2, 40, 16), torch.randn(2, 8, 16)
    perm = torch.randperm(40)
    for k in (None, 6):
        for normalize in ("inputs", "centroids"):
            layer = CentroidAttention(16, num_heads=2, num_neighbors=k, normalize=normalize).eval()
            assert_close(layer(x[:, perm], u), layer(x, u), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("k", [None, 5])
@pytest.mark.parametrize("normalize", ["inputs", "centroids"])
def test_mask_excludes_padded_inputs(k: int | None, normalize: str) -> None:
    layer = CentroidAttention(12, num_heads=2, num_neighbors=k, normalize=normalize).eval()
    x, u = torch.randn(2, 30, 12), torch.randn(2, 6, 12)
    mask = torch.ones(2, 30, dtype=torch.bool)
    mask[1, 20:] = False
    garbage = x.clone()
    garbage[1, 20:] = 1e3 * torch.randn(10, 12)  # padded inputs hold anything
    out = layer(garbage, u, mask=mask)
    assert_close(out, layer(x, u, mask=mask))
    assert_close(out[1:], layer(x[1:, :20], u[1:]), atol=1e-5, rtol=1e-5)


def test_every_parameter_gets_a_gradient() -> None:
    blocks = [
        CentroidBlock(16, "fps", {"num_centroids": 8, "space": "features"}, num_heads=2, num_neighbors=5, num_steps=2),
        CentroidBlock(16, "linear", {"num_inputs": 32, "num_centroids": 8}, num_heads=2, num_steps=3),
        CentroidBlock(16, "dwconv2d", {"dim": 16, "grid_size": (4, 8)}, num_heads=2, normalize="centroids"),
        SelfAttentionBlock(16, num_heads=2, num_neighbors=6),
    ]
    x = torch.randn(2, 32, 16)
    for block in blocks:
        out = block(x)
        out = out if isinstance(out, torch.Tensor) else out.x
        out.square().mean().backward()
        for name, p in block.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, f"{type(block).__name__}.{name} got no gradient"


@pytest.mark.parametrize("name", sorted(CENTROID_INITS))
def test_every_init_builds_runs_and_keeps_shapes(name: str) -> None:
    B, N, C, M = 2, 64, 16, 16
    kwargs = {
        "fps": {"num_centroids": M},
        "random": {"num_centroids": M},
        "mean_pool": {"num_centroids": M},
        "kmeans": {"num_centroids": M, "num_iters": 3},
        "linear": {"num_inputs": N, "num_centroids": M},
        "dwconv2d": {"dim": C, "grid_size": (8, 8)},
    }[name]
    block = CentroidBlock(C, name, kwargs, num_heads=4, num_neighbors=8).eval()
    x, pos = torch.randn(B, N, C), torch.rand(B, N, 3)
    out = block(x, pos=pos)
    assert out.x.shape == (B, M, C) and out.pos.shape == (B, M, 3)
    assert bool(torch.isfinite(out.x).all())
    assert_close(block(x, pos=pos).x, out.x)  # eval is deterministic, random init included
    if out.index is not None:
        assert_close(out.pos, gather(pos, out.index))


def test_inits_do_what_they_say() -> None:
    x = torch.arange(8.0).view(1, 8, 1).expand(1, 8, 2).contiguous()
    assert_close(build_centroid_init("mean_pool", num_centroids=4)(x).x[0, :, 0], torch.tensor([0.5, 2.5, 4.5, 6.5]))
    pos = torch.tensor([[[0.0], [0.1], [0.2], [10.0], [10.1], [10.2]]])
    km = build_centroid_init("kmeans", num_centroids=2, num_iters=3)(pos.expand(1, 6, 1).repeat(1, 1, 2), pos=pos)
    assert_close(km.pos.sort(1).values[0, :, 0], torch.tensor([0.1, 10.1]))
    fps = build_centroid_init("fps", num_centroids=2)(pos, pos=pos)
    assert fps.index.tolist() == [[0, 5]]
    dw = build_centroid_init("dwconv2d", dim=1, grid_size=(4, 4))
    grid = torch.ones(1, 16, 1)
    assert_close(dw(grid).x[0, 0, 0], torch.tensor(4 / 9))  # averaging filter, corner has 4 of 9 taps in the grid


def test_unknown_init_lists_choices() -> None:
    with pytest.raises(ValueError, match=r"choose one of.*fps.*kmeans"):
        build_centroid_init("voronoi", num_centroids=3)


def test_bf16_autocast_on_cpu_runs() -> None:
    block = CentroidBlock(32, "fps", {"num_centroids": 16, "space": "features"}, num_heads=4, num_neighbors=8)
    sa = SelfAttentionBlock(32, num_heads=4)
    x = torch.randn(2, 64, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = block(sa(x)).x
        out.float().square().mean().backward()
    assert out.shape == (2, 16, 32) and bool(torch.isfinite(out.float()).all())


@pytest.mark.torch_compat
def test_knn_path_never_builds_the_dense_score_matrix(monkeypatch: pytest.MonkeyPatch) -> None:
    """No tensor of B*H*M*N elements (or more) is created by the KNN forward + backward."""
    B, N, M, C, H, K = 1, 512, 128, 16, 4, 8
    dense_numel = B * H * M * N
    biggest = []

    class Spy(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in out if isinstance(out, (tuple, list)) else [out]:
                if isinstance(t, torch.Tensor):
                    biggest.append(t.numel())
            return out

    layer = CentroidAttention(C, num_heads=H, num_neighbors=K)
    x, u = torch.randn(B, N, C, requires_grad=True), torch.randn(B, M, C, requires_grad=True)
    # KNN distances are chunked: give them a budget below the dense matrix too.
    monkeypatch.setattr(layer, "knn_backend", "torch")
    import attention.points as P

    real_search = P.knn_search  # the layer's search (its inputs checked once by the layer)
    monkeypatch.setattr("attention.centroid.layer.knn_search", lambda *a: real_search(*a, chunk_bytes=4 * 16 * N))
    with Spy():
        layer(x, u).sum().backward()
    assert max(biggest) < dense_numel, f"largest tensor {max(biggest)} >= dense scores {dense_numel}"
    # The gathered keys / values exist one chunk at a time, so the largest tensors are KNN's candidate refinement,
    # (B, M, 1.25 K + 4, C), and the (B, M, K, H) scores.
    assert max(biggest) <= 2 * B * M * K * C


def _bad_idx() -> torch.Tensor:
    """Neighbour indices of 2 clouds of N = 10 inputs, one of them out of range (would read the next cloud)."""
    idx = torch.zeros(2, 4, 3, dtype=torch.long)
    idx[0, 0, 0] = 10
    return idx


def test_fps_init_with_mask_starts_at_a_real_point_and_dwconv_pos_follows_the_conv() -> None:
    x, pos = torch.randn(2, 10, 4), torch.rand(2, 10, 3)
    mask = torch.ones(2, 10, dtype=torch.bool)
    mask[0, :3] = False
    out = build_centroid_init("fps", num_centroids=4)(x, pos=pos, mask=mask)
    assert out.index[0, 0] == 3 and bool(mask.gather(1, out.index).all())
    dw = build_centroid_init("dwconv2d", dim=4, grid_size=(8, 8), kernel_size=5, stride=4)
    res = dw(torch.randn(1, 64, 4), pos=torch.rand(1, 64, 3))
    assert res.x.shape == (1, 4, 4) and res.pos.shape == (1, 4, 3) and dw.num_centroids == 4


@pytest.mark.torch_compat
@pytest.mark.parametrize("grid,kernel,stride", [((14, 14), 3, 2), ((7, 9), 3, 2), ((8, 8), 5, 4), ((5, 6), 3, 1)])
def test_dwconv_init_compiled_equals_the_library_conv_in_outputs_and_gradients(grid, kernel, stride) -> None:
    """Under torch.compile the init's conv is written as shifted multiply-adds (no convolution in the graph); eager
    mode runs nn.Conv2d, the reference: outputs and the gradients of the tokens, the weight and the bias agree."""
    torch.manual_seed(0)
    dw = build_centroid_init("dwconv2d", dim=6, grid_size=grid, kernel_size=kernel, stride=stride)
    nn.init.normal_(dw.conv.weight)
    nn.init.normal_(dw.conv.bias)
    base = torch.randn(3, 1 + grid[0] * grid[1], 6)  # a class token first, as the vision block slices it off
    ops = []

    def backend(gm: torch.fx.GraphModule, example_inputs):
        ops.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return torch._dynamo.lookup_backend("aot_eager")(gm, example_inputs)

    torch._dynamo.reset()
    compiled = torch.compile(dw, backend=backend, fullgraph=True)
    results = []
    for fn in (dw, compiled):
        dw.zero_grad()
        x = base.clone().requires_grad_(True)
        u = fn(x[:, 1:]).x
        (u * torch.linspace(-1, 1, u.numel()).view_as(u)).sum().backward()
        results.append((u, x.grad, dw.conv.weight.grad.clone(), dw.conv.bias.grad.clone()))
    assert ops and not any("conv" in op for op in ops), ops
    assert results[0][0].shape == (3, dw.num_centroids, 6)
    for ref, out in zip(*results):
        assert_close(out, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.torch_compat
def test_dwconv_init_compiled_under_autocast_returns_the_library_conv_dtype() -> None:
    """bf16 autocast casts the conv to bf16: the compiled form's multiply-adds run on the same bf16 operands."""
    torch.manual_seed(0)
    dw = build_centroid_init("dwconv2d", dim=8, grid_size=(6, 6))
    nn.init.normal_(dw.conv.weight)
    x = torch.randn(2, 36, 8)
    torch._dynamo.reset()
    compiled = torch.compile(dw, backend="aot_eager", fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref, out = dw(x).x, compiled(x).x
    assert ref.dtype == out.dtype == torch.bfloat16
    assert_close(out.float(), ref.float(), rtol=0.02, atol=0.02)
    # without autocast, mixed dtypes fail as the conv's do in eager mode, not promoted silently
    with pytest.raises(ValueError, match=r"tokens are torch\.bfloat16 but the conv's weight is torch\.float32"):
        torch.compile(dw, backend="aot_eager")(x.bfloat16())


def test_kmeans_init_takes_separate_fps_and_knn_backends() -> None:
    init = build_centroid_init("kmeans", num_centroids=4, fps_backend="torch", knn_backend="torch")
    assert init(torch.randn(1, 20, 4), pos=torch.rand(1, 20, 3)).x.shape == (1, 4, 4)


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: CentroidAttention(16, 3), ValueError, "divisible"),
        (lambda: CentroidAttention(16, 0), ValueError, "num_heads must be >= 1"),
        (lambda: CentroidAttention(16, 4)(torch.randn(2, 10), torch.randn(2, 4, 16)), ValueError, r"\(B, N, 16\)"),
        (lambda: CentroidAttention(16, 4)(torch.randn(2, 10, 8), torch.randn(2, 4, 8)), ValueError, r"\(B, N, 16\)"),
        (lambda: CentroidAttention(16, 4)(torch.randn(2, 10, 16), torch.randn(2, 12, 16)), ValueError, "M <= N"),
        (lambda: CentroidAttention(16, 4, 11)(torch.randn(2, 10, 16), torch.randn(2, 4, 16)), ValueError, "K <= N"),
        (lambda: CentroidAttention(16, 4)(torch.randn(2, 0, 16), torch.randn(2, 0, 16)), ValueError, "empty"),
        (lambda: CentroidAttention(16, 4)(torch.randn(2, 10, 16), torch.randn(3, 4, 16)), ValueError, "batch size"),
        (
            lambda: CentroidAttention(16, 4)(torch.full((2, 10, 16), float("nan")), torch.randn(2, 4, 16)),
            ValueError,
            "NaN",
        ),
        (
            lambda: CentroidAttention(16, 4)(torch.randn(2, 10, 16), torch.randn(2, 4, 16), mask=torch.ones(2, 9)),
            ValueError,
            "mask",
        ),
        (
            lambda: CentroidAttention(16, 4)(torch.ones(2, 10, 16, dtype=torch.long), torch.randn(2, 4, 16)),
            TypeError,
            "floating",
        ),
        (lambda: CentroidAttention(16, 4, normalize="rows"), ValueError, "normalize"),
        (lambda: build_centroid_init("fps", num_centroids=4)(torch.randn(1, 10, 4)), ValueError, "pos"),
        (lambda: build_centroid_init("linear", num_inputs=8, num_centroids=2)(torch.randn(1, 9, 4)), ValueError, "N=8"),
        (lambda: build_centroid_init("dwconv2d", dim=4, grid_size=(3, 3))(torch.randn(1, 10, 4)), ValueError, "3 x 3"),
        (lambda: build_centroid_init("dwconv2d", dim=4, grid_size=(8, 8), kernel_size=2), ValueError, "odd"),
        (
            lambda: CentroidAttention(8, 2)(torch.randn(2, 10, 8), torch.randn(2, 4, 8), neighbor_idx=_bad_idx()),
            ValueError,
            r"N=10 inputs",
        ),
        (
            lambda: CentroidAttention(8, 2)(
                torch.randn(2, 10, 8), torch.randn(2, 4, 8), neighbor_idx=torch.zeros(2, 4, 3)
            ),
            TypeError,
            "int64",
        ),
        (
            lambda: centroid_attention(*(torch.randn(2, 2, n, 4) for n in (3, 10, 10)), _bad_idx()[:, :3]),
            ValueError,
            r"N=10 inputs",
        ),
        (
            lambda: centroid_attention(torch.randn(2, 3, 4), torch.randn(2, 2, 10, 4), torch.randn(2, 2, 10, 4)),
            ValueError,
            r"\(B, H, M, D\)",
        ),
        (
            lambda: CentroidAttention(8, 2)(
                torch.randn(2, 10, 8), torch.randn(2, 4, 8), mask=torch.tensor([[True] * 10, [False] * 10])
            ),
            ValueError,
            "all-False",
        ),
        (
            lambda: build_centroid_init("random", num_centroids=4)(
                torch.randn(1, 10, 4), mask=torch.tensor([[True, True] + [False] * 8])
            ),
            ValueError,
            "M=4 real inputs",
        ),
        (
            lambda: build_centroid_init("mean_pool", num_centroids=5)(
                torch.randn(1, 10, 4), mask=torch.tensor([[True] * 5 + [False] * 5])
            ),
            ValueError,
            "all padding",
        ),
    ],
)
def test_bad_input_is_named(call, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


@pytest.mark.torch_compat
@pytest.mark.parametrize("num_neighbors", [None, 4])
def test_one_forward_traces_without_checks_or_host_syncs(num_neighbors: int | None) -> None:
    """FX follows the layer's one forward: no validation, no isfinite reduction, no global flag in the graph; the
    feature-space KNN and the chunked KNN product are single leaf calls; the traced graph equals eager."""
    torch.manual_seed(0)
    layer = CentroidAttention(16, num_heads=4, num_neighbors=num_neighbors, num_steps=2).eval()
    x, u = torch.randn(2, 10, 16), torch.randn(2, 5, 16)
    gm = torch.fx.symbolic_trace(layer, concrete_args={"mask": None, "neighbor_idx": None})
    assert "isfinite" not in gm.code and "check" not in gm.code
    if num_neighbors is not None:
        assert gm.code.count("feature_neighbors(") == 2 and gm.code.count("knn_centroid_attention(") == 2
    assert_close(gm(x, u), layer(x, u))
    if num_neighbors is None:  # the dense path is TorchScript-able (the vision models' centroid block)
        assert_close(torch.jit.script(layer)(x, u), layer(x, u))
    with pytest.raises(ValueError, match="M <= N"):  # eager still validates
        layer(x, torch.randn(2, 11, 16))


@pytest.mark.parametrize("validate", [True, False])
def test_a_knn_forward_scans_its_inputs_for_nan_once(monkeypatch: pytest.MonkeyPatch, validate: bool) -> None:
    """The layer checks x and the centroids once per forward (each NaN/Inf scan is a host sync on CUDA), and its
    neighbour search (every step) does not scan them again; with ``validate_inputs=False`` nothing is scanned. The
    public feature_neighbors still checks."""
    scanned = []
    isfinite = torch.isfinite
    monkeypatch.setattr(torch, "isfinite", lambda t: scanned.append(tuple(t.shape)) or isfinite(t))
    torch.manual_seed(0)
    layer = CentroidAttention(16, num_heads=4, num_neighbors=4, num_steps=3, validate_inputs=validate)
    x, u = torch.randn(2, 10, 16), torch.randn(2, 5, 16)
    layer(x, u)
    assert scanned == ([(2, 10, 16), (2, 5, 16)] if validate else [])
    scanned.clear()
    feature_neighbors(u, x, 4, None, "auto")
    assert sorted(scanned) == [(2, 5, 16), (2, 10, 16)]
    with pytest.raises(ValueError, match="NaN or Inf"):
        feature_neighbors(u, x.index_fill(1, torch.tensor([3]), float("nan")), 4, None, "auto")
    with pytest.raises(ValueError, match="k=11 neighbours requested but ref has only N=10"):
        feature_neighbors(u, x, 11, None, "auto", validate=False)  # the cheap k check stays


# CUDA cases of the equivalence tests (run by tools/gpu_check.py; skipped without a GPU).


@pytest.mark.gpu
@pytest.mark.parametrize("normalize", ["inputs", "centroids"])
def test_knn_path_on_cuda_equals_cpu_and_k_equal_n_equals_dense(normalize: str) -> None:
    torch.manual_seed(1)
    knn_layer = CentroidAttention(60, num_heads=4, num_neighbors=9, num_steps=2, normalize=normalize).double()
    x = torch.randn(3, 63, 60, dtype=torch.float64, requires_grad=True)
    u = torch.randn(3, 13, 60, dtype=torch.float64, requires_grad=True)
    out = knn_layer(x, u)
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, [x, u, *knn_layer.parameters()], g)
    xc, uc = (t.detach().cuda().requires_grad_(True) for t in (x, u))
    knn_layer.cuda()
    out_c = knn_layer(xc, uc)
    assert_close(out_c.cpu(), out)
    for a, b in zip(torch.autograd.grad(out_c, [xc, uc, *knn_layer.parameters()], g.cuda()), grads):
        assert_close(a.cpu(), b)
    dense = CentroidAttention(60, num_heads=4, num_steps=2, normalize=normalize).double().cuda()
    full = CentroidAttention(60, num_heads=4, num_neighbors=63, num_steps=2, normalize=normalize).double().cuda()
    full.load_state_dict(dense.state_dict())
    assert_close(full(xc, uc), dense(xc, uc))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunks", ["several", "default"])  # a few rows per chunk; the CUDA default (one chunk here)
def test_chunked_knn_path_on_cuda_equals_reference(dtype: torch.dtype, chunks: str) -> None:
    B, H, M, N, D, K = 2, 3, 13, 63, 60, 7
    idx = torch.randint(0, N, (B, M, K), device="cuda")
    budget = 4 * B * K * H * D * 4 if chunks == "several" else None
    _assert_cuda_knn_path_equals_reference(dtype, (B, H, M, N, D), idx, chunk_bytes=budget, backend="gather")


def _assert_cuda_knn_path_equals_reference(dtype: torch.dtype, shape: tuple, idx: torch.Tensor, **kw) -> None:
    """Outputs and q, k, v gradients of ``centroid_attention(..., **kw)`` on CUDA against the reference, with a
    padding mask that leaves every centroid a real neighbour."""
    B, H, M, N, D = shape
    q, k, v = (torch.randn(B, H, n, D, device="cuda", dtype=dtype, requires_grad=True) for n in (M, N, N))
    mask = torch.rand(B, N, device="cuda") > 0.2
    mask[:, idx[:, :, 0]] = True
    tol = {} if dtype == torch.float32 else {"atol": 5e-2, "rtol": 5e-2}
    ref = centroid_attention(q, k, v, idx, mask=mask, reference=True, normalize=kw.get("normalize", "inputs"))
    out = centroid_attention(q, k, v, idx, mask=mask, **kw)
    assert out.dtype == dtype
    assert_close(out, ref, **tol)
    g = torch.randn_like(ref)
    for a, b in zip(torch.autograd.grad(out, (q, k, v), g), torch.autograd.grad(ref, (q, k, v), g)):
        assert_close(a, b, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("normalize", ["inputs", "centroids"])
def test_masked_knn_path_on_cuda_equals_reference(dtype: torch.dtype, normalize: str) -> None:
    B, H, M, N, D, K = 2, 4, 64, 128, 16, 24
    idx = _distinct_neighbours(B, M, N, K).cuda()
    _assert_cuda_knn_path_equals_reference(dtype, (B, H, M, N, D), idx, normalize=normalize, backend="masked")


@pytest.mark.gpu
def test_centroid_block_bf16_autocast_on_cuda_is_finite() -> None:
    torch.manual_seed(0)
    block = CentroidBlock(64, "fps", {"num_centroids": 25}, num_heads=4, num_neighbors=8).cuda()
    x, pos = torch.randn(4, 100, 64, device="cuda"), torch.rand(4, 100, 3, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        out = block(x, pos=pos).x
    assert out.shape == (4, 25, 64)
    out.float().sum().backward()
    assert bool(torch.isfinite(out.float()).all())
    assert all(p.grad is None or bool(torch.isfinite(p.grad).all()) for p in block.parameters())
