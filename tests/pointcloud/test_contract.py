"""The model contract of the point model: torch.compile without graph breaks, torch.export and ONNX equal to eager.

FPS and KNN run as plain tensor code under tracing (``backend="auto"`` keeps to the reference there), so dynamo
unrolls FPS's M steps into one graph; the clouds are small to keep that cheap. TorchScript and FX do not apply: the
model's forward chooses its stages from the input's size in Python and runs chunked custom autograd Functions.
Every exported graph is checked on a second cloud, so indices baked in as constants would fail.
"""

from __future__ import annotations

import pytest
import torch
from torch.testing import assert_close

from pointcloud import create_model

# torch.compile, torch.export and ONNX of the point models change with the torch version
pytestmark = pytest.mark.torch_compat

NAME = "centroid_transformer_modelnet40"


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return create_model(NAME, num_neighbors=4, num_classes=5).eval()


def _clouds(seed: int) -> torch.Tensor:
    return torch.rand(2, 32, 3, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="module")
def exported() -> torch.export.ExportedProgram:
    """The model's torch.export program, once for the module: the ONNX test converts this same program (what
    ``torch.onnx.export(model, dynamo=True)`` exports first)."""
    return torch.export.export(_model(), (_clouds(0),))


@pytest.mark.slow
def test_point_model_compiles_without_graph_breaks() -> None:
    model = _model()
    torch._dynamo.reset()
    with torch.no_grad():
        explanation = torch._dynamo.explain(model)(_clouds(0))
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]


@pytest.mark.slow
def test_point_model_torch_export_equals_eager(exported) -> None:
    model, module = _model(), exported.module()
    with torch.no_grad():
        for seed in (0, 1):
            assert_close(module(_clouds(seed)), model(_clouds(seed)), rtol=1e-4, atol=1e-4)


@pytest.mark.slow
def test_point_model_onnx_export_equals_eager(exported, tmp_path) -> None:
    pytest.importorskip("onnxscript")
    ort = pytest.importorskip("onnxruntime")
    model = _model()
    path = tmp_path / "point.onnx"
    torch.onnx.export(exported, (_clouds(0),), str(path), dynamo=True, input_names=["points"], output_names=["logits"])
    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    with torch.no_grad():
        for seed in (0, 1):
            (out,) = session.run(None, {"points": _clouds(seed).numpy()})
            assert_close(torch.from_numpy(out), model(_clouds(seed)), rtol=1e-4, atol=1e-4)
