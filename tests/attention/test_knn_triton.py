"""The Triton KNN search == the chunked reference (``attention.knn(backend="torch")``): neighbour sets (ties aside),
distances, padding of clouds with fewer than k real points.

Without a GPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, a subprocess) on CPU tensors; the
``gpu`` tests run it compiled on CUDA, and a ``slow`` test compiles it for sm_90 ahead of time.
"""

from __future__ import annotations

import pytest
import torch

from attention import backends, knn
from engine.testing import assert_interpreted, compile_for_sm90, skip_if_interpreted

# The kernels under the Triton interpreter, their ahead-of-time compile and their dispatch follow torch and triton
pytestmark = pytest.mark.torch_compat

HAS_TRITON = backends.HAS_TRITON


def _clouds(B: int, M: int, N: int, C: int, real: int | None, device: str = "cpu", seed: int = 0):
    """Queries, references (with an exact duplicate point: a tie) and a mask keeping ``real`` points of the last
    cloud (None: no mask)."""
    g = torch.Generator().manual_seed(seed)
    q, r = torch.randn(B, M, C, generator=g), torch.randn(B, N, C, generator=g)
    r[:, 1] = r[:, 0]
    mask = None
    if real is not None:
        mask = torch.ones(B, N, dtype=torch.bool)
        mask[-1, torch.randperm(N, generator=g)[: N - real]] = False
    return q.to(device), r.to(device), None if mask is None else mask.to(device)


def assert_same_neighbours(got, ref, q, r, mask, what: str) -> None:
    """Ascending distances equal to the reference's; each returned index is at its returned distance; the sets are
    equal except among distances within rounding of the k-th; an infinite slot points at a padded point."""
    (d1, i1), (d0, i0) = got, ref
    assert d1.dtype == torch.float32 and i1.dtype == torch.int64 and d1.shape == i1.shape == d0.shape, what
    torch.testing.assert_close(d1, d0, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}: {m}")
    assert bool((d1[..., 1:] >= d1[..., :-1]).all()), f"{what}: distances not ascending"
    finite = torch.isfinite(d1)
    B, M, k = i1.shape
    exact = (r.float()[torch.arange(B)[:, None, None], i1] - q.float()[:, :, None]).square().sum(-1)
    torch.testing.assert_close(exact[finite], d1[finite], rtol=1e-5, atol=1e-5, msg=lambda m: f"{what} (idx): {m}")
    kth = d0[..., -1:]
    clear = (d0 < kth - 1e-4 * kth.clamp_min(1)) & torch.isfinite(d0)  # not a near-tie with the k-th
    for b in range(B):
        for m in range(M):
            want = set(i0[b, m][clear[b, m]].tolist())
            assert want <= set(i1[b, m].tolist()), f"{what}: query ({b}, {m}) misses {want - set(i1[b, m].tolist())}"
    if mask is not None:
        padded = ~torch.gather(mask, 1, i1.reshape(B, -1)).view(B, M, k)
        assert bool((padded == ~finite).all()), f"{what}: an infinite distance must point at a padded point"


