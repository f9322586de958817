"""The point models' row of ``tools/model_stats.py`` (:class:`engine.model_stats.Family`): every registered model on
one cloud of ``--points`` xyz points (default 1024), 40 classes, next to the paper's numbers.

Paper (section 3.2): the centroid transformer 4.1 M params, 5.4 GMACs (no separate numbers for the ablation twins);
peers DGCNN 1.8 M and PointNet++ (SSG) 1.5 M params (their GMACs are not given). The 5.4 GMACs follow the count with
KNN attention's key/value projections evaluated per (centroid, neighbour) edge (:func:`attention.edge_projection`),
not our per-point projections, so that count is the one compared and checked (``tools/model_stats.py`` explains why).
"""

from __future__ import annotations

from attention import edge_projection
from engine.bench import unit_sphere_clouds
from engine.model_stats import Family

from .model import create_model, list_models

__all__ = ["FAMILY"]

FAMILY = Family(
    list_models=list_models,
    build=lambda name: create_model(name, num_classes=40),
    example_input=lambda points: unit_sphere_clouds(1, points or 1024),  # (B, N, 3)
    describe=lambda points: f"one cloud of {points or 1024} points (xyz), 40 classes",
    paper={
        "centroid_transformer_modelnet40": (4.1, 5.4),
        "dgcnn_modelnet40": (1.8, None),
        "pointnet2_ssg_modelnet40": (1.5, None),
    },
    checks={"centroid_transformer_modelnet40": (0.15, 0.25)},
    per_edge=edge_projection,
)
