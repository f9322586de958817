"""DeiT-family vision models with a centroid block, registered in timm's model registry.

Importing this package registers the models, after which ``timm.create_model(name)`` builds them (timm has no plugin
discovery)::

    import timm
    import vision  # noqa: F401  (registers the models)

    model = timm.create_model("centroid_deit_tiny_c6_patch16_224", num_classes=100)

* :mod:`vision.centroid_deit`: :class:`~vision.centroid_deit.CentroidViT`, a DeiT whose block ``k`` turns the N patch
  tokens into N/4 centroids (paper section 3.4), its ``checkpoint_filter_fn`` for DeiT checkpoints, and the six
  paper variants ``centroid_deit_{tiny,small}_{c6,c5_overlap,c7_overlap}_patch16_224``.
* :mod:`vision.baselines`: the paper's baselines on the same skeleton, every block's mixer replaced:
  ``settrans_deit_{tiny,small}_patch16_224`` (ISAB) and ``linformer_deit_{tiny,small}_patch16_224``.
* :mod:`vision.data`: ImageFolder trees through ``timm.data`` and the embedded synthetic image classes.
* :mod:`vision.recipe`: DeiT's training recipe on timm's pipeline, run by ``tools/train_deit.py`` (import it
  explicitly; ``import vision`` only registers the models).

* :mod:`vision.mixer_deit`: DeiTs whose every block uses a sequence mixer of :mod:`attention.mixers`:
  ``{fsat,fat,hydra,cauchy,vandermonde,toeplitz}_deit_{tiny,small}_patch16_224``. The centroid DeiTs also take
  ``mixer=<name>`` (e.g. ``timm.create_model("centroid_deit_tiny_c6_patch16_224", mixer="cauchy")``).
"""

from . import baselines, centroid_deit, mixer_deit
from .centroid_deit import CentroidViT, checkpoint_filter_fn

__all__ = ["CentroidViT", "baselines", "centroid_deit", "checkpoint_filter_fn", "mixer_deit"]
