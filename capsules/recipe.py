"""The point capsule autoencoder's training recipe: config, data, model, Chamfer loss, evaluation, run by :mod:`engine`.

``tools/train_capsules.py`` is ``engine.main(CapsulesRecipe)``: :class:`CapsulesRecipe` declares the domain parts and
:func:`engine.run` does the rest. The config is flat and mirrors :class:`CapsulesConfig`; the paper's rows live in
``configs/capsules/``. Model knobs left at ``None`` keep the registered model's defaults; ``model_kwargs`` reaches any
other constructor keyword.

Reference schedule (3D Point Capsule Networks code): Adam, lr 1e-4, batch 8; the paper trains 200 epochs on ShapeNet
Part (12 capsules) and 300 on ShapeNet Core13 (64 capsules). The defaults here are the main job: the centroid small
model (512 x 16 primary -> 12 x 128 latent capsules) with the patch decoder (each capsule one continuous patch) on the
embedded synthetic part shapes at 256 points, 20 epochs (240 steps), sized to run on a 2-core CPU in under 5 minutes.
``decoder: heads`` selects the reference code's decoder. The loss and every reported Chamfer number follow
:data:`capsules.chamfer.CHAMFER_DEFINITION`, written into ``final_metrics.json`` as ``chamfer_definition``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.data import DataLoader

from engine import CompileMode, Recipe, check_config, collect_model_kwargs, epoch_lr_schedule
from measure.stats import count_params
from pointcloud.recipe import MAX_POINTS

from .chamfer import CHAMFER_DEFINITION, chamfer_distance
from .data import DATASETS, build_dataset
from .metrics import NO_PART_LABELS, capsule_purity, patch_spread, random_patches
from .model import create_model, list_models

__all__ = ["CapsulesConfig", "CapsulesRecipe", "build_datasets", "build_model", "evaluate", "model_spec"]

_logger = logging.getLogger(__name__)


@dataclass
class CapsulesConfig:
    """Every knob of a capsule-autoencoder run (defaults: the CPU main job on the embedded synthetic parts)."""

    name: str = "main"  # run name: runs go to runs/capsules/<name>/<timestamp>
    # model (None: the registered model's default)
    model: str = "pointcaps_centroid_small"  # registered model (capsules.list_models())
    num_iterations: int | None = None  # dynamic-routing iterations, or centroid-attention steps T
    num_heads: int | None = None  # attention heads of the centroid block (centroid models only)
    mlp_ratio: float | None = None  # MLP width of the centroid block, as a multiple of its width (centroid only)
    lift_rank: int | None = None  # rank of the per-capsule lift (centroid only; 0: one shared lift)
    decoder: str | None = None  # patch (each capsule decodes one continuous patch) or heads (the reference code's)
    decoder_width: int | None = None  # hidden width of the patch decoder's MLP
    decoder_grid: str | None = None  # random (fresh 2-D grid points every training step) or fixed (the eval grid)
    model_kwargs: dict = field(default_factory=dict)  # any other constructor keyword of the model
    # data: num_points is both the input cloud and the reconstruction size
    dataset: str = "synthetic_parts"  # capsules.data.DATASETS: synthetic_parts, shapenet_part, modelnet40_normal, ...
    data_root: str | None = None  # dataset root; --data-root wins (null: $CENTROID_DATA, else ./datasets)
    num_points: int = 256  # points per input cloud and per reconstruction
    categories: list[str] | None = None  # ShapeNet Part categories to keep, e.g. [Airplane] (null: all)
    synthetic_classes: list[str] = field(  # classes of synthetic_parts (capsules.data.PART_NAMES)
        default_factory=lambda: ["table", "chair", "airplane", "lamp", "mug"]
    )
    synthetic_train_per_class: int = 20  # synthetic training shapes per class
    synthetic_test_per_class: int = 8  # synthetic test shapes per class
    test_split: str = "test"  # split evaluated every epoch: test, or val (ShapeNet Part)
    up_axis: str | None = None  # the shapes' up axis for the viewer: y or z (null: the dataset's own)
    # optimization
    epochs: int = 20  # epochs to train (more on --resume stretches what is left of the schedule)
    batch_size: int = 8  # global batch, split evenly over the ranks (>= 2 for BatchNorm)
    eval_batch_size: int = 16  # evaluation batch per rank
    lr: float = 1e-3  # peak learning rate of Adam
    weight_decay: float = 0.0  # Adam weight decay (L2)
    cosine: bool = True  # cosine decay to 1% of lr (false: step decay by lr_gamma every lr_step epochs)
    lr_step: int = 20  # with cosine false: epochs between two step decays
    lr_gamma: float = 0.5  # with cosine false: factor of each step decay
    grad_clip: float | None = None  # max global gradient norm (null: no clipping)
    amp: bool = False  # bfloat16 autocast (CUDA only)
    compile: CompileMode | None = None  # torch.compile mode for training (reduce-overhead: CUDA graphs; null: eager)
    workers: int = 0  # DataLoader worker processes per rank, at most 256 (above the usable CPUs: cut to their number)
    seed: int = 0  # seed of the initialization, data order and sampling
    chamfer_backend: str = "auto"  # nearest-neighbour search of the Chamfer loss (capsules.chamfer backends)


MODEL_KNOBS = ("num_iterations", "num_heads", "mlp_ratio", "lift_rank", "decoder", "decoder_width", "decoder_grid")


def model_spec(cfg: CapsulesConfig) -> tuple[str, dict[str, Any]]:
    """``(cfg.model, constructor keywords)``: the point count, the config's knobs and ``model_kwargs``."""
    return cfg.model, {"num_points": cfg.num_points, **collect_model_kwargs(cfg, MODEL_KNOBS)}


