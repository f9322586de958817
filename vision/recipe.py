"""The DeiT training recipe on timm's pipeline: config, data, model, optimizer, schedule, EMA and evaluation, run by
:mod:`engine`.

Every part that DeiT's ``main.py`` takes from timm comes from
timm here too:

* data: ``timm.data.create_transform`` (random resized crop, flip, RandAugment ``rand-m9-mstd0.5-inc1``, random
  erasing, eval resize + centre crop at ``crop_pct``) on datasets from :mod:`vision.data` (``timm.data.create_dataset``
  for ImageFolder trees, or the embedded synthetic images); ``timm.data.Mixup`` (mixup + cutmix with label
  smoothing folded into the soft targets); ``timm.data.distributed_sampler.RepeatAugSampler`` for DeiT's repeated
  augmentation under DDP;
* ``timm.optim.create_optimizer_v2`` (AdamW; no weight decay on biases, norms, ``pos_embed`` and ``cls_token``) with
  DeiT's linear scaling ``lr = lr * global_batch / 512``;
* ``timm.scheduler.create_scheduler_v2`` (cosine with linear warmup), stepped as timm's ``train.py`` does
  (``step(epoch + 1)`` after each epoch, ``step_update`` after each update);
* ``timm.loss``: ``SoftTargetCrossEntropy`` with mixup / cutmix, ``LabelSmoothingCrossEntropy`` without;
* ``timm.utils.ModelEmaV3`` (DeiT: decay 0.99996 per update, no warmup), evaluated beside the model every epoch.

``tools/train_deit.py`` is ``engine.main(DeiTRecipe)``: :func:`engine.run` owns the run, and its
:class:`~engine.Trainer` the loop (tqdm, ``log.jsonl`` + TensorBoard, atomic ``last.pt`` with model, optimizer,
scheduler, scaler, EMA and RNG state, ``best.pt`` on the best top-1, exact ``--resume``, AMP on CUDA, DDP).
``batch_size`` is the **global** batch (DeiT's per-GPU batch times the number of GPUs), split evenly over the ranks;
so ``lr * batch_size / lr_base_size`` is DeiT's ``lr * batch_size_per_gpu * world_size / 512``.

Resume determinism: augmentation (timm's transforms draw from Python's, NumPy's and torch's global RNGs) and mixup
are drawn from RNGs that the Trainer reseeds from ``(seed, epoch, rank)`` at every epoch, DataLoader workers are
seeded from the loader's generator (also reseeded), and workers are not persistent: a resumed run replays the
remaining epochs exactly for the same number of ranks and workers.

The dataclass defaults are the main job: a reduced centroid DeiT (64 px, patch 8, width 128, 4 blocks, the centroid
block at index 2: 64 -> 16 patch tokens) trained for 8 epochs on 7,500 embedded synthetic images with a light version
of the recipe (random resized crop, flip, colour jitter, label smoothing; no RandAugment, mixup, erasing or EMA, which
slow a 940-step run down more than they help it), sized for a 2-core CPU in under 5 minutes
(``configs/vision/synthetic_centroid_tiny.yaml`` spells the same values out; measured figures in docs/guides/vision.md).
``configs/vision/deit_imagenet_base.yaml`` holds DeiT's ImageNet recipe that each paper row includes.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import logging
from dataclasses import dataclass, field
from typing import Any, Literal

import timm
import torch
import torch.nn.functional as F
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, Mixup, create_transform
from timm.data.distributed_sampler import RepeatAugSampler
from timm.loss import LabelSmoothingCrossEntropy, SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from timm.utils import ModelEmaV3
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, Subset

from engine import (
    CompileMode,
    DistributedContext,
    Recipe,
    StretchOnResume,
    UsageError,
    collect_model_kwargs,
    create_with_kwargs,
    split_batch,
    unwrap_state_dict,
)
from measure.stats import count_gmacs, count_params

from .data import build_dataset, patch_posterize  # importing vision (this package) registered the models in timm

__all__ = ["DeiTConfig", "DeiTRecipe", "build_loaders", "build_model", "build_transforms", "evaluate", "model_spec"]

_logger = logging.getLogger(__name__)


@dataclass
class DeiTConfig:
    """Every knob of a DeiT run (defaults: the CPU main job on the embedded synthetic images)."""

    name: str = "synthetic_centroid_tiny"  # run name: runs go to runs/deit/<name>/<timestamp>
    # model: any timm name (ours are registered by `import vision`); knobs left null keep the registered value
    model: str = "centroid_deit_tiny_c6_patch16_224"  # timm model name
    img_size: int = 64  # input side length in pixels
    patch_size: int | None = 8  # patch side length in pixels
    embed_dim: int | None = 128  # token width
    depth: int | None = 4  # transformer blocks
    num_heads: int | None = 4  # attention heads per block
    mlp_ratio: float | None = 2.0  # MLP hidden width, as a multiple of embed_dim
    centroid_index: int | None = 2  # index of the centroid block (that many full-resolution blocks run before it)
    model_kwargs: dict = field(default_factory=dict)  # any other model kwarg, e.g. {num_inducing: 32}
    drop_rate: float = 0.0  # dropout before the classifier (timm's drop_rate)
    drop_path: float = 0.0  # stochastic depth rate (timm's drop_path_rate)
    # data
    dataset: Literal["synthetic", "imagefolder"] = "synthetic"  # embedded synthetic images, or an ImageFolder tree
    data_root: str | None = None  # dataset root with train/ and val/ or test/; --data-root wins (null: $CENTROID_DATA)
    train_folder: str = "train"  # imagefolder: the training split's folder
    eval_folder: str | None = None  # imagefolder: the held-out split's folder (null: val/, test/ or validation/)
    synthetic_classes: int = 10  # classes of the synthetic dataset
    synthetic_train_per_class: int = 750  # synthetic training images per class
    synthetic_val_per_class: int = 100  # synthetic validation images per class
    synthetic_image_size: int = 64  # side length of the rendered synthetic images (then cropped to img_size)
    workers: int = 0  # DataLoader worker processes per rank, at most 256 (above the usable CPUs: cut to their number)
    # augmentation (timm.data.create_transform; train split only except crop_pct / interpolation / mean / std)
    scale: tuple[float, float] = (0.5, 1.0)  # area range of the random resized crop
    ratio: tuple[float, float] = (0.75, 1.3333333333333333)  # aspect-ratio range of the random resized crop
    hflip: float = 0.5  # probability of a horizontal flip
    color_jitter: float = 0.3  # colour-jitter strength; ignored by timm when auto_augment is set
    auto_augment: str | None = None  # timm auto-augment policy (null: none); DeiT: "rand-m9-mstd0.5-inc1"
    interpolation: str = "bicubic"  # resize interpolation
    reprob: float = 0.0  # random-erasing probability
    remode: str = "pixel"  # random-erasing fill: pixel, rand or const
    recount: int = 1  # random-erasing boxes per image
    crop_pct: float = 0.875  # evaluation: resize to img_size / crop_pct, then centre crop img_size
    mean: tuple[float, float, float] = IMAGENET_DEFAULT_MEAN  # per-channel normalization mean
    std: tuple[float, float, float] = IMAGENET_DEFAULT_STD  # per-channel normalization std
    aug_repeats: int = 0  # DeiT's repeated augmentation (3), under DDP only, as in DeiT
    # mixup / cutmix (timm.data.Mixup); both 0 disables it
    mixup: float = 0.0  # mixup alpha (0: off)
    cutmix: float = 0.0  # cutmix alpha (0: off)
    cutmix_minmax: tuple[float, float] | None = None  # cutmix box-area ratio range; when set, used instead of alpha
    mixup_prob: float = 1.0  # probability of mixing a batch (or pair or element)
    mixup_switch_prob: float = 0.5  # probability of cutmix instead of mixup when both are on
    mixup_mode: Literal["batch", "pair", "elem"] = "batch"  # mix per batch, pair of samples or element
    smoothing: float = 0.1  # label smoothing
    # optimization
    epochs: int = 8  # epochs to train (more on --resume stretches what is left of the schedule)
    batch_size: int = 64  # global batch, split evenly over the ranks
    eval_batch_size: int = 256  # evaluation batch per rank
    opt: str = "adamw"  # timm optimizer name (timm.optim.create_optimizer_v2)
    opt_eps: float = 1e-8  # optimizer epsilon
    opt_betas: tuple[float, float] | None = None  # Adam betas (null: the optimizer's default)
    momentum: float = 0.9  # SGD momentum (momentum optimizers only)
    lr: float = 8e-3  # at lr_base_size images per step; the run uses lr * batch_size / lr_base_size (1e-3 here)
    lr_base_size: int = 512  # images per step that lr is given for (0: lr is used as it is)
    weight_decay: float = 0.05  # decoupled weight decay (not on biases, norms, pos_embed, cls_token)
    sched: str = "cosine"  # timm schedule name (timm.scheduler.create_scheduler_v2)
    sched_on_updates: bool = True  # step the schedule per update instead of per epoch (DeiT: per epoch)
    warmup_epochs: int = 1  # epochs of linear warm-up from warmup_lr
    warmup_lr: float = 1e-6  # learning rate at the start of the warm-up
    min_lr: float = 1e-5  # learning rate at the end of the schedule
    cooldown_epochs: int = 0  # epochs at min_lr after the schedule
    grad_clip: float | None = None  # max global gradient norm (null: no clipping)
    # EMA of the weights (timm.utils.ModelEmaV3), evaluated every epoch beside the model
    model_ema: bool = False  # keep and evaluate the EMA
    model_ema_decay: float = 0.99996  # EMA decay per update
    model_ema_warmup: bool = False  # timm's EMA warm-up (a smaller decay in the first updates)
    # runtime
    amp: bool = True  # autocast in amp_dtype (CUDA only; ignored on CPU)
    amp_dtype: Literal["bfloat16", "float16"] = "bfloat16"  # autocast dtype (float16 adds a GradScaler)
    compile: CompileMode | None = None  # torch.compile mode for training (reduce-overhead: CUDA graphs; null: eager)
    log_every: int = 0  # also log loss, lr and throughput every this many steps (0: once per epoch)
    seed: int = 0  # seed of the initialization, data order and augmentation


MODEL_KNOBS = ("patch_size", "embed_dim", "depth", "num_heads", "mlp_ratio", "centroid_index")


def model_spec(cfg: DeiTConfig, num_classes: int) -> tuple[str, dict[str, Any]]:
    """``(cfg.model, timm.create_model keywords)``: the classes of the data, image size, dropout rates, the config's
    knobs and ``model_kwargs``."""
    fixed = dict(num_classes=num_classes, img_size=cfg.img_size, drop_rate=cfg.drop_rate, drop_path_rate=cfg.drop_path)
    return cfg.model, {**fixed, **collect_model_kwargs(cfg, MODEL_KNOBS)}


def build_model(cfg: DeiTConfig, num_classes: int) -> nn.Module:
    """``timm.create_model(cfg.model, ...)`` with the config's knobs and ``model_kwargs`` (a foreign one is named)."""
    name, kwargs = model_spec(cfg, num_classes)
    try:
        return create_with_kwargs(functools.partial(timm.create_model, name), name, kwargs)
    except RuntimeError as err:
        if "Unknown model" not in str(err):
            raise
        raise ValueError(f"{err}; our models are {timm.list_models('*_deit_*_patch16_224')}") from err


