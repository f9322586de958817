"""timm's model contract for every model `import vision` registers: forward / backward, FX feature extraction,
TorchScript of the model and of its FX graph, torch.compile without graph breaks, torch.export and ONNX.

Mirrors timm's own tests/test_models.py (``_create_fx_model``, ``test_model_forward_fx``,
``test_model_forward_torchscript``, ``test_model_forward_fx_torchscript``) on tiny overrides of each variant
(32 px images, 2 blocks, the centroid block at index 1), so the sweep stays CPU-cheap. The mixer DeiTs whose mixer
TorchScript cannot compile (custom autograd Functions: FSAT, Cauchy, Vandermonde) must fail with an error that names
the mixer, and refuse to build under timm's ``set_scriptable(True)``; the others script like the rest.
"""

from __future__ import annotations

import pytest
import timm
import torch
from timm.layers import set_scriptable
from timm.layers._fx import get_notrace_functions, get_notrace_modules
from timm.models import FeatureGraphNet, create_feature_extractor
from timm.models._registry import _model_to_module
from torch.testing import assert_close
from torchvision.models import feature_extraction as tv_fx

import vision  # noqa: F401  (registers the models)
from attention.mixers import MIXERS, UNSCRIPTABLE_MIXERS

NAMES = sorted(n for n, module in _model_to_module.items() if module in ("centroid_deit", "baselines", "mixer_deit"))
CENTROID = [n for n in NAMES if _model_to_module[n] == "centroid_deit"]
MIXER = [n for n in NAMES if _model_to_module[n] == "mixer_deit"]
UNSCRIPTABLE = [n for n in MIXER if n.split("_")[0] in UNSCRIPTABLE_MIXERS]  # fsat_, cauchy_, vandermonde_
SCRIPTABLE = [n for n in NAMES if n not in UNSCRIPTABLE]
IMG = 32


def test_every_registered_name_is_swept() -> None:
    assert len(NAMES) == 22 and len(CENTROID) == 6 and len(MIXER) == 12
    assert len(UNSCRIPTABLE) == 6 and len(SCRIPTABLE) == 16  # fat_, hydra_, toeplitz_ DeiTs script


def _overrides(name: str) -> dict:
    kw = dict(img_size=IMG, depth=2, num_classes=7)
    if name in CENTROID:
        kw["centroid_index"] = 1
    return kw


