"""Hydra's quasiseparable mixer: the paper's matrix (against a step-by-step transcription of the reference's
recurrence), chunked scans == dense matrix (outputs and gradients, float64 and bf16 autocast), the structural
invariants, O(L) memory, TorchScript / FX, and ``mixer="hydra"`` in the DeiT and point models."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from attention.mixers import MatrixMixer, QuasiseparableMatrix, apply_matrix, quasiseparable_mix
from attention.mixers.functional import hydra_mix


def _hydra(dim: int = 12, heads: int = 2, shared_bc: bool = False, **kw) -> MatrixMixer:
    torch.manual_seed(0)
    m = MatrixMixer(dim, heads, matrix="quasiseparable" if shared_bc else "hydra", **kw).double()
    with torch.no_grad():  # larger steps and A than at init, so that decays and the diagonal matter in the tests
        m.gate_bias.add_(torch.randn_like(m.gate_bias))
        m.matrix.A_log.normal_()
    return m


def _ssm_scan(x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, Bm: torch.Tensor, Cm: torch.Tensor) -> torch.Tensor:
    """Mamba-2's recurrence one step at a time: h_t = exp(A dt_t) h_{t-1} + dt_t B_t x_t^T, y_t = C_t h_t.

    x ``(B, L, H, P)``, dt ``(B, L, H)``, A ``(H,)``, Bm / Cm ``(B, L, H, N)``.
    """
    Bsz, L, H, P = x.shape
    h = x.new_zeros(Bsz, H, Bm.shape[-1], P)
    ys = []
    for t in range(L):
        a = torch.exp(A * dt[:, t])[..., None, None]  # (B, H, 1, 1)
        h = a * h + (dt[:, t, :, None] * Bm[:, t]).unsqueeze(-1) * x[:, t].unsqueeze(-2)
        ys.append((Cm[:, t].unsqueeze(-2) @ h).squeeze(-2))  # (B, H, P)
    return torch.stack(ys, dim=1)


def _reference_hydra(mixer: MatrixMixer, x: torch.Tensor) -> torch.Tensor:
    """The matrix product of goombalab/hydra ``Hydra.forward`` (between the conv and the gated norm), transcribed:
    forward and flipped backward streams batched, one scan, ``roll(1)`` with row 0 zeroed, flip back, diagonal."""
    Bsz, L, _ = x.shape
    q, k, v, g = mixer.inputs(x)  # (B, H, L, .)
    N = mixer.matrix.state_dim
    to_blh = lambda t: t.transpose(1, 2)  # noqa: E731  (B, H, L, .) -> (B, L, H, .)
    v, q, k, g = to_blh(v), to_blh(q), to_blh(k), to_blh(g)
    dt = torch.cat([g[..., 0], g[..., 1].flip(1)], dim=0)  # dt = cat(dt_fwd, flip(dt_bwd)) on the batch
    dt = F.softplus(dt)
    xs = torch.cat([v, v.flip(1)], dim=0)
    Bm = torch.cat([k[..., :N], k[..., -N:].flip(1)], dim=0)
    Cm = torch.cat([q[..., :N], q[..., -N:].flip(1)], dim=0)
    A = -torch.exp(mixer.matrix.A_log)
    y = _ssm_scan(xs, dt, A, Bm, Cm)  # (2B, L, H, P)
    y = torch.roll(y, shifts=1, dims=1)
    y[:, 0] = 0.0
    y = y[:Bsz] + y[Bsz:].flip(1) + v * g[..., 2:3]  # x * (fc_D(x) + D)
    return y.transpose(1, 2)  # (B, H, L, P)


@pytest.mark.parametrize("shared_bc", [False, True])
def test_matrix_is_the_reference_recurrence(shared_bc: bool) -> None:
    m = _hydra(shared_bc=shared_bc, chunk_size=4)
    x = torch.randn(2, 11, 12, dtype=torch.float64)
    ref = _reference_hydra(m, x)
    q, k, v, g = m.inputs(x)
    torch.testing.assert_close(apply_matrix(m.materialize(x), v), ref)
    torch.testing.assert_close(m.matrix(q, k, v, g), ref)


@pytest.mark.parametrize("chunk", [1, 3, 5, 13, 64])
def test_scan_matches_dense_for_every_chunk_length(chunk: int) -> None:
    m = _hydra(chunk_size=chunk, state_dim=3)
    x = torch.randn(2, 13, 12, dtype=torch.float64, requires_grad=True)
    out, ref = m(x), m.forward_reference(x)
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(out)
    params = [x, *m.parameters()]
    for a, b in zip(torch.autograd.grad((out * w).sum(), params), torch.autograd.grad((ref * w).sum(), params)):
        torch.testing.assert_close(a, b)


@pytest.mark.parametrize("name", ["hydra", "quasiseparable", "hydra_static"])
def test_bf16_autocast_matches_the_float64_matrix(name: str) -> None:
    torch.manual_seed(1)
    static = name.endswith("_static")
    m = MatrixMixer(32, 4, matrix=name.removesuffix("_static"), data_dependent=not static, max_len=40, chunk_size=8)
    x = torch.randn(2, 33, 32, requires_grad=True)
    ref_m = MatrixMixer(32, 4, matrix=name.removesuffix("_static"), data_dependent=not static, max_len=40).double()
    ref_m.load_state_dict(m.state_dict())
    x64 = x.detach().double().requires_grad_()
    ref = ref_m.forward_reference(x64)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x)
    assert out.dtype == torch.bfloat16 and torch.isfinite(out).all()
    tol = 0.03 * ref.abs().max().item()
    torch.testing.assert_close(out.double(), ref, atol=tol, rtol=0.05)
    w = torch.randn_like(ref)
    (gx,) = torch.autograd.grad((out.double() * w).sum(), [x])
    (gx_ref,) = torch.autograd.grad((ref * w).sum(), [x64])
    torch.testing.assert_close(gx.double(), gx_ref, atol=0.03 * gx_ref.abs().max().item(), rtol=0.05)


def test_off_diagonal_blocks_have_rank_at_most_the_state_size() -> None:
    N, L = 2, 13
    m = _hydra(state_dim=N)
    dense = m.materialize(torch.randn(1, L, 12, dtype=torch.float64))[0]  # (H, L, L)
    ranks = []
    for h in range(dense.shape[0]):
        for s in range(1, L):
            for block in (dense[h, s:, :s], dense[h, :s, s:]):  # strictly below / above the diagonal
                ranks.append(int(torch.linalg.matrix_rank(block)))
    assert max(ranks) == N  # never above N, and reached (the bound is not vacuous: blocks are up to 6 x 7)
    assert torch.linalg.matrix_rank(dense[0]) > N  # while the whole matrix is not low-rank


def test_lower_and_upper_triangles_come_from_different_parameters() -> None:
    m = _hydra(state_dim=3)
    x = torch.randn(2, 9, 12, dtype=torch.float64)
    q, k, _, g = (t.detach().requires_grad_() for t in m.inputs(x))
    dense = m.matrix.materialize(q, k, g)
    w = torch.randn_like(dense)
    N = 3
    for part, own, other in ((torch.tril(dense, -1), 0, 1), (torch.triu(dense, 1), 1, 0)):
        gq, gk, gg = torch.autograd.grad((part * w).sum(), [q, k, g], retain_graph=True)
        gq, gk = gq.unflatten(-1, (2, N)), gk.unflatten(-1, (2, N))  # [C | C'], [B | B']
        assert gq[..., own, :].abs().sum() > 0 and gk[..., own, :].abs().sum() > 0 and gg[..., own].abs().sum() > 0
        assert gq[..., other, :].abs().sum() == 0 and gk[..., other, :].abs().sum() == 0
        assert gg[..., other].abs().sum() == 0 and gg[..., 2].abs().sum() == 0  # nor the diagonal's gate
    (gd,) = torch.autograd.grad((torch.diagonal(dense, dim1=-2, dim2=-1)).sum(), [g])
    torch.testing.assert_close(gd[..., 2], torch.ones_like(gd[..., 2]))  # the diagonal is the third gate itself
    assert gd[..., :2].abs().sum() == 0


class _LargestTensor(TorchDispatchMode):
    """Records the largest tensor any op produces, and the elements of all of them."""

    def __init__(self) -> None:
        super().__init__()
        self.largest = self.total = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
                self.total += t.numel()
        return out


def _scan_work(L: int, N: int, T: int) -> int:
    args = [torch.randn(1, 2, L, N, requires_grad=True) for _ in range(5)]
    logs = [(-torch.rand(1, 2, L)).requires_grad_() for _ in range(3)]
    with _LargestTensor() as probe:
        quasiseparable_mix(*args, *logs, chunk=T).sum().backward()
    return probe.total


@pytest.mark.torch_compat
def test_scan_work_is_linear_in_length() -> None:
    # elements allocated by forward + backward: doubling L doubles them (a per-chunk gradient as large as all the
    # chunk states, as indexing inside the carry loop would give, makes this quadratic in L / T)
    small, large = _scan_work(512, 16, 8), _scan_work(1024, 16, 8)
    assert large < 2.2 * small


@pytest.mark.torch_compat
def test_scan_memory_is_linear_in_length() -> None:
    B, H, L, N, T = 1, 2, 1024, 8, 16
    args = [torch.randn(B, H, L, N, requires_grad=True) for _ in range(4)]
    v = torch.randn(B, H, L, N, requires_grad=True)
    logs = [(-torch.rand(B, H, L)).requires_grad_() for _ in range(2)]
    diag = torch.randn(B, H, L, requires_grad=True)
    with _LargestTensor() as probe:
        quasiseparable_mix(*args, v, *logs, diag, chunk=T).square().sum().backward()
    assert probe.largest <= 2 * B * H * L * T  # the (T, T) blocks of both directions; an (L, L) matrix is 64x more
    assert all(t.grad is not None and torch.isfinite(t.grad).all() for t in (*args, v, *logs, diag))


@pytest.mark.torch_compat
def test_torchscript_and_fx_follow_the_scan() -> None:
    m = _hydra(chunk_size=4).float().eval()
    x = torch.randn(2, 11, 12)
    q, k, v, g = m.inputs(x)
    ref = m.matrix(q, k, v, g)
    scripted = torch.jit.script(m.matrix)
    torch.testing.assert_close(scripted(q, k, v, g), ref)
    torch.testing.assert_close(
        scripted(q[:, :, :7], k[:, :, :7], v[:, :, :7], g[:, :, :7]),
        m.matrix(q[:, :, :7], k[:, :, :7], v[:, :, :7], g[:, :, :7]),
    )  # another length: nothing was specialized
    traced = torch.fx.symbolic_trace(m.matrix)
    assert any(n.op == "call_function" and n.target is hydra_mix for n in traced.graph.nodes)
    torch.testing.assert_close(traced(q, k, v, g), ref)


def test_bad_arguments_raise_clear_errors() -> None:
    with pytest.raises(ValueError, match="dt_min <= dt_max"):
        QuasiseparableMatrix(8, dt_min=0.1, dt_max=0.01)
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        QuasiseparableMatrix(8, chunk_size=0)
    with pytest.raises(ValueError, match="needs its gates"):
        QuasiseparableMatrix(8).materialize(torch.randn(1, 1, 3, 16), torch.randn(1, 1, 3, 16))


def test_hydra_in_the_deit_and_point_models() -> None:
    timm = pytest.importorskip("timm")
    import vision  # noqa: F401  (registers the models)
    from pointcloud.model import create_model

    torch.manual_seed(0)
    deit = timm.create_model("hydra_deit_tiny_patch16_224", img_size=32, num_classes=3, depth=2)
    mixers = [b.attn for b in deit.blocks]
    assert all(isinstance(a, MatrixMixer) and isinstance(a.matrix, QuasiseparableMatrix) for a in mixers)
    assert all(not a.matrix.shared_bc and a.qkv.out_features == 4 * 192 + 192 for a in mixers)  # [C|C'], [B|B'], v
    out = deit(torch.randn(2, 3, 32, 32))
    assert out.shape == (2, 3) and torch.isfinite(out).all()
    out.sum().backward()
    assert mixers[0].matrix.A_log.grad is not None and mixers[0].gate.weight.grad.abs().sum() > 0
    points = create_model("centroid_transformer_modelnet40", num_classes=4, num_neighbors=8, mixer="hydra")
    assert isinstance(points.blocks[0].mixer.matrix, QuasiseparableMatrix)
    out = points(torch.randn(2, 64, 3))
    assert out.shape == (2, 4) and torch.isfinite(out).all()


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scan_on_cuda_equals_the_dense_matrix(dtype: torch.dtype) -> None:
    m = _hydra(dim=64, heads=4).cuda()
    x = torch.randn(2, 1001, 64, device="cuda", dtype=torch.float64, requires_grad=True)
    ref = m.forward_reference(x)
    (g_ref,) = torch.autograd.grad(ref.square().sum(), [x])
    x_low = x.detach().float().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        out = m.float()(x_low)
    (g,) = torch.autograd.grad(out.float().square().sum(), [x_low])
    tol = 1e-4 if dtype == torch.float32 else 0.03
    torch.testing.assert_close(out.double(), ref, atol=tol * ref.abs().max().item(), rtol=tol)
    torch.testing.assert_close(g.double(), g_ref, atol=tol * g_ref.abs().max().item(), rtol=tol)
