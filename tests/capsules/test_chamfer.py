"""Chamfer distance: the pinned definition, a hand-computed example, and every backend against the dense reference."""

from __future__ import annotations

import math

import pytest
import torch
from torch.testing import assert_close

import capsules
from attention import available, backends
from capsules import chamfer as chamfer_mod
from capsules.chamfer import CHAMFER_BACKENDS, CHAMFER_DEFINITION, ChamferOutput, chamfer_definition, chamfer_distance
from measure.bench import largest_output_bytes

FAST = [name for name in CHAMFER_BACKENDS if name != "dense"]
# pytorch3d's wheel loads with torch 2.11 and 2.12 only: its tests are torch_compat, which CI runs on torch 2.11;
# elsewhere they skip with the reason (not installed, or the import error of an extension built for another torch)
PYTORCH3D_MISSING = backends.LOAD_ERRORS.get("pytorch3d", "pytorch3d not installed")


def _backend(name: str):
    if name == "pytorch3d":
        needs = pytest.mark.skipif(not available("chamfer", name), reason=PYTORCH3D_MISSING)
        return pytest.param(name, marks=[pytest.mark.torch_compat, needs])
    return pytest.param(name, marks=pytest.mark.skipif(not available("chamfer", name), reason=f"{name} not installed"))


BACKENDS = [_backend(name) for name in FAST]
FLOAT32_SEARCHES = [_backend(name) for name in ("knn_cluster", "pytorch3d")]  # search in float32 whatever the input
SIZES = [(63, 50, 3), (50, 63, 5), (63, 63, 3), (7, 1, 3)]


def _dtype(backend: str) -> torch.dtype:
    # torch_cluster and pytorch3d search in float32 only: compare those backends in float32, with tolerances.
    return torch.float32 if backend in ("knn_cluster", "pytorch3d") else torch.float64