# timm's keyword -> the DeiTConfig field passed under it (DeiT's main.py names), per timm call
# fmt: off
_TRANSFORM_ARGS = {"scale": "scale", "ratio": "ratio", "hflip": "hflip", "color_jitter": "color_jitter",
                   "auto_augment": "auto_augment", "re_prob": "reprob", "re_mode": "remode", "re_count": "recount"}
_MIXUP_ARGS = {"mixup_alpha": "mixup", "cutmix_alpha": "cutmix", "cutmix_minmax": "cutmix_minmax", "prob": "mixup_prob",
               "switch_prob": "mixup_switch_prob", "mode": "mixup_mode", "label_smoothing": "smoothing"}
_SCHEDULER_ARGS = {"sched": "sched", "num_epochs": "epochs", "min_lr": "min_lr", "warmup_lr": "warmup_lr",
                   "warmup_epochs": "warmup_epochs", "cooldown_epochs": "cooldown_epochs"}
# fmt: on


def _timm_kwargs(cfg: DeiTConfig, args: dict[str, str]) -> dict[str, Any]:
    return {keyword: getattr(cfg, field) for keyword, field in args.items()}


def build_transforms(cfg: DeiTConfig) -> tuple[Any, Any]:
    """timm's train and eval transforms (PIL image -> normalized tensor) for ``cfg``."""
    common = dict(interpolation=cfg.interpolation, mean=cfg.mean, std=cfg.std)  # both splits
    # patch_posterize: RandAugment at Pillow >= 13 (see vision.data)
    train_tf = create_transform(cfg.img_size, is_training=True, **_timm_kwargs(cfg, _TRANSFORM_ARGS), **common)
    patch_posterize(train_tf)
    eval_tf = create_transform(cfg.img_size, is_training=False, crop_pct=cfg.crop_pct, **common)
    return train_tf, eval_tf


