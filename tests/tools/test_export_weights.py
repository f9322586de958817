"""tools/export_weights.py (engine.export): best.pt -> model.safetensors + config.json, loaded back by timm and by
pointcloud."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import timm
import torch
from safetensors.torch import load_file
from torch.testing import assert_close

import capsules  # noqa: F401
import lra  # noqa: F401
import pointcloud
import vision  # noqa: F401
from engine.checkpoint import save_checkpoint
from engine.export import PROBE_ATOL, PROBE_RTOL, export_weights, load_exported, model_args_from_overrides
from engine.registry import create_by_name, example_inputs
from engine.testing import run_tool
from engine.weights import DIGEST_KEY, weights_digest
from pointcloud.model import example_clouds

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
    done = run_tool("export_weights", [str(tmp_path / "best.pt"), "--out", str(tmp_path / "out"), "--set", *sets])
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
    done = run_tool("export_weights", [str(tmp_path / "missing.pt"), "--out", "x"])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.strip() == f"error: checkpoint not found: {tmp_path / 'missing.pt'}"


# --------------------------------------------------------------------------------------------------------------------
# --set on top of a recorded model: refused unless the model's outputs stay the trained one's
# --------------------------------------------------------------------------------------------------------------------

# One tiny model per family the CLIs train (registered name, recorded keywords, the run's config), with a --set that
# changes its function although the weights keep their shapes, and one that keeps it (a backend, or dropout, which
# eval mode does not use).
FAMILIES = {
    "train_modelnet": (
        "centroid_transformer_modelnet40",
        dict(num_neighbors=4, num_classes=5, num_centroids=[16, 8], fuse_dim=32, widths=[16, 32, 32, 32],
             head_dims=[32, 32]),
        {"num_points": 32},
        {"num_heads": 2},
        {"attn_backend": "gather"},
    ),
    "train_partseg": (
        "centroid_transformer_partseg",
        dict(num_neighbors=4, num_centroids=[16, 8], fuse_dim=32, widths=[16, 32, 32, 32], global_dim=16,
             head_dims=[16], num_parts=6, num_categories=2),
        {"num_points": 32},
        {"num_heads": 2},
        {"drop": 0.1},
    ),
    "train_capsules": (
        "pointcaps_centroid_small",
        dict(num_points=32, num_primary=32, num_latent=4, latent_dim=16),
        {"num_points": 32},
        {"num_iterations": 5},
        {"primary_backend": "torch"},
    ),
    "train_deit": (OURS_1, TINY, {}, {"num_heads": 4}, {"drop_rate": 0.1}),
    "lra_listops": ("listops_classifier", dict(seq_len=24, width=16), {}, {"num_heads": 2}, {"drop": 0.1}),
}  # fmt: skip


def _recorded_run(tmp_path: Path, family: str) -> tuple[Path, torch.nn.Module]:
    """best.pt as a training CLI writes it (weights, config, model_spec) for ``family``'s tiny model."""
    name, kwargs, config, _, _ = FAMILIES[family]
    torch.manual_seed(0)
    model = _perturbed(create_by_name(name, kwargs))
    state = {"model": model.state_dict(), "config": {"model": name, **config},
             "model_spec": {"name": name, "kwargs": kwargs}}  # fmt: skip
    save_checkpoint(state, tmp_path / "best.pt")
    return tmp_path / "best.pt", model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_a_set_that_changes_the_function_is_refused_and_one_that_keeps_it_exports_the_weights(
    family: str, tmp_path: Path
) -> None:
    """Same shapes, another function: loading the weights proves nothing, the outputs on a probe batch do."""
    name, kwargs, config, changes, keeps = FAMILIES[family]
    best, model = _recorded_run(tmp_path, family)
    keys = ", ".join(changes)
    with pytest.raises(
        ValueError, match=rf"refusing to export .*best.pt with --set {keys}: it changes what the trained"
    ):
        export_weights(best, tmp_path / "changed", model_args=changes)
    assert not (tmp_path / "changed" / "model.safetensors").exists()
    export_weights(best, tmp_path / "kept", model_args=keeps)
    exported = load_file(str(tmp_path / "kept" / "model.safetensors"))
    trained = model.state_dict()
    assert exported.keys() == trained.keys() and all(torch.equal(exported[k], trained[k]) for k in trained)
    assert json.loads((tmp_path / "kept" / "config.json").read_text())["model_args"] == {**kwargs, **keeps}
    loaded = load_exported(tmp_path / "kept")
    inputs = example_inputs(name, model, config)
    with torch.no_grad():
        assert_close(loaded(*inputs), model(*inputs), rtol=PROBE_RTOL, atol=PROBE_ATOL)


