"""ListOps (Long Range Arena) with any sequence mixer: a seeded generator, a small classifier, a training run.

    python tools/lra_listops.py                                     # the CPU main job: short sequences, minutes
    python tools/lra_listops.py --set mixer=fsat                    # any name of attention.MIXERS
    python tools/lra_listops.py --config configs/lra/listops_fsat.yaml --device cuda    # LRA lengths, on a GPU
    python tools/lra_listops.py --resume auto                                 # continue a killed run (latest)

Task (Nangia and Bowman 2018; the LRA version of Tay et al., arXiv:2011.04006): a nested expression such as
``[MAX 2 9 [MIN 4 7 ] 0 ]`` over the operators MAX, MIN, MED (median, rounded down: LRA's ``int(np.median)``) and
SM (sum modulo 10), digits 0-9; the label is its value (10 classes). The generator is
LRA's ``listops.py`` (a value with probability 0.75 at each node above ``max_depth``, else an operator with 2 to
``max_args`` arguments), driven by a seeded ``random.Random``, keeping expressions with ``min_length <= tokens <=
max_length`` (rejection sampling, as LRA does). LRA's setting: max_depth 10, max_args 10, lengths 500-2000,
96K / 2K / 2K examples, sequences padded to 2000.

Model: token embedding + learned position embedding, ``depth`` pre-norm :class:`attention.MixerBlock` s with the
chosen mixer, a final LayerNorm, mean pooling over the real tokens, a linear head. Padding tokens (id 0) are mixed
like any token (matrix mixers here take no mask); the pooling and the labels ignore them.

The run folder (default: a new ``runs/lra_listops/<name>/<timestamp>``, ``latest`` points to the newest; rules in
the README's ``engine`` section) gets ``config.yaml``, ``train.log``, ``log.jsonl``, ``tb/``,
``last.pt`` (every epoch, atomic), ``best.pt`` and ``final_metrics.json`` (with the majority-class baseline).
"""

from __future__ import annotations

import logging
import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a clone without installing

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, TensorDataset

import engine
from attention import MixerBlock, build_mixer
from engine import Recipe, UsageError, count_params

_logger = logging.getLogger("lra_listops")

# --------------------------------------------------------------------------------------------------------------------
# Data: LRA's ListOps grammar
# --------------------------------------------------------------------------------------------------------------------

OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
END = "]"
VOCAB = ("<pad>", *[str(d) for d in range(10)], *OPERATORS, END)  # id 0 is padding
TOKEN_IDS = {t: i for i, t in enumerate(VOCAB)}
VALUE_P = 0.25  # LRA: an operator node with probability 0.25 (below max_depth), else a digit


def _tree(rng: random.Random, depth: int, max_depth: int, max_args: int) -> list[str]:
    """Tokens of one random (sub)expression, LRA's ``generate_tree``."""
    r = rng.random() if depth < max_depth else 1.0
    if r > VALUE_P:
        return [str(rng.randrange(10))]
    n = rng.randint(2, max_args)
    args = [_tree(rng, depth + 1, max_depth, max_args) for _ in range(n)]
    op = rng.choice(OPERATORS)
    return [op, *[t for a in args for t in a], END]


