"""The exact pruned CPU FPS (attention/kernels/fps_numba.py): the reference's indices on hard clouds, bad requests."""

from __future__ import annotations

import pytest
import torch

from attention import backends
from attention.points import farthest_point_sample

pytestmark = pytest.mark.skipif(not backends.HAS_NUMBA, reason="numba missing")


def _same(x: torch.Tensor, m: int, **kwargs) -> None:
    ref = farthest_point_sample(x, m, backend="torch", **kwargs)
    out = farthest_point_sample(x, m, backend="numba", **kwargs)
    assert out.dtype == torch.long and out.shape == ref.shape
    assert torch.equal(out, ref)


def _clustered(n: int, c: int = 3, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    centres = torch.randn(8, c, generator=g) * 10
    which = torch.randint(0, 8, (n,), generator=g)
    return (centres[which] + 0.01 * torch.randn(n, c, generator=g))[None]


@pytest.mark.parametrize("n,m,c", [(63, 63, 3), (63, 20, 3), (1, 1, 3), (2, 2, 3), (1000, 300, 3), (777, 200, 5)])
def test_numba_fps_equals_reference_odd_sizes(n: int, m: int, c: int) -> None:
    torch.manual_seed(n)
    _same(torch.rand(2, n, c), m, start=torch.randint(0, n, (2,)))


@pytest.mark.parametrize("c", [1, 2, 4, 16, 64])
def test_numba_fps_equals_reference_any_channels(c: int) -> None:
    torch.manual_seed(c)
    _same(torch.randn(3, 500, c), 120, start=torch.tensor([0, 17, 499]))


def test_numba_fps_duplicates_and_ties() -> None:
    # A small integer lattice: many exactly equal distances, so the lowest-index rule decides almost every step;
    # M > number of distinct points, so the tail repeats the lowest-index point once every distance is zero.
    torch.manual_seed(1)
    lattice = torch.randint(0, 4, (2, 600, 3)).float()
    _same(lattice, 600, start=torch.tensor([5, 0]))
    dup = torch.rand(1, 100, 3).repeat(1, 5, 1)  # every point five times
    _same(dup, 300, start=7)
    same = torch.zeros(1, 70, 3)  # one point 70 times: all ties at zero
    _same(same, 70)


def test_numba_fps_clustered_and_far_from_origin() -> None:
    _same(_clustered(5000), 700, start=3)
    # Far from the origin, float32 differences are coarse: many rounded ties and near-ties.
    torch.manual_seed(2)
    far = torch.rand(2, 3000, 3) + torch.tensor([1e4, -3e4, 5e3])
    _same(far, 500, start=torch.tensor([0, 2999]))
    tiny = torch.rand(1, 2000, 3) * 1e-20  # squares near float32's underflow
    _same(tiny, 300)


def _fps_float64(x: torch.Tensor, m: int, start: int) -> list[int]:
    """FPS with distances summed in float64 and rounded once: the order a kernel with other rounding would pick."""
    x = x.double()
    chosen = [start]
    d = torch.full((x.shape[0],), float("inf"))
    for _ in range(m - 1):
        d = torch.minimum(d, ((x - x[chosen[-1]]) ** 2).sum(-1).float())
        chosen.append(int(d.argmax()))
    return chosen


def test_numba_fps_uses_the_reference_rounding() -> None:
    # A coarse lattice far from the origin: float32's rounding of each difference, square and sum decides near-ties,
    # so exact (float64) distances give other indices; the kernel must reproduce the float32 ones.
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 50, (400, 3), generator=g).float() * 0.37 + torch.tensor([3e3, 1e3, -2e3])
    ref = farthest_point_sample(x[None], 200, start=0, backend="torch")
    assert ref[0].tolist() != _fps_float64(x, 200, 0)  # the cloud does tell the two roundings apart
    assert torch.equal(farthest_point_sample(x[None], 200, start=0, backend="numba"), ref)


def test_numba_fps_masks_lengths_and_random_start() -> None:
    torch.manual_seed(3)
    x = torch.rand(3, 1500, 3)
    mask = torch.rand(3, 1500) > 0.4
    mask[:, 10] = True
    _same(x, 200, start=torch.full((3,), 10), mask=mask)
    lengths = torch.tensor([1500, 901, 257])
    _same(x, 257, start=torch.tensor([1499, 0, 256]), lengths=lengths)
    g = torch.Generator().manual_seed(0)
    a = farthest_point_sample(x, 50, start=None, mask=mask, backend="numba", generator=g)
    g = torch.Generator().manual_seed(0)
    assert torch.equal(a, farthest_point_sample(x, 50, start=None, mask=mask, backend="torch", generator=g))


def test_numba_fps_float64_and_bfloat16_inputs_run_in_float32_like_the_reference() -> None:
    torch.manual_seed(4)
    _same(torch.rand(2, 400, 3, dtype=torch.float64), 100)
    _same(torch.rand(2, 400, 3).bfloat16(), 100)


@pytest.mark.parametrize("n,m", [(50_000, 4096), pytest.param(100_000, 8192, marks=pytest.mark.slow)])
def test_numba_fps_equals_reference_large_cloud(n: int, m: int) -> None:
    torch.manual_seed(5)
    _same(torch.rand(1, n, 3), m, start=12345)
    _same(_clustered(n, seed=5), m // 4, start=0)


def test_numba_fps_explicit_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ValueError, match="cannot sample M=11"):
        farthest_point_sample(torch.rand(1, 10, 3), 11, backend="numba")
    monkeypatch.setitem(backends.INSTALLED, "numba", False)
    with pytest.raises(ImportError, match="pip install numba"):
        farthest_point_sample(torch.rand(1, 10, 3), 3, backend="numba")


@pytest.mark.gpu
def test_numba_fps_refuses_cuda_tensors() -> None:
    with pytest.raises(ValueError, match="runs on cpu, got a cuda tensor"):
        farthest_point_sample(torch.rand(1, 10, 3, device="cuda"), 3, backend="numba")
