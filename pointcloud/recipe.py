"""The ModelNet40 training recipe: config, data, model, optimizer and evaluation, run by :mod:`engine`.

``tools/train_modelnet.py`` is ``engine.main(ModelNetRecipe)``: :class:`ModelNetRecipe` declares the domain parts and
:func:`engine.run` does the rest. The config is flat and mirrors :class:`ModelNetConfig`; YAML rows live in
``configs/pointcloud/``. Model knobs left at ``None`` keep the registered model's own default (so the ablation twins
keep their ``init`` and ``num_steps=0``); ``model_kwargs`` reaches any other constructor keyword (``mixer: hydra``).

Paper schedule (section 3.2): Adam, step decay every 20 epochs, 250 epochs. The defaults here are the main job: the
default centroid transformer on the embedded synthetic shapes at 256 points (so 128 and 64 centroids, and K = 16
neighbours), 5 epochs, sized to run on a 2-core CPU in minutes (the measured figures: the README's results).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader

from attention import MIXERS
from engine import CompileMode, Recipe, check_config, collect_model_kwargs, epoch_lr_schedule
from engine.config import shorten
from engine.distributed import unwrap
from measure.stats import count_gmacs, count_params

from . import transforms
from .data import DATASETS, UP_AXES, build_dataset
from .model import create_model, list_models
from .transforms import vote_logits

__all__ = [
    "MAX_POINTS",
    "MAX_VOTES",
    "ModelNetConfig",
    "ModelNetRecipe",
    "build_datasets",
    "build_model",
    "evaluate",
    "model_spec",
    "point_checks",
    "up_axis",
]

_logger = logging.getLogger(__name__)

#: Most points per cloud: 64 times the 1,024 of ModelNet's protocol, and every release stores fewer (10,000 at most).
#: One cloud of 10**11 points asks for hundreds of GiB; refused with the config instead.
MAX_POINTS = 65536
#: Most test-time votes: each is a full pass over the test split, and gains stop after about ten.
MAX_VOTES = 1000


@dataclass
class ModelNetConfig:
    """Every knob of a ModelNet40 run (defaults: the CPU main job on the embedded synthetic data)."""

    name: str = "main"  # run name: runs go to runs/modelnet40/<name>/<timestamp>
    # model (None: the registered model's default)
    model: str = "centroid_transformer_modelnet40"  # registered model (pointcloud.list_models())
    num_centroids: list[int | float] | None = None  # [N1, N2], centroids of the 2 CA blocks: counts or fractions
    num_neighbors: int | None = 16  # K of every block; 16 at 256 points (null: the model's 24, chosen for 1024)
    num_heads: int | None = None  # attention heads per block
    num_steps: int | None = None  # T, centroid-attention steps (0: the downsampling-only ablation twin)
    mlp_ratio: float | None = None  # hidden width of each block's MLP, as a multiple of the block width
    fuse_dim: int | None = None  # width of the per-point fusion layer whose max and mean pools feed the head
    drop: float | None = None  # dropout in the classifier head
    model_kwargs: dict = field(default_factory=dict)  # any other constructor keyword, e.g. {mixer: hydra}
    # data
    dataset: str = "synthetic"  # synthetic, modelnet40_h5, modelnet40_normal, modelnet40_sampled, modelnet10_*
    data_root: str | None = None  # dataset root; --data-root wins (null: $CENTROID_DATA, else ./datasets)
    num_points: int = 256  # points per cloud (at most 65536): the first num_points stored points of each shape
    use_normals: bool = False  # feed x, y, z, nx, ny, nz instead of x, y, z (not with modelnet40_h5)
    synthetic_classes: int = 10  # classes of the synthetic dataset (2 to 13)
    synthetic_train_per_class: int = 100  # synthetic training shapes per class
    synthetic_test_per_class: int = 30  # synthetic test shapes per class
    up_axis: str | None = None  # axis of rotate_up (null: the dataset's own, pointcloud.data.UP_AXES; others refused)
    normalize: bool = False  # centre each stored cloud and scale it to the unit sphere (synthetic clouds already are)
    max_abs_coord: float | None = 10.0  # refuse stored clouds with a larger |x|, |y| or |z| (null: no limit)
    # augmentation (train split only)
    scale_lo: float = 0.8  # smallest random scale factor (one factor per axis)
    scale_hi: float = 1.25  # largest random scale factor
    translate: float = 0.1  # largest random shift per axis (0: off)
    jitter: float = 0.01  # std of the clipped Gaussian noise added to each coordinate (0: off)
    rotate_up: bool = True  # random rotation about up_axis
    point_dropout: float = 0.0  # largest fraction of points replaced by the first point (PointNet++; 0: off)
    shuffle_points: bool = True  # shuffle the point order of each cloud
    # optimization
    epochs: int = 5  # epochs to train (more on --resume stretches what is left of the schedule)
    batch_size: int = 32  # global batch, split evenly over the ranks
    eval_batch_size: int = 64  # evaluation batch per rank
    lr: float = 2e-3  # peak learning rate of AdamW
    weight_decay: float = 1e-4  # AdamW weight decay
    lr_step: int = 20  # with cosine false: epochs between two step decays
    lr_gamma: float = 0.7  # with cosine false: factor of each step decay
    warmup_epochs: int = 0  # epochs of linear warm-up before the decay
    cosine: bool = True  # cosine decay to 1% of lr (false: the paper's step decay by lr_gamma every lr_step)
    label_smoothing: float = 0.2  # label smoothing of the cross-entropy
    grad_clip: float | None = None  # max global gradient norm (null: no clipping)
    amp: bool = False  # bfloat16 autocast (CUDA only)
    compile: CompileMode | None = None  # torch.compile mode for training (reduce-overhead: CUDA graphs; null: eager)
    workers: int = 0  # DataLoader worker processes per rank, at most 256 (above the usable CPUs: cut to their number)
    seed: int = 0  # seed of the initialization, data order and augmentation
    votes: int = 1  # test-time voting (1 to 1000): logits averaged over as many randomly scaled copies of each cloud


MODEL_KNOBS = ("num_centroids", "num_neighbors", "num_heads", "num_steps", "mlp_ratio", "fuse_dim", "drop")


def model_spec(cfg: ModelNetConfig, num_classes: int) -> tuple[str, dict[str, Any]]:
    """``(cfg.model, constructor keywords)``: the classes and input channels of the data, the config's knobs and
    ``model_kwargs``."""
    kwargs = dict(num_classes=num_classes, in_channels=6 if cfg.use_normals else 3)
    return cfg.model, {**kwargs, **collect_model_kwargs(cfg, MODEL_KNOBS)}


def build_model(cfg: ModelNetConfig, num_classes: int) -> nn.Module:
    """``create_model(cfg.model, ...)`` with the config's knobs and ``model_kwargs``; a keyword it lacks is named."""
    name, kwargs = model_spec(cfg, num_classes)
    return create_model(name, **kwargs)


