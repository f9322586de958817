"""Structured matrix mixers: efficient path == dense matrix (outputs and gradients, odd L), bidirectionality, bf16,
the registry, TorchScript (scripted == eager, or an error naming the mixer), and the chunked paths' memory bound; the
Dense and DFT mixers against their matrices written out."""

from __future__ import annotations

import math

import pytest
import torch

from attention.mixers import (
    MATRIX_MIXERS,
    MIXERS,
    UNSCRIPTABLE_MIXERS,
    DenseMixer,
    FourierMixer,
    MatrixMixer,
    build_mixer,
    cauchy_mix,
    vandermonde_mix,
)
from measure.bench import largest_output_bytes

SMALL_CHUNKS = {
    "cauchy": {"chunk_size": 4},
    "vandermonde": {"chunk_size": 4},
    "hydra": {"chunk_size": 4},
    "quasiseparable": {"chunk_size": 4},
}


def _mixer(name: str, data_dependent: bool, dim: int = 20, heads: int = 2, max_len: int = 16) -> MatrixMixer:
    torch.manual_seed(0)
    kw = SMALL_CHUNKS.get(name, {})
    return MatrixMixer(dim, heads, matrix=name, data_dependent=data_dependent, max_len=max_len, **kw).double()


@pytest.mark.parametrize("data_dependent", [True, False])
@pytest.mark.parametrize("name", sorted(MATRIX_MIXERS))
def test_efficient_path_matches_dense_matrix(name: str, data_dependent: bool) -> None:
    m = _mixer(name, data_dependent)
    x = torch.randn(2, 13, 20, dtype=torch.float64, requires_grad=True)  # odd L, D = 10 (not a multiple of d_group)
    out, ref = m(x), m.forward_reference(x)
    torch.testing.assert_close(out, ref)
    w = torch.randn_like(out)
    params = [p for p in m.parameters() if p.requires_grad]
    g1 = torch.autograd.grad((out * w).sum(), [x, *params], allow_unused=True)
    g2 = torch.autograd.grad((ref * w).sum(), [x, *params], allow_unused=True)
    for a, b in zip(g1, g2):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b)
    assert g1[0].abs().sum() > 0


@pytest.mark.parametrize("name", sorted(MATRIX_MIXERS))
def test_every_mixer_is_bidirectional_and_twins_ignore_the_input(name: str) -> None:
    m = _mixer(name, True)
    x = torch.randn(1, 9, 20, dtype=torch.float64)
    x2 = x.clone()
    x2[:, -1] += 1.0
    assert not torch.allclose(m(x)[:, 0], m(x2)[:, 0])  # the first output sees the last token
    x3 = x.clone()
    x3[:, 0] += 1.0
    assert not torch.allclose(m(x)[:, -1], m(x3)[:, -1])  # and the last output the first token
    twin = _mixer(name, False)
    torch.testing.assert_close(twin.materialize(x), twin.materialize(torch.randn_like(x)))


def test_matrices_have_their_structure() -> None:
    x = torch.randn(1, 7, 20, dtype=torch.float64)
    t = _mixer("toeplitz", True).materialize(x)  # (B, H, D, L, L)
    torch.testing.assert_close(t[..., 1:, 1:], t[..., :-1, :-1])  # constant along diagonals
    lin = _mixer("linear", True).materialize(x)
    torch.testing.assert_close(lin.sum(-1), torch.ones_like(lin.sum(-1)))  # linear attention: rows sum to 1
    c = _mixer("cauchy", True).materialize(x)
    assert (c > 0).all()  # positive denominators by construction


def test_lowrank_is_the_unnormalized_scaled_product() -> None:
    m = _mixer("lowrank", True)  # D = 10
    x = torch.randn(2, 15, 20, dtype=torch.float64)
    q, k, _, _ = m.inputs(x)
    dense = m.materialize(x)
    torch.testing.assert_close(dense, q @ k.transpose(-1, -2) / (15 * 10) ** 0.5)
    assert torch.linalg.matrix_rank(dense[0, 0]) <= m.head_dim < 15  # rank <= D
    assert not torch.allclose(dense.sum(-1), torch.ones_like(dense.sum(-1)))  # not normalized, unlike "linear"


