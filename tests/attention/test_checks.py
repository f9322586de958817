"""attention.checks: the shared validation of sequences, masks and indices says what was expected and what came."""

from __future__ import annotations

import pytest
import torch

from attention.checks import check_heads, check_index, check_mask, check_seq, input_checks


@pytest.mark.parametrize(
    "x,kwargs,error,match",
    [
        ([1.0], {}, TypeError, r"x must be a torch.Tensor of shape \(B, L, C\), got list"),
        (torch.randn(4, 8), {}, ValueError, r"x must be \(B, L, C\), got a 2-d tensor of shape \(4, 8\)"),
        (torch.randn(4, 8), {"channels": 8}, ValueError, r"x must be \(B, L, 8\), got a 2-d tensor"),
        (torch.ones(1, 4, 8, dtype=torch.long), {}, TypeError, r"floating point tensor \(.*\), got torch.int64"),
        (torch.randn(1, 4, 9), {"channels": 8}, ValueError, r"x must be \(B, L, 8\), got shape \(1, 4, 9\)"),
        (torch.randn(1, 0, 8), {}, ValueError, "at least one token"),
        (torch.randn(1, 9, 8), {"max_len": 8}, ValueError, "sequence length L=9 exceeds max_len=8"),
    ],
)
def test_check_seq_names_what_was_expected(x, kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        check_seq(x, "x", **kwargs)


def test_check_seq_passes_a_good_sequence_and_is_off_with_the_switch() -> None:
    check_seq(torch.randn(2, 5, 8), "x", channels=8, max_len=5)
    with input_checks(False):
        check_seq(torch.randn(4, 8), "x", channels=3)  # shapes unchecked; the type still is
        with pytest.raises(TypeError):
            check_seq(None, "x")


@pytest.mark.parametrize(
    "mask,kwargs,error,match",
    [
        ([True], {}, TypeError, r"mask must be a bool torch.Tensor of shape \(2, 5\), got list"),
        (torch.ones(2, 4, dtype=torch.bool), {}, ValueError, r"shape \(2, 5\), got torch.bool \(2, 4\)"),
        (
            torch.ones(2, 5),
            {"like_name": "x"},
            ValueError,
            r"bool tensor of shape \(2, 5\) matching x, got torch.float",
        ),
        (
            torch.ones(2, 5, dtype=torch.bool, device="meta"),
            {"device": torch.device("cpu"), "like_name": "x"},
            ValueError,
            "mask is on meta but x is on cpu",
        ),
        (
            torch.tensor([[True] * 5, [False] * 5]),
            {"nonempty": "cloud"},
            ValueError,
            "every cloud needs at least one real entry; mask has an all-False row",
        ),
    ],
)
def test_check_mask_names_what_was_expected(mask, kwargs: dict, error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        check_mask(mask, "mask", batch=2, length=5, **kwargs)


def test_check_mask_passes_none_and_a_good_mask() -> None:
    check_mask(None, "mask", batch=2, length=5, nonempty="cloud")
    check_mask(torch.tensor([[True] * 5, [False] * 4 + [True]]), "mask", batch=2, length=5, nonempty="cloud")


@pytest.mark.parametrize(
    "idx,error,match",
    [
        (torch.zeros(2, 4, 3), TypeError, "int64"),
        (torch.zeros(2, 3, 2, dtype=torch.long), ValueError, r"idx must be a \(B, M, K\) = \(2, 4, K\) index tensor"),
        (torch.zeros(2, 4, dtype=torch.long), ValueError, r"\(B, M, K\) = \(2, 4, K\)"),
        (torch.full((2, 4, 3), 10), ValueError, r"idx must index the N=10 inputs, got values in \[10, 10\]"),
        (torch.full((2, 4, 3), -1), ValueError, r"got values in \[-1, -1\]"),
        (torch.zeros(2, 4, 3, dtype=torch.long, device="meta"), ValueError, "idx is on meta but the data is on cpu"),
    ],
)
def test_check_index_with_a_shape_and_a_bound(idx: torch.Tensor, error: type[Exception], match: str) -> None:
    kwargs = {"shape": (2, 4, "K"), "dims": "(B, M, K)", "bound": 10, "of": "N=10 inputs"}
    with pytest.raises(error, match=match):
        check_index(idx, "idx", batch=2, device=torch.device("cpu"), **kwargs)
    check_index(torch.randint(0, 10, (2, 4, 7)), "idx", batch=2, device=torch.device("cpu"), **kwargs)


def test_heads_must_divide_the_channels_and_the_message_names_the_argument() -> None:
    check_heads(12, 3)
    with pytest.raises(ValueError, match=r"num_heads must be >= 1 and latent_dim=10 divisible by it, got num_heads=4"):
        check_heads(10, 4, "latent_dim")
    with pytest.raises(ValueError, match=r"dim=8 divisible by it, got num_heads=0"):
        check_heads(8, 0)


def test_checks_stand_aside_while_a_cuda_graph_is_captured(monkeypatch: pytest.MonkeyPatch) -> None:
    """A capture (torch.cuda.graph, make_graphed_callables) forbids reading a value back: a layer captured whole skips
    its checks, as under a tracer, and checks again once the capture ends."""
    from attention import knn
    from attention.checks import checks_active

    q = torch.full((1, 4, 3), float("nan"))
    with pytest.raises(ValueError, match="NaN or Inf"):
        knn(q, torch.randn(1, 8, 3), 2)
    capturing = [True]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    assert not checks_active()
    knn(q, torch.randn(1, 8, 3), 2, backend="torch")  # no check: no error
    capturing[0] = False
    assert checks_active()
    with pytest.raises(ValueError, match="NaN or Inf"):
        knn(q, torch.randn(1, 8, 3), 2)