def up_axis(cfg: ModelNetConfig) -> str:
    """The axis of ``cfg``'s rotation about the up axis: its ``up_axis``, else its dataset's own (:data:`UP_AXES`)."""
    return cfg.up_axis or UP_AXES[cfg.dataset]


def _up_axis_checks(cfg: ModelNetConfig) -> list[tuple[bool, str]]:
    """``up_axis`` is x, y, z or null, and an explicit one is the dataset's own: ``rotate_up`` about another axis than
    the one the shapes stand on tips them over, silently (the loss still falls)."""
    own = UP_AXES.get(cfg.dataset)
    return [
        (cfg.up_axis in (None, "x", "y", "z"), f"up_axis must be 'x', 'y', 'z' or null, got {cfg.up_axis!r}"),
        (
            cfg.up_axis is None or own is None or cfg.up_axis == own,
            f"up_axis {cfg.up_axis!r} disagrees with dataset {cfg.dataset!r}, whose shapes stand on {own!r} "
            f"(pointcloud.data.UP_AXES): rotate_up would turn them about the wrong axis. Set up_axis: null (the "
            f"dataset's own) or up_axis: {own}",
        ),
    ]


def _train_transform(cfg: ModelNetConfig) -> transforms.Compose:
    parts = [transforms.NormalizeUnitSphere()] if _normalize(cfg) else []
    parts.append(transforms.RandomScale(cfg.scale_lo, cfg.scale_hi, anisotropic=True))
    if cfg.rotate_up:
        parts.append(transforms.RandomRotateUp(up_axis(cfg)))
    if cfg.translate > 0:
        parts.append(transforms.RandomTranslate(cfg.translate))
    if cfg.jitter > 0:
        parts.append(transforms.Jitter(cfg.jitter))
    if cfg.point_dropout > 0:
        parts.append(transforms.RandomPointDropout(cfg.point_dropout))
    if cfg.shuffle_points:
        parts.append(transforms.ShufflePoints())
    return transforms.Compose(parts)