def test_vandermonde_fixed_frequency_is_the_reference_matrix() -> None:
    torch.manual_seed(3)
    m = MatrixMixer(8, 2, matrix="vandermonde", freq=1e-3, chunk_size=3).double()
    x = torch.randn(1, 11, 8, dtype=torch.float64)
    q, k, _, _ = m.inputs(x)
    pos = torch.arange(11, dtype=torch.float64)
    # the reference: cos(2 pi eps q_td l) - cos(2 pi eps k_ld t), summed over d (ours keeps the 1/L factor)
    ref = (
        torch.cos(2 * torch.pi * 1e-3 * q[:, :, :, None, :] * pos[None, :, None])
        - torch.cos(2 * torch.pi * 1e-3 * k[:, :, None, :, :] * pos[:, None, None])
    ).sum(-1) / 11
    torch.testing.assert_close(m.materialize(x), ref)
    torch.testing.assert_close(m(x), m.forward_reference(x))


@pytest.mark.parametrize("name", sorted(MATRIX_MIXERS))
def test_bf16_autocast_is_finite_and_close(name: str) -> None:
    torch.manual_seed(1)
    m = MatrixMixer(32, 4, matrix=name)
    x = torch.randn(2, 33, 32, requires_grad=True)
    ref = m(x)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = m(x)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref, atol=0.05 * ref.abs().max().item() + 1e-3, rtol=0.05)
    out.float().sum().backward()
    assert torch.isfinite(x.grad).all()


def test_cauchy_denominators_stay_away_from_zero() -> None:
    m = MatrixMixer(8, 1, matrix="cauchy")
    with torch.no_grad():
        m.matrix.c_raw.fill_(-50.0)  # c -> c_min
    q = torch.full((1, 1, 5, 8), -60.0)  # softplus -> 0: the worst case, denominators -> c_min
    a, b = m.matrix._terms(q, q)
    assert float((a.unsqueeze(3) + b.unsqueeze(2)).min().detach()) >= m.matrix.c_min * 0.999
    assert torch.isfinite(cauchy_mix(a, b, torch.randn(1, 1, 5, 3))).all()
    with pytest.raises(ValueError, match="c_min must be > 0"):
        MatrixMixer(8, 1, matrix="cauchy", c_min=0.0)


@pytest.mark.torch_compat
@pytest.mark.parametrize("fn", ["cauchy", "vandermonde"])
def test_chunked_paths_never_build_more_than_a_chunk(fn: str) -> None:
    B, H, L, D, chunk, d_group = 1, 2, 128, 16, 8, 4
    q = torch.rand(B, H, L, D, requires_grad=True)
    k = torch.rand(B, H, L, D, requires_grad=True)
    v = torch.randn(B, H, L, D, requires_grad=True)

    def step() -> None:
        if fn == "cauchy":
            y = cauchy_mix(q + 1, k, v, chunk=chunk, d_group=d_group)
        else:
            y = vandermonde_mix(q, k, v, 0.01, chunk=chunk)
        y.square().sum().backward()

    largest = largest_output_bytes(step) // 4  # float32 elements
    # cauchy: B H chunk L d_group; vandermonde: B H chunk 2D sqrt(L) (the cosines and sines of a chunk's rows)
    per_row = L * d_group if fn == "cauchy" else 2 * D * (math.isqrt(L - 1) + 1)
    assert largest <= B * H * chunk * per_row
    assert largest < B * H * L * L * D / 32  # the (B, H, L, L, D) tensor that materializing would build


def test_vandermonde_chunked_path_against_its_definition_at_long_lengths() -> None:
    """The angle-addition grid (p = a S + b) against cos(theta p) written out, at lengths that are not squares and
    with positions up to L - 1 where the arguments are largest."""
    torch.manual_seed(4)
    for L, chunk in ((1, 1), (2, 1), (97, 10), (300, 64)):
        q = torch.rand(1, 2, L, 3, dtype=torch.float64) * 4 - 2
        k = torch.rand(1, 2, L, 3, dtype=torch.float64) * 4 - 2
        v = torch.randn(1, 2, L, 5, dtype=torch.float64)
        w = 2 * math.pi * 0.37 / max(L, 1)
        pos = torch.arange(L, dtype=torch.float64)
        m = (
            torch.cos(w * q[:, :, :, None, :] * pos[:, None]) - torch.cos(w * k[:, :, None, :, :] * pos[:, None, None])
        ).sum(-1)
        y = vandermonde_mix(q, k, v, 0.37 / max(L, 1), chunk=chunk, backend="torch")
        torch.testing.assert_close(y, m @ v, atol=1e-9, rtol=1e-9)


