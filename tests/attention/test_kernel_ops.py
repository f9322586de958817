"""The Triton kernels as operators (``attention.kernels.ops``) and the switchboard's choice under ``torch.compile``.

Each launch is a ``torch.ops.attention`` operator with a fake implementation, so a compiled graph calls the kernels as
opaque ops; ``"auto"`` keeps them (and every other traceable backend) under ``torch.compile``, and takes the reference
under FX and ``torch.export``. Without a GPU the kernels run under Triton's interpreter in a subprocess: PyTorch's own
operator test (``torch.library.opcheck``: schema, fake tensors, autograd registration, AOT dispatch) for every
operator, and inductor-compiled layers and the point model equal to eager with the kernels inside the graph.
"""

from __future__ import annotations

import inspect

import pytest
import torch

from attention import backends
from engine.testing import assert_interpreted

# torch.library operators, opcheck, torch.compile and torch.export of the kernels change with the torch version
pytestmark = pytest.mark.torch_compat

KERNEL_OPS = ("fps_triton", "knn_triton", "knn_attention_triton_fwd", "knn_attention_triton_bwd", "fsat_edges_fwd",
              "fsat_edges_bwd", "ssd_scan_fwd", "ssd_scan_bwd", "structured_mix_fwd", "structured_mix_bwd")  # fmt: skip


def test_every_triton_backend_is_traceable_and_its_operators_are_declared_without_triton() -> None:
    """The operators exist once attention is imported (no triton import), and every Triton entry of the switchboard
    is marked traceable; packages dynamo cannot follow (extensions, numba, csr's sparse tensors) are not."""
    for name in KERNEL_OPS:
        assert hasattr(torch.ops.attention, name), name
    for op, entries in backends.BACKENDS.items():
        for b in entries.values():
            if b.package == "triton":
                assert b.compiles(), (op, b.name)
            elif b.package is not None:
                assert not b.compiles(), (op, b.name)
    assert not backends.BACKENDS["fsat_edges"]["csr"].compiles()
    assert backends.BACKENDS["knn_attention"]["masked"].compiles()


