"""ListOps (Nangia and Bowman 2018; the Long Range Arena version of Tay et al., arXiv:2011.04006): a seeded generator.

A nested expression such as ``[MAX 2 9 [MIN 4 7 ] 0 ]`` over the operators MAX, MIN, MED (median, rounded down: LRA's
``int(np.median)``) and SM (sum modulo 10), digits 0-9; the label is its value (10 classes). The generator is LRA's
``listops.py`` (a value with probability 0.75 at each node above ``max_depth``, else an operator with 2 to
``max_args`` arguments), driven by a seeded ``random.Random``, keeping expressions with ``min_length <= tokens <=
max_length`` (rejection sampling, as LRA does). LRA's setting: max_depth 10, max_args 10, lengths 500-2000,
96K / 2K / 2K examples, sequences padded to 2000.
"""

from __future__ import annotations

import random

import torch
from torch.utils.data import TensorDataset

__all__ = ["END", "OPERATORS", "TOKEN_IDS", "VOCAB", "encode", "evaluate_tokens", "generate_listops"]

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
