"""Parameters and GMACs of the point models next to the papers' numbers (``tools/model_stats.py --family pointcloud``).

Every model of :func:`pointcloud.list_models` on one cloud of xyz points (default 1024), 40 classes. Paper: the
centroid transformer 4.1 M params, 5.4 GMACs (section 3.2; no separate numbers for the ablation twins); peers DGCNN
1.8 M and PointNet++ (SSG) 1.5 M params (their GMACs are not given); PointNet from its own paper (Table 6; its
"FLOPs" count multiply-adds): 3.5 M params and 0.44 GMACs with the input and feature transforms, 0.8 M and 0.148
without ("vanilla"). The centroid paper's Table 2 row "PointNet 89.2 OA, 0.8 M, 0.3 GMACs" takes the accuracy of the
model with transforms and the parameter count of the vanilla one; 0.3 GMACs is neither variant's count.

Two GMAC columns: ours (keys and values projected once per point, then gathered per neighbour) and "per-edge k/v",
the same forward pass with KNN attention's key/value projections evaluated per (centroid, neighbour) edge
(:func:`attention.edge_projection`, a module swap; outputs tested equal). The paper's 5.4 GMACs cannot come from
per-point projections: with them this architecture counts 1.2-1.5 GMACs at 1024 points for any sensible N1, N2, K
(3.7 with no downsampling at all, and K hardly matters), while per edge the count grows with K, which is how choosing
N1, N2 and K can set it. So the ratio and ``--check`` compare the paper with the per-edge column, the defaults
(N1 = N / 2, N2 = N1 / 2, K = 24; see ``pointcloud/model.py``) are chosen on it, and the ``GMACs`` column is what our
model actually costs. ``--check``: params 4.1 M +-15%, per-edge GMACs 5.4 +-25%.
"""

from __future__ import annotations

from attention import edge_projection
from measure.bench import unit_sphere_clouds
from measure.stats import ModelFamily

from .model import create_model, list_models

__all__ = ["FAMILY"]

FAMILY = ModelFamily(
    list_models=lambda: list_models(),
    build=lambda name: create_model(name, num_classes=40),
    example_input=lambda points: unit_sphere_clouds(1, points or 1024),  # (B, N, 3)
    describe=lambda points: f"one cloud of {points or 1024} points (xyz), 40 classes",
    paper={
        "centroid_transformer_modelnet40": (4.1, 5.4),
        "dgcnn_modelnet40": (1.8, None),
        "pointnet2_ssg_modelnet40": (1.5, None),
        "pointnet_modelnet40": (3.5, 0.44),
        "pointnet_vanilla_modelnet40": (0.8, 0.148),
    },
    checks={"centroid_transformer_modelnet40": (0.15, 0.25)},
    edge_gmacs=edge_projection,
)
