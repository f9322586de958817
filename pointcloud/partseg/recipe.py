"""The part-segmentation training recipe (ShapeNet Part's protocol), run by :mod:`engine`.

``tools/train_partseg.py`` is ``engine.main(PartSegRecipe)``: :class:`PartSegRecipe` declares the domain parts and
:func:`engine.run` does the rest (run folder, resume, eval-only, DDP, AMP). The config is flat and mirrors
:class:`PartSegConfig`; YAML rows live in ``configs/partseg/``. Model knobs left at ``None`` keep the registered
model's own default; ``model_kwargs`` reaches any other constructor keyword (``mixer: hydra``).

Each sample is ``(points, category, part labels)`` (:class:`pointcloud.parts.PartSegmentation`); the loss is the
per-point cross-entropy over all parts, the evaluation ShapeNet Part's (:mod:`pointcloud.partseg.metrics`): the
arg-max over the category's parts, instance and class mIoU, optionally averaged over ``votes`` randomly scaled copies
of each test cloud (:func:`pointcloud.transforms.vote_logits`, as in classification).

The defaults are the main job: the centroid model, narrowed to run on a 2-core CPU, on the embedded synthetic part
shapes (5 categories, 13 parts) at 256 points with normals, 12 epochs of batch 8, head dropout 0.1 (the models' 0.5 is
for full-length training), sized to finish in under 5 minutes there (figures: docs/guides/part-segmentation.md). It
runs on one CPU thread (``threads: 1``): with torch's default of one thread per core, a model this small on a CPU
that other jobs keep busy stalls at every parallel op waiting for a descheduled thread; torchrun likewise starts each
rank with one. ``configs/partseg/`` holds the ShapeNet Part row and the PointNet++ peer on the same data.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from engine import CompileMode, Recipe, check_config, collect_model_kwargs, epoch_lr_schedule
from measure.stats import count_gmacs, count_params

from ..parts import PART_NAMES, PartSegmentation, ShapeNetPart, SyntheticParts
from ..recipe import point_checks
from ..transforms import Compose, Jitter, RandomRotateUp, RandomScale, RandomTranslate, ShufflePoints, vote_logits
from .metrics import PartSegMeter
from .model import create_model, list_models

__all__ = ["DATASETS", "PartSegConfig", "PartSegRecipe", "build_datasets", "build_model", "evaluate", "model_spec"]

_logger = logging.getLogger(__name__)

DATASETS = ("synthetic_parts", "shapenet_part", "shapenet_part_normal")


@dataclass
class PartSegConfig:
    """Every knob of a part-segmentation run (defaults: the CPU main job on the embedded synthetic part shapes)."""

    name: str = "main"  # run name: runs go to runs/partseg/<name>/<timestamp>
    # model (null: the registered model's default)
    model: str = "centroid_transformer_partseg"  # registered model (pointcloud.partseg.list_models())
    num_centroids: list[int | float] | None = None  # centroids (CA blocks) or SA centres: counts or fractions of N
    num_neighbors: int | None = 16  # K of every block; 16 at 256 points (null: the model's own, 24 or PointNet++'s)
    num_heads: int | None = None  # attention heads per block (centroid model)
    num_steps: int | None = None  # T, centroid-attention steps (centroid model)
    mlp_ratio: float | None = None  # hidden width of each block's MLP, as a multiple of the block width
    fuse_dim: int | None = None  # width of the encoder's per-point fusion layer (centroid model)
    upsample: str | None = None  # how centroid stages reach the points: inverse_distance or nearest (centroid model)
    drop: float | None = 0.1  # dropout in the per-point head; 0.1 for short runs (null: the model's 0.5)
    model_kwargs: dict = field(  # any other constructor keyword, e.g. {mixer: hydra}
        default_factory=lambda: {"widths": [32, 64, 64, 128], "global_dim": 128, "head_dims": [128, 64]}
    )
    # data
    dataset: str = "synthetic_parts"  # synthetic_parts, shapenet_part (v0 layout) or shapenet_part_normal
    data_root: str | None = None  # dataset root; --data-root wins (null: $CENTROID_DATA, else ./datasets)
    num_points: int = 256  # points per cloud, at most 65536 (ShapeNet Part shapes are resampled to it)
    use_normals: bool = True  # feed x, y, z, nx, ny, nz (not with shapenet_part, whose v0 layout stores none)
    categories: list[str] | None = None  # ShapeNet Part categories to keep, e.g. [Airplane, Chair] (null: all 16)
    train_split: str = "train"  # ShapeNet Part split to train on: train or trainval
    test_split: str = "test"  # ShapeNet Part split to evaluate on: test or val
    synthetic_classes: list[str] = field(  # synthetic categories (pointcloud.parts.PART_NAMES)
        default_factory=lambda: ["table", "chair", "airplane", "lamp", "mug"]
    )
    synthetic_train_per_class: int = 48  # synthetic training shapes per category
    synthetic_test_per_class: int = 24  # synthetic test shapes per category
    max_abs_coord: float | None = 10.0  # refuse ShapeNet Part files with a stored |x|, |y| or |z| above it (null: none)
    # augmentation (train split only)
    scale_lo: float = 0.8  # smallest random scale factor (one factor per axis)
    scale_hi: float = 1.25  # largest random scale factor
    translate: float = 0.1  # largest random shift per axis (0: off)
    jitter: float = 0.01  # std of the Gaussian noise added to each coordinate (0: off)
    jitter_clip: float = 0.05  # the noise is clipped to [-jitter_clip, jitter_clip]
    rotate_up: bool = False  # random rotation about the data's up axis: z synthetic, y ShapeNet (off: they are aligned)
    shuffle_points: bool = True  # shuffle the point order of each cloud (labels follow their points)
    # optimization
    epochs: int = 12  # epochs to train (more on --resume stretches what is left of the schedule)
    batch_size: int = 8  # global batch, split evenly over the ranks
    eval_batch_size: int = 32  # evaluation batch per rank
    lr: float = 2e-3  # peak learning rate of AdamW
    weight_decay: float = 1e-4  # AdamW weight decay
    cosine: bool = True  # cosine decay to 1% of lr (false: step decay by lr_gamma every lr_step, or at lr_milestones)
    lr_step: int = 20  # with cosine false and no lr_milestones: epochs between two step decays
    lr_milestones: list[int] | None = None  # with cosine false: epochs at which lr is multiplied by lr_gamma
    lr_gamma: float = 0.1  # with cosine false: factor of each step decay
    warmup_epochs: int = 0  # epochs of linear warm-up before the decay
    label_smoothing: float = 0.0  # label smoothing of the per-point cross-entropy
    grad_clip: float | None = None  # max global gradient norm (null: no clipping)
    amp: bool = False  # bfloat16 autocast (CUDA only)
    compile: CompileMode | None = None  # torch.compile mode for training (reduce-overhead: CUDA graphs; null: eager)
    workers: int = 0  # DataLoader worker processes per rank, at most 256 (above the usable CPUs: cut to their number)
    threads: int | None = 1  # torch CPU threads of this process (null: torch's default, one per core)
    seed: int = 0  # seed of the initialization, data order and augmentation
    votes: int = 1  # test-time voting (1 to 1000): logits averaged over as many randomly scaled copies of each cloud


MODEL_KNOBS = ("num_centroids", "num_neighbors", "num_heads", "num_steps", "mlp_ratio", "fuse_dim", "upsample", "drop")


def model_spec(cfg: PartSegConfig, num_parts: int, num_categories: int) -> tuple[str, dict[str, Any]]:
    """``(cfg.model, constructor keywords)``: the parts, categories and input channels of the data, the config's knobs
    and ``model_kwargs``."""
    kwargs = dict(num_parts=num_parts, num_categories=num_categories, in_channels=6 if cfg.use_normals else 3)
    return cfg.model, {**kwargs, **collect_model_kwargs(cfg, MODEL_KNOBS)}


def build_model(cfg: PartSegConfig, num_parts: int, num_categories: int) -> nn.Module:
    """``create_model(cfg.model, ...)`` with the config's knobs and ``model_kwargs``; a keyword it lacks is named."""
    name, kwargs = model_spec(cfg, num_parts, num_categories)
    return create_model(name, **kwargs)