_INTERPRETED = """
import torch
from test_knn_triton import _clouds, assert_same_neighbours
from attention import knn
from attention.kernels import knn_triton as kt
from attention.kernels.knn_triton import knn_triton

# odd sizes; C = 3 (coordinates) and feature widths that are not powers of two; k from 1 to 64 (several tiles, a
# ragged last one); a last cloud with fewer real points than k (inf padding). The exact tiles (C < 16, or k whose
# spare candidates need a longer list) and the expanded form with its rescoring (C >= 16: one and several steps of 16
# channels, 16, 32 and 64 list slots), clouds far from the origin (the centring: uncentred, the expansion's rounding
# at 1e4 would pass the gaps between neighbours), fewer real points than list slots
for B, M, N, C, k, real, offset in [(2, 7, 37, 3, 5, None, 0), (2, 9, 70, 19, 20, 40, 0), (1, 5, 33, 24, 33, None, 0),
                                    (2, 6, 19, 3, 10, 6, 0), (1, 3, 100, 5, 64, None, 0), (2, 4, 9, 2, 1, 3, 0),
                                    (2, 11, 90, 70, 24, 30, 0), (1, 6, 80, 40, 52, None, 0),
                                    (2, 5, 60, 33, 8, None, 10000), (2, 7, 50, 16, 16, 17, 0)]:
    q, r, mask = _clouds(B, M, N, C, real)
    q, r = q + offset, r + offset
    assert kt._blocks(k, C)[0] == ((C, k) in {{(19, 20), (24, 33), (70, 24), (33, 8)}}), (C, k)
    what = f"B={{B}} M={{M}} N={{N}} C={{C}} k={{k}} real={{real}} offset={{offset}}"
    ref = knn(q, r, k, mask=mask, backend="torch")
    assert_same_neighbours(knn_triton(q, r, k, mask), ref, q, r, mask, what)
    assert_same_neighbours(knn(q, r, k, mask=mask, backend="triton"), ref, q, r, mask, what + " backend='triton'")

# the centre of a masked cloud is its real points' mean: here they lie 1e4 from the padded rows (at 0), whose weight
# in the centre would move it by thousands, and the expansion's rounding with it
q, r, mask = _clouds(2, 6, 80, 40, 30)
q, r = q + 1e4, torch.where(mask[..., None], r + 1e4, 0.0)
assert kt._blocks(10, 40)[0]
what = "real points 1e4 from the padded rows"
assert_same_neighbours(knn_triton(q, r, 10, mask), knn(q, r, 10, mask=mask, backend="torch"), q, r, mask, what)

# two clusters 100 apart in every channel: the centre lies between them, so the expanded form's rounding (~1e-7 of
# |q - centre|^2 ~ 4e5) moves each distance by ~0.1, far below the gaps between neighbours but far above the rounding
# of an exact distance: only the rescoring returns the reference's distances
g = torch.Generator().manual_seed(3)
side = lambda n: torch.where(torch.arange(n) % 2 == 0, 100.0, -100.0)[None, :, None]
q, r = torch.randn(2, 11, 40, generator=g) + side(11), torch.randn(2, 90, 40, generator=g) + side(90)
assert kt._blocks(10, 40)[0]
assert_same_neighbours(knn_triton(q, r, 10), knn(q, r, 10, backend="torch"), q, r, None, "two clusters")

# the reference points split among programs, the lists merged by the second kernel: 2 and 3 parts of several tiles,
# more splits than tiles (fewer parts get columns), a ragged last part, a masked cloud with fewer real points than k,
# two and three blocks of queries (M > BLOCK_M); exactly the one-part search's lists, ties included
for B, M, N, C, k, real, splits in [(2, 9, 100, 5, 7, None, 3), (1, 6, 130, 3, 16, None, 2), (2, 5, 70, 19, 20, 12, 8),
                                    (1, 4, 200, 3, 40, None, 3), (2, 3, 45, 4, 1, 30, 4), (2, 40, 100, 3, 5, None, 3),
                                    (1, 70, 96, 6, 12, 50, 2), (2, 9, 300, 40, 24, 100, 3)]:
    q, r, mask = _clouds(B, M, N, C, real, seed=1)
    bk = kt._blocks(k, C)[2]
    S, tiles = kt._plan(N, bk, splits)
    assert 1 < S <= splits and S * tiles * bk >= N, (S, tiles)  # several parts, and together they cover N
    what = f"B={{B}} M={{M}} N={{N}} C={{C}} k={{k}} real={{real}} split in {{S}}"
    got = knn_triton(q, r, k, mask, splits=splits)
    assert_same_neighbours(got, knn(q, r, k, mask=mask, backend="torch"), q, r, mask, what)
    one = knn_triton(q, r, k, mask, splits=1)
    # (the expanded form's parts each keep their spare candidates, more than one part rescores: the same lists where,
    # as in these random clouds, no candidate lies within the expansion's rounding of the k-th)
    assert torch.equal(got[0], one[0]) and torch.equal(got[1], one[1]), what + ": not the one-part search's lists"
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton missing")
def test_triton_knn_under_interpreter_equals_reference() -> None:
    assert_interpreted(_INTERPRETED.format(), __file__)


@pytest.mark.skipif(not HAS_TRITON, reason="triton missing")
def test_split_search_fills_the_gpu_only_where_the_query_blocks_do_not() -> None:
    """One cloud's few query blocks are split up to the programs a GPU keeps busy, never below a few tiles a part;
    a grid that already fills the GPU, or a cloud of a few tiles, is searched in one part."""
    from attention.kernels import knn_triton as kt

    sms = 132
    assert kt.auto_splits(8, 1024, 32, sms) == 1024 // (kt._MIN_TILES * 32)  # B = 1, M = 256: the most tiles allow
    assert kt.auto_splits(128, 16384, 32, sms) == -(-kt._PROGRAMS_PER_SM * sms // 128)  # B = 1, M = 4096
    assert kt.auto_splits(kt._PROGRAMS_PER_SM * sms, 16384, 32, sms) == 1  # the query blocks fill the GPU
    assert kt.auto_splits(1, 3 * 32, 32, sms) == 1  # fewer tiles than a part's minimum
    with pytest.raises(ValueError, match="splits must be >= 1, got 0"):
        kt.knn_triton(*_clouds(1, 3, 40, 3, None)[:2], 4, splits=0)


def test_triton_knn_limits_are_refused_by_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    q, r, _ = _clouds(1, 3, 80, 3, None)
    with pytest.raises(ValueError, match=r"runs on cuda \(CPU tensors under TRITON_INTERPRET=1.*got a cpu tensor"):
        knn(q, r, 4, backend="triton")
    monkeypatch.setattr(backends, "_triton_interpreted", lambda: True)
    with pytest.raises(ValueError, match=r"backend 'triton' of knn supports k <= 64, got k=65"):
        knn(q, r, 65, backend="triton")


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_TRITON, reason="triton missing")
@pytest.mark.parametrize("k", [1, 16, 24, 64])
def test_triton_knn_on_cuda_equals_reference(k: int) -> None:
    """The point model's searches: coordinates (C = 3) and features (C = 64, 128), a ragged batch; the KNN centroid
    step's single clouds (searched in parts, the lists merged), and each shape in one part and in three."""
    from attention.kernels.knn_triton import knn_triton

    for B, M, N, C, real in [(4, 513, 1031, 3, None), (3, 257, 1024, 64, 500), (2, 128, 4097, 128, None),
                             (1, 256, 1024, 128, None), (1, 1024, 4096, 128, 3000)]:  # fmt: skip
        q, r, mask = _clouds(B, M, N, C, real, device="cuda")
        ref = knn(q, r, k, mask=mask, backend="torch")
        got = knn(q, r, k, mask=mask, backend="triton")
        what = f"cuda B={B} M={M} N={N} C={C} k={k} real={real}"
        assert_same_neighbours(got, ref, q, r, mask, what)
        assert knn(q, r, k, mask=mask)[1].equal(got[1])  # auto takes the kernel
        one = knn_triton(q, r, k, mask, splits=1)
        assert_same_neighbours(one, ref, q, r, mask, f"{what} splits=1")
        # auto splits the single clouds; the lists are the one-part search's, ties included (the expanded form: where
        # no candidate lies within the expansion's rounding of the k-th, as here)
        for splits in (None, 3):
            got = knn_triton(q, r, k, mask, splits=splits)
            assert torch.equal(got[0], one[0]) and torch.equal(got[1], one[1]), f"{what} {splits=}"