def _model(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model(name, **_overrides(name), **kwargs).eval()


def _input(batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, 3, IMG, IMG, generator=torch.Generator().manual_seed(1))


def _create_fx_model(model: torch.nn.Module, train: bool = False) -> torch.nn.Module:
    """timm's tests/test_models.py helper: trace with timm's leaf modules / functions, return the last node."""
    tracer_kwargs = dict(
        leaf_modules=get_notrace_modules(), autowrap_functions=get_notrace_functions(), param_shapes_constant=True
    )
    train_nodes, eval_nodes = tv_fx.get_graph_node_names(model, tracer_kwargs=tracer_kwargs)
    eval_return_nodes = [eval_nodes[-1]]
    train_return_nodes = [train_nodes[-1]]
    if train:
        graph = tv_fx.NodePathTracer(**tracer_kwargs).trace(model)
        graph_nodes = list(reversed(graph.nodes))
        output_node_names = [n.name for n in graph_nodes[0]._input_nodes.keys()]
        graph_node_names = [n.name for n in graph_nodes]
        output_node_indices = [-graph_node_names.index(node_name) for node_name in output_node_names]
        train_return_nodes = [train_nodes[ix] for ix in output_node_indices]
    return tv_fx.create_feature_extractor(
        model,
        train_return_nodes=train_return_nodes,
        eval_return_nodes=eval_return_nodes,
        tracer_kwargs=tracer_kwargs,
    )


@pytest.mark.parametrize("name", NAMES)
def test_forward_backward(name: str) -> None:
    model = _model(name).train()
    out = model(_input())
    assert out.shape == (2, 7) and bool(torch.isfinite(out).all())
    out.square().mean().backward()
    missing = [n for n, p in model.named_parameters() if p.requires_grad and p.grad is None]
    assert not missing, f"{name}: parameters without a gradient: {missing}"


@pytest.mark.torch_compat
@pytest.mark.parametrize("name", NAMES)
def test_fx_forward_and_backward(name: str) -> None:
    """timm's test_model_forward_fx and test_model_backward_fx: the FX graph equals eager, and trains."""
    model = _model(name)
    x = _input()
    with torch.no_grad():
        ref = model(x)
        out = next(iter(_create_fx_model(model)(x).values()))
    assert_close(out, ref)
    fx_train = _create_fx_model(model.train(), train=True)
    out = next(iter(fx_train(x).values()))
    out.square().mean().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


@pytest.mark.torch_compat
@pytest.mark.parametrize("name", NAMES)
def test_feature_extraction_reports_the_reduction(name: str) -> None:
    """timm's FX feature extraction (create_feature_extractor and FeatureGraphNet) on the blocks, with the
    reduction feature_info reports (stride doubles at the centroid block)."""
    model = _model(name)
    x = _input()
    with torch.no_grad():
        feats = create_feature_extractor(model, return_nodes={"blocks.0": "b0", "blocks.1": "b1"})(x)
        graph_net = FeatureGraphNet(model, out_indices=(0, 1))(x)
    assert [f.shape for f in graph_net] == [feats["b0"].shape, feats["b1"].shape]
    assert feats["b0"].shape[0] == 2 and feats["b1"].shape[-1] == model.embed_dim
    reductions = [info["reduction"] for info in model.feature_info]
    if name in CENTROID:
        assert reductions[1] == 2 * reductions[0]  # the centroid block halves each grid side
        assert feats["b1"].shape[1] - 1 == (feats["b0"].shape[1] - 1 + 3) // 4
    else:
        assert reductions[1] == reductions[0]


@pytest.mark.torch_compat
@pytest.mark.parametrize("name", SCRIPTABLE)
def test_torchscript_and_fx_then_torchscript(name: str) -> None:
    """timm's test_model_forward_torchscript and test_model_forward_fx_torchscript."""
    with set_scriptable(True):
        model = _model(name)
    x = _input()
    with torch.no_grad():
        ref = model(x)
        assert_close(torch.jit.script(model)(x), ref)
        fx_scripted = torch.jit.script(_create_fx_model(model))
        assert_close(next(iter(fx_scripted(x).values())), ref)


@pytest.mark.torch_compat
@pytest.mark.parametrize("mixer", sorted(set(MIXERS) - UNSCRIPTABLE_MIXERS))
def test_centroid_deit_with_a_scriptable_mixer_scripts(mixer: str) -> None:
    """``mixer=`` on a centroid DeiT: every mixer TorchScript can compile (softmax, linear, lowrank, toeplitz, hydra,
    quasiseparable, their static twins, FAT) scripts with the centroid block, model and FX graph equal to eager."""
    name = CENTROID[0]
    with set_scriptable(True):
        model = _model(name, mixer=mixer)
    x = _input()
    with torch.no_grad():
        ref = model(x)
        assert_close(torch.jit.script(model)(x), ref)
        assert_close(next(iter(torch.jit.script(_create_fx_model(model))(x).values())), ref)


@pytest.mark.torch_compat
@pytest.mark.parametrize("name", UNSCRIPTABLE)
def test_mixer_deit_scripting_fails_naming_the_mixer(name: str) -> None:
    """TorchScript cannot compile the FSAT, Cauchy and Vandermonde mixers (custom autograd Functions): scripting the
    model or its FX graph names the mixer; under timm's set_scriptable(True) the model refuses to build, naming it
    too."""
    model = _model(name)
    names = {"fsat": "FSAT"}  # the mixer's name in the message
    expected = names.get(model.mixer, model.mixer)
    for target in (model, _create_fx_model(model)):
        with pytest.raises(RuntimeError, match=rf"the '?{expected}'? sequence mixer cannot be compiled by TorchScript"):
            torch.jit.script(target)
    with set_scriptable(True), pytest.raises(RuntimeError, match=rf"mixer '{model.mixer}'.*set_scriptable"):
        _model(name)


def _graph_breaks(model: torch.nn.Module, x: torch.Tensor) -> tuple[int, list]:
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(model)(x)
    return explanation.graph_break_count, [str(b.reason) for b in explanation.break_reasons]


@pytest.mark.torch_compat
@pytest.mark.parametrize("name", [n if n == CENTROID[0] else pytest.param(n, marks=pytest.mark.slow) for n in CENTROID])
def test_centroid_deit_compiles_without_graph_breaks(name: str) -> None:
    model = _model(name)
    with torch.no_grad():
        count, reasons = _graph_breaks(model, _input())
    assert count == 0, f"{name}: {count} graph breaks: {reasons}"


OURS_1 = "centroid_deit_tiny_c6_patch16_224"


@pytest.mark.torch_compat
@pytest.mark.slow
def test_ours_1_compiled_fullgraph_equals_eager() -> None:
    model = _model(OURS_1)
    x = _input()
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        assert_close(compiled(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.torch_compat
@pytest.mark.slow
def test_ours_1_torch_export_equals_eager() -> None:
    model = _model(OURS_1)
    exported = torch.export.export(model, (_input(),)).module()
    with torch.no_grad():
        for x in (_input(), torch.randn(2, 3, IMG, IMG)):
            assert_close(exported(x), model(x), rtol=1e-4, atol=1e-4)


@pytest.mark.torch_compat
@pytest.mark.slow
def test_ours_1_onnx_export_equals_eager(tmp_path) -> None:
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    model = _model(OURS_1)
    x = _input()
    path = tmp_path / "ours1.onnx"
    torch.onnx.export(model, (x,), str(path), dynamo=True, input_names=["images"], output_names=["logits"])
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    (out,) = session.run(None, {"images": x.numpy()})
    with torch.no_grad():
        assert_close(torch.from_numpy(out), model(x), rtol=1e-4, atol=1e-4)