def _normalize(cfg: ModelNetConfig) -> bool:
    return cfg.normalize and cfg.dataset != "synthetic"  # synthetic clouds are generated normalized


def build_datasets(cfg: ModelNetConfig, data_root: str | None = None):
    """The train and test datasets of ``cfg``: augmentation on train only; ``normalize`` on both, before it."""
    root = data_root or cfg.data_root
    common: dict[str, Any] = {"num_points": cfg.num_points, "use_normals": cfg.use_normals, "seed": cfg.seed}
    train_kw: dict[str, Any] = {"transform": _train_transform(cfg)}
    test_kw: dict[str, Any] = {"transform": transforms.NormalizeUnitSphere()} if _normalize(cfg) else {}
    if cfg.dataset == "synthetic":
        common["num_classes"] = cfg.synthetic_classes
        train_kw["samples_per_class"] = cfg.synthetic_train_per_class
        test_kw["samples_per_class"] = cfg.synthetic_test_per_class
    else:  # the check looks at the stored clouds, before normalize
        common["max_abs_coord"] = None if cfg.normalize else cfg.max_abs_coord
    train_set = build_dataset(cfg.dataset, "train", root, **common, **train_kw)
    test_set = build_dataset(cfg.dataset, "test", root, **common, **test_kw)
    return train_set, test_set


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, device: torch.device, num_classes: int, votes: int = 1, seed: int = 0
) -> dict[str, float]:
    """Test loss, overall accuracy and mean class accuracy (in %), optionally with test-time voting."""
    model.eval()
    correct = torch.zeros(num_classes, dtype=torch.long)
    total = torch.zeros(num_classes, dtype=torch.long)
    loss_sum, count = 0.0, 0
    for b, (points, labels) in enumerate(loader):
        points, labels = points.to(device), labels.to(device)
        logits = vote_logits(model, points, votes, seed=seed + b) if votes > 1 else model(points)
        loss_sum += float(F.cross_entropy(logits.float(), labels, reduction="sum"))
        count += labels.numel()
        pred = logits.argmax(-1).cpu()
        labels = labels.cpu()
        total += torch.bincount(labels, minlength=num_classes)
        correct += torch.bincount(labels[pred == labels], minlength=num_classes)
    present = total > 0
    return {
        "test_loss": loss_sum / max(count, 1),
        "test_oa": 100.0 * float(correct.sum()) / max(int(total.sum()), 1),
        "test_macc": 100.0 * float((correct[present].float() / total[present].float()).mean()),
    }


def _scheduler(cfg: ModelNetConfig, optimizer: torch.optim.Optimizer) -> torch.optim.lr_scheduler.LRScheduler:
    """Per-epoch schedule: linear warm-up, then cosine to 1% (``cosine``) or the paper's step decay."""

    return epoch_lr_schedule(
        optimizer,
        epochs=cfg.epochs,
        cosine=cfg.cosine,
        lr_step=cfg.lr_step,
        lr_gamma=cfg.lr_gamma,
        warmup_epochs=cfg.warmup_epochs,
    )


def point_checks(cfg: Any, min_points: int) -> list[tuple[bool, str]]:
    """The :func:`engine.check_config` checks of the fields every point-model config has: ``num_points`` (at least
    ``min_points``, at most :data:`MAX_POINTS`), ``num_neighbors`` (K), ``num_centroids``, ``votes`` (at most
    :data:`MAX_VOTES`), the scale range and ``model_kwargs.mixer`` (a name of :data:`attention.MIXERS`)."""
    centroids_ok = all(0 < m < 1 if isinstance(m, float) else 1 <= m <= cfg.num_points for m in cfg.num_centroids or ())
    mixer = (cfg.model_kwargs or {}).get("mixer")
    return [
        (cfg.num_points >= min_points, f"num_points must be >= {min_points}, got {cfg.num_points}"),
        (cfg.num_points <= MAX_POINTS, f"num_points must be <= {MAX_POINTS}, got {cfg.num_points}"),
        (
            cfg.num_neighbors is None or 1 <= cfg.num_neighbors <= cfg.num_points,
            f"num_neighbors (K) must be in [1, num_points={cfg.num_points}], got {cfg.num_neighbors}",
        ),
        (
            centroids_ok,
            f"num_centroids entries must be counts in [1, num_points={cfg.num_points}] or fractions in "
            f"(0, 1), got {cfg.num_centroids}",
        ),
        (cfg.votes >= 1, f"votes must be >= 1, got {cfg.votes}"),
        (cfg.votes <= MAX_VOTES, f"votes must be <= {MAX_VOTES}, got {cfg.votes}"),
        (0 < cfg.scale_lo <= cfg.scale_hi, f"need 0 < scale_lo <= scale_hi, got {cfg.scale_lo} and {cfg.scale_hi}"),
        (
            mixer is None or (isinstance(mixer, str) and mixer in MIXERS),
            f"model_kwargs.mixer must be null (KNN attention) or one of {sorted(MIXERS)}, got {shorten(mixer)}",
        ),
    ]