@pytest.mark.slow
@pytest.mark.skipif(not HAS_TRITON, reason="triton missing")
def test_triton_knn_kernel_compiles_for_an_h100() -> None:
    """The sorts of int64 keys, the 3-d difference tiles, the products and the rescoring of the expanded form, the
    split search and its merge: compiled for sm_90 ahead of time at k = 8, 16, 24, 32, 40, 64. In the exact form the
    split search takes the registers of the search in one part and spills nothing up to k = 32 (the expanded form a
    few bytes of stack at most, the merge nothing), and at k = 32 an SM holds the programs the split counts on."""
    from attention.kernels import knn_triton as kt

    skip_if_interpreted(kt._knn_kernel)
    ptrs = {"q_ptr": "*fp32", "r_ptr": "*fp32", "centre_ptr": "*fp32", "mask_ptr": "*u8", "dist_ptr": "*fp32",
            "idx_ptr": "*i64"}  # fmt: skip
    sizes = {"M": "i32", "N": "i32", "C": "i32", "k": "i32", "S": "i32", "tiles": "i32"}
    for k, C in ((16, 3), (32, 3), (8, 64), (24, 128), (32, 128), (40, 128), (64, 64)):
        expanded, bm, bk, bc, rc, warps = kt._blocks(k, C)
        usage = {}
        for split in (False, True):
            consts = {"HAS_MASK": True, "SPLIT": split, "EXPANDED": expanded, "BLOCK_M": bm, "BLOCK_K": bk,
                      "BLOCK_C": bc, "RESCORE_C": rc}  # fmt: skip
            sig = {**ptrs, "part_ptr": "*i64", **sizes}
            usage[split] = compile_for_sm90(kt._knn_kernel, sig, consts, warps, enable_fp_fusion=False)
        sig = {"part_ptr": "*i64", "dist_ptr": "*fp32", "idx_ptr": "*i64", "M": "i32", "k": "i32", "S": "i32"}
        merge = compile_for_sm90(kt._knn_merge_kernel, sig, {"BLOCK_M": bm, "BLOCK_K": bk}, warps)
        if merge is None:  # no cuobjdump in this triton
            continue
        assert merge["spill_bytes"] == 0, (k, "merge", merge)
        if expanded:  # its register use swings with the mask and the split (168-255); a few bytes of stack at most
            assert all(u["spill_bytes"] <= 16 for u in usage.values()), (k, C, usage)
            continue
        # the split changes only where the list goes: the search loop takes the registers it took in one part
        assert usage[True] == usage[False], (k, C, usage)
        if k <= 32:
            assert usage[True]["spill_bytes"] == 0, (k, C, usage)
        if k == 32:  # the resident programs _PROGRAMS_PER_SM counts on (65536 registers an SM)
            assert 65536 // (usage[True]["registers"] * 32 * warps) >= kt._PROGRAMS_PER_SM, usage
