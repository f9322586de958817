"""The capsule autoencoders' row of ``tools/model_stats.py`` (:class:`engine.model_stats.Family`): every registered
model with the reference code's decoder (``decoder="heads"``, the paper's architecture; the default patch decoder is
one shared MLP of 0.07 M parameters) on one cloud of ``--points`` points (default 2048; the decoder always emits 2048).

Paper (section 3.3, 12 / 64 latent capsules): dynamic routing 18.4 / 19.8 M params, centroid 0.6 / 5.3 M; no GMACs.
Only routing small follows from the reference architecture (``tools/model_stats.py`` breaks the others down), so it
is the one checked.
"""

from __future__ import annotations

from engine.bench import unit_sphere_clouds
from engine.model_stats import Family

from .model import create_model, list_models

__all__ = ["FAMILY"]

FAMILY = Family(
    list_models=list_models,
    build=lambda name: create_model(name, decoder="heads"),
    example_input=lambda points: unit_sphere_clouds(1, points or 2048),  # (B, N, 3)
    describe=lambda points: f"one cloud of {points or 2048} points (xyz), 2048 reconstructed points",
    paper={
        "pointcaps_routing_small": (18.4, None),
        "pointcaps_centroid_small": (0.6, None),
        "pointcaps_routing_base": (19.8, None),
        "pointcaps_centroid_base": (5.3, None),
    },
    checks={"pointcaps_routing_small": (0.05, 1.0)},
)
