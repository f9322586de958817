"""Point ops: reference invariants on CPU, every available backend against the reference, bad input."""

from __future__ import annotations

import dataclasses
import weakref

import pytest
import torch
from torch.testing import assert_close
from torch.utils._pytree import tree_leaves

from attention import CentroidAttention, backends, points
from attention.points import (
    farthest_point_sample,
    gather,
    interpolate,
    knn,
    knn_chunked,
    knn_spare_candidates,
    nearest_upsample,
)
from measure.bench import OpCounter

# pytorch3d's wheel loads with torch 2.11 and 2.12 only: its tests are torch_compat, which CI runs on torch 2.11;
# elsewhere they skip with the reason (not installed, or the import error of an extension built for another torch)
PYTORCH3D_MISSING = backends.LOAD_ERRORS.get("pytorch3d", "pytorch3d not installed")
KNN_ALT = [
    pytest.param("cluster", marks=pytest.mark.skipif(not points.HAS_TORCH_CLUSTER, reason="torch-cluster missing")),
    pytest.param(
        "pytorch3d",
        marks=[pytest.mark.torch_compat, pytest.mark.skipif(not points.HAS_PYTORCH3D, reason=PYTORCH3D_MISSING)],
    ),
]
FPS_ALT = [*KNN_ALT, pytest.param("numba", marks=pytest.mark.skipif(not backends.HAS_NUMBA, reason="numba missing"))]
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _brute_fps(x: torch.Tensor, m: int, start: int) -> list[int]:
    """FPS written out point by point, the definition."""
    chosen = [start]
    d = ((x - x[start]) ** 2).sum(-1)
    for _ in range(m - 1):
        nxt = int(d.argmax())
        chosen.append(nxt)
        d = torch.minimum(d, ((x - x[nxt]) ** 2).sum(-1))
    return chosen


@pytest.mark.parametrize("shape", [(3, 63, 5), (2, 100, 3), (1, 7, 2)])
def test_fps_reference_matches_definition(shape: tuple[int, int, int]) -> None:
    x = torch.rand(*shape)
    m = shape[1] // 2
    start = torch.randint(0, shape[1], (shape[0],))
    idx = farthest_point_sample(x, m, start=start, backend="torch")
    assert idx.shape == (shape[0], m) and idx.dtype == torch.long
    for b in range(shape[0]):
        assert idx[b].tolist() == _brute_fps(x[b], m, int(start[b]))


def test_fps_all_points_is_a_permutation() -> None:
    x = torch.rand(2, 50, 3)
    idx = farthest_point_sample(x, 50, backend="torch")
    assert torch.equal(idx.sort(1).values, torch.arange(50).expand(2, 50))


def test_fps_permutation_consistent() -> None:
    x = torch.rand(2, 80, 3)
    perm = torch.randperm(80)
    idx = farthest_point_sample(x, 20, start=torch.tensor([5, 9]), backend="torch")
    inv = perm.argsort()  # x[:, perm][:, inv[i]] == x[:, i]
    idx_p = farthest_point_sample(x[:, perm], 20, start=inv[torch.tensor([5, 9])], backend="torch")
    assert torch.equal(perm[idx_p], idx)


def test_fps_random_start_deterministic_with_generator() -> None:
    x = torch.rand(4, 64, 3)
    a = farthest_point_sample(x, 16, start=None, generator=torch.Generator().manual_seed(3))
    b = farthest_point_sample(x, 16, start=None, generator=torch.Generator().manual_seed(3))
    assert torch.equal(a, b)


def test_fps_ragged_never_picks_padding() -> None:
    x = torch.rand(3, 40, 3)
    lengths = torch.tensor([40, 25, 10])
    idx = farthest_point_sample(x, 10, lengths=lengths, backend="torch")
    assert bool((idx < lengths[:, None]).all())
    # Each cloud alone gives the same samples as the padded batch.
    for b in range(3):
        alone = farthest_point_sample(x[b : b + 1, : int(lengths[b])], 10, backend="torch")
        assert torch.equal(alone[0], idx[b])
    # A mask with holes in the middle: random start lands on real points only.
    mask = torch.rand(3, 40) > 0.5
    mask[:, 0] = True
    idx = farthest_point_sample(x, 5, start=None, mask=mask)
    assert bool(mask.gather(1, idx).all())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", FPS_ALT)