def test_cli_refuses_a_knob_the_run_never_set_in_one_line(tmp_path: Path) -> None:
    """The issue's command: ``export_weights.py ok1/best.pt --set num_heads=2`` (exit 0 before, outputs 0.02 off)."""
    best, _ = _recorded_run(tmp_path, "train_modelnet")
    done = run_tool("export_weights", [str(best), "--out", str(tmp_path / "out"), "--set", "num_heads=2"])
    assert done.returncode == 2 and "Traceback" not in done.stderr
    line = done.stderr.strip().splitlines()[-1]
    assert line.startswith(f"error: refusing to export {best} with --set num_heads: it changes what the trained")
    assert "drop num_heads from --set" in line
    assert not (tmp_path / "out" / "model.safetensors").exists()


# --------------------------------------------------------------------------------------------------------------------
# model.safetensors carries a digest of its tensors; readers check it and refuse non-finite weights
# --------------------------------------------------------------------------------------------------------------------


def _export_modelnet(tmp_path: Path) -> tuple[Path, torch.nn.Module]:
    best, model = _recorded_run(tmp_path, "train_modelnet")
    return export_weights(best, tmp_path / "out"), model


def test_the_export_records_its_tensors_digest(tmp_path: Path) -> None:
    path, model = _export_modelnet(tmp_path)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        metadata = f.metadata()
    assert metadata[DIGEST_KEY] == weights_digest(model.state_dict()) == weights_digest(load_file(str(path)))
    assert metadata["format"] == "pt" and metadata["architecture"] == "centroid_transformer_modelnet40"


def test_a_flipped_data_byte_is_refused_naming_the_file(tmp_path: Path) -> None:
    path, _ = _export_modelnet(tmp_path)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10  # a byte of the last tensor's data, not of the header
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{path} is damaged: its tensors' sha256 is .*export the checkpoint again"):
        load_exported(tmp_path / "out")
    name, kwargs, *_ = FAMILIES["train_modelnet"]
    with pytest.raises(ValueError, match=rf"{path} is damaged"):
        pointcloud.create_model(name, checkpoint=path, **kwargs)


def test_timm_loading_a_damaged_vision_export_is_refused(tmp_path: Path) -> None:
    best, _ = _recorded_run(tmp_path, "train_deit")
    path = export_weights(best, tmp_path / "out")
    data = bytearray(path.read_bytes())
    data[-3] ^= 0x10
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=rf"{path} is damaged"):
        timm.create_model(OURS_1, pretrained=True, pretrained_cfg_overlay=dict(file=str(path), num_classes=7), **TINY)


def _rewrite(path: Path, tensors: dict[str, torch.Tensor], digest: bool) -> None:
    """``path`` rewritten with ``tensors``, with their digest or (as an older export) without one."""
    from safetensors.torch import save_file

    metadata = {"format": "pt", **({DIGEST_KEY: weights_digest(tensors)} if digest else {})}
    save_file(tensors, str(path), metadata=metadata)


@pytest.mark.parametrize("digest", [True, False])
def test_a_nan_weight_is_refused_on_load(tmp_path: Path, digest: bool) -> None:
    path, _ = _export_modelnet(tmp_path)
    tensors = load_file(str(path))
    tensors["head.weight"][0, 0] = float("nan")
    _rewrite(path, tensors, digest)
    with pytest.raises(ValueError, match=rf"{path} holds non-finite weights \(NaN or inf; head.weight: 1 of \d+\)"):
        load_exported(tmp_path / "out")


def test_an_export_without_a_digest_loads_with_a_warning(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path, model = _export_modelnet(tmp_path)
    _rewrite(path, load_file(str(path)), digest=False)
    with caplog.at_level(logging.WARNING, logger="engine.weights"):
        loaded = load_exported(tmp_path / "out")
    assert [r.levelname for r in caplog.records] == ["WARNING"]
    assert f"{path} records no {DIGEST_KEY}" in caplog.records[0].getMessage()
    x = example_clouds(model, {"num_points": 32})
    with torch.no_grad():
        assert_close(loaded(x), model(x), rtol=0, atol=0)


def test_non_finite_weights_are_not_exported(tmp_path: Path) -> None:
    best, model = _recorded_run(tmp_path, "train_modelnet")
    state = torch.load(best, weights_only=True)
    state["model"]["head.bias"][1] = float("inf")
    save_checkpoint(state, best)
    with pytest.raises(
        ValueError, match=r"refusing to export .*best.pt: its model weights hold NaN or inf \(head.bias"
    ):
        export_weights(best, tmp_path / "out")