def build_datasets(cfg: DeiTConfig, data_root: str | None = None, splits: tuple[str, ...] = ("train", "val")):
    train_tf, eval_tf = build_transforms(cfg)
    out = {}
    for split in splits:
        kwargs: dict[str, Any] = {}
        if cfg.dataset == "synthetic":
            per_class = cfg.synthetic_train_per_class if split == "train" else cfg.synthetic_val_per_class
            kwargs = dict(
                num_classes=cfg.synthetic_classes,
                samples_per_class=per_class,
                image_size=cfg.synthetic_image_size,
                seed=cfg.seed,
            )
        elif cfg.dataset == "imagefolder":
            kwargs = dict(train_folder=cfg.train_folder, eval_folder=cfg.eval_folder)
        tf = train_tf if split == "train" else eval_tf
        out[split] = build_dataset(cfg.dataset, split, root=data_root or cfg.data_root, transform=tf, **kwargs)
    if cfg.dataset == "imagefolder":
        _warn_small_images(cfg)
    return out


#: At or below this resolution ImageNet's eval crop and flips change what the model sees (see _warn_small_images).
SMALL_IMAGE_SIZE = 64


def _warn_small_images(cfg: DeiTConfig) -> None:
    """One line when ImageNet's flip or eval crop is used on small real images (the embedded synthetic classes are
    flip invariant and drawn inside the crop, so they are left alone)."""
    if cfg.img_size > SMALL_IMAGE_SIZE:
        return
    habits = []
    if cfg.hflip > 0:
        habits.append(f"hflip={cfg.hflip} (flips change digits, text and anything chiral)")
    if cfg.crop_pct < 1:
        resized = int(cfg.img_size / cfg.crop_pct)
        habits.append(f"crop_pct={cfg.crop_pct} (resizes to {resized} px and cuts the border off)")
    if habits:
        _logger.warning(
            "img_size=%d with ImageNet's %s: for small images use configs/vision/small_images.yaml (hflip 0, "
            "crop_pct 1.0) unless your classes survive these",
            cfg.img_size,
            " and ".join(habits),
        )


