"""The package's export surface: each public name is listed once, in the module that defines it, and
``from attention import X`` keeps working for every name the package has exported."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import attention

# Every name ``attention`` exported when its packages began to build their __all__ from their submodules'.
EXPORTED = """
ATTN_CHUNK_BYTES ATTN_CHUNK_BYTES_CUDA AUTO_ORDER BACKENDS Backend CENTROID_INITS CauchyMatrix CentroidAttention
CentroidBlock CentroidOutput ConvFeatureMap DWConv2dInit DropPath EDGE_BACKENDS FEATURE_MAPS
FPSAMPLE_BUCKET_HEIGHT FPSInit FPS_BACKENDS FourierAttention FourierCross FourierSparseAttention HAS_FPSAMPLE
HAS_NUMBA HAS_PYTORCH3D HAS_TORCH_CLUSTER HAS_TRITON INSTALLED INSTALL_HINTS KMeansInit KNN_BACKENDS
LinearAttentionMatrix LinearInit LowRankMatrix MASKED_AUTO_MAX_INPUTS_PER_NEIGHBOR MATRIX_MIXERS MIXERS
MatrixMixer MeanPoolInit MixerBlock Mlp MlpFeatureMap NORMALIZATIONS QuasiseparableMatrix RandomInit
SelfAttentionBlock SoftmaxMatrix ToeplitzMatrix TruncateGrad UNSCRIPTABLE_MATRICES UNSCRIPTABLE_MIXERS
VandermondeMatrix apply_matrix attn_chunk_bytes available backend_names build_centroid_init build_mixer
cauchy_mix centroid_attention check_index check_neighbor_idx check_points checks_active dense_centroid_attention
edge_attention farthest_point_sample feature_neighbors fold_cross fps_auto_order gather input_checks
input_checks_enabled interpolate is_tracing knn knn_centroid_attention lengths_to_mask masked_knn_attention
nearest_upsample pooled_cross pooled_cross_reference quasiseparable_mix resolve resolve_num_centroids
set_input_checks sparse_edge_attention sparse_edge_attention_reference toeplitz_mix vandermonde_mix
""".split()
# Caller-side backend orders and per-module chunk budgets, replaced by the switchboard (attention.backends.resolve,
# the entries' preferences) and one budget table (attention.chunking.CHUNK_BUDGETS, chunk_budget).
REMOVED = {
    "ATTN_CHUNK_BYTES",
    "ATTN_CHUNK_BYTES_CUDA",
    "FPS_BACKENDS",
    "KNN_BACKENDS",
    "attn_chunk_bytes",
    "fps_auto_order",
}


def test_every_exported_name_resolves_and_none_was_dropped() -> None:
    assert len(attention.__all__) == len(set(attention.__all__))
    assert [n for n in attention.__all__ if not hasattr(attention, n)] == []
    assert sorted(set(EXPORTED) - REMOVED - set(attention.__all__)) == []
    assert not REMOVED & set(attention.__all__)
    namespace: dict = {}
    exec("from attention import *", namespace)
    assert set(attention.__all__) <= set(namespace)


# What each package defines itself (everything else comes from its submodules).
OWN = {
    "attention": set(),
    "attention.centroid": set(),
    "attention.mixers": {"MIXERS", "UNSCRIPTABLE_MIXERS", "build_mixer"},
}


@pytest.mark.parametrize("package", sorted(OWN))
def test_a_package_exports_what_its_submodules_list(package: str) -> None:
    """A package's __all__ is its submodules' lists plus what it defines, each name the submodule's own object."""
    pkg = importlib.import_module(package)
    # the submodules its __init__ star-imports (not others that were imported since, e.g. attention.bench)
    tree = ast.parse(Path(pkg.__file__).read_text())
    starred = [n.module for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1 and n.names[0].name == "*"]
    subs = [importlib.import_module(f"{package}.{name}") for name in starred]
    assert set(pkg.__all__) == {name for m in subs for name in m.__all__} | OWN[package]
    for m in subs:
        for name in m.__all__:
            assert getattr(pkg, name) is getattr(m, name), f"{package}.{name} is not {m.__name__}.{name}"