class ModelNetRecipe(Recipe):
    """ModelNet40 classification: cross-entropy with label smoothing, AdamW, per-epoch cosine or step schedule."""

    group = "modelnet40"
    config_cls = ModelNetConfig
    monitor = "test_oa"
    monitor_mode = "max"
    resume_mutable = ("votes",)
    # how to evaluate, and what only training reads (augmentation, schedule, loss)
    eval_mutable = ("votes", "scale_lo", "scale_hi", "translate", "jitter", "rotate_up", "point_dropout",
                    "shuffle_points", "lr_step", "lr_gamma", "cosine", "label_smoothing")  # fmt: skip

    @classmethod
    def validate(cls, cfg: ModelNetConfig) -> None:
        check_config(
            cfg,
            [
                (cfg.model in list_models(), f"model {cfg.model!r} is not registered; choose one of {list_models()}"),
                (cfg.dataset in DATASETS, f"dataset {cfg.dataset!r} is unknown; choose one of {sorted(DATASETS)}"),
                *point_checks(cfg, min_points=1),
                *_up_axis_checks(cfg),
                (
                    cfg.max_abs_coord is None or cfg.max_abs_coord > 0,
                    f"max_abs_coord must be > 0 or null, got {cfg.max_abs_coord}",
                ),
            ],
        )

    def build_datasets(self):
        return build_datasets(self.cfg, self.data_root)

    def model_spec(self) -> tuple[str, dict[str, Any]]:
        return model_spec(self.cfg, self.train_set.num_classes)

    def summary(self, model: nn.Module) -> dict[str, Any]:
        cfg = self.cfg
        example = torch.zeros(1, cfg.num_points, 6 if cfg.use_normals else 3, device=self.ctx.device)
        example[0, :, :3] = torch.randn(cfg.num_points, 3, generator=torch.Generator().manual_seed(0)).to(example)
        return {"params": count_params(model), "gmacs": count_gmacs(model, example), "num_points": cfg.num_points,
                "dataset": cfg.dataset, "model": cfg.model}  # fmt: skip

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)

    def build_scheduler(self, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
        return _scheduler(self.cfg, optimizer), self.cfg.epochs

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):
        points, labels = batch
        logits = model(points)
        loss = F.cross_entropy(logits.float(), labels, label_smoothing=self.cfg.label_smoothing)
        logs = {"acc": 100.0 * (logits.argmax(-1) == labels).float().mean()}
        aux = getattr(unwrap(model), "aux_loss", None)  # a model's own regularizer (PointNet's transform loss)
        if aux is not None:
            loss = loss + aux.float()
            logs["aux_loss"] = aux.detach()
        return loss, logs

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return evaluate(model, self.eval_loader, self.ctx.device, self.train_set.num_classes)

    def finalize(self, final: dict[str, Any], model: nn.Module) -> dict[str, Any]:
        if self.cfg.votes <= 1:
            return {}
        voted = self._voted(model)
        return {f"{k}_vote{self.cfg.votes}": v for k, v in voted.items()}

    def evaluate_checkpoint(self, model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
        return {**self._voted(model), "votes": self.cfg.votes}

    def _voted(self, model: nn.Module) -> dict[str, float]:
        cfg = self.cfg
        return evaluate(model, self.eval_loader, self.ctx.device, self.train_set.num_classes, cfg.votes, cfg.seed)
