"""Parameters and GMACs of the vision models next to the paper's numbers (``tools/model_stats.py --family vision``).

Measured: the timm models that ``import vision`` registers, on one 224 px image, with timm's DeiT-tiny and
DeiT-small as references. Paper (section 3.4): Ours-1..6 = ``centroid_deit_{tiny,small}_{c6,c5_overlap,
c7_overlap}_patch16_224``. The "centroid @ k" reading (k full-resolution blocks before the centroid block)
reproduces Ours-1, -2, -4, -5; the @7 rows measure 1.18 / 4.27 GMACs against the paper's 1.3 / 4.7, which the
same models reach with the centroid block one index later (``centroid_index=8``: 1.29 / 4.66), and their params
(5.73 / 22.08 M) do not show the paper's +0.1 / +0.2 M (see ``vision/centroid_deit.py``).
"""

from __future__ import annotations

import timm
import torch

from measure.stats import ModelFamily

__all__ = ["FAMILY", "REFERENCES"]

REFERENCES = ["deit_tiny_patch16_224", "deit_small_patch16_224"]  # timm's own DeiTs, the paper's baselines


def _models() -> list[str]:
    ours = [n for n in timm.list_models() if timm.models.model_entrypoint(n).__module__.startswith("vision.")]
    return [*ours, *REFERENCES]


FAMILY = ModelFamily(
    list_models=_models,
    build=lambda name: timm.create_model(name, pretrained=False),
    example_input=lambda points: torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0)),
    describe=lambda points: "one 224 x 224 RGB image, 1000 classes",
    # Paper (section 3.4), Ours-1..6 (M params / GMACs), keyed by the names vision/centroid_deit.py registers.
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
