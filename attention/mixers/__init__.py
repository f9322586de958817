"""Sequence mixers with one surface, ``mixer(x, attn_mask=None) -> (B, L, C)``, built by name from :data:`MIXERS`.

* the structured matrix mixers of :mod:`attention.mixers.structured` (softmax, linear attention, lowrank, toeplitz,
  cauchy, vandermonde, hydra, quasiseparable = hydra with one B, C for both directions) and their non-data-dependent
  twins (``<name>_static``, need ``max_len``);
* the framework's mixers with no data dependence, Dense (a free matrix, needs ``max_len``) and DFT (FNet), from
  :mod:`attention.mixers.fixed`;
* FSAT and FAT from :mod:`attention.mixers.fsat` (FSAT needs ``max_len``).

``build_mixer("cauchy", dim=192, num_heads=3)`` is what the models' ``mixer=`` keyword calls.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from torch import nn

from . import block, fixed, fsat, functional, structured
from .block import *  # noqa: F403
from .fixed import *  # noqa: F403
from .fixed import DenseMixer, FourierMixer
from .fsat import *  # noqa: F403
from .fsat import FourierAttention, FourierSparseAttention
from .functional import *  # noqa: F403
from .structured import *  # noqa: F403
from .structured import UNSCRIPTABLE_MATRICES, MatrixMixer

# Each public name is listed once, in the __all__ of the module that defines it; this package exports them all.
__all__ = ["MIXERS", "UNSCRIPTABLE_MIXERS", "build_mixer"]
__all__ += structured.__all__
__all__ += functional.__all__
__all__ += fixed.__all__
__all__ += fsat.__all__
__all__ += block.__all__

MIXERS: dict[str, Callable[..., nn.Module]] = {
    "softmax": partial(MatrixMixer, matrix="softmax"),
    "linear": partial(MatrixMixer, matrix="linear"),
    "lowrank": partial(MatrixMixer, matrix="lowrank"),
    "toeplitz": partial(MatrixMixer, matrix="toeplitz"),
    "cauchy": partial(MatrixMixer, matrix="cauchy"),
    "vandermonde": partial(MatrixMixer, matrix="vandermonde"),
    "hydra": partial(MatrixMixer, matrix="hydra"),
    "quasiseparable": partial(MatrixMixer, matrix="quasiseparable"),
    "softmax_static": partial(MatrixMixer, matrix="softmax", data_dependent=False),
    "linear_static": partial(MatrixMixer, matrix="linear", data_dependent=False),
    "lowrank_static": partial(MatrixMixer, matrix="lowrank", data_dependent=False),
    "toeplitz_static": partial(MatrixMixer, matrix="toeplitz", data_dependent=False),
    "cauchy_static": partial(MatrixMixer, matrix="cauchy", data_dependent=False),
    "vandermonde_static": partial(MatrixMixer, matrix="vandermonde", data_dependent=False),
    "hydra_static": partial(MatrixMixer, matrix="hydra", data_dependent=False),
    "quasiseparable_static": partial(MatrixMixer, matrix="quasiseparable", data_dependent=False),
    "dense": DenseMixer,
    "dft": FourierMixer,
    "fsat": FourierSparseAttention,
    "fat": FourierAttention,
}
"""Mixer name -> constructor ``(dim, num_heads=..., qkv_bias=..., **kwargs)`` of a module ``mixer(x, attn_mask=None)``
mapping ``(B, L, C)`` to ``(B, L, C)``. Its keys are the names that the ``mixer=`` keyword of the centroid DeiTs, the
point model and the ListOps classifier accepts. Build one with :func:`build_mixer`, which checks the name and passes
``max_len`` to the mixers that need it (``fsat``, ``dense`` and the ``*_static`` twins)."""

_NEEDS_MAX_LEN = {"fsat", "dense", *(name for name in MIXERS if name.endswith("_static"))}

UNSCRIPTABLE_MIXERS = frozenset({"fsat", *(name for name in MIXERS if name.split("_")[0] in UNSCRIPTABLE_MATRICES)})
"""The names of :data:`MIXERS` that TorchScript cannot compile: ``fsat``, ``cauchy``, ``vandermonde``,
``cauchy_static`` and ``vandermonde_static``, whose products are custom autograd Functions (FSAT's sparse edge
products and gradient truncation, the chunked Cauchy / Vandermonde paths and their Triton kernels). ``torch.jit.script``
of such a mixer, or of a model that holds one, raises a ``RuntimeError`` naming it, and a centroid DeiT refuses one at
construction under timm's ``set_scriptable(True)``. Every other mixer scripts, as a module and inside an FX graph;
to export a model with one of these, use ``torch.fx``, ``torch.compile`` or ``torch.export``."""


def build_mixer(
    name: str, dim: int, num_heads: int = 8, max_len: int | None = None, qkv_bias: bool = False, **kwargs
) -> nn.Module:
    """Builds the mixer ``name`` (a key of :data:`MIXERS`) of width ``dim``.

    Args:
        name: mixer name.
        dim: width C.
        num_heads: heads H.
        max_len: the longest sequence; required by ``fsat``, ``dense`` and the ``*_static`` twins, ignored by the
            others.
        qkv_bias: bias of the input projections.
        **kwargs: mixer-specific options (e.g. ``num_edges`` for FSAT, ``chunk_size`` and ``backend`` for
            cauchy, ``state_dim`` and ``chunk_size`` for hydra, ``freq`` for vandermonde).
    """
    if not isinstance(name, str) or name not in MIXERS:  # a list from a config is unhashable: named, not a TypeError
        raise ValueError(f"unknown mixer {name!r}; choose one of {sorted(MIXERS)}")
    if name in _NEEDS_MAX_LEN:
        if max_len is None:
            raise ValueError(f"mixer {name!r} needs max_len (the longest sequence it will see)")
        kwargs["max_len"] = max_len
    return MIXERS[name](dim, num_heads=num_heads, qkv_bias=qkv_bias, **kwargs)