def test_softmax_matches_explicit_and_takes_a_mask() -> None:
    torch.manual_seed(2)
    m = MatrixMixer(16, 2, matrix="softmax")
    explicit = MatrixMixer(16, 2, matrix="softmax", sdpa=False)
    explicit.load_state_dict(m.state_dict())
    x = torch.randn(2, 11, 16)
    mask = torch.rand(2, 1, 11, 11) > 0.3
    mask[..., 0] = True
    torch.testing.assert_close(m(x, attn_mask=mask), explicit(x, attn_mask=mask), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(m(x), m.forward_reference(x), atol=1e-5, rtol=1e-5)


def test_registry_builds_every_mixer_and_names_the_choices() -> None:
    x = torch.randn(2, 10, 16)
    for name in MIXERS:
        mixer = build_mixer(name, 16, num_heads=2, max_len=12)
        out = mixer(x)
        assert out.shape == x.shape and torch.isfinite(out).all(), name
    with pytest.raises(ValueError, match=r"unknown mixer 'nope'; choose one of \['cauchy'"):
        build_mixer("nope", 16)
    with pytest.raises(ValueError, match=r"unknown mixer \[1\]; choose one of \['cauchy'"):  # not a TypeError
        build_mixer([1], 16)
    with pytest.raises(ValueError, match="needs max_len"):
        build_mixer("fsat", 16)
    with pytest.raises(ValueError, match="needs max_len"):
        build_mixer("cauchy_static", 16)
    assert {"dense", "dft"} <= set(MIXERS)


def test_bad_inputs_raise_clear_errors() -> None:
    m = MatrixMixer(16, 2, matrix="toeplitz")
    with pytest.raises(ValueError, match=r"x must be \(B, L, 16\)"):
        m(torch.randn(10, 16))
    with pytest.raises(ValueError, match="softmax matrix only"):
        m(torch.randn(1, 4, 16), attn_mask=torch.ones(4, 4, dtype=torch.bool))
    twin = MatrixMixer(16, 2, matrix="cauchy", data_dependent=False, max_len=8)
    with pytest.raises(ValueError, match="exceeds max_len=8"):
        twin(torch.randn(1, 9, 16))
    with pytest.raises(ValueError, match="unknown matrix"):
        MatrixMixer(16, 2, matrix="hankel")
    with pytest.raises(ValueError, match="divisible"):
        MatrixMixer(15, 2)
    with pytest.raises(ValueError, match="num_heads must be >= 1"):
        MatrixMixer(16, 0)


def _grads(out: torch.Tensor, w: torch.Tensor, x: torch.Tensor, module: torch.nn.Module) -> list:
    params = [p for p in module.parameters() if p.requires_grad]
    return list(torch.autograd.grad((out * w).sum(), [x, *params], allow_unused=True))


@pytest.mark.torch_compat
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_torchscript_compiles_every_mixer_but_the_custom_function_ones(name: str) -> None:
    """Scripted == eager (outputs and gradients, two lengths: nothing specialized) for every mixer outside
    UNSCRIPTABLE_MIXERS; those (custom autograd Functions) raise an error that names the mixer."""
    torch.manual_seed(0)
    m = build_mixer(name, 16, num_heads=2, max_len=12, **SMALL_CHUNKS.get(name.split("_")[0], {})).double().eval()
    if name in UNSCRIPTABLE_MIXERS:
        label = "FSAT" if name == "fsat" else f"'{name.split('_')[0]}'"
        with pytest.raises(RuntimeError, match=rf"the {label} sequence mixer cannot be compiled by TorchScript"):
            torch.jit.script(m)
        return
    scripted = torch.jit.script(m)
    for L in (9, 12):
        x = torch.randn(2, L, 16, dtype=torch.float64, requires_grad=True)
        out, ref = scripted(x), m(x)
        torch.testing.assert_close(out, ref)
        w = torch.randn_like(ref)
        for a, b in zip(_grads(out, w, x, scripted), _grads(ref, w, x, m)):
            assert (a is None) == (b is None)
            if a is not None:
                torch.testing.assert_close(a, b)


@pytest.mark.torch_compat
def test_scripted_mixers_keep_their_errors_and_the_softmax_mask() -> None:
    torch.manual_seed(2)
    x = torch.randn(2, 11, 16)
    mask = torch.rand(2, 1, 11, 11) > 0.3
    mask[..., 0] = True
    softmax = MatrixMixer(16, 2, matrix="softmax").eval()
    torch.testing.assert_close(torch.jit.script(softmax)(x, attn_mask=mask), softmax(x, attn_mask=mask))
    with pytest.raises(torch.jit.Error, match="softmax matrix only"):
        torch.jit.script(MatrixMixer(16, 2, matrix="toeplitz"))(x, attn_mask=mask)
    twin = torch.jit.script(MatrixMixer(16, 2, matrix="hydra", data_dependent=False, max_len=8))
    with pytest.raises(torch.jit.Error, match="exceeds max_len=8"):
        twin(torch.randn(1, 9, 16))


def test_dense_mixer_is_its_free_matrix_times_the_values() -> None:
    """Dense: y = proj(einsum(W[:L, :L] / sqrt(L_max), v)) with one free matrix per head, the same for every input;
    gradients reach the matrix's top-left L x L block only."""
    torch.manual_seed(4)
    m = build_mixer("dense", 12, num_heads=3, max_len=16).double()
    assert isinstance(m, DenseMixer) and m.matrix.shape == (3, 16, 16)
    x = torch.randn(2, 11, 12, dtype=torch.float64)
    v = m.v(x).view(2, 11, 3, 4)  # (B, L, H, D)
    mixed = torch.einsum("hij,bjhd->bihd", m.matrix[:, :11, :11], v) / 16**0.5
    torch.testing.assert_close(m(x), m.proj(mixed.reshape(2, 11, 12)))
    torch.testing.assert_close(m.materialize(x), m.materialize(torch.randn_like(x)))  # no data dependence
    m(x).square().sum().backward()
    assert m.matrix.grad[:, :11, :11].abs().sum() > 0 and not m.matrix.grad[:, 11:].any()
    with pytest.raises(ValueError, match="exceeds max_len=16"):
        m(torch.randn(1, 17, 12, dtype=torch.float64))
    with pytest.raises(ValueError, match="softmax matrix only, not 'dense'"):
        m(x, attn_mask=torch.ones(11, 11, dtype=torch.bool))
    with pytest.raises(ValueError, match="needs max_len"):
        build_mixer("dense", 12)


@pytest.mark.parametrize("L", [1, 7, 16])
def test_dft_mixer_is_the_real_part_of_the_2d_dft(L: int) -> None:
    """DFT (FNet): Re(F_L X F_C) with the orthonormal DFT matrices written out; no parameters; bf16 in, bf16 out."""
    m = build_mixer("dft", 10, num_heads=2)
    assert isinstance(m, FourierMixer) and not list(m.parameters())
    x = torch.randn(3, L, 10, dtype=torch.float64)
    f_l, f_c = FourierMixer.dft_matrix(L), FourierMixer.dft_matrix(10)
    ref = (f_l @ x.to(torch.complex128) @ f_c).real  # F_C is symmetric: the channel transform is x F_C
    torch.testing.assert_close(m(x), ref)
    assert m(x.bfloat16()).dtype == torch.bfloat16
    if L == 1:  # the 1-D DFT of a single token is itself: only the channel transform remains
        torch.testing.assert_close(m(x), (x.to(torch.complex128) @ f_c).real)
    with pytest.raises(ValueError, match="softmax matrix only, not 'dft'"):
        m(x, attn_mask=torch.ones(L, L, dtype=torch.bool))
