"""The ``compile`` config key: engine.run trains through ``torch.compile(model, mode=...)``, with the same losses as
eager, checkpoints of the uncompiled module, and a resume that may switch it on or off."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torch import nn

from engine import CompileMode, Trainer, load_checkpoint, run
from engine.testing import BlobsTask, BlobsTaskConfig, blobs, read_log, strip_timing

# Training through torch.compile changes with the torch version
pytestmark = pytest.mark.torch_compat

DIM, CLASSES = 8, 3


@dataclass
class LineConfig(BlobsTaskConfig):
    name: str = "line"
    epochs: int = 2
    compile: CompileMode | None = None


class LineRecipe(BlobsTask):
    group = "line"
    config_cls = LineConfig
    monitor = "val_loss"

    def build_datasets(self):
        return blobs(64, 0), blobs(32, 2)

    def build_model(self) -> nn.Module:  # no dropout: inductor draws other random numbers than eager
        return nn.Sequential(nn.Linear(DIM, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, CLASSES))


def _records(out: Path) -> list[dict]:
    return [strip_timing(r) for r in read_log(out)]


def test_compile_key_trains_through_torch_compile_and_saves_the_plain_module(tmp_path, monkeypatch) -> None:
    """The key reaches torch.compile once, for training only (dynamo's eager backend here: the same aten ops, so the
    same losses bit for bit); checkpoints hold the uncompiled module's keys; a resume may turn it off."""
    real_compile, modes = torch.compile, []

    def spy(model, mode=None, **kwargs):
        modes.append(mode)
        return real_compile(model, backend="eager")

    monkeypatch.setattr(torch, "compile", spy)
    eager = run(LineRecipe, LineConfig(), output_dir=tmp_path / "eager", device="cpu", progress=False)
    assert modes == []
    compiled = run(LineRecipe, LineConfig(compile="reduce-overhead"), output_dir=tmp_path / "compiled", device="cpu",
                   progress=False)  # fmt: skip
    assert modes == ["reduce-overhead"]
    assert compiled["val_loss"] == eager["val_loss"]
    assert _records(tmp_path / "compiled") == _records(tmp_path / "eager")
    saved = load_checkpoint(tmp_path / "compiled" / "last.pt")["model"]
    assert list(saved) == list(load_checkpoint(tmp_path / "eager" / "last.pt")["model"])  # no "_orig_mod." prefix
    resumed = run(LineRecipe, LineConfig(epochs=3), output_dir=tmp_path / "compiled", resume="auto", device="cpu",
                  progress=False)  # fmt: skip
    assert resumed["epochs"] == 3 and modes == ["reduce-overhead"]


def test_trainer_refuses_an_unknown_compile_mode(tmp_path) -> None:
    model = nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"compile_mode must be None or one of \('default', 'reduce-overhead'"):
        Trainer(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), train_loader=[], loss_fn=None,
                evaluate_fn=None, run_dir=tmp_path, epochs=1, compile_mode="fast")  # fmt: skip


@pytest.mark.slow
def test_compiled_training_with_inductor_equals_eager(tmp_path) -> None:
    """torch.compile's default backend (inductor, C++ on CPU): every epoch's losses equal eager's within rounding."""
    run(LineRecipe, LineConfig(), output_dir=tmp_path / "eager", device="cpu", progress=False)
    run(LineRecipe, LineConfig(compile="default"), output_dir=tmp_path / "compiled", device="cpu", progress=False)
    eager, compiled = _records(tmp_path / "eager"), _records(tmp_path / "compiled")
    assert len(eager) == len(compiled) == 2
    for a, b in zip(eager, compiled):
        for key in ("train_loss", "val_loss"):
            assert b[key] == pytest.approx(a[key], rel=1e-5), (key, a["epoch"])
