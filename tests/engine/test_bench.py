"""engine.bench: the aten-op count that stands for a GPU's launch cost."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine import bench as benchutil


def test_count_aten_ops_counts_forward_backward_views_and_syncs() -> None:
    x = torch.randn(4, 3, requires_grad=True)
    # forward view, mul, sum; backward: ones_like for the seed gradient, expand, mul, view, detach for x.grad
    ops, views = benchutil.count_aten_ops(lambda: x.view(12).mul(2.0).sum().backward())
    assert (ops, views) == (8, 4)  # torch 2.11 and 2.15 alike
    sync_ops, _ = benchutil.count_aten_ops(lambda: x.sum().item())
    assert sync_ops == 2  # sum + _local_scalar_dense


def test_count_aten_ops_sees_chunking() -> None:
    """More chunks, more ops: what the KNN attention's chunk budget changes."""
    x = torch.randn(64, 8)

    def chunked(n: int) -> None:
        for part in x.chunk(n):
            F.relu(part).sum()

    one, _ = benchutil.count_aten_ops(lambda: chunked(1))
    eight, _ = benchutil.count_aten_ops(lambda: chunked(8))
    assert eight > 7 * one // 2 and eight - one >= 14


def test_run_config_in_process_turns_an_exception_into_the_rows_error() -> None:
    def measure(cfg: dict) -> dict:
        if cfg["fail"]:
            raise RuntimeError("CUDA out of memory (pretend)")
        return {"ms": 1.0}

    assert benchutil.run_config("unused.py", measure, {"fail": False}, isolate=False) == {"ms": 1.0}
    assert benchutil.run_config("unused.py", measure, {"fail": True}, isolate=False) == {
        "error": "RuntimeError: CUDA out of memory (pretend)"
    }
    assert benchutil.isolate_configs("auto", "cpu") and not benchutil.isolate_configs("auto", "cuda")
    assert benchutil.isolate_configs("yes", "cuda") and not benchutil.isolate_configs("no", "cpu")
