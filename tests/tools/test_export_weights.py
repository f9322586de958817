"""tools/export_weights.py (engine.export): best.pt -> model.safetensors + config.json, loaded back by timm and by
pointcloud."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import timm
import torch
from torch.testing import assert_close

import pointcloud
import vision  # noqa: F401
from engine.checkpoint import save_checkpoint
from engine.export import export_weights, load_exported, model_args_from_overrides
from engine.testing import REPO, tool_env

# Checkpoint loading (into safetensors, through timm's pretrained loader) changes with the torch version
pytestmark = pytest.mark.torch_compat

OURS_1 = "centroid_deit_tiny_c6_patch16_224"
TINY = dict(img_size=32, depth=2, centroid_index=1, num_classes=7)


def _perturbed(model: torch.nn.Module) -> torch.nn.Module:
    """Weights unlike any fresh init, so a load that silently kept the init would fail the comparison."""
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return model.eval()


def test_vision_round_trip_through_timm_pretrained(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = _perturbed(timm.create_model(OURS_1, **TINY))
    ema = {f"module.{k}": v + 1.0 for k, v in model.state_dict().items()}  # timm ModelEmaV3 key layout
    save_checkpoint({"model": model.state_dict(), "ema": ema, "config": {"model": OURS_1}}, tmp_path / "best.pt")
    sets = [f"{k}={v}" for k, v in TINY.items()]
    cli = [sys.executable, str(REPO / "tools" / "export_weights.py"), str(tmp_path / "best.pt"), "--out"]
    done = subprocess.run([*cli, str(tmp_path / "out"), "--set", *sets], env=tool_env(), capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    path = tmp_path / "out" / "model.safetensors"
    assert f"wrote {path}" in done.stdout
    meta = json.loads((tmp_path / "out" / "config.json").read_text())
    assert meta["architecture"] == OURS_1 and meta["num_classes"] == 7 and meta["model_args"] == TINY
    assert meta["pretrained_cfg"]["file"] == "model.safetensors" and meta["pretrained_cfg"]["num_classes"] == 7
    loaded = timm.create_model(
        OURS_1, pretrained=True, pretrained_cfg_overlay=dict(file=str(path), num_classes=7), **TINY
    ).eval()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert_close(loaded(x), model(x), rtol=0, atol=0)
    # --ema exports the EMA weights (prefix stripped)
    assert model_args_from_overrides(sets) == TINY  # the CLI's --set grammar (YAML values, as the training CLIs')
    export_weights(tmp_path / "best.pt", tmp_path / "ema", model_args=TINY, ema=True)
    from safetensors.torch import load_file

    ema_sd = load_file(str(tmp_path / "ema" / "model.safetensors"))
    assert_close(ema_sd["cls_token"], model.state_dict()["cls_token"] + 1.0)


def test_pointcloud_round_trip(tmp_path: Path) -> None:
    name = "centroid_transformer_modelnet40"
    torch.manual_seed(0)
    model = _perturbed(pointcloud.create_model(name, num_neighbors=4, num_classes=5))
    save_checkpoint({"model": model.state_dict(), "config": {}}, tmp_path / "best.pt")
    path = export_weights(tmp_path / "best.pt", tmp_path / "out", name, {"num_neighbors": 4, "num_classes": 5})
    loaded = pointcloud.create_model(name, checkpoint=path, num_neighbors=4, num_classes=5).eval()
    x = torch.rand(2, 64, 3)
    with torch.no_grad():
        assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_errors_name_the_fix(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = timm.create_model(OURS_1, **TINY)
    save_checkpoint({"model": model.state_dict(), "config": {}}, tmp_path / "best.pt")
    with pytest.raises(ValueError, match="pass --model NAME"):
        export_weights(tmp_path / "best.pt", tmp_path / "out")
    with pytest.raises(ValueError, match="--set"):
        export_weights(tmp_path / "best.pt", tmp_path / "out", OURS_1, dict(TINY, depth=3))
    with pytest.raises(ValueError, match="unknown model"):
        export_weights(tmp_path / "best.pt", tmp_path / "out", "no_such_model")
    with pytest.raises(ValueError, match=r"\.safetensors"):
        pointcloud.create_model("centroid_transformer_modelnet40", checkpoint=tmp_path / "best.pt")


def test_a_recorded_model_spec_is_used_and_a_changed_keyword_refused(tmp_path: Path) -> None:
    name, kwargs = "centroid_transformer_modelnet40", {"num_neighbors": 4, "num_classes": 5}
    torch.manual_seed(0)
    model = _perturbed(pointcloud.create_model(name, **kwargs))
    state = {"model": model.state_dict(), "config": {"model": name}, "model_spec": {"name": name, "kwargs": kwargs}}
    save_checkpoint(state, tmp_path / "best.pt")
    export_weights(tmp_path / "best.pt", tmp_path / "out")  # no name, no keywords: the recorded ones
    loaded = load_exported(tmp_path / "out")
    x = torch.rand(2, 64, 3)
    with torch.no_grad():
        assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["model_args"] == kwargs
    with pytest.raises(ValueError, match=r"refusing to export .*num_neighbors: 4 in the run, 8 now"):
        export_weights(tmp_path / "best.pt", tmp_path / "bad", model_args={"num_neighbors": 8})
    with pytest.raises(ValueError, match="holds a centroid_transformer_modelnet40, not a dgcnn"):
        export_weights(tmp_path / "best.pt", tmp_path / "bad", name="dgcnn")
    export_weights(tmp_path / "best.pt", tmp_path / "torch", model_args={"attn_backend": "gather"})  # an added keyword


def test_cli_user_errors_are_one_line(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "tools" / "export_weights.py"), str(tmp_path / "missing.pt"), "--out", "x"],
        env=tool_env(), capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"error: checkpoint not found: {tmp_path / 'missing.pt'}"