def _train_transform(cfg: PartSegConfig) -> Compose:
    parts: list = [RandomScale(cfg.scale_lo, cfg.scale_hi, anisotropic=True)]
    if cfg.rotate_up:
        parts.append(RandomRotateUp("z" if cfg.dataset == "synthetic_parts" else "y"))
    if cfg.translate > 0:
        parts.append(RandomTranslate(cfg.translate))
    if cfg.jitter > 0:
        parts.append(Jitter(cfg.jitter, cfg.jitter_clip))
    if cfg.shuffle_points:
        parts.append(ShufflePoints())
    return Compose(parts)


def build_datasets(cfg: PartSegConfig, data_root: str | None = None) -> tuple[PartSegmentation, PartSegmentation]:
    """The train and test :class:`PartSegmentation` sets of ``cfg`` (augmentation on the train set only)."""
    root = data_root or cfg.data_root
    if cfg.dataset == "synthetic_parts":
        classes = tuple(cfg.synthetic_classes)
        train = SyntheticParts("train", cfg.num_points, classes, cfg.synthetic_train_per_class, cfg.seed)
        test = SyntheticParts("test", cfg.num_points, classes, cfg.synthetic_test_per_class, cfg.seed)
    else:
        layout = "normal" if cfg.dataset == "shapenet_part_normal" else "v0"
        common: dict[str, Any] = dict(num_points=cfg.num_points, layout=layout, categories=cfg.categories,
                                      seed=cfg.seed, max_abs_coord=cfg.max_abs_coord)  # fmt: skip
        train = ShapeNetPart(root, cfg.train_split, **common)
        test = ShapeNetPart(root, cfg.test_split, **common)
    return (
        PartSegmentation(train, cfg.use_normals, _train_transform(cfg), cfg.seed),
        PartSegmentation(test, cfg.use_normals, None, cfg.seed),
    )


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, device: torch.device, votes: int = 1, seed: int = 0
) -> dict[str, Any]:
    """Test loss, point accuracy, instance and class mIoU (in %; ShapeNet Part's protocol), optionally voted.

    Returns also ``class_ious``: each category's mIoU by name.
    """
    model.eval()
    dataset = loader.dataset
    meter = PartSegMeter(dataset.part_classes, dataset.category_names)
    loss_sum, correct, count = 0.0, 0, 0
    for b, (points, category, labels) in enumerate(loader):
        points, category, labels = points.to(device), category.to(device), labels.to(device)
        if votes > 1:
            logits = vote_logits(lambda p: model(p, category), points, votes, seed=seed + b)  # noqa: B023
        else:
            logits = model(points, category)
        logits = logits.float()
        loss_sum += float(F.cross_entropy(logits.flatten(0, 1), labels.flatten(), reduction="sum"))
        pred = meter.update(logits, labels, category)
        correct += int((pred == labels).sum())
        count += labels.numel()
    miou = meter.compute()
    return {
        "test_loss": loss_sum / max(count, 1),
        "test_acc": 100.0 * correct / max(count, 1),
        "test_instance_miou": miou["instance_miou"],
        "test_class_miou": miou["class_miou"],
        "class_ious": meter.class_ious() if meter.ious else {},
    }


