"""The capsules guide's table: the point capsule autoencoder with centroid attention or dynamic routing, the patch or
the reference decoder, on the embedded synthetic part shapes: ``tools/run_ablation.py --table capsules``.

**Regime**: each row's config as it stands (``configs/capsules/synthetic_*.yaml``: the CLI's main job is the first
row), so that every row's command is the guide's; the seeds vary the synthetic shapes too. The metric is part purity
on the test split, with the Chamfer distance and part purity's chance level beside it.
"""

from __future__ import annotations

from engine.ablation import Row, Table, register_table

from .recipe import CapsulesRecipe

__all__ = ["CAPSULES_TABLE"]

_CENTROID = "configs/capsules/synthetic_centroid_small.yaml"

CAPSULES_TABLE = register_table(
    Table(
        name="capsules",
        title="Point capsules on the synthetic part shapes: part purity (test split)",
        recipe=CapsulesRecipe,
        tool="tools/train_capsules.py",
        metric="test_part_purity",
        metric_range=(0.0, 1.0),
        columns=("test_part_purity_chance", "test_chamfer"),
        digits=4,
        rows=(
            Row("patch decoder, centroid (the default)", _CENTROID),
            Row("patch decoder, routing", "configs/capsules/synthetic_routing_small.yaml"),
            Row("reference decoder, centroid", "configs/capsules/synthetic_centroid_small_heads.yaml", ("epochs=10",)),
            Row("patch decoder, centroid, longer", _CENTROID, ("epochs=60",)),
        ),
        description=(
            "Each row's config as it stands (5 synthetic classes, 20 training and 8 test shapes per class, 256 "
            "points, batch 8, Adam 1e-3 with cosine decay, 20 epochs = 240 steps unless the row says otherwise); "
            "part purity: the share of each capsule's decoded points whose nearest input point lies on the "
            "capsule's majority part, against its chance level (`test_part_purity_chance`, random patches of the "
            "same sizes); Chamfer as `capsules.CHAMFER_DEFINITION`."
        ),
    )
)