@pytest.mark.parametrize("shape,m", [((3, 63, 5), 20), ((2, 1024, 3), 512), ((4, 100, 3), 1)])
def test_fps_backend_equals_reference(backend: str, device: str, shape: tuple[int, int, int], m: int) -> None:
    if not backends.available("fps", backend, device):
        pytest.skip(f"backend {backend} does not run on {device}")
    x = torch.rand(*shape, device=device)
    start = torch.randint(0, shape[1], (shape[0],), device=device)
    ref = farthest_point_sample(x, m, start=start, backend="torch")
    out = farthest_point_sample(x, m, start=start, backend=backend)
    if backends.BACKENDS["fps"][backend].exact:
        assert torch.equal(out, ref)
    else:
        # torch-cluster: the same greedy rule, rounded differently: a near-tie may take another path, as fpsample's
        _assert_fps_up_to_near_ties(x, out, ref, start)


@pytest.mark.parametrize("backend", FPS_ALT)
def test_fps_backend_ragged_equals_reference(backend: str) -> None:
    x = torch.rand(3, 63, 5)
    mask = torch.rand(3, 63) > 0.3
    mask[:, 4] = True
    start = torch.full((3,), 4)
    ref = farthest_point_sample(x, 12, start=start, mask=mask, backend="torch")
    out = farthest_point_sample(x, 12, start=start, mask=mask, backend=backend)
    if backends.BACKENDS["fps"][backend].exact:
        assert torch.equal(out, ref)
    else:  # see test_fps_backend_equals_reference
        assert torch.equal(out[:, 0], start) and bool(mask.gather(1, out).all())
        assert all(row.unique().numel() == 12 for row in out)


@pytest.mark.skipif(not points.HAS_FPSAMPLE, reason="fpsample missing")
@pytest.mark.parametrize("shape,m", [((3, 63, 5), 20), ((2, 1024, 3), 512), ((4, 100, 3), 1), ((1, 3000, 60), 700)])
def test_fpsample_fps_is_farthest_point_sampling(shape: tuple[int, int, int], m: int) -> None:
    """fpsample runs the same greedy rule; its rounding differs, so a near-tie can send it down another (equally
    valid) path: the start is kept, samples are distinct, and the coverage matches the reference's closely."""
    x = torch.rand(*shape)
    start = torch.randint(0, shape[1], (shape[0],))
    ref = farthest_point_sample(x, m, start=start, backend="torch")
    out = farthest_point_sample(x, m, start=start, backend="fpsample")
    _assert_fps_up_to_near_ties(x, out, ref, start)
    mask = torch.rand(shape[:2]) > 0.3
    mask[torch.arange(shape[0]), start] = True
    m_real = min(m, int(mask.sum(1).min()))
    ragged = farthest_point_sample(x, m_real, start=start, mask=mask, backend="fpsample")
    assert torch.equal(ragged[:, 0], start) and bool(mask.gather(1, ragged).all())  # real points only


def _assert_fps_up_to_near_ties(x: torch.Tensor, out: torch.Tensor, ref: torch.Tensor, start: torch.Tensor) -> None:
    """FPS whose rounding differs from the reference's: the start is kept, samples are distinct, and each cloud's
    coverage is within 5% of the reference's."""
    assert torch.equal(out[:, 0], start) and all(row.unique().numel() == out.shape[1] for row in out)
    for b in range(x.shape[0]):
        assert _coverage(x[b : b + 1], out[b : b + 1]) <= 1.05 * _coverage(x[b : b + 1], ref[b : b + 1])


def _coverage(x: torch.Tensor, idx: torch.Tensor) -> float:
    """Largest distance from a point to its nearest sample (what FPS greedily minimizes)."""
    return float(knn(x, gather(x, idx), 1, backend="torch")[0].max().sqrt())


@pytest.mark.skipif(not points.HAS_FPSAMPLE, reason="fpsample missing")
def test_fpsample_bucket_is_an_explicit_approximation_with_close_coverage() -> None:
    torch.manual_seed(0)
    x = torch.rand(1, 20000, 3)
    exact = farthest_point_sample(x, 1024, backend="torch")
    bucket = farthest_point_sample(x, 1024, backend="fpsample_bucket")
    assert bucket.unique().numel() == 1024  # fpsample's bucket FPS does not keep the start point first
    assert _coverage(x, bucket) <= 1.25 * _coverage(x, exact)
    assert torch.equal(farthest_point_sample(x, 1024), exact)  # auto never picks the approximation


@pytest.mark.gpu
def test_fps_triton_equals_reference() -> None:
    x = torch.rand(4, 1000, 3, device="cuda")
    start = torch.randint(0, 1000, (4,), device="cuda")
    ref = farthest_point_sample(x, 300, start=start, backend="torch")
    assert torch.equal(farthest_point_sample(x, 300, start=start, backend="triton"), ref)


