"""The ``"vector"`` and ``"max"`` aggregations of centroid attention: against PyG's ``PointTransformerConv`` (Point
Transformer's vector attention) and ``PointNetConv`` (PointNet++'s max-pooled set abstraction) run in the same test,
against a plain per-edge loop written out here (grouped vector attention, Point Transformer v2), outputs and
gradients, and the translation invariance they claim when read through relative positions."""

from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.testing import assert_close

from attention import (
    AGGREGATIONS,
    CentroidAttention,
    CentroidBlock,
    gather,
    grouped_vector_attention,
    knn,
    knn_vector_attention,
)


def _problem(dtype: torch.dtype = torch.float32, B: int = 2, N: int = 23, M: int = 7, C: int = 12, K: int = 5):
    x = torch.randn(B, N, C, dtype=dtype, requires_grad=True)
    pos = torch.randn(B, N, 3, dtype=dtype, requires_grad=True)
    sel = torch.stack([torch.randperm(N)[:M] for _ in range(B)])
    u = gather(x.detach(), sel).requires_grad_()
    upos = gather(pos.detach(), sel).requires_grad_()
    idx = torch.stack([torch.stack([torch.randperm(N)[:K] for _ in range(M)]) for _ in range(B)])
    return x, u, pos, upos, idx


def _loop_reference(layer: CentroidAttention, x, u, pos, upos, idx):
    """Grouped vector attention per (centroid, neighbour) edge in a plain loop over the K neighbours: relation
    q_i - k_j + delta_ij, logits w2(relu(w1(relation))) per group, softmax over the neighbours, values v_j + delta_ij
    weighted group by group."""
    B, N, C = x.shape
    M, K, G = u.shape[1], idx.shape[-1], layer.num_heads
    q = layer.q(layer.norm_q(u))
    k, v = layer.kv(layer.norm_kv(x)).view(B, N, 2, C).unbind(2)
    logits, values = [], []
    for j in range(K):
        nb = idx[:, :, j]
        delta = 0.0
        if layer.pos_enc is not None:
            delta = layer.pos_enc(torch.stack([pos[b, nb[b]] for b in range(B)]) - upos)  # (B, M, C)
        kj = torch.stack([k[b, nb[b]] for b in range(B)])
        vj = torch.stack([v[b, nb[b]] for b in range(B)])
        logits.append(layer.weight_enc(q - kj + delta))  # (B, M, G)
        values.append((vj + delta).view(B, M, G, C // G))
    a = torch.stack(logits, -1).softmax(-1)  # (B, M, G, K)
    out = sum(a[..., j, None] * values[j] for j in range(K))
    return u + layer.proj(out.reshape(B, M, C))


def _grads_match(out, ref, inputs, **tol) -> None:
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, inputs, g, retain_graph=True)  # out and ref may share their first layers
    for a, b in zip(grads, torch.autograd.grad(ref, inputs, g)):
        assert_close(a, b, **tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("pos_encoding", [False, True])
def test_vector_equals_loop_reference(dtype: torch.dtype, pos_encoding: bool) -> None:
    torch.manual_seed(0)
    layer = CentroidAttention(12, num_heads=3, num_neighbors=5, aggregation="vector", pos_encoding=pos_encoding)
    layer = layer.to(dtype)
    x, u, pos, upos, idx = _problem(dtype)
    out = layer(x, u, neighbor_idx=idx, pos=pos, centroid_pos=upos)
    ref = _loop_reference(layer, x, u, pos, upos, idx)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {}
    assert_close(out, ref, **tol)
    positions = [pos, upos] if pos_encoding else []
    _grads_match(out, ref, [x, u, *positions, *layer.parameters()], **tol)


@pytest.mark.parametrize("normalize", ["inputs", "centroids"])
@pytest.mark.parametrize("pos_encoding", [False, True])
@pytest.mark.parametrize("chunk_bytes", [None, 64])
def test_factored_vector_path_equals_per_edge_form(normalize: str, pos_encoding: bool, chunk_bytes) -> None:
    # knn_vector_attention (the layer's path: the logits' first layer moved through q - k + delta, values by chunked
    # gathers) against grouped_vector_attention over the per-edge relations and values, padded inputs included
    torch.manual_seed(7)
    layer = CentroidAttention(12, num_heads=4, num_neighbors=5, aggregation="vector", pos_encoding=pos_encoding,
                              normalize=normalize).double()  # fmt: skip
    x, u, pos, upos, idx = _problem(torch.float64)
    mask = torch.rand(x.shape[:2]) > 0.2
    B, N, C = x.shape
    M = u.shape[1]
    kv = layer.kv(layer.norm_kv(x))
    rel, vn = layer._edges(u, kv, idx, pos, upos)
    ref = grouped_vector_attention(layer.weight_enc(rel), vn, idx, N, mask=mask, normalize=normalize, dropout_p=0.0,
                                   eps=1e-6)  # fmt: skip
    fc1, act, fc2 = layer.weight_enc
    k, v = kv.view(B, N, 2, C).unbind(2)
    pos_args = {}
    if pos_encoding:
        enc = layer.pos_enc
        pos_args = {"pos_hidden": enc.act(enc.fc1(gather(pos, idx) - upos.unsqueeze(2))),
                    "pos_weight": enc.fc2.weight, "pos_bias": enc.fc2.bias}  # fmt: skip
    out = knn_vector_attention(layer.q(layer.norm_q(u)), k, v, idx, (fc1.weight, fc1.bias, lambda t: fc2(act(t))),
                               mask, normalize, chunk_bytes=chunk_bytes, **pos_args)  # fmt: skip
    assert out.shape == (B, 4, M, 3)
    assert_close(out, ref)
    positions = [pos, upos] if pos_encoding else []
    params = [p for n, p in layer.named_parameters() if not n.startswith("proj.")]  # the output projection comes after
    _grads_match(out, ref, [x, u, *positions, *params])


def _edge_index(idx: torch.Tensor, N: int, M: int) -> torch.Tensor:
    """PyG's bipartite edges (source: input j of the flattened batch, target: centroid i) of (B, M, K) neighbours."""
    B, _, K = idx.shape
    src = (idx + (torch.arange(B) * N).view(B, 1, 1)).reshape(-1)
    dst = (torch.arange(B * M).view(B, M, 1).expand(B, M, K)).reshape(-1)
    return torch.stack([src, dst])


class _Negated(nn.Module):
    """PyG encodes p_i - p_j (target minus source); the layer encodes p_j - p_i."""

    def __init__(self, enc: nn.Module) -> None:
        super().__init__()
        self.enc = enc

    def forward(self, rel: torch.Tensor) -> torch.Tensor:
        return self.enc(-rel)


def test_vector_with_one_group_per_channel_is_pyg_point_transformer_conv() -> None:
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(1)
    C, K = 8, 4
    layer = CentroidAttention(C, num_heads=C, num_neighbors=K, aggregation="vector", pos_encoding=True,
                              norm_layer=None).double()  # fmt: skip
    conv = pyg.PointTransformerConv(C, C, pos_nn=_Negated(layer.pos_enc), attn_nn=layer.weight_enc,
                                    add_self_loops=False).double()  # fmt: skip
    wk, wv = layer.kv.weight.chunk(2)
    with torch.no_grad():
        conv.lin_dst.weight.copy_(layer.q.weight)  # q of the centroid (target)
        conv.lin_src.weight.copy_(wk)  # k of the input (source)
        conv.lin.weight.copy_(wv)  # v of the input
    x, u, pos, upos, idx = _problem(torch.float64, N=21, M=6, C=C, K=K)
    B, N, M = x.shape[0], x.shape[1], u.shape[1]
    out = layer(x, u, neighbor_idx=idx, pos=pos, centroid_pos=upos)
    y = conv((x.reshape(B * N, C), u.reshape(B * M, C)), (pos.reshape(B * N, 3), upos.reshape(B * M, 3)),
             _edge_index(idx, N, M))  # fmt: skip
    ref = u + layer.proj(y.view(B, M, C))
    assert_close(out, ref)
    shared = [x, u, pos, upos, *layer.pos_enc.parameters(), *layer.weight_enc.parameters(), *layer.proj.parameters()]
    g = torch.randn_like(out)
    grads = torch.autograd.grad(out, [*shared, layer.q.weight, layer.kv.weight], g)
    ref_grads = torch.autograd.grad(ref, [*shared, conv.lin_dst.weight, conv.lin_src.weight, conv.lin.weight], g)
    for a, b in zip(grads, [*ref_grads[:-2], torch.cat(ref_grads[-2:])]):
        assert_close(a, b)


class _PointNetLocal(nn.Module):
    """PointNetConv's local MLP over [x_j, p_j - p_i] as the layer computes it: v(x_j) + delta(p_j - p_i)."""

    def __init__(self, layer: CentroidAttention) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, msg: torch.Tensor) -> torch.Tensor:
        C = self.layer.dim
        v = msg[:, :C] @ self.layer.kv.weight[C:].T
        return v + self.layer.pos_enc(msg[:, C:])


def test_max_is_pyg_pointnet_conv() -> None:
    pyg = pytest.importorskip("torch_geometric.nn")
    torch.manual_seed(2)
    C, K = 8, 4
    layer = CentroidAttention(C, num_heads=2, num_neighbors=K, aggregation="max", pos_encoding=True,
                              norm_layer=None).double()  # fmt: skip
    conv = pyg.PointNetConv(local_nn=_PointNetLocal(layer), add_self_loops=False)
    x, u, pos, upos, idx = _problem(torch.float64, N=21, M=6, C=C, K=K)
    B, N, M = x.shape[0], x.shape[1], u.shape[1]
    out = layer(x, u, neighbor_idx=idx, pos=pos, centroid_pos=upos)
    y = conv((x.reshape(B * N, C), None), (pos.reshape(B * N, 3), upos.reshape(B * M, 3)), _edge_index(idx, N, M))
    ref = u + layer.proj(y.view(B, M, C))
    assert_close(out, ref)
    _grads_match(out, ref, [x, u, pos, upos, layer.kv.weight, *layer.pos_enc.parameters(), *layer.proj.parameters()])


def test_max_gradcheck_and_masked_neighbours() -> None:
    torch.manual_seed(3)
    layer = CentroidAttention(6, num_heads=2, num_neighbors=3, aggregation="max", pos_encoding=True,
                              pos_hidden=4).double()  # fmt: skip
    x = torch.randn(1, 9, 6, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(1, 9, 3, dtype=torch.float64, requires_grad=True)
    u, upos = x[:, :4].detach().clone().requires_grad_(), pos[:, :4].detach().clone().requires_grad_()
    idx = knn(upos.detach(), pos.detach(), 3)[1]
    assert torch.autograd.gradcheck(lambda *t: layer(t[0], t[1], neighbor_idx=idx, pos=t[2], centroid_pos=t[3]),
                                    (x, u, pos, upos))  # fmt: skip
    # a padded input is never the maximum: the output equals the one without that input among the neighbours
    mask = torch.ones(1, 9, dtype=torch.bool)
    mask[0, idx[0, 0, 2]] = False
    masked = layer(x, u, mask=mask, neighbor_idx=idx, pos=pos, centroid_pos=upos)
    keep = layer(x, u, neighbor_idx=torch.cat([idx[..., :2], idx[..., :1]], -1), pos=pos, centroid_pos=upos)
    assert_close(masked[0, 0], keep[0, 0])


@pytest.mark.parametrize("aggregation", ["vector", "max"])
@pytest.mark.parametrize("space", ["feature", "pos"])
def test_relative_positions_only_give_translation_invariance(aggregation: str, space: str) -> None:
    torch.manual_seed(4)
    block = CentroidBlock(16, "fps", {"num_centroids": 9}, num_heads=4, num_neighbors=6, neighbor_space=space,
                          pos_encoding=True, aggregation=aggregation, num_steps=2).eval()  # fmt: skip
    x, pos = torch.randn(2, 40, 16), torch.rand(2, 40, 3)
    shift = torch.tensor([3.0, -7.0, 11.0])
    out = block(x, pos)
    assert_close(block(x, pos + shift).x, out.x, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(block(x, pos * 2.0).x, out.x, atol=1e-3)  # it does read the offsets


@pytest.mark.parametrize("aggregation", ["vector", "max"])
def test_attention_weights_of_edge_aggregations(aggregation: str) -> None:
    torch.manual_seed(5)
    layer = CentroidAttention(12, num_heads=3, num_neighbors=5, aggregation=aggregation, pos_encoding=True).eval()
    B, N, M, C = 2, 19, 6, 12
    x, pos = torch.randn(B, N, C), torch.rand(B, N, 3)
    u, upos = x[:, :M], pos[:, :M]
    attn, idx = layer.attention_weights(x, u, pos=pos, centroid_pos=upos)
    assert attn.shape == (B, 3, M, 5) and idx.shape == (B, M, 5)
    assert_close(attn.sum(-1), torch.ones(B, 3, M))
    if aggregation == "vector":  # the weights applied to the values give the layer's own update
        v = layer.kv(layer.norm_kv(x))[..., C:]
        vn = (gather(v, idx) + layer.pos_enc(gather(pos, idx) - upos.unsqueeze(2))).view(B, M, 5, 3, 4)
        out = torch.einsum("bgmk,bmkgd->bmgd", attn, vn).reshape(B, M, C)
        assert_close(layer(x, u, pos=pos, centroid_pos=upos), u + layer.proj(out), atol=1e-5, rtol=1e-5)


def test_grouped_vector_attention_with_one_group_per_head_is_dot_weighting() -> None:
    # handed the dot product's scaled scores as logits, the grouped form gives the multi-head attention's output
    torch.manual_seed(6)
    B, M, K, H, D, N = 2, 5, 4, 3, 4, 11
    q, kn, vn = torch.randn(B, H, M, D), torch.randn(B, M, K, H, D), torch.randn(B, M, K, H, D)
    idx = torch.randint(0, N, (B, M, K))
    scores = torch.einsum("bhmd,bmkhd->bmkh", q, kn) * D**-0.5
    out = grouped_vector_attention(scores, vn.reshape(B, M, K, H * D), idx, N, mask=None, normalize="inputs",
                                   dropout_p=0.0, eps=1e-6)  # fmt: skip
    ref = torch.einsum("bmkh,bmkhd->bhmd", scores.softmax(2), vn)
    assert_close(out, ref)


def test_bad_aggregation_settings_are_named() -> None:
    assert AGGREGATIONS == ("dot", "vector", "max")
    with pytest.raises(ValueError, match="aggregation must be one of"):
        CentroidAttention(8, aggregation="mean")
    with pytest.raises(ValueError, match="attn_backend='masked' is a form of the dot-product attention"):
        CentroidAttention(8, num_neighbors=3, aggregation="vector", attn_backend="masked")
    layer = CentroidAttention(8, num_heads=2, aggregation="max")
    with pytest.raises(ValueError, match="aggregation='max' needs neighbours"):
        layer(torch.randn(1, 6, 8), torch.randn(1, 3, 8))