def _per_rank_batch(cfg: DeiTConfig, ctx: DistributedContext, train_size: int | None = None) -> int:
    per_rank = split_batch(cfg.batch_size, ctx.world_size, train_size)
    if _mixup_active(cfg) and per_rank % 2:
        raise UsageError(f"mixup / cutmix need an even batch per rank, got {per_rank} (batch_size={cfg.batch_size})")
    return per_rank


def build_loaders(cfg: DeiTConfig, ctx: DistributedContext, data_root: str | None = None):
    """Train loader (shuffled, DDP- or repeated-augmentation-sampled, drop_last) and this rank's shard of val."""
    sets = build_datasets(cfg, data_root)
    train_loader, val_loader = _loaders(cfg, ctx, sets["train"], sets["val"])
    return train_loader, val_loader, sets["train"].num_classes


def _loaders(cfg: DeiTConfig, ctx: DistributedContext, train_set: Any, val_set: Any) -> tuple[DataLoader, DataLoader]:
    per_rank = _per_rank_batch(cfg, ctx, len(train_set))
    sampler = None
    if ctx.world_size > 1:
        if cfg.aug_repeats > 0:
            sampler = RepeatAugSampler(train_set, ctx.world_size, ctx.rank, shuffle=True, num_repeats=cfg.aug_repeats)
        else:
            sampler = DistributedSampler(
                train_set, ctx.world_size, ctx.rank, shuffle=True, seed=cfg.seed, drop_last=True
            )
    elif cfg.aug_repeats > 0:
        _logger.warning(
            "aug_repeats=%d is used under DDP only (as in DeiT): ignored in a single process", cfg.aug_repeats
        )
    pin = ctx.device.type == "cuda"
    train_loader = DataLoader(
        train_set,
        batch_size=per_rank,
        shuffle=sampler is None,
        sampler=sampler,
        num_workers=cfg.workers,
        drop_last=True,
        pin_memory=pin,
        generator=torch.Generator(),
    )
    # Evaluation: contiguous, unpadded shards, so the summed counts are exact.
    n = len(val_set)
    shard = range(ctx.rank * n // ctx.world_size, (ctx.rank + 1) * n // ctx.world_size)
    val_loader = DataLoader(
        Subset(val_set, shard) if ctx.world_size > 1 else val_set,
        batch_size=cfg.eval_batch_size,
        shuffle=False,
        num_workers=cfg.workers,
        pin_memory=pin,
    )
    return train_loader, val_loader


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, device: torch.device, ctx: DistributedContext | None = None
) -> dict[str, float]:
    """Val loss, top-1 and top-5 accuracy (%) over all ranks' shards."""
    model.eval()
    totals = torch.zeros(4, dtype=torch.float64, device=device)  # loss sum, top-1 hits, top-5 hits, count
    for images, targets in loader:
        images, targets = images.to(device, non_blocking=True), targets.to(device, non_blocking=True)
        logits = model(images).float()
        top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices  # (B, 5)
        hits = top == targets[:, None]
        totals += torch.stack(
            [
                F.cross_entropy(logits, targets, reduction="sum").double(),
                hits[:, 0].sum().double(),
                hits.any(-1).sum().double(),
                torch.tensor(float(targets.numel()), dtype=torch.float64, device=device),
            ]
        )
    if ctx is not None:
        ctx.all_reduce_sum(totals)
    loss, top1, top5, count = totals.tolist()
    count = max(count, 1.0)
    return {"val_loss": loss / count, "top1": 100.0 * top1 / count, "top5": 100.0 * top5 / count}