def _brute_knn(q: torch.Tensor, r: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    d = ((q[:, :, None] - r[:, None]) ** 2).sum(-1)
    return d.topk(k, dim=-1, largest=False, sorted=True)


@pytest.mark.parametrize("shape", [(2, 17, 63, 5), (1, 64, 64, 3), (3, 1, 9, 2)])
def test_knn_reference_matches_brute_force(shape: tuple[int, int, int, int]) -> None:
    B, M, N, C = shape
    q, r = torch.rand(B, M, C), torch.rand(B, N, C)
    dist, idx = knn(q, r, 4 if N >= 4 else N, backend="torch")
    ref_d, ref_i = _brute_knn(q, r, dist.shape[-1])
    assert torch.equal(idx, ref_i)
    assert_close(dist, ref_d)
    assert bool((dist[..., 1:] >= dist[..., :-1]).all())


@pytest.mark.parametrize("offset,spread", [(100.0, 1.0), (1000.0, 0.01)])
def test_knn_reference_far_from_origin(offset: float, spread: float) -> None:
    """The matmul expansion loses precision with large norms; centring keeps the neighbours exact."""
    r = offset + spread * torch.rand(1, 2000, 3)
    q = r[:, :64] + spread * 1e-3 * torch.rand(1, 64, 3)
    dist, idx = knn(q, r, 16, backend="torch")
    ref_d, _ = _brute_knn(q.double(), r.double(), 16)
    # float32 coordinates at 1000 are quantized to 6e-5, so exact ties occur: compare the distances of the chosen
    # neighbours (a wrong neighbour shows up as a larger distance), computed in float64 from the chosen indices.
    chosen = ((q.double()[:, :, None] - gather(r.double(), idx)) ** 2).sum(-1)
    assert_close(chosen, ref_d, atol=1e-12, rtol=1e-9)
    assert_close(dist.double(), ref_d, atol=1e-6 * spread**2, rtol=1e-4)


def test_knn_chunking_gives_same_result() -> None:
    q, r = torch.rand(2, 300, 3), torch.rand(2, 500, 3)
    full = knn(q, r, 8, backend="torch")
    # A budget of one row of distances per chunk: 300 chunks, same answer.
    tiny = knn(q, r, 8, backend="torch", chunk_bytes=4 * 2 * 500)
    assert torch.equal(full[1], tiny[1])
    assert_close(full[0], tiny[0])
    # Less than one row: the reference points are walked in column tiles too (a running set of candidates).
    mask = torch.rand(2, 500) > 0.2
    full = knn(q, r, 8, mask=mask, backend="torch")
    for budget in (4 * 2 * 7, 4 * 2 * 100):
        cols = knn(q, r, 8, mask=mask, backend="torch", chunk_bytes=budget)
        assert torch.equal(full[1], cols[1]), budget
        assert_close(full[0], cols[0])


def test_knn_chunked_keeps_the_input_precision_and_equals_a_dense_matrix() -> None:
    """The one chunked exact search (knn's reference, Chamfer's "chunked"): float64 stays float64, and its choice is
    a dense distance matrix's, whatever the chunking."""
    q = torch.tensor([[[0.0, 0.0]]], dtype=torch.float64)
    r = torch.tensor([[[1.0, 0.0], [0.0, 3.0], [-2.0, 0.0], [0.0, 0.5], [0.0, -4.0]]], dtype=torch.float64)
    dist, idx = knn_chunked(q, r, 3)
    assert dist.dtype == torch.float64 and idx.tolist() == [[[3, 0, 2]]] and dist.tolist() == [[[0.25, 1.0, 4.0]]]
    a, b = torch.randn(2, 40, 3, dtype=torch.float64), torch.randn(2, 33, 3, dtype=torch.float64)
    dense = ((a[:, :, None] - b[:, None]) ** 2).sum(-1).min(-1)
    for budget in (8, 8 * 2 * 10, None):  # column tiles, row chunks, the default
        dist, idx = knn_chunked(a, b, 1, chunk_bytes=budget)
        assert torch.equal(idx[..., 0], dense.indices) and torch.equal(dist[..., 0], dense.values)


def test_knn_chunking_bounds_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """The largest distance block built is (B, rows, N) with rows * B * N * 4 <= chunk_bytes."""
    seen = []
    real = torch.baddbmm

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append(out.numel() * 4)
        return out

    monkeypatch.setattr(torch, "baddbmm", spy)
    knn(torch.rand(2, 1000, 3), torch.rand(2, 2000, 3), 4, backend="torch", chunk_bytes=1 << 20)
    assert seen and max(seen) <= 1 << 20 and len(seen) > 1


@pytest.mark.parametrize("masked", [False, True])
def test_knn_chunked_with_a_tiny_budget_equals_one_chunk(masked: bool) -> None:
    """Many chunks of queries with a smaller last one, and column tiles narrower than the spare candidates (k = 9
    keeps 13 per query: each 7-column tile offers fewer, the last tile 3) give one chunk's neighbours and distances."""
    g = torch.Generator().manual_seed(0)
    B, M, N, C, k = 2, 37, 101, 5, 9
    q, r = torch.randn(B, M, C, generator=g), torch.randn(B, N, C, generator=g)
    mask = torch.rand(B, N, generator=g) > 0.3 if masked else None
    assert knn_spare_candidates(k) == 13
    one = knn_chunked(q, r, k, mask=mask, chunk_bytes=1 << 30)
    row = 4 * B * N  # one query's distances: 4 rows a chunk make 9 chunks of 4 and one of 1
    for budget in (4 * row, 4 * B * 7, 1):  # row chunks; 7-column tiles (101 = 14 * 7 + 3); one column at a time
        dist, idx = knn_chunked(q, r, k, mask=mask, chunk_bytes=budget)
        assert torch.equal(idx, one[1]) and torch.equal(dist, one[0]), budget
        assert dist.is_contiguous() and idx.is_contiguous()
    brute = ((q[:, :, None] - r[:, None]) ** 2).sum(-1)
    if mask is not None:
        brute = brute.masked_fill(~mask[:, None], float("inf"))
    assert_close(one[0], brute.topk(k, dim=-1, largest=False).values)


def test_knn_chunked_keeps_nothing_from_one_chunk_to_the_next() -> None:
    """Each chunk works in buffers allocated before the first one and writes its rows into the preallocated result:
    no tensor an op makes during a chunk is alive two chunks later. Results kept per chunk until the end sat between
    the freed distance blocks of later chunks, and the allocator's heap grew with every chunk (tools/bench_points.py
    --knn-memory measures the resident set)."""
    made: list[tuple[int, weakref.ref]] = []  # (chunk, tensor) of every tensor an op returned that it was not given
    kept: list[int] = []
    chunk = 0

    def see(func, args, kwargs, out) -> None:
        nonlocal chunk
        if func.overloadpacket.__name__ == "baddbmm":  # a chunk's distances (one block a chunk: no column tiles)
            chunk += 1
            kept.extend(c for c, ref in made if 0 < c < chunk - 1 and ref() is not None)
        given = {id(t) for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        made.extend(
            (chunk, weakref.ref(t)) for t in tree_leaves(out) if isinstance(t, torch.Tensor) and id(t) not in given
        )

    q, r = torch.rand(1, 60, 3), torch.rand(1, 50, 3)
    with OpCounter(see):
        dist, idx = knn_chunked(q, r, 4, chunk_bytes=4 * 50 * 4)  # 4 queries a chunk: 15 chunks
    assert chunk == 15 and not kept, f"tensors of chunks {sorted(set(kept))} outlived them"
    one = knn_chunked(q, r, 4, chunk_bytes=1 << 30)
    assert torch.equal(idx, one[1]) and torch.equal(dist, one[0])


def test_knn_mask_excludes_padding_and_pads_with_inf() -> None:
    q, r = torch.rand(2, 10, 3), torch.rand(2, 30, 3)
    mask = torch.zeros(2, 30, dtype=torch.bool)
    mask[0, :20] = True
    mask[1, :3] = True
    dist, idx = knn(q, r, 5, mask=mask, backend="torch")
    assert bool((idx[0] < 20).all())
    assert bool((idx[1, :, :3] < 3).all()) and bool(torch.isinf(dist[1, :, 3:]).all())
    ref_d, ref_i = _brute_knn(q[:1], r[:1, :20], 5)
    assert torch.equal(idx[:1], ref_i)
    assert_close(dist[:1], ref_d)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", KNN_ALT)
@pytest.mark.parametrize("shape,k", [((2, 17, 63, 5), 7), ((2, 256, 1024, 3), 16), ((1, 5, 5, 3), 5)])
def test_knn_backend_equals_reference(backend: str, device: str, shape: tuple[int, ...], k: int) -> None:
    B, M, N, C = shape
    q, r = torch.rand(B, M, C, device=device), torch.rand(B, N, C, device=device)
    ref_d, ref_i = knn(q, r, k, backend="torch")
    dist, idx = knn(q, r, k, backend=backend)
    assert torch.equal(idx.sort(-1).values, ref_i.sort(-1).values)  # same neighbour sets
    assert_close(dist, ref_d)


@pytest.mark.parametrize("backend", KNN_ALT)
def test_knn_backend_ragged_equals_reference(backend: str) -> None:
    q, r = torch.rand(3, 11, 5), torch.rand(3, 63, 5)
    mask = torch.rand(3, 63) > 0.4
    ref_d, ref_i = knn(q, r, 6, mask=mask, backend="torch")
    dist, idx = knn(q, r, 6, mask=mask, backend=backend)
    assert torch.equal(idx.sort(-1).values, ref_i.sort(-1).values)
    assert_close(dist, ref_d)


@pytest.mark.torch_compat
@pytest.mark.skipif(not points.HAS_PYTORCH3D, reason=PYTORCH3D_MISSING)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("padded", [False, True])
def test_pytorch3d_fps_and_knn_in_feature_space_every_precision_and_padded(dtype: torch.dtype, padded: bool) -> None:
    """Odd sizes in feature space (N = 63, C = 60), inputs in any precision (both search in float32, as the reference
    does), clouds padded to a common N (``lengths``): the reference's FPS indices and KNN neighbours. KNN's distances
    carry no gradient from either (the reference's contract: the neighbours are a selection, not a function)."""
    torch.manual_seed(0)
    x = torch.rand(3, 63, 60).to(dtype).requires_grad_()
    lengths = torch.tensor([63, 40, 21]) if padded else None
    mask = None if lengths is None else points.lengths_to_mask(lengths, 63)
    start = torch.tensor([5, 0, 20])
    ref = farthest_point_sample(x, 20, start=start, lengths=lengths, backend="torch")
    assert torch.equal(farthest_point_sample(x, 20, start=start, lengths=lengths, backend="pytorch3d"), ref)
    q = gather(x.detach(), ref[:, :17])  # (3, 17, 60) sampled queries
    ref_d, ref_i = knn(q, x, 7, mask=mask, backend="torch")
    dist, idx = knn(q, x, 7, mask=mask, backend="pytorch3d")
    assert torch.equal(idx.sort(-1).values, ref_i.sort(-1).values)
    assert_close(dist, ref_d)
    assert dist.dtype == ref_d.dtype == torch.float32 and not dist.requires_grad and not ref_d.requires_grad


def test_gather_any_index_shape_and_gradient() -> None:
    x = torch.randn(2, 10, 4, requires_grad=True)
    idx = torch.randint(0, 10, (2, 3, 5, 2))
    out = gather(x, idx)
    assert out.shape == (2, 3, 5, 2, 4)
    for b in range(2):
        assert torch.equal(out[b], x[b][idx[b]])
    out.sum().backward()
    counts = torch.stack([torch.bincount(idx[b].flatten(), minlength=10) for b in range(2)]).float()
    assert_close(x.grad, counts[..., None].expand(-1, -1, 4))
    assert gather(torch.arange(10.0).expand(2, 10), idx[..., 0]).shape == (2, 3, 5)


def test_nearest_upsample_and_interpolate() -> None:
    pos = torch.rand(2, 50, 3)
    sub = pos[:, :10]
    feats = torch.randn(2, 10, 6, requires_grad=True)
    up = nearest_upsample(pos, sub, feats)
    assert up.shape == (2, 50, 6)
    assert torch.equal(up[:, :10], feats)  # a point that is a centroid takes its own features
    d = ((pos[:, :, None] - sub[:, None]) ** 2).sum(-1)
    assert torch.equal(up, gather(feats, d.argmin(-1)))
    smooth = interpolate(pos, sub, feats, k=3)
    assert_close(smooth[:, :10], feats, atol=1e-4, rtol=1e-4)  # weight of the coincident point dominates
    smooth.sum().backward()
    assert feats.grad is not None and bool(torch.isfinite(feats.grad).all())


# ---------------------------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "call,error,match",
    [
        (lambda: farthest_point_sample(torch.rand(10, 3), 4), ValueError, r"\(B, N, C\)"),
        (lambda: farthest_point_sample(torch.rand(2, 10, 3), 11), ValueError, "M <= N"),
        (lambda: farthest_point_sample(torch.rand(2, 0, 3), 1), ValueError, "empty"),
        (lambda: farthest_point_sample(torch.randint(0, 5, (2, 10, 3)), 4), TypeError, "floating"),
        (lambda: farthest_point_sample(torch.tensor([[[0.0, float("nan"), 0.0]] * 4]), 2), ValueError, "NaN"),
        (lambda: farthest_point_sample(torch.tensor([[[0.0, float("inf"), 0.0]] * 4]), 2), ValueError, "Inf"),
        (lambda: farthest_point_sample(torch.rand(2, 10, 3), 0), ValueError, "positive"),
        (lambda: farthest_point_sample(torch.rand(2, 10, 3), 3, start=10), ValueError, r"\[0, 10\)"),
        (lambda: farthest_point_sample(torch.rand(2, 10, 3), 3, start=torch.zeros(3).long()), ValueError, "batch"),
        (lambda: farthest_point_sample(torch.rand(2, 10, 3), 3, lengths=torch.tensor([10, 0])), ValueError, "empty"),
        (lambda: farthest_point_sample(torch.rand(2, 10, 3), 6, lengths=torch.tensor([10, 5])), ValueError, "M <= N"),
        (lambda: farthest_point_sample(torch.rand(2, 10, 3), 3, backend="nope"), ValueError, "choose one of"),
        (lambda: knn(torch.rand(2, 4, 3), torch.rand(2, 5, 3), 6), ValueError, "k <= N"),
        (lambda: knn(torch.rand(2, 4, 3), torch.rand(2, 5, 4), 2), ValueError, "channel count"),
        (lambda: knn(torch.rand(3, 4, 3), torch.rand(2, 5, 3), 2), ValueError, "batch size"),
        (lambda: knn(torch.rand(2, 4, 3), torch.rand(2, 5, 3).double().to(torch.int32), 2), TypeError, "floating"),
        (lambda: knn(torch.rand(2, 4, 3), torch.rand(2, 5, 3), 2, mask=torch.ones(2, 4).bool()), ValueError, "mask"),
        (lambda: knn(torch.rand(2, 4, 3), torch.rand(2, 0, 3), 1), ValueError, "empty"),
        (lambda: knn(torch.full((2, 4, 3), float("nan")), torch.rand(2, 5, 3), 2), ValueError, "NaN"),
        (
            lambda: knn(torch.rand(2, 4, 3), torch.rand(2, 5, 3), 2, mask=torch.tensor([[True] * 5, [False] * 5])),
            ValueError,
            "all-False",
        ),
        (lambda: gather(torch.rand(2, 5, 3), torch.rand(2, 4)), TypeError, "int64"),
        (lambda: gather(torch.rand(2, 5, 3), torch.zeros(3, 4).long()), ValueError, "batch size 2"),
        (lambda: gather(torch.rand(5), torch.zeros(3, 4).long()), ValueError, r"\(B, N, C\)"),
    ],
)
def test_bad_input_is_named(call, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        call()


def test_mismatched_devices_are_named() -> None:
    # The meta device stands in for a second device on a CPU-only machine.
    with pytest.raises(ValueError, match="query is on meta but ref is on cpu"):
        knn(torch.rand(2, 4, 3, device="meta"), torch.rand(2, 5, 3), 2)
    with pytest.raises(ValueError, match="centroids is on meta but x is on cpu"):
        CentroidAttention(8, 2)(torch.rand(2, 10, 8), torch.rand(2, 4, 8, device="meta"))


@pytest.mark.gpu
def test_mismatched_cuda_devices_are_named() -> None:
    with pytest.raises(ValueError, match="device"):
        knn(torch.rand(2, 4, 3, device="cuda"), torch.rand(2, 5, 3), 2)


@pytest.mark.torch_compat
def test_missing_backend_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backends.INSTALLED, "torch_cluster", False)
    monkeypatch.setitem(backends.INSTALLED, "fpsample", False)
    with pytest.raises(ImportError, match="torch-cluster"):
        farthest_point_sample(torch.rand(1, 10, 3), 3, backend="cluster")
    with pytest.raises(ImportError, match="pip install fpsample"):
        farthest_point_sample(torch.rand(1, 10, 3), 3, backend="fpsample")
    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    with pytest.raises(ValueError, match=r"runs on cuda \(CPU tensors under TRITON_INTERPRET=1.*got a cpu tensor"):
        farthest_point_sample(torch.rand(1, 10, 3), 3, backend="triton")


@pytest.mark.torch_compat
def test_auto_backend_works_without_optional_packages(monkeypatch: pytest.MonkeyPatch) -> None:
    for package in ("torch_cluster", "pytorch3d", "triton", "fpsample", "numba"):
        monkeypatch.setitem(backends.INSTALLED, package, False)
    x = torch.rand(2, 30, 3)
    assert torch.equal(farthest_point_sample(x, 5), farthest_point_sample(x, 5, backend="torch"))
    assert torch.equal(knn(x, x, 3)[1], knn(x, x, 3, backend="torch")[1])


def _spy_on(monkeypatch: pytest.MonkeyPatch, op: str, used: list[str], run_as: dict[str, str]) -> None:
    """Every backend of ``op`` records its name when it runs; ``run_as`` maps a backend to the one that computes for
    it (a package this machine may lack)."""
    real = dict(backends.BACKENDS[op])
    for name, b in real.items():
        runner = real[run_as.get(name, name)]
        spy = lambda *a, _n=name, _r=runner: used.append(_n) or _r.load()(*a)  # noqa: E731
        monkeypatch.setitem(backends.BACKENDS[op], name, dataclasses.replace(b, impl=spy))


@pytest.mark.torch_compat
def test_auto_knn_picks_cluster_for_coordinates_only(monkeypatch: pytest.MonkeyPatch) -> None:
    used = []
    _spy_on(monkeypatch, "knn", used, {"cluster": "torch"})
    monkeypatch.setitem(backends.INSTALLED, "torch_cluster", True)
    knn(torch.rand(1, 5, 3), torch.rand(1, 20, 3), 2)
    knn(torch.rand(1, 5, 16), torch.rand(1, 20, 16), 2)
    assert used == ["cluster", "torch"]
    # a cloud with fewer than k real points: auto takes the reference, which pads with inf
    mask = torch.zeros(1, 20, dtype=torch.bool)
    mask[0, :3] = True
    dist, _ = knn(torch.rand(1, 5, 3), torch.rand(1, 20, 3), 4, mask=mask)
    assert used[2:] == ["torch"] and bool(torch.isinf(dist[..., 3]).all())


@pytest.mark.torch_compat
@pytest.mark.parametrize("backend", ["cluster", "pytorch3d"])
def test_explicit_knn_backend_refuses_a_cloud_with_fewer_than_k_real_points(
    backend: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Only the reference pads missing neighbours with inf: an explicit other backend raises instead of switching."""
    used = []
    _spy_on(monkeypatch, "knn", used, {"cluster": "torch", "pytorch3d": "torch"})
    monkeypatch.setitem(backends.INSTALLED, backends.BACKENDS["knn"][backend].package, True)
    q, r = torch.rand(2, 5, 3), torch.rand(2, 20, 3)
    mask = torch.ones(2, 20, dtype=torch.bool)
    mask[1, 3:] = False
    with pytest.raises(ValueError, match=r"needs k <= the real points of every cloud, got k=4 and a cloud of 3"):
        knn(q, r, 4, mask=mask, backend=backend)
    knn(q, r, 3, mask=mask, backend=backend)  # k = 3 fits every cloud
    assert used == [backend]


@pytest.mark.torch_compat
def test_auto_fps_picks_numba_on_cpu_for_coordinates_only(monkeypatch: pytest.MonkeyPatch) -> None:
    used = []
    _spy_on(monkeypatch, "fps", used, {"numba": "torch"})
    monkeypatch.setitem(backends.INSTALLED, "numba", True)
    farthest_point_sample(torch.rand(2, 20, 3), 5)
    farthest_point_sample(torch.rand(2, 20, 16), 5)
    monkeypatch.setitem(backends.INSTALLED, "numba", False)
    farthest_point_sample(torch.rand(2, 20, 3), 5)
    assert used == ["numba", "torch", "torch"]


def test_input_checks_can_be_switched_off() -> None:
    from attention import input_checks

    x = torch.rand(2, 10, 3)
    x[0, 0, 0] = float("nan")
    with input_checks(False):
        farthest_point_sample(x, 3)  # no error: the caller vouched for its data
    with pytest.raises(ValueError, match="NaN"):
        farthest_point_sample(x, 3)


_INTERPRETED_FPS = """
import torch
from attention import BACKENDS, farthest_point_sample
from attention.kernels.fps_triton import fps_triton
fps_torch = BACKENDS["fps"]["torch"].load()
torch.manual_seed(0)
for B, N, C, M in [(3, 63, 5, 20), (2, 100, 3, 50)]:
    x, s = torch.rand(B, N, C), torch.randint(0, N, (B,))
    assert torch.equal(fps_triton(x, M, s, None), fps_torch(x, M, s, None))
    # the public path: an explicit "triton" takes CPU tensors under the interpreter (attention.backends.resolve)
    assert torch.equal(farthest_point_sample(x, M, start=s, backend="triton"), fps_torch(x, M, s, None))
    mask = torch.rand(B, N) > 0.3
    mask[torch.arange(B), s] = True
    assert torch.equal(fps_triton(x, M // 3, s, mask), fps_torch(x, M // 3, s, mask))
print("ok")
"""


@pytest.mark.torch_compat
@pytest.mark.slow
@pytest.mark.skipif(not points.HAS_TRITON, reason="triton missing")
def test_fps_triton_kernel_under_interpreter_equals_reference() -> None:
    """The Triton kernel's logic on CPU, through Triton's interpreter (no GPU needed)."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": "1"}
    out = subprocess.run([sys.executable, "-c", _INTERPRETED_FPS], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


# CUDA cases of the equivalence tests (run by tools/gpu_check.py; skipped without a GPU).


@pytest.mark.gpu
@pytest.mark.skipif(not points.HAS_TRITON, reason="triton missing")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape,m", [((3, 63, 5), 20), ((32, 1024, 3), 512), ((2, 4097, 3), 700)])
def test_fps_triton_on_cuda_equals_reference(dtype: torch.dtype, shape: tuple[int, int, int], m: int) -> None:
    """Both paths measure distances in float32, so bf16 clouds give the same indices too; padded clouds as well."""
    x = torch.rand(*shape, device="cuda").to(dtype)
    start = torch.randint(0, shape[1], (shape[0],), device="cuda")
    ref = farthest_point_sample(x, m, start=start, backend="torch")
    assert torch.equal(farthest_point_sample(x, m, start=start, backend="triton"), ref)
    mask = torch.rand(shape[:2], device="cuda") > 0.3
    mask[torch.arange(shape[0], device="cuda"), start] = True
    k = min(m, int(mask.sum(1).min()))
    ref = farthest_point_sample(x, k, start=start, mask=mask, backend="torch")
    assert torch.equal(farthest_point_sample(x, k, start=start, mask=mask, backend="triton"), ref)


@pytest.mark.gpu
def test_knn_chunking_on_cuda_equals_one_chunk_and_cpu() -> None:
    q, r = torch.rand(2, 300, 3), torch.rand(2, 500, 3)
    mask = torch.rand(2, 500) > 0.2
    cpu_d, cpu_i = knn(q, r, 8, mask=mask, backend="torch")
    full_d, full_i = knn(q.cuda(), r.cuda(), 8, mask=mask.cuda(), backend="torch")
    tiny_d, tiny_i = knn(q.cuda(), r.cuda(), 8, mask=mask.cuda(), backend="torch", chunk_bytes=4 * 2 * 500)
    assert torch.equal(full_i, tiny_i)
    assert_close(full_d, tiny_d)
    assert torch.equal(full_i.sort(-1).values.cpu(), cpu_i.sort(-1).values)  # same neighbour sets as on CPU
    assert_close(full_d.cpu(), cpu_d)
    feats = torch.randn(2, 500, 64, device="cuda")
    auto = knn(feats[:, :100], feats, 16)  # auto on CUDA, feature space
    ref = knn(feats[:, :100].cpu(), feats.cpu(), 16, backend="torch")
    assert torch.equal(auto[1].sort(-1).values.cpu(), ref[1].sort(-1).values)


@pytest.mark.gpu
def test_gather_and_upsample_on_cuda_equal_cpu() -> None:
    x = torch.randn(2, 63, 60, dtype=torch.float64, requires_grad=True)
    idx = torch.randint(0, 63, (2, 17, 5))
    xc = x.detach().cuda().requires_grad_(True)
    out, out_c = gather(x, idx), gather(xc, idx.cuda())
    assert_close(out_c.cpu(), out)
    w = torch.randn_like(out)
    (gx,) = torch.autograd.grad((out * w).sum(), x)
    (gxc,) = torch.autograd.grad((out_c * w.cuda()).sum(), xc)
    assert_close(gxc.cpu(), gx)
    pos, ref_pos = torch.rand(2, 40, 3), torch.rand(2, 11, 3)
    feats = torch.randn(2, 11, 7)
    up = nearest_upsample(pos, ref_pos, feats)
    assert_close(nearest_upsample(pos.cuda(), ref_pos.cuda(), feats.cuda()).cpu(), up)