def build_model(cfg: CapsulesConfig) -> nn.Module:
    """``create_model(cfg.model, ...)`` with the config's knobs and ``model_kwargs``; a keyword it lacks is named."""
    name, kwargs = model_spec(cfg)
    return create_model(name, **kwargs)


def build_datasets(cfg: CapsulesConfig, data_root: str | None = None):
    root = data_root or cfg.data_root
    common: dict[str, Any] = {"num_points": cfg.num_points, "seed": cfg.seed}
    train_kw: dict[str, Any] = {}
    test_kw: dict[str, Any] = {}
    if cfg.dataset == "synthetic_parts":
        common["classes"] = tuple(cfg.synthetic_classes)
        train_kw["samples_per_class"] = cfg.synthetic_train_per_class
        test_kw["samples_per_class"] = cfg.synthetic_test_per_class
    elif cfg.categories is not None:
        if not cfg.dataset.startswith("shapenet_part"):
            raise ValueError(f"categories applies to the ShapeNet Part datasets, not {cfg.dataset!r}: set it to null")
        common["categories"] = cfg.categories
    train_set = build_dataset(cfg.dataset, "train", root, **common, **train_kw)
    test_set = build_dataset(cfg.dataset, cfg.test_split, root, **common, **test_kw)
    return train_set, test_set


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device, backend: str = "auto") -> dict[str, float]:
    """Test Chamfer distance (:data:`CHAMFER_DEFINITION`, mean over shapes), part purity (mean over capsules) and patch
    spread (mean over shapes).

    ``test_part_purity_chance`` is the purity of the same reconstructions cut into random patches of the same sizes
    (a fixed permutation of the capsule ids): the level a decomposition that ignores the parts would reach. Purity
    needs part labels (NaN without them); the patch spread (:func:`capsules.metrics.patch_spread`, the spread of each
    capsule's decoded points relative to the whole shape's) needs none, and ``test_patch_spread_random`` is that of
    the same random patches: capsules that decode regions score well below it. On data without part labels both
    purities are :data:`~capsules.metrics.NO_PART_LABELS` (``"no part labels"``), which the logs print as it is.
    """
    model.eval()
    chamfer_sum, count = 0.0, 0
    chance_capsule = random_patches(model.point_capsule)  # the same decoded points cut into random patches
    sums = {"test_part_purity": [0.0, 0], "test_part_purity_chance": [0.0, 0]}
    spread = {"test_patch_spread": 0.0, "test_patch_spread_random": 0.0}
    for points, parts in loader:
        points, parts = points.to(device), parts.to(device)
        recon = model(points)
        chamfer_sum += float(chamfer_distance(recon.float(), points, reduction="sum", backend=backend))
        count += len(points)
        for key, cap in (("test_part_purity", model.point_capsule), ("test_part_purity_chance", chance_capsule)):
            purity = capsule_purity(recon.float(), cap, points, parts, num_capsules=model.num_latent)
            keep = ~torch.isnan(purity)
            sums[key][0] += float(purity[keep].sum())
            sums[key][1] += int(keep.sum())
        spread["test_patch_spread"] += patch_spread(recon, model.point_capsule) * len(points)
        spread["test_patch_spread_random"] += patch_spread(recon, chance_capsule) * len(points)
    purities = {k: s / n if n else NO_PART_LABELS for k, (s, n) in sums.items()}
    spreads = {k: v / max(count, 1) for k, v in spread.items()}
    return {"test_chamfer": chamfer_sum / max(count, 1), **purities, **spreads}


