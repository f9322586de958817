"""The ListOps training recipe behind ``tools/lra_listops.py``: cross-entropy, AdamW, linear warm-up then decay.

The data are drawn by :func:`lra.data.generate_listops` (train with ``seed``, test with ``seed + 10000``), or, with
``data_root`` (``--data-root``), read from LRA's released ``basic_{train,val,test}.tsv`` (every row; sequences cut to
``seq_len``); both pass through LRA's written form (:func:`lra.data.parse_row`). The defaults of
:class:`ListOpsConfig` are the CPU main job (short expressions, minutes), ``configs/lra/listops_*.yaml`` the LRA
lengths. The final metrics carry the majority-class accuracy as the baseline to beat.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader

import engine
from engine import CompileMode, Recipe, check_config, collect_model_kwargs
from measure.stats import count_params

from . import model as _model  # noqa: F401  (registers listops_classifier, the model_spec's name)
from .data import LRA_FILES, ListOpsSet, encode, generate_listops, parse_row, read_listops_tsv, to_lra_string

_logger = logging.getLogger(__name__)

__all__ = ["ListOpsConfig", "ListOpsRecipe", "build_data", "evaluate", "report"]


# the config fields that are ListOpsClassifier keywords (model_kwargs passes any other)
MODEL_KNOBS = ("mixer", "seq_len", "width", "depth", "num_heads", "mlp_ratio", "drop", "mixer_kwargs")


@dataclass
class ListOpsConfig:
    """Every knob of a ListOps run (defaults: the CPU main job, short expressions)."""

    name: str = "main"  # run name: runs go to runs/lra_listops/<name>/<timestamp>
    # model
    mixer: str = "softmax"  # sequence mixer of every block: a name of attention.MIXERS
    mixer_kwargs: dict = field(default_factory=dict)  # options of the mixer, e.g. {num_edges: 8} for fsat
    model_kwargs: dict = field(default_factory=dict)  # any other ListOpsClassifier keyword
    width: int = 64  # token width
    depth: int = 2  # mixer blocks
    num_heads: int = 4  # heads of the mixer
    mlp_ratio: float = 2.0  # MLP hidden width, as a multiple of width
    drop: float = 0.0  # dropout in the blocks
    # data (LRA: 96000 / 2000, lengths 500-2000, max_depth 10, max_args 10, seq_len 2000)
    data_root: str | None = None  # folder with LRA's basic_{train,val,test}.tsv (or listops-1000/); null: generate
    eval_split: str = "test"  # with data_root: the released split evaluated each epoch, test or val
    train_size: int = 4000  # training expressions
    test_size: int = 500  # test expressions
    min_length: int = 10  # fewest tokens of an expression
    max_length: int = 64  # most tokens of an expression
    max_depth: int = 4  # deepest nesting of an expression
    max_args: int = 5  # most arguments of an operator
    seq_len: int = 64  # model input length: right-padded to it (>= max_length; released rows longer are cut)
    # optimization
    epochs: int = 8  # epochs to train (more on --resume stretches what is left of the schedule)
    batch_size: int = 32  # global batch, split evenly over the ranks
    eval_batch_size: int = 128  # evaluation batch per rank
    lr: float = 2e-3  # peak learning rate of AdamW
    weight_decay: float = 0.01  # AdamW weight decay
    warmup_epochs: int = 1  # epochs of linear warm-up, then linear decay to 10% of lr
    grad_clip: float | None = 1.0  # max global gradient norm (null: no clipping)
    amp: bool = False  # bfloat16 autocast (CUDA only)
    compile: CompileMode | None = None  # torch.compile mode for training (reduce-overhead: CUDA graphs; null: eager)
    seed: int = 0  # seed of the data (test: seed + 10000), the initialization and the data order


LRA_TREE = """<data_root>/                 (or <data_root>/listops-1000/)
    basic_train.tsv          Source<TAB>Target header, then one expression<TAB>value a line
    basic_val.tsv
    basic_test.tsv"""


def lra_folder(root: str | Path) -> Path:
    """The folder under ``root`` (itself or ``listops-1000/``) that holds LRA's three ListOps files."""
    return engine.locate(root, "listops-1000", list(LRA_FILES.values()), "LRA ListOps", LRA_TREE)


