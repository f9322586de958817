"""The vision models' row of ``tools/model_stats.py`` (:class:`engine.model_stats.Family`): the timm models that this
package registers, with timm's DeiT-tiny and DeiT-small as references, on one 224 px image, 1000 classes.

Paper (section 3.4): Ours-1..6 = ``centroid_deit_{tiny,small}_{c6,c5_overlap,c7_overlap}_patch16_224`` (params in M,
GMACs), and the baselines on the same skeleton (``vision/centroid_deit.py`` discusses the @7 rows).
"""

from __future__ import annotations

import timm
import torch

from engine.model_stats import Family

__all__ = ["FAMILY"]

_REFERENCES = ["deit_tiny_patch16_224", "deit_small_patch16_224"]


def _list_models() -> list[str]:
    ours = [n for n in timm.list_models() if timm.models.model_entrypoint(n).__module__.startswith("vision.")]
    return [*ours, *_REFERENCES] if ours else []


FAMILY = Family(
    list_models=_list_models,
    build=lambda name: timm.create_model(name, pretrained=False),
    example_input=lambda points: torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0)),
    describe=lambda points: "one 224 x 224 RGB image, 1000 classes",
    paper={
        "deit_tiny_patch16_224": (5.7, 1.3),
        "deit_small_patch16_224": (22.1, 4.7),
        "centroid_deit_tiny_c6_patch16_224": (5.7, 0.8),  # Ours-1
        "centroid_deit_tiny_c5_overlap_patch16_224": (5.7, 1.0),  # Ours-2
        "centroid_deit_tiny_c7_overlap_patch16_224": (5.8, 1.3),  # Ours-3
        "centroid_deit_small_c6_patch16_224": (22.1, 2.9),  # Ours-4
        "centroid_deit_small_c5_overlap_patch16_224": (22.1, 3.6),  # Ours-5
        "centroid_deit_small_c7_overlap_patch16_224": (22.3, 4.7),  # Ours-6
        "settrans_deit_tiny_patch16_224": (5.9, 1.1),
        "settrans_deit_small_patch16_224": (22.4, 3.8),
        "linformer_deit_tiny_patch16_224": (6.3, 1.2),
        "linformer_deit_small_patch16_224": (22.6, 4.4),
    },
)