def _scheduler(cfg: CapsulesConfig, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    """Per-epoch schedule: cosine to 1% (``cosine``) or step decay by ``lr_gamma`` every ``lr_step`` epochs."""

    return epoch_lr_schedule(
        optimizer, epochs=cfg.epochs, cosine=cfg.cosine, lr_step=cfg.lr_step, lr_gamma=cfg.lr_gamma
    )


class CapsulesRecipe(Recipe):
    """The point capsule autoencoder: Chamfer loss (:data:`CHAMFER_DEFINITION`), Adam, per-epoch schedule."""

    group = "capsules"
    config_cls = CapsulesConfig
    monitor = "test_chamfer"
    monitor_mode = "min"

    @classmethod
    def validate(cls, cfg: CapsulesConfig) -> None:
        check_config(
            cfg,
            [
                (cfg.model in list_models(), f"model {cfg.model!r} is not registered; choose one of {list_models()}"),
                (cfg.num_points >= 2, f"num_points must be >= 2, got {cfg.num_points}"),
                (cfg.num_points <= MAX_POINTS, f"num_points must be <= {MAX_POINTS}, got {cfg.num_points}"),
                (
                    cfg.batch_size >= 2,
                    f"batch_size must be >= 2 (BatchNorm needs two shapes per batch), got {cfg.batch_size}",
                ),
                (cfg.up_axis in (None, "y", "z"), f"up_axis must be 'y', 'z' or null, got {cfg.up_axis!r}"),
                (cfg.dataset in DATASETS, f"dataset {cfg.dataset!r} is unknown; choose one of {sorted(DATASETS)}"),
            ],
        )

    def build_datasets(self):
        return build_datasets(self.cfg, self.data_root)

    def model_spec(self) -> tuple[str, dict[str, Any]]:
        return model_spec(self.cfg)

    def summary(self, model: nn.Module) -> dict[str, Any]:
        cfg = self.cfg
        return {"params": count_params(model), "chamfer_definition": CHAMFER_DEFINITION, "model": cfg.model,
                "dataset": cfg.dataset, "num_points": cfg.num_points}  # fmt: skip

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.Adam(model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)

    def build_scheduler(self, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
        return _scheduler(self.cfg, optimizer), self.cfg.epochs

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):
        points, _ = batch
        recon = model(points)
        loss = chamfer_distance(recon.float(), points, backend=self.cfg.chamfer_backend)
        return loss, {"chamfer": loss.detach()}

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return evaluate(model, self.eval_loader, self.ctx.device, self.cfg.chamfer_backend)

    def finalize(self, final: dict[str, Any], model: nn.Module) -> dict[str, Any]:
        records = self.records()
        first = records[0].get("test_chamfer") if records else None
        return {**_headline(final), "first_epoch_test_chamfer": first}

    def evaluate_checkpoint(self, model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
        metrics = self.evaluate(model)
        return {**metrics, **_headline(metrics)}


def _headline(metrics: dict[str, Any]) -> dict[str, Any]:
    """The headline numbers (test split): ``chamfer``, ``part_purity`` (and its chance level) where the data has part
    labels, ``patch_spread`` (and its random-patch level) always."""
    return {
        "chamfer": metrics.get("test_chamfer"),
        "part_purity": metrics.get("test_part_purity"),
        "part_purity_chance": metrics.get("test_part_purity_chance"),
        "patch_spread": metrics.get("test_patch_spread"),
        "patch_spread_random": metrics.get("test_patch_spread_random"),
    }