def _clouds(B: int, N: int, M: int, C: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(B, N, C, dtype=dtype, requires_grad=True)
    b = (torch.randn(B, M, C, dtype=dtype) * 0.9 + 0.1).requires_grad_()
    return a, b


def _everything(a: torch.Tensor, b: torch.Tensor, backend: str, **kwargs) -> tuple[ChamferOutput, tuple, tuple]:
    """Output with per-point values and indices, and the gradients of a random functional of all of them."""
    out = chamfer_distance(a, b, return_per_point=True, return_indices=True, backend=backend, **kwargs)
    g = torch.Generator().manual_seed(1)
    wa = torch.rand(out.dist_a.shape, generator=g, dtype=a.dtype)
    wb = torch.rand(out.dist_b.shape, generator=g, dtype=a.dtype)
    total = out.loss.sum() + (out.dist_a * wa).sum() + (out.dist_b * wb).sum()
    grads = torch.autograd.grad(total, (a, b))
    return out, grads


# ---------------------------------------------------------------------------------------------------------------------
# The definition
# ---------------------------------------------------------------------------------------------------------------------


def test_definition_is_pinned_in_the_docstrings() -> None:
    for doc in (chamfer_mod.__doc__, chamfer_distance.__doc__):
        assert CHAMFER_DEFINITION in " ".join(doc.split())
    assert capsules.CHAMFER_DEFINITION is CHAMFER_DEFINITION
    assert "squared L2" in CHAMFER_DEFINITION and "sum of the two directional means" in CHAMFER_DEFINITION
    assert chamfer_definition() == CHAMFER_DEFINITION
    assert "||a - b||^2" not in chamfer_definition(squared=False)
    assert "summed over the batch" in chamfer_definition(reduction="sum")
    with pytest.raises(ValueError, match="reduction"):
        chamfer_definition(reduction="max")


def _tiny() -> tuple[torch.Tensor, torch.Tensor]:
    # Cloud pair 0 is worked out by hand in test_hand_computed_example; pair 1 is b covering a exactly (distance 0).
    a = torch.tensor([[[0.0, 0, 0], [1, 0, 0]], [[0, 0, 0], [2, 0, 0]]], dtype=torch.float64)
    b = torch.tensor([[[0.0, 2, 0], [1, 1, 0], [3, 0, 0]], [[0, 0, 0], [2, 0, 0], [2, 0, 0]]], dtype=torch.float64)
    return a, b


@pytest.mark.parametrize("backend", ["dense", *BACKENDS])
def test_hand_computed_example(backend: str) -> None:
    a, b = _tiny()
    # a0=(0,0,0): |.|^2 to b = 4, 2, 9 -> 2 (b1); a1=(1,0,0): 5, 1, 4 -> 1 (b1); mean over a = 1.5
    # b0=(0,2,0): to a = 4, 5 -> 4 (a0); b1=(1,1,0): 2, 1 -> 1 (a1); b2=(3,0,0): 9, 4 -> 4 (a1); mean over b = 3
    # Chamfer = 1.5 + 3 = 4.5 for pair 0; pair 1 is 0; the batch mean is 2.25.
    out = chamfer_distance(a, b, reduction="none", return_per_point=True, return_indices=True, backend=backend)
    assert_close(out.loss, torch.tensor([4.5, 0.0], dtype=torch.float64))
    assert_close(out.dist_a[0], torch.tensor([2.0, 1.0], dtype=torch.float64))
    assert_close(out.dist_b[0], torch.tensor([4.0, 1.0, 4.0], dtype=torch.float64))
    assert out.idx_a[0].tolist() == [1, 1] and out.idx_b[0].tolist() == [0, 1, 1]
    assert chamfer_distance(a, b, backend=backend).item() == 2.25
    assert chamfer_distance(a, b, reduction="sum", backend=backend).item() == 4.5
    # Euclidean: mean(sqrt 2, 1) + mean(2, 1, 2) for pair 0.
    euclid = chamfer_distance(a, b, reduction="none", squared=False, backend=backend)
    assert_close(euclid, torch.tensor([(math.sqrt(2) + 1) / 2 + 5 / 3, 0.0], dtype=torch.float64))


def test_return_types_and_reductions() -> None:
    a, b = _clouds(3, 9, 11, 3, torch.float64)
    loss = chamfer_distance(a, b)
    assert isinstance(loss, torch.Tensor) and loss.shape == ()
    per = chamfer_distance(a, b, reduction="none", return_per_point=True)
    assert isinstance(per, ChamferOutput) and per.idx_a is None and per.idx_b is None
    assert per.loss.shape == (3,) and per.dist_a.shape == (3, 9) and per.dist_b.shape == (3, 11)
    assert_close(per.loss, per.dist_a.mean(1) + per.dist_b.mean(1))
    assert_close(loss, per.loss.mean())
    assert_close(chamfer_distance(a, b, reduction="sum"), per.loss.sum())
    idx = chamfer_distance(a, b, return_indices=True)
    assert idx.dist_a is None and idx.idx_a.shape == (3, 9) and idx.idx_b.shape == (3, 11)
    assert idx.idx_a.dtype == torch.long and int(idx.idx_a.max()) < 11 and int(idx.idx_b.max()) < 9
    # Symmetric in its arguments (the two directions swap).
    assert_close(chamfer_distance(b, a, reduction="none"), per.loss)


# ---------------------------------------------------------------------------------------------------------------------
# Backends == dense reference
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("N, M, C", SIZES)
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("squared", [True, False])
def test_backend_matches_dense(backend: str, N: int, M: int, C: int, squared: bool) -> None:
    dtype = _dtype(backend)
    a, b = _clouds(2, N, M, C, dtype)
    ref, ref_grads = _everything(a, b, "dense", squared=squared, reduction="none")
    out, grads = _everything(a, b, backend, squared=squared, reduction="none")
    tol = {} if dtype == torch.float64 else {"rtol": 1e-5, "atol": 1e-6}
    assert torch.equal(out.idx_a, ref.idx_a) and torch.equal(out.idx_b, ref.idx_b)
    assert_close(out.loss, ref.loss, **tol)
    assert_close(out.dist_a, ref.dist_a, **tol)
    assert_close(out.dist_b, ref.dist_b, **tol)
    assert_close(grads[0], ref_grads[0], **tol)
    assert_close(grads[1], ref_grads[1], **tol)


@pytest.mark.parametrize("chunk_bytes", [8, 200, 3000, 10**6])
def test_chunked_tilings_match_dense(chunk_bytes: int) -> None:
    # 8 bytes: one element per tile (column tiling); 200: a few columns of one row; 3000: several rows; 1e6: one tile.
    a, b = _clouds(2, 37, 29, 3, torch.float64)
    ref = chamfer_distance(a, b, reduction="none", return_indices=True, backend="dense")
    out = chamfer_distance(a, b, reduction="none", return_indices=True, backend="chunked", chunk_bytes=chunk_bytes)
    assert torch.equal(out.idx_a, ref.idx_a) and torch.equal(out.idx_b, ref.idx_b)
    assert_close(out.loss, ref.loss)


@pytest.mark.parametrize("backend", ["dense", "chunked"])
def test_gradcheck(backend: str) -> None:
    a, b = _clouds(2, 6, 5, 3, torch.float64)
    assert torch.autograd.gradcheck(lambda x, y: chamfer_distance(x, y, backend=backend), (a, b))
    assert torch.autograd.gradcheck(lambda x, y: chamfer_distance(x, y, squared=False, backend=backend), (a, b))


@pytest.mark.parametrize("backend", ["dense", *BACKENDS])
def test_euclidean_gradient_finite_at_coincident_points(backend: str) -> None:
    a, b = _tiny()  # pair 1 has every point of a on a point of b and vice versa: distance exactly 0
    a, b = a.to(_dtype(backend)).requires_grad_(), b.to(_dtype(backend)).requires_grad_()
    loss = chamfer_distance(a, b, squared=False, backend=backend)
    ga, gb = torch.autograd.grad(loss, (a, b))
    assert torch.isfinite(ga).all() and torch.isfinite(gb).all()
    assert ga[1].abs().sum() == 0 and gb[1].abs().sum() == 0  # a perfect fit is a stationary point
    # Away from coincidence the gradient is the plain Euclidean one: d|a - b|/da = (a - b) / |a - b|.
    x = torch.tensor([[[0.0, 0, 0]]], dtype=torch.float64, requires_grad=True)
    y = torch.tensor([[[3.0, 4, 0]]], dtype=torch.float64)
    (gx,) = torch.autograd.grad(chamfer_distance(x, y, squared=False, reduction="sum"), (x,))
    assert_close(gx, torch.tensor([[[-1.2, -1.6, 0.0]]], dtype=torch.float64))  # both directions: 2 * (-0.6, -0.8)


@pytest.mark.parametrize("backend", ["chunked", *FLOAT32_SEARCHES])
def test_low_precision_is_close_to_float32(backend: str) -> None:
    a, b = _clouds(2, 40, 30, 3, torch.float32)
    ref = chamfer_distance(a.detach(), b.detach(), backend="dense")
    got = chamfer_distance(a.detach().bfloat16(), b.detach().bfloat16(), backend=backend)
    assert got.dtype == torch.bfloat16
    assert_close(got.float(), ref, rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("backend", FLOAT32_SEARCHES)
def test_float32_searches_take_float64_clouds(backend: str) -> None:
    """torch-cluster and pytorch3d search in float32 (pytorch3d's CPU kernel takes nothing else); the distances to the
    neighbours found are then recomputed in the clouds' float64, with gradients."""
    a, b = _clouds(2, 63, 50, 3, torch.float64)
    ref, ref_grads = _everything(a, b, "dense")
    out, grads = _everything(a, b, backend)
    assert out.loss.dtype == torch.float64 and grads[0].dtype == torch.float64
    assert torch.equal(out.idx_a, ref.idx_a) and torch.equal(out.idx_b, ref.idx_b)  # no near-ties at these sizes
    assert_close(out.loss, ref.loss)
    assert_close(grads, ref_grads)


# ---------------------------------------------------------------------------------------------------------------------
# Memory bound of the chunked path
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.torch_compat
@pytest.mark.parametrize("chunk_bytes", [64 * 2**10, 1024])
def test_chunked_never_materializes_the_full_matrix(chunk_bytes: int) -> None:
    B, N, M, C = 2, 300, 200, 3
    a, b = _clouds(B, N, M, C, torch.float64)
    full = B * N * M * 8  # 960 kB: the (B, N, M) float64 matrix
    inputs = max(B * N * C, B * M * C) * 8  # tensors of the size of a cloud are fine
    chunked = largest_output_bytes(
        lambda: chamfer_distance(a, b, backend="chunked", chunk_bytes=chunk_bytes).backward()
    )
    assert chunked <= max(chunk_bytes, inputs) < full
    # The probe sees the dense reference's matrix, so it does measure what it claims to.
    assert largest_output_bytes(lambda: chamfer_distance(a, b, backend="dense").backward()) >= full


# ---------------------------------------------------------------------------------------------------------------------
# Backend selection and bad input
# ---------------------------------------------------------------------------------------------------------------------


@pytest.mark.torch_compat
def test_auto_backend_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    small = torch.zeros(2, 10, 3), torch.zeros(2, 12, 3)
    large = torch.zeros(8, 2048, 3), torch.zeros(8, 2048, 3)
    assert chamfer_mod._resolve_backend("auto", *small) == "dense"
    big = "knn_cluster" if available("chamfer", "knn_cluster") else "chunked"
    assert chamfer_mod._resolve_backend("auto", *large) == big
    assert chamfer_mod._resolve_backend("auto", *(x.double() for x in large)) == "chunked"  # exact search for fp64
    assert chamfer_mod._resolve_backend("auto", torch.zeros(8, 2048, 8), torch.zeros(8, 2048, 8)) == "chunked"
    monkeypatch.setitem(backends.INSTALLED, "torch_cluster", False)
    assert chamfer_mod._resolve_backend("auto", *large) == "chunked"
    assert chamfer_mod._resolve_backend("knn_torch", *large) == "knn_torch"


@pytest.mark.torch_compat
def test_missing_backend_raises_import_error(monkeypatch: pytest.MonkeyPatch) -> None:
    a, b = _clouds(1, 4, 5, 3, torch.float32)
    monkeypatch.setitem(backends.INSTALLED, "pytorch3d", False)
    monkeypatch.setitem(backends.INSTALLED, "torch_cluster", False)
    with pytest.raises(ImportError, match=r"pytorch3d.*INSTALL"):
        chamfer_distance(a, b, backend="pytorch3d")
    with pytest.raises(ImportError, match="pip install --no-build-isolation torch-cluster"):
        chamfer_distance(a, b, backend="knn_cluster")
    with pytest.raises(ValueError, match=r"unknown backend 'fast'.*chunked"):
        chamfer_distance(a, b, backend="fast")


@pytest.mark.parametrize(
    "a, b, error, match",
    [
        (torch.zeros(4, 3), torch.zeros(1, 4, 3), ValueError, r"a must be \(B, N, C\), got a 2-d"),
        (torch.zeros(1, 4, 3), torch.zeros(1, 4, 3, 1), ValueError, r"b must be \(B, N, C\), got a 4-d"),
        (torch.zeros(1, 4, 3), torch.zeros(1, 4, 2), ValueError, "same channel count C, got 2 and 3"),
        (torch.zeros(2, 4, 3), torch.zeros(1, 4, 3), ValueError, "same batch size"),
        (torch.zeros(1, 0, 3), torch.zeros(1, 4, 3), ValueError, "empty point set"),
        (torch.zeros(1, 4, 3), torch.zeros(1, 0, 3), ValueError, "empty point set"),
        (torch.full((1, 4, 3), math.nan), torch.zeros(1, 4, 3), ValueError, "NaN or Inf"),
        (torch.zeros(1, 4, 3), torch.full((1, 4, 3), math.inf), ValueError, "NaN or Inf"),
        (torch.zeros(1, 4, 3, dtype=torch.long), torch.zeros(1, 4, 3), TypeError, "floating point"),
        (torch.zeros(1, 4, 3), torch.zeros(1, 4, 3, dtype=torch.float64), TypeError, "same dtype"),
        ([[0.0, 0.0, 0.0]], torch.zeros(1, 4, 3), TypeError, "torch.Tensor"),
    ],
)
def test_bad_input(a, b, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        chamfer_distance(a, b)


def test_bad_options() -> None:
    a, b = _clouds(1, 4, 5, 3, torch.float32)
    with pytest.raises(ValueError, match="unknown reduction 'max'"):
        chamfer_distance(a, b, reduction="max")
    with pytest.raises(ValueError, match="chunk_bytes must be a positive int"):
        chamfer_distance(a, b, chunk_bytes=0)