def _mixup_active(cfg: DeiTConfig) -> bool:
    return cfg.mixup > 0 or cfg.cutmix > 0 or cfg.cutmix_minmax is not None


def _mixup(cfg: DeiTConfig, num_classes: int) -> Mixup | None:
    if not _mixup_active(cfg):
        return None
    return Mixup(**_timm_kwargs(cfg, _MIXUP_ARGS), num_classes=num_classes)


def _criterion(cfg: DeiTConfig, mixup: Mixup | None) -> nn.Module:
    if mixup is not None:
        return SoftTargetCrossEntropy()  # smoothing is in the mixed targets
    if cfg.smoothing > 0:
        return LabelSmoothingCrossEntropy(smoothing=cfg.smoothing)
    return nn.CrossEntropyLoss()


def _scaled_lr(cfg: DeiTConfig, ctx: DistributedContext) -> float:
    global_batch = _per_rank_batch(cfg, ctx) * ctx.world_size
    return cfg.lr * global_batch / cfg.lr_base_size if cfg.lr_base_size > 0 else cfg.lr


def _example(cfg: DeiTConfig, device: torch.device) -> torch.Tensor:
    return torch.randn(1, 3, cfg.img_size, cfg.img_size, generator=torch.Generator().manual_seed(0)).to(device)


