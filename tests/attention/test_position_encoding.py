"""Relative position encoding, LayerScale and position-space neighbours of centroid attention: against plain
references written out here (outputs and gradients), and the invariances they claim."""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from attention import (
    CentroidAttention,
    CentroidBlock,
    LayerScale,
    RelativePositionEncoding,
    SelfAttentionBlock,
    gather,
    knn,
)


def _reference_step(layer: CentroidAttention, x, u, pos, upos, idx):
    """One step of Point Transformer's form with a dot product, per (centroid, neighbour) edge, in plain loops over
    the K neighbours: logits q_i . (k_j + delta_ij) / sqrt(D), softmax over the neighbours, values v_j + delta_ij."""
    B, N, C = x.shape
    M, K = u.shape[1], idx.shape[-1]
    H, D = layer.num_heads, layer.head_dim
    q = layer.q(layer.norm_q(u)).view(B, M, H, D)
    k, v = layer.kv(layer.norm_kv(x)).view(B, N, 2, H, D).unbind(2)
    logits, values = [], []
    for j in range(K):
        nb = idx[:, :, j]  # (B, M)
        rel = torch.stack([pos[b, nb[b]] for b in range(B)]) - upos  # (B, M, P)
        delta = layer.pos_enc(rel).view(B, M, H, D)
        kj = torch.stack([k[b, nb[b]] for b in range(B)]) + delta  # (B, M, H, D)
        vj = torch.stack([v[b, nb[b]] for b in range(B)]) + delta
        logits.append((q * kj).sum(-1) / D**0.5)  # (B, M, H)
        values.append(vj)
    a = torch.stack(logits, -1).softmax(-1)  # (B, M, H, K)
    out = sum(a[..., j, None] * values[j] for j in range(K))  # (B, M, H, D)
    return u + layer.proj(out.reshape(B, M, C))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_pos_encoding_equals_edge_reference(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    B, N, M, C, K = 2, 23, 7, 12, 5  # odd sizes
    layer = CentroidAttention(C, num_heads=3, num_neighbors=K, pos_encoding=True).to(dtype)
    x = torch.randn(B, N, C, dtype=dtype, requires_grad=True)
    pos = torch.randn(B, N, 3, dtype=dtype, requires_grad=True)
    sel = torch.stack([torch.randperm(N)[:M] for _ in range(B)])
    u = gather(x.detach(), sel).requires_grad_()
    upos = gather(pos.detach(), sel).requires_grad_()
    idx = torch.stack([torch.stack([torch.randperm(N)[:K] for _ in range(M)]) for _ in range(B)])
    out = layer(x, u, neighbor_idx=idx, pos=pos, centroid_pos=upos)
    ref = _reference_step(layer, x, u, pos, upos, idx)
    tol = {"atol": 1e-5, "rtol": 1e-5} if dtype == torch.float32 else {}
    assert_close(out, ref, **tol)
    g = torch.randn_like(out)
    inputs = [x, u, pos, upos, *layer.parameters()]
    grads = torch.autograd.grad(out, inputs, g)
    grads_ref = torch.autograd.grad(ref, inputs, g)
    for a, b in zip(grads, grads_ref):
        assert_close(a, b, **tol)


def test_pos_encoding_gradcheck() -> None:
    torch.manual_seed(1)
    layer = CentroidAttention(6, num_heads=2, num_neighbors=3, pos_encoding=True, pos_hidden=4).double()
    x = torch.randn(1, 9, 6, dtype=torch.float64, requires_grad=True)
    pos = torch.randn(1, 9, 3, dtype=torch.float64, requires_grad=True)
    u, upos = x[:, :4].detach().clone().requires_grad_(), pos[:, :4].detach().clone().requires_grad_()
    idx = knn(upos.detach(), pos.detach(), 3)[1]
    assert torch.autograd.gradcheck(lambda *t: layer(t[0], t[1], neighbor_idx=idx, pos=t[2], centroid_pos=t[3]),
                                    (x, u, pos, upos))  # fmt: skip


@pytest.mark.parametrize("space", ["feature", "pos"])
def test_pos_encoding_reads_only_offsets(space: str) -> None:
    # the block reads positions only through p_j - p_i (and pos-space KNN, which is translation-equivariant)
    torch.manual_seed(2)
    block = CentroidBlock(16, "fps", {"num_centroids": 9}, num_heads=2, num_neighbors=6, neighbor_space=space,
                          pos_encoding=True, num_steps=2).eval()  # fmt: skip
    x, pos = torch.randn(2, 40, 16), torch.rand(2, 40, 3)
    shift = torch.tensor([3.0, -7.0, 11.0])
    out = block(x, pos)
    moved = block(x, pos + shift)
    assert_close(moved.x, out.x, atol=1e-5, rtol=1e-5)
    assert_close(moved.pos, out.pos + shift)
    # and it does read them: other offsets give another output
    assert not torch.allclose(block(x, pos * 2.0).x, out.x, atol=1e-3)


def test_self_attention_block_pos_encoding_translation_invariant() -> None:
    torch.manual_seed(3)
    block = SelfAttentionBlock(8, num_heads=2, num_neighbors=5, pos_encoding=True).eval()
    x, pos = torch.randn(2, 30, 8), torch.rand(2, 30, 3)
    nbr = knn(pos, pos, 5)[1]
    assert_close(block(x, neighbor_idx=nbr, pos=pos + 5.0), block(x, neighbor_idx=nbr, pos=pos), atol=1e-5, rtol=1e-5)


def test_zero_layer_scale_starts_at_the_downsampling_twin() -> None:
    torch.manual_seed(4)
    block = CentroidBlock(16, "fps", {"num_centroids": 8}, num_heads=2, num_neighbors=5, layer_scale=0.0)
    twin = CentroidBlock(16, "fps", {"num_centroids": 8}, num_heads=2, num_steps=0)
    twin.load_state_dict(block.state_dict(), strict=False)  # the twin has the same norm and MLP, no attention
    x, pos = torch.randn(3, 30, 16), torch.rand(3, 30, 3)
    assert_close(block(x, pos).x, twin(x, pos).x)
    # gamma gets a gradient (the update itself), so the step learns
    block(x, pos).x.sum().backward()
    assert block.attn.layer_scale.gamma.grad.abs().sum() > 0


def test_layer_scale_scales_per_channel() -> None:
    ls = LayerScale(4, 0.5)
    x = torch.randn(3, 4)
    assert_close(ls(x), 0.5 * x)
    assert ls.gamma.shape == (4,)


def test_pos_space_neighbours_are_the_nearest_positions() -> None:
    torch.manual_seed(5)
    block = CentroidBlock(8, "fps", {"num_centroids": 6}, num_heads=2, num_neighbors=4, neighbor_space="pos").eval()
    x, pos = torch.randn(2, 25, 8), torch.rand(2, 25, 3)
    u, upos, index = block.init(x, pos)
    expected = block.attn(x, u, neighbor_idx=knn(upos, pos, 4)[1])
    expected = expected + block.mlp(block.norm(expected))
    assert_close(block(x, pos).x, expected)


def test_pos_space_with_k_equal_n_is_dense() -> None:
    torch.manual_seed(6)
    block = CentroidBlock(8, "fps", {"num_centroids": 5}, num_heads=2, num_neighbors=20, neighbor_space="pos").eval()
    dense = CentroidBlock(8, "fps", {"num_centroids": 5}, num_heads=2).eval()
    dense.load_state_dict(block.state_dict())
    x, pos = torch.randn(2, 20, 8), torch.rand(2, 20, 3)
    assert_close(block(x, pos).x, dense(x, pos).x, atol=1e-5, rtol=1e-5)


def test_relative_position_encoding_shapes() -> None:
    enc = RelativePositionEncoding(12, pos_dim=3, hidden=5)
    assert enc(torch.randn(2, 7, 4, 3)).shape == (2, 7, 4, 12)


def test_bad_inputs_name_what_was_expected() -> None:
    layer = CentroidAttention(8, num_heads=2, num_neighbors=3, pos_encoding=True)
    x = torch.randn(1, 10, 8)
    with pytest.raises(ValueError, match="needs pos"):
        layer(x, x[:, :4])
    with pytest.raises(ValueError, match="pos must be"):
        layer(x, x[:, :4], pos=torch.rand(1, 9, 3), centroid_pos=torch.rand(1, 4, 3))
    dense = CentroidAttention(8, num_heads=2, pos_encoding=True)
    with pytest.raises(ValueError, match="needs neighbours"):
        dense(x, x[:, :4], pos=torch.rand(1, 10, 3), centroid_pos=torch.rand(1, 4, 3))
    with pytest.raises(ValueError, match="neighbor_space"):
        CentroidBlock(8, "fps", {"num_centroids": 4}, num_heads=2, num_neighbors=3, neighbor_space="xyz")
    with pytest.raises(ValueError, match="needs num_neighbors"):
        CentroidBlock(8, "fps", {"num_centroids": 4}, num_heads=2, neighbor_space="pos")
    block = CentroidBlock(8, "random", {"num_centroids": 4}, num_heads=2, num_neighbors=3, neighbor_space="pos")
    with pytest.raises(ValueError, match="neighbor_space='pos' needs pos"):
        block(x)


@pytest.mark.parametrize("normalize", ["inputs", "centroids"])
@pytest.mark.parametrize("pos_encoding", [False, True])
def test_attention_weights_reproduce_the_step(normalize: str, pos_encoding: bool) -> None:
    # the recomputed weights applied to the (position-encoded) values give the layer's own update
    torch.manual_seed(7)
    layer = CentroidAttention(12, num_heads=3, num_neighbors=5, normalize=normalize, pos_encoding=pos_encoding).eval()
    B, N, M, H, D = 2, 19, 6, 3, 4
    x, pos = torch.randn(B, N, 12), torch.rand(B, N, 3)
    u, upos = x[:, :M], pos[:, :M]
    kwargs = {"pos": pos, "centroid_pos": upos} if pos_encoding else {}
    attn, idx = layer.attention_weights(x, u, **kwargs)
    assert attn.shape == (B, H, M, 5) and idx.shape == (B, M, 5)
    v = layer.kv(layer.norm_kv(x)).view(B, N, 2, 12)[:, :, 1]
    vn = gather(v, idx).view(B, M, 5, H, D)
    if pos_encoding:
        vn = vn + layer.pos_enc(gather(pos, idx) - upos.unsqueeze(2)).view(B, M, 5, H, D)
    out = torch.einsum("bhmk,bmkhd->bmhd", attn, vn).reshape(B, M, 12)
    assert_close(layer(x, u, **kwargs), u + layer.proj(out), atol=1e-5, rtol=1e-5)
    dense = CentroidAttention(12, num_heads=3, normalize=normalize).eval()
    full, none = dense.attention_weights(x, u)
    assert none is None and full.shape == (B, H, M, N)
    if normalize == "inputs":
        assert_close(full.sum(-1), torch.ones(B, H, M))


@pytest.mark.parametrize("normalize", ["inputs", "centroids"])
@pytest.mark.parametrize("chunk_bytes", [None, 64])
def test_factored_pos_path_equals_per_edge_keys_and_values(normalize: str, chunk_bytes: int | None) -> None:
    # knn_centroid_attention's pos_* arguments against edge_attention over explicit k + delta, v + delta, float64
    from attention.centroid.functional import edge_attention, knn_centroid_attention

    torch.manual_seed(8)
    B, H, M, N, D, K, R = 2, 3, 5, 17, 4, 6, 7
    q = torch.randn(B, H, M, D, dtype=torch.float64, requires_grad=True)
    k, v = (torch.randn(B, H, N, D, dtype=torch.float64, requires_grad=True) for _ in range(2))
    hidden = torch.randn(B, M, K, R, dtype=torch.float64, requires_grad=True)
    w = torch.randn(H * D, R, dtype=torch.float64, requires_grad=True)
    b = torch.randn(H * D, dtype=torch.float64, requires_grad=True)
    idx = torch.stack([torch.stack([torch.randperm(N)[:K] for _ in range(M)]) for _ in range(B)])
    mask = torch.rand(B, N) > 0.2
    mask[:, idx[:, :, 0]] = True  # every centroid keeps a real neighbour
    out = knn_centroid_attention(q, k, v, idx, mask, normalize, chunk_bytes=chunk_bytes, pos_hidden=hidden,
                                 pos_weight=w, pos_bias=b)  # fmt: skip
    delta = (hidden @ w.T + b).view(B, M, K, H, D)
    kn = gather(k.transpose(1, 2).reshape(B, N, H * D), idx).view(B, M, K, H, D) + delta
    vn = gather(v.transpose(1, 2).reshape(B, N, H * D), idx).view(B, M, K, H, D) + delta
    ref = edge_attention(q, kn, vn, idx, N, mask=mask, normalize=normalize, dropout_p=0.0, eps=1e-6)
    assert_close(out, ref)
    g = torch.randn_like(out)
    inputs = (q, k, v, hidden, w, b)
    for a, r in zip(torch.autograd.grad(out, inputs, g), torch.autograd.grad(ref, inputs, g)):
        assert_close(a, r)


def test_pos_encoding_bf16_close_to_float64() -> None:
    torch.manual_seed(9)
    layer = CentroidAttention(16, num_heads=2, num_neighbors=5, pos_encoding=True)
    x, pos = torch.randn(2, 21, 16), torch.rand(2, 21, 3)
    kw = {"pos": pos, "centroid_pos": pos[:, :6]}
    nbr = knn(pos[:, :6], pos, 5)[1]  # fixed: a feature-space search may pick other neighbours in bf16
    ref = layer.double()(x.double(), x[:, :6].double(), neighbor_idx=nbr, **{k: t.double() for k, t in kw.items()})
    out = layer.bfloat16()(x.bfloat16(), x[:, :6].bfloat16(), neighbor_idx=nbr,
                           **{k: t.bfloat16() for k, t in kw.items()})  # fmt: skip
    assert out.dtype == torch.bfloat16
    assert_close(out.double(), ref, atol=0.05, rtol=0.02)