def test_auto_under_torch_compile_walks_the_order_over_traceable_backends() -> None:
    """Inside a function torch.compile traces, "auto" skips what dynamo cannot follow (FSAT's csr products on CPU:
    gather instead) and keeps the rest of the device's order; in eager mode, under FX and under torch.export (which
    torch 2.11's dynamo cannot tell from torch.compile by ``torch.compiler.is_exporting()``) it is unchanged."""
    import torch.fx

    seen: list[str] = []

    def choose(x: torch.Tensor) -> torch.Tensor:
        seen.append(backends.resolve("fsat_edges", "auto", x.device, {"D": 8, "E": 2}, x.dtype))
        seen.append(backends.resolve("knn_attention", "auto", x.device, {"D": 8}, x.dtype))
        return x + 1

    class Choose(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return choose(x)

    x = torch.zeros(3)
    choose(x)
    torch.compile(choose, backend="eager", fullgraph=True)(x)
    torch.fx.symbolic_trace(choose)
    torch.export.export(Choose(), (x,))  # dynamo too, but the exported graph must hold plain aten ops
    assert seen == ["csr", "gather", "gather", "gather", "csr", "gather", "csr", "gather"]


def test_auto_under_torch_compile_keeps_the_cuda_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    """On CUDA (the decision alone, no device needed) a compiled model keeps every fused kernel auto takes in eager
    mode, and untraceable packages are passed over; under FX / export the reference, as before."""
    monkeypatch.setitem(backends.INSTALLED, "triton", True)
    monkeypatch.setitem(backends.INSTALLED, "torch_cluster", True)
    shapes = {
        "fps": {"N": 1024, "C": 3},
        "knn": {"k": 16, "C": 3},
        "fsat_edges": {"D": 64, "E": 8},
        "quasiseparable_mix": {"N": 64, "Dv": 64, "separate_dt": True},
        "knn_attention": {"D": 32, "normalize": "inputs", "N": 1024, "K": 16, "distinct": True},
    }
    eager = {op: backends.resolve(op, "auto", "cuda", shape, torch.float32) for op, shape in shapes.items()}
    assert set(eager.values()) == {"triton"}
    monkeypatch.setattr(backends, "is_tracing", lambda: True)
    monkeypatch.setattr(backends, "is_compiling", lambda: True)
    assert {op: backends.resolve(op, "auto", "cuda", shape, torch.float32) for op, shape in shapes.items()} == eager
    assert backends.resolve("knn", "auto", "cpu", {"k": 16, "C": 3}, torch.float32) == "torch"  # not the kd-tree
    monkeypatch.setattr(backends, "is_compiling", lambda: False)  # FX or torch.export
    assert {op: backends.resolve(op, "auto", "cuda", shape, torch.float32) for op, shape in shapes.items()} == {
        op: next(iter(backends.BACKENDS[op])) for op in shapes
    }


_FIRST_CALL_COMPILED = """
import sys

import torch

from attention import CentroidAttention
from attention.mixers import FourierSparseAttention, MatrixMixer

kernels = ("knn_attention_triton", "fsat_triton", "ssd_triton", "mixers_triton")
assert not any(f"attention.kernels.{m}" in sys.modules for m in kernels), "a kernel module was imported before"
torch.manual_seed(0)
x, u, xs = torch.randn(1, 64, 16), torch.randn(1, 16, 16), torch.randn(1, 24, 16)
layers = {
    "knn_attention_triton": (CentroidAttention(16, 2, num_neighbors=4, num_steps=2, attn_backend="triton"), (x, u)),
    "fsat_triton": (FourierSparseAttention(16, num_heads=2, max_len=24, num_edges=3, edge_backend="triton"), (xs,)),
    "ssd_triton": (MatrixMixer(16, num_heads=2, matrix="hydra", backend="triton"), (xs,)),
    "mixers_triton": (MatrixMixer(16, num_heads=2, matrix="cauchy", backend="triton"), (xs,)),
}
for module, (layer, inputs) in layers.items():
    # fullgraph: a graph break raises (importlib inside the T-step loop skipped the whole frame: eager in disguise)
    torch.compile(layer, backend="eager", fullgraph=True)(*inputs).sum().backward()
    assert f"attention.kernels.{module}" in sys.modules, module
print("ok")
"""


def test_every_traceable_kernel_module_has_an_import_statement_in_the_switchboard() -> None:
    """A kernel module that the switchboard loads through importlib would bring back the graph break on a compiled
    model's first call: each traceable backend's module is imported with the package (the operators of
    ``attention.kernels.ops``) or by an import statement of its own in ``attention/backends.py``."""
    source = inspect.getsource(backends)
    for op, choices in backends.BACKENDS.items():
        for b in choices.values():
            if not (b.compiles() and isinstance(b.impl, str)) or not b.impl.startswith("attention.kernels."):
                continue
            module = b.impl.split(":")[0]
            if module != "attention.kernels.ops":
                name = module.rsplit(".", 1)[1]
                assert f'module == "{module}"' in source, (op, b.name, module)
                assert f"from .kernels import {name} as loaded" in source, (op, b.name, module)


@pytest.mark.skipif(not backends.HAS_TRITON, reason="triton missing")
def test_a_compiled_first_call_imports_the_kernels_in_one_graph() -> None:
    """A compiled model's first call loads the kernel modules while dynamo traces (an import statement, not
    importlib) and stays one graph: the KNN centroid layer over two steps, FSAT, Hydra and the Cauchy mixer."""
    assert_interpreted(_FIRST_CALL_COMPILED, __file__, timeout=600)


_INTERPRETED_SETUP = """
import torch
from torch.library import opcheck

import attention.kernels.fsat_triton as fsat_k
import attention.kernels.knn_attention_triton as knn_attn_k
import attention.kernels.ssd_triton as ssd_k
from attention import backends
from attention.kernels import fps_triton as fps_k, knn_triton as knn_k, mixers_triton as mix_k
from attention.mixers import FourierSparseAttention, MatrixMixer
from pointcloud import create_model

ops = torch.ops.attention
g = torch.Generator().manual_seed(0)
rand = lambda *s: torch.randn(*s, generator=g)
launches = {}


def counting(module, name):
    real = getattr(module, name)

    key = f"{module.__name__.rsplit('.', 1)[1]}.{name}"

    def wrapper(*args):
        launches[key] = launches.get(key, 0) + 1
        return real(*args)

    setattr(module, name, wrapper)


for module, names in ((fsat_k, ("launch_forward", "launch_backward")), (ssd_k, ("launch_forward", "launch_backward")),
                      (knn_attn_k, ("launch_forward", "launch_backward")), (fps_k, ("fps_triton",)),
                      (knn_k, ("knn_triton",))):
    for name in names:
        counting(module, name)


def outputs_and_grads(module, *inputs):
    out = module(*inputs)
    grads = torch.autograd.grad(out.float().square().sum(), [t for t in inputs if t.requires_grad]
                                + [p for p in module.parameters() if p.requires_grad], allow_unused=True)
    return [out, *(g for g in grads if g is not None)]


def assert_compiled_equals_eager(make, inputs, kernels, rtol=1e-4):
    torch.manual_seed(0)
    eager, twin = make(), make()
    twin.load_state_dict(eager.state_dict())
    ref = outputs_and_grads(eager, *inputs)
    launches.clear()
    got = outputs_and_grads(torch.compile(twin, fullgraph=True), *inputs)
    assert set(kernels) <= set(launches), (kernels, launches)
    for a, b in zip(got, ref, strict=True):
        torch.testing.assert_close(a, b, rtol=rtol, atol=rtol * b.abs().max().item())
"""

_OPCHECK = """
x, start = rand(2, 50, 3), torch.tensor([0, 7])
opcheck(ops.fps_triton, (x, 9, start, None))
opcheck(ops.knn_triton, (rand(2, 9, 3), x, 5, torch.rand(2, 50, generator=g) > 0.2))
q, k, v = rand(2, 2, 7, 8), rand(2, 2, 30, 8), rand(2, 2, 30, 8)
idx = torch.randint(0, 30, (2, 7, 5), generator=g)
out, lse, out32 = ops.knn_attention_triton_fwd(q, k, v, idx, None, None, None)
opcheck(ops.knn_attention_triton_fwd, (q, k, v, idx, None, None, 2))
opcheck(ops.knn_attention_triton_bwd, (q, k, v, idx, None, out, rand(*out.shape), lse, None, 2))
B, H, L, D, E = 2, 2, 13, 8, 3
N = B * H * L
q2 = rand(B, L, H, D).transpose(1, 2)  # as FSAT passes them: views of its projections
k2, v2 = rand(B, L, 2, H, D).permute(2, 0, 3, 1, 4).unbind(0)
eidx = torch.randint(-1, L, (B, H, L, E), generator=g)
conf = torch.rand(N * E, generator=g)
crow, order = fsat_k.group_edges_by_query(eidx)
out, lse = ops.fsat_edges_fwd(q2, k2, v2, conf, crow, order, None)
opcheck(ops.fsat_edges_fwd, (q2, k2, v2, conf, crow, order, None))
do = rand(B, L, H, D).transpose(1, 2)
delta = (do * out).sum(-1)
opcheck(ops.fsat_edges_bwd, (q2, k2, v2, eidx, conf, lse, delta, do, True, None))
c, b, la = rand(2, 1, 2, 37, 4), rand(2, 1, 2, 37, 4), -torch.rand(2, 1, 2, 37, generator=g)
vv = rand(1, 2, 37, 5)
states, tot, z = ops.ssd_scan_fwd(c, b, vv, la, None)
opcheck(ops.ssd_scan_fwd, (c, b, vv, la, None))
opcheck(ops.ssd_scan_bwd, (c, b, vv, la, states, tot, rand(1, 2, 37, 5), None))
xm, ym, vm = rand(1, 2, 20, 4).abs() + 0.5, rand(1, 2, 20, 4).abs() + 0.5, rand(1, 2, 20, 6)
opcheck(ops.structured_mix_fwd, (xm, ym, vm, 0.0, 0, None, None))
opcheck(ops.structured_mix_bwd, (xm, ym, vm, rand(1, 2, 20, 6), 0.0, 0, None, None))
print("ok")
"""

_COMPILED_MIXERS = """
# FSAT (predicted edges only: inductor draws other random numbers than eager), Hydra's scan, both SSD directions
xs = torch.randn(2, 41, 24, requires_grad=True)
fsat = lambda: FourierSparseAttention(24, num_heads=3, max_len=41, num_edges=3, num_random=0, edge_backend="triton")
assert_compiled_equals_eager(fsat, (xs,), ["fsat_triton.launch_forward", "fsat_triton.launch_backward"])
hydra = lambda: MatrixMixer(24, num_heads=3, matrix="hydra", backend="triton")
assert_compiled_equals_eager(hydra, (xs,), ["ssd_triton.launch_forward", "ssd_triton.launch_backward"])
print("ok")
"""

_COMPILED_POINT_MODEL = """
# The point model with CUDA's auto orders (the fused FPS, KNN and KNN attention): compiled, auto keeps them
for op in ("fps", "knn", "knn_attention"):
    backends.AUTO_ORDER[op, "cpu"] = backends.AUTO_ORDER[op, "cuda"]
points = torch.rand(2, 32, 3, generator=g)  # small: the interpreter runs every kernel program in Python
model = lambda: create_model("centroid_transformer_modelnet40", num_classes=5, drop=0.0, num_centroids=(16, 8),
                             num_neighbors=8).eval()
kernels = ["fps_triton.fps_triton", "knn_triton.knn_triton", "knn_attention_triton.launch_forward",
           "knn_attention_triton.launch_backward"]
assert_compiled_equals_eager(model, (points,), kernels, rtol=1e-3)
print("ok")
"""


@pytest.mark.slow
@pytest.mark.skipif(not backends.HAS_TRITON, reason="triton missing")
def test_kernel_operators_under_interpreter_pass_opcheck() -> None:
    """Every kernel operator passes ``torch.library.opcheck`` (schema, fake tensors, autograd registration, AOT
    dispatch)."""
    assert_interpreted(_INTERPRETED_SETUP + _OPCHECK, __file__, timeout=900)


@pytest.mark.slow
@pytest.mark.skipif(not backends.HAS_TRITON, reason="triton missing")
def test_compiled_mixers_under_interpreter_equal_eager_with_their_kernels() -> None:
    """FSAT and Hydra compiled by inductor equal eager, with their kernels launched from the compiled graph."""
    assert_interpreted(_INTERPRETED_SETUP + _COMPILED_MIXERS, __file__, timeout=900)


@pytest.mark.slow
@pytest.mark.skipif(not backends.HAS_TRITON, reason="triton missing")
def test_compiled_point_model_under_interpreter_equals_eager_with_its_kernels() -> None:
    """The point model with CUDA's auto orders (the fused FPS, KNN and KNN attention) compiled by inductor equals
    eager, with the kernels launched from the compiled graph."""
    assert_interpreted(_INTERPRETED_SETUP + _COMPILED_POINT_MODEL, __file__, timeout=900)