def build_data(cfg: ListOpsConfig, data_root: str | Path | None = None) -> tuple[ListOpsSet, ListOpsSet]:
    """The encoded train and evaluation sets of ``cfg``: LRA's files under ``data_root`` (or ``cfg.data_root``), every
    row, cut to ``seq_len``; else generated (deterministic in ``cfg.seed``) and passed through LRA's written form."""
    root = data_root or cfg.data_root
    if root is not None:
        folder = lra_folder(root)
        paths = folder / LRA_FILES["train"], folder / LRA_FILES[cfg.eval_split]
        train, evaluation = (read_listops_tsv(path) for path in paths)
        cut = sum(len(t) > cfg.seq_len for t, _ in train) + sum(len(t) > cfg.seq_len for t, _ in evaluation)
        if cut:
            _logger.info("%d of %d expressions are longer than seq_len=%d: cut", cut, len(train) + len(evaluation),
                         cfg.seq_len)  # fmt: skip
        train_set, eval_set = (
            encode(examples, cfg.seq_len, truncate=True, source=str(path))
            for examples, path in zip((train, evaluation), paths)
        )
        return train_set, eval_set
    kw = dict(min_length=cfg.min_length, max_length=cfg.max_length, max_depth=cfg.max_depth, max_args=cfg.max_args)
    sets = []
    for size, seed in ((cfg.train_size, cfg.seed), (cfg.test_size, cfg.seed + 10_000)):
        examples = generate_listops(size, seed, **kw)
        rows = [parse_row(f"{to_lra_string(t)}\t{v}", "a generated row") for t, v in examples]
        sets.append(encode(rows, cfg.seq_len, source=f"generated with seed {seed}"))
    return sets[0], sets[1]


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> dict[str, float]:
    """Mean cross-entropy and accuracy (%) of ``model`` over ``loader``."""
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for tokens, labels in loader:
        tokens, labels = tokens.to(device), labels.to(device)
        logits = model(tokens).float()
        loss_sum += float(F.cross_entropy(logits, labels, reduction="sum"))
        correct += int((logits.argmax(-1) == labels).sum())
        count += labels.numel()
    return {"test_loss": loss_sum / max(count, 1), "test_acc": 100.0 * correct / max(count, 1)}


def report(metrics: dict[str, Any]) -> str:
    """The last log line of a run: accuracy next to the majority-class baseline."""
    return (
        f"test_acc={metrics.get('test_acc', float('nan')):.2f}% (majority class: {metrics['majority_acc']:.2f}%), "
        f"{metrics['mixer']} mixer"
    )


class ListOpsRecipe(Recipe):
    """ListOps classification with any sequence mixer: cross-entropy, AdamW, linear warm-up then linear decay."""

    group = "lra_listops"
    config_cls = ListOpsConfig
    monitor = "test_acc"
    monitor_mode = "max"

    @classmethod
    def validate(cls, cfg: ListOpsConfig) -> None:
        generated = cfg.data_root is None  # the generator's knobs are unused with released files
        check_config(cfg, [
            (not generated or 1 <= cfg.min_length <= cfg.max_length <= cfg.seq_len,
             f"need 1 <= min_length <= max_length <= seq_len, got {cfg.min_length}, {cfg.max_length}, {cfg.seq_len}"),
            (not generated or (cfg.train_size >= 1 and cfg.test_size >= 1),
             f"train_size and test_size must be >= 1, got {cfg.train_size} and {cfg.test_size}"),
            (cfg.seq_len >= 1, f"seq_len must be >= 1, got {cfg.seq_len}"),
            (cfg.eval_split in ("test", "val"), f"eval_split must be test or val, got {cfg.eval_split!r}"),
        ])  # fmt: skip

    def build_datasets(self):
        return build_data(self.cfg, self.data_root)

    def model_spec(self) -> tuple[str, dict[str, Any]]:
        return "listops_classifier", collect_model_kwargs(self.cfg, MODEL_KNOBS)

    def summary(self, model: nn.Module) -> dict[str, Any]:
        train_labels, test_labels = self.train_set.tensors[1], self.eval_set.tensors[1]
        majority = int(torch.bincount(train_labels, minlength=10).argmax())
        lengths = (self.train_set.tensors[0] != 0).sum(1).float()
        return {"params": count_params(model), "mixer": self.cfg.mixer,
                "majority_acc": 100.0 * float((test_labels == majority).float().mean()),
                "mean_length": float(lengths.mean())}  # fmt: skip

    def build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        return torch.optim.AdamW(model.parameters(), lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)

    def build_scheduler(self, optimizer: torch.optim.Optimizer, steps_per_epoch: int):
        cfg = self.cfg
        linear = engine.EpochLR(  # linear warm-up, then linear decay to 10%
            optimizer, lambda step, progress: 1.0 - 0.9 * progress, epochs=cfg.epochs, warmup_epochs=cfg.warmup_epochs
        )
        return linear, cfg.epochs

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]):
        tokens, labels = batch
        logits = model(tokens).float()
        return F.cross_entropy(logits, labels), {"acc": 100.0 * (logits.argmax(-1) == labels).float().mean()}

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return evaluate(model, self.eval_loader, self.ctx.device)