def _replica_digest(*modules: nn.Module) -> str:
    h = hashlib.sha256()
    for module in modules:
        for name, tensor in module.state_dict().items():
            h.update(name.encode())
            h.update(tensor.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_replicas_in_sync(ctx: DistributedContext, *modules: nn.Module) -> str:
    """Under DDP, checks that every rank holds bit-identical weights (model and EMA); returns the SHA-256 digest."""
    digest = _replica_digest(*modules)
    digests = ctx.all_gather_object(digest)
    if len(set(digests)) != 1:
        raise RuntimeError(f"DDP replicas diverged: weight digests per rank {[d[:12] for d in digests]}")
    if ctx.world_size > 1:
        _logger.info("DDP: weights identical on all %d ranks (sha256 %s)", ctx.world_size, digest[:16])
    return digest


class DeiTRecipe(Recipe):
    """DeiT on timm's pipeline: mixup / cutmix, timm's optimizer and scheduler, EMA, top-1 / top-5."""

    group = "deit"
    config_cls = DeiTConfig
    monitor = "top1"
    monitor_mode = "max"
    resume_mutable = ("log_every",)

    def build_datasets(self):
        sets = build_datasets(self.cfg, self.data_root)
        return sets["train"], sets["val"]

    def build_loaders(self, train_set: Any, eval_set: Any):
        return _loaders(self.cfg, self.ctx, train_set, eval_set)

    def model_spec(self) -> tuple[str, dict[str, Any]]:
        return model_spec(self.cfg, self.train_set.num_classes)

    def build_model(self) -> nn.Module:
        return build_model(self.cfg, self.train_set.num_classes)

    def summary(self, model: nn.Module) -> dict[str, Any]:
        cfg = self.cfg
        gmacs = count_gmacs(model, _example(cfg, self.ctx.device))
        return dict(
            params=count_params(model), gmacs=gmacs, model=cfg.model, dataset=cfg.dataset, img_size=cfg.img_size
        )

    @property
    def amp_dtype(self) -> torch.dtype:
        return torch.bfloat16 if self.cfg.amp_dtype == "bfloat16" else torch.float16

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        cfg = self.cfg
        self.ema = (
            ModelEmaV3(model, decay=cfg.model_ema_decay, use_warmup=cfg.model_ema_warmup) if cfg.model_ema else None
        )
        self.lr = _scaled_lr(cfg, self.ctx)
        opt_kwargs: dict[str, Any] = {"eps": cfg.opt_eps}
        if cfg.opt_betas is not None:
            opt_kwargs["betas"] = cfg.opt_betas
        self.mixup = _mixup(cfg, self.train_set.num_classes)
        self.criterion = _criterion(cfg, self.mixup)
        return create_optimizer_v2(
            model, opt=cfg.opt, lr=self.lr, weight_decay=cfg.weight_decay, momentum=cfg.momentum, **opt_kwargs
        )

    def build_scheduler(self, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
        cfg = self.cfg
        scheduler, num_epochs = create_scheduler_v2(
            optimizer,
            **_timm_kwargs(cfg, _SCHEDULER_ARGS),
            step_on_epochs=not cfg.sched_on_updates,
            updates_per_epoch=steps_per_epoch,
        )
        if hasattr(scheduler, "t_initial"):  # a schedule with an end: --resume with other epochs stretches the rest
            scheduler = StretchOnResume(
                scheduler, epochs=num_epochs, updates_per_epoch=steps_per_epoch, warmup_epochs=cfg.warmup_epochs
            )
        _logger.info(
            "%s lr %.3g (= %.3g x global batch %d / %d), %s schedule over %d epochs, %s%s",
            cfg.opt, self.lr, cfg.lr, cfg.batch_size, cfg.lr_base_size, cfg.sched, num_epochs,
            "mixup/cutmix" if _mixup_active(cfg) else "no mixup",
            f", EMA {cfg.model_ema_decay}" if self.ema is not None else "",
        )  # fmt: skip
        return scheduler, num_epochs

    def trainer_kwargs(self) -> dict[str, Any]:
        return {"ema": self.ema, "amp_dtype": self.amp_dtype, "log_every": self.cfg.log_every}

    def loss(self, model: nn.Module, batch: tuple[torch.Tensor, torch.Tensor]):
        images, targets = batch
        soft = targets
        if self.mixup is not None:
            images, soft = self.mixup(images, targets)
        logits = model(images)
        loss = self.criterion(logits.float(), soft)
        with torch.no_grad():  # train accuracy against the unmixed labels
            top = logits.topk(min(5, logits.shape[-1]), dim=-1).indices
            hits = (top == targets[:, None]).float()
        return loss, {"top1": 100.0 * hits[:, 0].mean(), "top5": 100.0 * hits.any(-1).float().mean()}

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        metrics = evaluate(model, self.eval_loader, self.ctx.device, self.ctx)
        if getattr(self, "ema", None) is not None:
            ema_metrics = evaluate(self.ema.module, self.eval_loader, self.ctx.device, self.ctx)
            metrics.update({f"ema_{k}": v for k, v in ema_metrics.items()})
        return metrics

    def finalize(self, final: dict[str, Any], model: nn.Module) -> dict[str, Any]:
        check_replicas_in_sync(self.ctx, model, *([self.ema] if self.ema is not None else []))
        return {"lr_scaled": self.lr}

    def evaluate_checkpoint(self, model: nn.Module, state: dict[str, Any]) -> dict[str, Any]:
        amp = self.cfg.amp and self.ctx.device.type == "cuda"
        with torch.autocast(self.ctx.device.type, dtype=self.amp_dtype, enabled=amp):
            metrics = evaluate(model, self.eval_loader, self.ctx.device, self.ctx)
            if state.get("ema") is not None:
                ema_model = copy.deepcopy(model)
                ema_model.load_state_dict(unwrap_state_dict(state["ema"]))  # ModelEmaV3 keys: module.<name>
                ema_metrics = evaluate(ema_model, self.eval_loader, self.ctx.device, self.ctx)
                metrics.update({f"ema_{k}": v for k, v in ema_metrics.items()})
        return metrics