def _scheduler(cfg: PartSegConfig, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    """Per-epoch schedule: warm-up, then cosine to 1%, step decay every ``lr_step`` or at ``lr_milestones``."""
    if cfg.cosine or not cfg.lr_milestones:
        return epoch_lr_schedule(optimizer, epochs=cfg.epochs, cosine=cfg.cosine, lr_step=cfg.lr_step,
                                 lr_gamma=cfg.lr_gamma, warmup_epochs=cfg.warmup_epochs)  # fmt: skip
    milestones, warmup = sorted(cfg.lr_milestones), cfg.warmup_epochs

    def factor(epoch: int) -> float:
        if epoch < warmup:
            return (epoch + 1) / (warmup + 1)
        return cfg.lr_gamma ** sum(epoch >= m for m in milestones)

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


class PartSegRecipe(Recipe):
    """Part segmentation: per-point cross-entropy, AdamW, per-epoch schedule, ShapeNet Part's mIoU."""

    group = "partseg"
    config_cls = PartSegConfig
    monitor = "test_instance_miou"
    monitor_mode = "max"
    resume_mutable = ("votes", "threads")
    # how to evaluate, and what only training reads (augmentation, schedule, loss)
    eval_mutable = ("votes", "threads", "scale_lo", "scale_hi", "translate", "jitter", "jitter_clip", "rotate_up",
                    "shuffle_points", "cosine", "lr_step", "lr_milestones", "lr_gamma", "label_smoothing")  # fmt: skip

    @classmethod
    def validate(cls, cfg: PartSegConfig) -> None:
        shapenet = cfg.dataset.startswith("shapenet_part")
        check_config(
            cfg,
            [
                (cfg.model in list_models(), f"model {cfg.model!r} is not registered; choose one of {list_models()}"),
                (cfg.dataset in DATASETS, f"dataset must be one of {list(DATASETS)}, got {cfg.dataset!r}"),
                *point_checks(cfg, min_points=2),
                (
                    cfg.batch_size >= 2,
                    f"batch_size must be >= 2 (BatchNorm needs two shapes per batch), got {cfg.batch_size}",
                ),
                (cfg.threads is None or cfg.threads >= 1, f"threads must be >= 1 or null, got {cfg.threads}"),
                (
                    cfg.max_abs_coord is None or cfg.max_abs_coord > 0,
                    f"max_abs_coord must be > 0 or null, got {cfg.max_abs_coord}",
                ),
                (
                    cfg.dataset != "shapenet_part" or not cfg.use_normals,
                    "use_normals needs normals, which the v0 layout (dataset shapenet_part) does not store: use "
                    "dataset shapenet_part_normal or set use_normals to false",
                ),
                (
                    cfg.categories is None or shapenet,
                    f"categories applies to the ShapeNet Part datasets, not {cfg.dataset!r}: set it to null",
                ),
                (
                    all(c in PART_NAMES for c in cfg.synthetic_classes) and len(cfg.synthetic_classes) > 0,
                    f"synthetic_classes must be a non-empty subset of {sorted(PART_NAMES)}, got "
                    f"{cfg.synthetic_classes}",
                ),
                (
                    cfg.train_split in ("train", "trainval") and cfg.test_split in ("test", "val"),
                    f"train_split must be train or trainval and test_split test or val, got {cfg.train_split!r} "
                    f"and {cfg.test_split!r}",
                ),
                (
                    shapenet or (cfg.train_split, cfg.test_split) == ("train", "test"),
                    "the synthetic parts have a train and a test split only: set train_split train, test_split test",
                ),
            ],
        )

    def __init__(self, cfg: PartSegConfig, ctx, data_root: str | None = None) -> None:
        super().__init__(cfg, ctx, data_root)
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)

    def build_datasets(self):
        return build_datasets(self.cfg, self.data_root)

    def model_spec(self) -> tuple[str, dict[str, Any]]:
        return model_spec(self.cfg, self.train_set.num_parts, self.train_set.num_categories)

    def summary(self, model: nn.Module) -> dict[str, Any]:
        cfg = self.cfg
        example = torch.zeros(1, cfg.num_points, 6 if cfg.use_normals else 3, device=self.ctx.device)
        example[0, :, :3] = torch.randn(cfg.num_points, 3, generator=torch.Generator().manual_seed(0)).to(example)
        category = torch.zeros(1, dtype=torch.long, device=self.ctx.device)
        return {"params": count_params(model), "gmacs": count_gmacs(model, example, category),
                "num_points": cfg.num_points, "dataset": cfg.dataset, "model": cfg.model,
                "num_parts": self.train_set.num_parts, "num_categories": self.train_set.num_categories}  # fmt: skip

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)

    def build_scheduler(self, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
        return _scheduler(self.cfg, optimizer), self.cfg.epochs

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor]):
        points, category, labels = batch
        logits = model(points, category)
        loss = F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), label_smoothing=self.cfg.label_smoothing)
        return loss, {"acc": 100.0 * (logits.argmax(-1) == labels).float().mean()}

    def evaluate(self, model: nn.Module) -> dict[str, Any]:
        metrics = evaluate(model, self.eval_loader, self.ctx.device)
        metrics.pop("class_ious")  # one record per epoch holds scalars; the final metrics get the per-category ones
        return metrics

    def finalize(self, final: dict[str, Any], model: nn.Module) -> dict[str, Any]:
        voted = self._voted(model)
        if self.cfg.votes <= 1:
            return {"class_ious": voted["class_ious"]}
        return {f"{k}_vote{self.cfg.votes}": v for k, v in voted.items()}

    def evaluate_checkpoint(self, model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
        return {**self._voted(model), "votes": self.cfg.votes}

    def _voted(self, model: nn.Module) -> dict[str, Any]:
        cfg = self.cfg
        return evaluate(model, self.eval_loader, self.ctx.device, cfg.votes, cfg.seed)
