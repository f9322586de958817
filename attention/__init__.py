"""The shared core of the centroid-attention toolkit.

* :mod:`attention.centroid`: centroid attention (dense or over K nearest inputs, T steps), its inits and blocks
  (subpackage: ``functional``, ``layer``, ``inits``, ``blocks``, ``accounting``).
* :mod:`attention.points`: farthest point sampling, k nearest neighbours, gather and interpolation, with a plain
  PyTorch reference and optional fast backends (torch-cluster, pytorch3d, Triton).
* :mod:`attention.layers`: the transformer MLP and stochastic depth shared by the blocks.
* :mod:`attention.mixers`: structured matrix mixers (softmax, linear, Toeplitz, Cauchy, Vandermonde, Hydra) and
  their non-data-dependent twins, Dense and DFT (:mod:`attention.mixers.fixed`), with FSAT / FAT, in one registry
  (:data:`MIXERS`, :func:`build_mixer`).
* :mod:`attention.mixers.fsat`: FSAT (Fourier sparse attention) and FAT over the FFT-pooled hidden-state cross.
* :mod:`attention.backends`: the backend switchboard (optional packages, what each kernel supports, ``resolve``).
* :mod:`attention.chunking`: the per-op, per-device memory budgets of the chunked paths.
* :mod:`attention.checks`: the input validation of every public op (eager mode only; off while tracing).
"""

from . import backends, centroid, checks, chunking, layers, mixers, points
from .backends import *  # noqa: F403
from .centroid import *  # noqa: F403
from .checks import *  # noqa: F403
from .chunking import *  # noqa: F403
from .layers import *  # noqa: F403
from .mixers import *  # noqa: F403
from .points import *  # noqa: F403

# Each public name is listed once, in the __all__ of the module that defines it; the package exports them all
# (dict.fromkeys: points re-exports the HAS_* flags of backends).
__all__ = list(
    dict.fromkeys(
        [
            *backends.__all__,
            *checks.__all__,
            *chunking.__all__,
            *points.__all__,
            *layers.__all__,
            *centroid.__all__,
            *mixers.__all__,
        ]
    )
)
