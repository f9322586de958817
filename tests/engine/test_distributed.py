"""Tests for engine.distributed: single-process context, and 2-process DDP on CPU (gloo) through the Trainer."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from engine import DistributedContext, Trainer, init_distributed, load_checkpoint, unwrap, wrap_ddp
from engine.testing import free_port


def test_single_process_context(monkeypatch):
    for name in ("WORLD_SIZE", "RANK", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)
    ctx = init_distributed("cpu")
    assert (ctx.rank, ctx.world_size, ctx.is_main, ctx.is_distributed) == (0, 1, True, False)
    assert ctx.device == torch.device("cpu")
    t = torch.ones(3)
    assert ctx.all_reduce_sum(t) is t and torch.equal(t, torch.ones(3))
    assert ctx.all_gather_object({"a": 1}) == [{"a": 1}]
    ctx.barrier()
    ctx.destroy()
    model = nn.Linear(2, 2)
    assert wrap_ddp(model, ctx) is model and unwrap(model) is model
    assert init_distributed("auto").device.type == ("cuda" if torch.cuda.is_available() else "cpu")


def test_missing_rank_is_an_error(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match="RANK"):
        init_distributed("cpu")


def _worker(rank: int, world_size: int, port: int, run_dir: str) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world_size),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    ctx = init_distributed("cpu")
    ok = False
    try:
        assert ctx.is_distributed and ctx.rank == rank and ctx.world_size == world_size
        g = torch.Generator().manual_seed(0)
        x = torch.randn(64, 4, generator=g)
        y = x @ torch.randn(4, 1, generator=g)
        dataset = TensorDataset(x, y)
        loader = DataLoader(dataset, batch_size=8, sampler=DistributedSampler(dataset, shuffle=True, seed=0))
        torch.manual_seed(0)  # same init on every rank (DDP also broadcasts rank 0's parameters)
        model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Dropout(0.1), nn.Linear(16, 1))
        initial = torch.cat([p.detach().flatten().clone() for p in model.parameters()])
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

        def loss_fn(model, batch):
            inputs, targets = batch
            return F.mse_loss(model(inputs), targets), {}

        def evaluate_fn(model, epoch):
            return {"val_loss": F.mse_loss(model(x), y)}

        trainer = Trainer(
            model=model,
            optimizer=optimizer,
            train_loader=loader,
            loss_fn=loss_fn,
            evaluate_fn=evaluate_fn,
            run_dir=run_dir,
            epochs=2,
            ctx=ctx,
            progress=False,
        )
        assert isinstance(trainer.model, nn.parallel.DistributedDataParallel)
        final = trainer.fit()
        params = torch.cat([p.detach().flatten() for p in trainer.module.parameters()])
        gathered = ctx.all_gather_object(params)
        assert all(torch.equal(gathered[0], other) for other in gathered[1:]), "parameters differ across ranks"
        assert not torch.equal(params, initial), "no step was taken"
        assert trainer.global_step == 2 * 4  # 64 samples / 2 ranks / batch 8 = 4 steps per epoch
        finals = ctx.all_gather_object(final)
        assert finals[0]["val_loss"] == finals[1]["val_loss"]
        if ctx.is_main:
            torch.save(params, Path(run_dir) / "params_rank0.pt")
        ok = True
    finally:
        ctx.destroy(barrier=ok)  # a failed rank must not leave its peer waiting at the barrier


@pytest.mark.slow
def test_ddp_two_processes_on_cpu(tmp_path):
    mp.spawn(_worker, args=(2, free_port(), str(tmp_path)), nprocs=2, join=True)
    params = torch.load(tmp_path / "params_rank0.pt")
    last = load_checkpoint(tmp_path / "last.pt")
    assert last["epoch"] == 2
    assert torch.equal(torch.cat([t.flatten() for t in last["model"].values()]), params)
    log = [line for line in (tmp_path / "log.jsonl").read_text().splitlines() if line]
    assert len(log) == 2  # only rank 0 writes


@pytest.mark.parametrize("barrier", [True, False])
def test_destroy_meets_the_peers_only_when_asked(monkeypatch, barrier):
    """destroy() destroys the group and settles gloo's threads; the barrier is skipped after an error."""
    import engine.distributed as distributed

    calls = []
    monkeypatch.setattr(distributed.dist, "is_initialized", lambda: True)
    monkeypatch.setattr(distributed.dist, "get_backend", lambda *a: "gloo")
    monkeypatch.setattr(distributed.dist, "barrier", lambda *a, **k: calls.append("barrier"))
    monkeypatch.setattr(distributed.dist, "destroy_process_group", lambda *a: calls.append("destroy"))
    monkeypatch.setattr(distributed.time, "sleep", lambda s: calls.append(("sleep", s)))
    DistributedContext(rank=1, world_size=2).destroy(barrier=barrier)
    settle = ("sleep", distributed.TEARDOWN_SETTLE_S)
    assert calls == (["barrier", "destroy", settle] if barrier else ["destroy", settle])
    calls.clear()
    DistributedContext().destroy(barrier=barrier)  # a single process has no group: nothing to do
    assert calls == []


def test_context_defaults():
    ctx = DistributedContext()
    assert ctx.is_main and not ctx.is_distributed and ctx.device == torch.device("cpu")