def _apply(op: str, args: list[int]) -> int:
    if op == "[MAX":
        return max(args)
    if op == "[MIN":
        return min(args)
    if op == "[MED":
        s = sorted(args)
        return (s[(len(s) - 1) // 2] + s[len(s) // 2]) // 2  # LRA's int(np.median(args))
    return sum(args) % 10


def evaluate_tokens(tokens: list[str]) -> int:
    """Value of a token list, by a stack machine (independent of the generator's recursion)."""
    stack: list[list] = [[None, []]]
    for t in tokens:
        if t in OPERATORS:
            stack.append([t, []])
        elif t == END:
            op, args = stack.pop()
            if op is None or not args:
                raise ValueError(f"malformed expression near {t!r}: {' '.join(tokens)[:80]}")
            stack[-1][1].append(_apply(op, args))
        else:
            stack[-1][1].append(int(t))
    if len(stack) != 1 or len(stack[0][1]) != 1:
        raise ValueError(f"malformed expression: {' '.join(tokens)[:80]}")
    return stack[0][1][0]


def generate_listops(
    num: int, seed: int, min_length: int, max_length: int, max_depth: int = 10, max_args: int = 10
) -> list[tuple[list[str], int]]:
    """``num`` expressions (tokens, value) with ``min_length <= len(tokens) <= max_length``; deterministic in seed."""
    if not 1 <= min_length <= max_length:
        raise ValueError(f"need 1 <= min_length <= max_length, got {min_length} and {max_length}")
    rng = random.Random(seed)
    out: list[tuple[list[str], int]] = []
    tries = 0
    while len(out) < num:
        tries += 1
        if tries > 1000 * max(num, 100):
            raise ValueError(
                f"could not draw {num} expressions of {min_length}-{max_length} tokens with max_depth={max_depth}, "
                f"max_args={max_args}: widen the length range"
            )
        tokens = _tree(rng, 0, max_depth, max_args)
        if min_length <= len(tokens) <= max_length:
            out.append((tokens, evaluate_tokens(tokens)))
    return out


def encode(examples: list[tuple[list[str], int]], seq_len: int) -> TensorDataset:
    """``(N, seq_len)`` token ids (right-padded with 0) and ``(N,)`` labels."""
    ids = torch.zeros(len(examples), seq_len, dtype=torch.long)
    for n, (tokens, _) in enumerate(examples):
        if len(tokens) > seq_len:
            raise ValueError(f"an expression has {len(tokens)} tokens > seq_len={seq_len}: raise seq_len")
        ids[n, : len(tokens)] = torch.tensor([TOKEN_IDS[t] for t in tokens])
    return TensorDataset(ids, torch.tensor([v for _, v in examples]))


# --------------------------------------------------------------------------------------------------------------------
# Model
# --------------------------------------------------------------------------------------------------------------------


class ListOpsClassifier(nn.Module):
    """Embedding + position embedding -> ``depth`` MixerBlocks -> LayerNorm -> masked mean pool -> linear.

    Shapes:
        tokens: ``(B, L)`` ids, 0 = padding, L <= seq_len; output: ``(B, num_classes)``.
    """

    def __init__(
        self,
        mixer: str = "softmax",
        seq_len: int = 2000,
        width: int = 64,
        depth: int = 2,
        num_heads: int = 4,
        mlp_ratio: float = 2.0,
        drop: float = 0.0,
        num_classes: int = 10,
        mixer_kwargs: dict | None = None,
    ) -> None:
        super().__init__()
        self.embed = nn.Embedding(len(VOCAB), width, padding_idx=0)
        self.pos = nn.Parameter(torch.randn(1, seq_len, width) * 0.02)
        self.blocks = nn.ModuleList(
            [
                MixerBlock(
                    width,
                    build_mixer(mixer, width, num_heads=num_heads, max_len=seq_len, **(mixer_kwargs or {})),
                    mlp_ratio=mlp_ratio,
                    drop=drop,
                )
                for _ in range(depth)
            ]
        )
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, num_classes)

    def forward(self, tokens: Tensor) -> Tensor:
        B, L = tokens.shape
        x = self.embed(tokens) + self.pos[:, :L]  # (B, L, C)
        for blk in self.blocks:
            x = blk(x)
        x = self.norm(x)
        keep = (tokens != 0).unsqueeze(-1).to(x.dtype)  # (B, L, 1)
        return self.head((x * keep).sum(1) / keep.sum(1).clamp_min(1))


# --------------------------------------------------------------------------------------------------------------------
# Recipe
# --------------------------------------------------------------------------------------------------------------------


@dataclass
class ListOpsConfig:
    """Every knob of a ListOps run (defaults: the CPU main job, short expressions)."""

    name: str = "main"
    # model
    mixer: str = "softmax"
    mixer_kwargs: dict = field(default_factory=dict)
    model_kwargs: dict = field(default_factory=dict)  # any other ListOpsClassifier keyword
    width: int = 64
    depth: int = 2
    num_heads: int = 4
    mlp_ratio: float = 2.0
    drop: float = 0.0
    # data (LRA: 96000 / 2000, lengths 500-2000, max_depth 10, max_args 10, seq_len 2000)
    train_size: int = 4000
    test_size: int = 500
    min_length: int = 10
    max_length: int = 64
    max_depth: int = 4
    max_args: int = 5
    seq_len: int = 64
    # optimization
    epochs: int = 8
    batch_size: int = 32
    eval_batch_size: int = 128
    lr: float = 2e-3
    weight_decay: float = 0.01
    warmup_epochs: int = 1
    grad_clip: float | None = 1.0
    amp: bool = False
    seed: int = 0


def build_data(cfg: ListOpsConfig) -> tuple[TensorDataset, TensorDataset]:
    kw = dict(min_length=cfg.min_length, max_length=cfg.max_length, max_depth=cfg.max_depth, max_args=cfg.max_args)
    train = generate_listops(cfg.train_size, cfg.seed, **kw)
    test = generate_listops(cfg.test_size, cfg.seed + 10_000, **kw)
    return encode(train, cfg.seq_len), encode(test, cfg.seq_len)


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> dict[str, float]:
    model.eval()
    loss_sum, correct, count = 0.0, 0, 0
    for tokens, labels in loader:
        tokens, labels = tokens.to(device), labels.to(device)
        logits = model(tokens).float()
        loss_sum += float(F.cross_entropy(logits, labels, reduction="sum"))
        correct += int((logits.argmax(-1) == labels).sum())
        count += labels.numel()
    return {"test_loss": loss_sum / max(count, 1), "test_acc": 100.0 * correct / max(count, 1)}


class ListOpsRecipe(Recipe):
    """ListOps classification with any sequence mixer: cross-entropy, AdamW, linear warm-up then linear decay."""

    group = "lra_listops"
    config_cls = ListOpsConfig
    monitor = "test_acc"
    monitor_mode = "max"

    @classmethod
    def validate(cls, cfg: ListOpsConfig) -> None:
        problems = []
        if not 1 <= cfg.min_length <= cfg.max_length <= cfg.seq_len:
            problems.append(
                f"need 1 <= min_length <= max_length <= seq_len, got {cfg.min_length}, {cfg.max_length}, {cfg.seq_len}"
            )
        if cfg.train_size < 1 or cfg.test_size < 1:
            problems.append(f"train_size and test_size must be >= 1, got {cfg.train_size} and {cfg.test_size}")
        if problems:
            raise UsageError("ListOpsConfig: " + "; ".join(problems))

    def build_datasets(self):
        return build_data(self.cfg)

    def build_model(self) -> nn.Module:
        cfg = self.cfg
        kwargs = dict(mixer=cfg.mixer, seq_len=cfg.seq_len, width=cfg.width, depth=cfg.depth, num_heads=cfg.num_heads,
                      mlp_ratio=cfg.mlp_ratio, drop=cfg.drop, mixer_kwargs=cfg.mixer_kwargs)  # fmt: skip
        return engine.create_with_kwargs(ListOpsClassifier, "ListOpsClassifier", {**kwargs, **cfg.model_kwargs})

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

        def factor(epoch: int) -> float:  # linear warm-up, then linear decay to 10%
            if epoch < cfg.warmup_epochs:
                return (epoch + 1) / (cfg.warmup_epochs + 1)
            return 1.0 - 0.9 * (epoch - cfg.warmup_epochs) / max(1, cfg.epochs - cfg.warmup_epochs)

        return torch.optim.lr_scheduler.LambdaLR(optimizer, factor), cfg.epochs

    def loss(self, model: nn.Module, batch: tuple[Tensor, Tensor]):
        tokens, labels = batch
        logits = model(tokens).float()
        return F.cross_entropy(logits, labels), {"acc": 100.0 * (logits.argmax(-1) == labels).float().mean()}

    def evaluate(self, model: nn.Module) -> dict[str, float]:
        return evaluate(model, self.eval_loader, self.ctx.device)


def main(argv: list[str] | None = None) -> dict:
    return engine.main(
        ListOpsRecipe,
        argv,
        description=__doc__,
        report=lambda m: (
            f"test_acc={m.get('test_acc', float('nan')):.2f}% (majority class: {m['majority_acc']:.2f}%), "
            f"{m['mixer']} mixer"
        ),
    )


if __name__ == "__main__":
    main()
