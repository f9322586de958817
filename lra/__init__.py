"""Long Range Arena tasks (Tay et al., arXiv:2011.04006) for the sequence mixers of :mod:`attention`; ListOps first.

* :mod:`lra.data`: ListOps, LRA's grammar as a seeded generator, an independent evaluator, the token encoding.
* :mod:`lra.model`: :class:`ListOpsClassifier`, embeddings, mixer blocks and a masked mean pool.
* :mod:`lra.recipe`: the training recipe behind ``tools/lra_listops.py`` (:class:`ListOpsRecipe`, its config).
"""

from . import data, model, recipe
from .data import *  # noqa: F403
from .model import *  # noqa: F403
from .recipe import *  # noqa: F403

__all__ = [*data.__all__, *model.__all__, *recipe.__all__]
