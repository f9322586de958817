"""Centroid attention: attention from M centroids to N inputs, the layer that lets a network shorten its sequence.

Wu et al., "Centroid Transformers: Learning to Abstract with Attention", arXiv:2102.08606.

* :mod:`.functional`: the op (:func:`centroid_attention`, dense or over K nearest inputs, two normalizations) and
  its traceable dense / chunked KNN cores.
* :mod:`.layer`: :class:`CentroidAttention`, T steps with the skip (one forward that FX, TorchScript and dynamo follow).
* :mod:`.inits`: the centroid inits (:data:`CENTROID_INITS`).
* :mod:`.blocks`: :class:`CentroidBlock` and :class:`SelfAttentionBlock`.
* :mod:`.accounting`: the FLOP formulas of the chunked KNN products, the per-edge twin of the layer
  (:func:`edge_projection`) and the plain multi-head attention step (:func:`attention_step_reference`).

Each public name is listed once, in the ``__all__`` of the module that defines it; this package exports them all.
"""

from . import accounting, blocks, functional, inits, layer
from .accounting import *  # noqa: F403
from .blocks import *  # noqa: F403
from .functional import *  # noqa: F403
from .inits import *  # noqa: F403
from .layer import *  # noqa: F403

__all__: list[str] = []
__all__ += functional.__all__
__all__ += layer.__all__
__all__ += inits.__all__
__all__ += blocks.__all__
__all__ += accounting.__all__
