"""ListOps (Nangia and Bowman 2018; the Long Range Arena version of Tay et al., arXiv:2011.04006): a seeded generator.

A nested expression such as ``[MAX 2 9 [MIN 4 7 ] 0 ]`` over the operators MAX, MIN, MED (median, rounded down: LRA's
``int(np.median)``) and SM (sum modulo 10), digits 0-9; the label is its value (10 classes). The generator is LRA's
``listops.py`` (a value with probability 0.75 at each node above ``max_depth``, else an operator with 2 to
``max_args`` arguments), driven by a seeded ``random.Random``, keeping expressions with ``min_length <= tokens <=
max_length`` (rejection sampling, as LRA does). LRA's setting: max_depth 10, max_args 10, lengths 500-2000,
96K / 2K / 2K examples, sequences padded to 2000.

The released data (LRA's ``listops-1000/basic_{train,val,test}.tsv``) are tab-separated files with a ``Source`` /
``Target`` header, then one expression a line, written with LRA's bracketing parentheses around every partial
application (``( ( ( [MAX 2 ) 9 ) ] )`` for ``[MAX 2 9 ]``), and its value. :func:`read_listops_tsv` drops the
parentheses, as the state-space models' LRA loaders do, so the remaining whitespace-separated tokens are the
vocabulary here (:data:`VOCAB`); :func:`write_listops_tsv` writes generated expressions in the same format
(:func:`to_lra_string`), and both reach the model through :func:`parse_row`: generated and released data take one
code path. Every row is evaluated (:func:`evaluate_tokens`): a file with rows that do not parse as one expression or
whose expression's value is not their label is refused, naming their count and the first few by file and line.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from pathlib import Path

import torch
from torch.utils.data import TensorDataset

from measure.atomic import atomic_write_text

__all__ = [
    "END",
    "LRA_FILES",
    "OPERATORS",
    "SHOWN_BAD_ROWS",
    "TOKEN_IDS",
    "TSV_HEADER",
    "VOCAB",
    "ListOpsSet",
    "encode",
    "evaluate_tokens",
    "generate_listops",
    "parse_row",
    "read_listops_tsv",
    "to_lra_string",
    "write_listops_tsv",
]

OPERATORS = ("[MAX", "[MIN", "[MED", "[SM")
END = "]"
VOCAB = ("<pad>", *[str(d) for d in range(10)], *OPERATORS, END)  # id 0 is padding
TOKEN_IDS = {t: i for i, t in enumerate(VOCAB)}
VALUE_P = 0.25  # LRA: an operator node with probability 0.25 (below max_depth), else a digit
TSV_HEADER = "Source\tTarget"
LRA_FILES = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}  # listops-1000/


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
    """Value of a token list, by a stack machine (independent of the generator's recursion).

    Raises:
        ValueError: the tokens are not one expression (a ``]`` without its operator, an operator without arguments
            or without its ``]``, no value or several at the top level); the message says which.
    """
    stack: list[list] = [[None, []]]
    for t in tokens:
        if t in OPERATORS:
            stack.append([t, []])
        elif t == END:
            if len(stack) == 1:
                raise ValueError(f"malformed expression (a ']' closes no operator): {' '.join(tokens)[:80]}")
            op, args = stack.pop()
            if not args:
                raise ValueError(f"malformed expression ({op} without arguments): {' '.join(tokens)[:80]}")
            stack[-1][1].append(_apply(op, args))
        else:
            stack[-1][1].append(int(t))
    if len(stack) != 1:
        raise ValueError(f"malformed expression ({stack[-1][0]} without its ']'): {' '.join(tokens)[:80]}")
    if len(stack[0][1]) != 1:
        found = len(stack[0][1])
        raise ValueError(f"malformed expression ({found} values at the top level, not one): {' '.join(tokens)[:80]}")
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


class ListOpsSet(TensorDataset):
    """Encoded expressions: ``tensors`` are the ``(N, seq_len)`` token ids and the ``(N,)`` labels; ``source`` says
    where they came from (a file, or the generator), which its ``repr`` names."""

    def __init__(self, ids: torch.Tensor, labels: torch.Tensor, source: str = "") -> None:
        super().__init__(ids, labels)
        self.source = source

    def __repr__(self) -> str:
        source = f", source={self.source!r}" if self.source else ""
        return f"{type(self).__name__}(rows={len(self)}, seq_len={self.tensors[0].shape[1]}{source})"


def encode(examples: list[tuple[list[str], int]], seq_len: int, truncate: bool = False, source: str = "") -> ListOpsSet:
    """``(N, seq_len)`` token ids (right-padded with 0) and ``(N,)`` labels.

    Args:
        examples: ``(tokens, value)`` pairs.
        seq_len: the model's input length.
        truncate: cut longer expressions to their first ``seq_len`` tokens (as LRA's loaders do); otherwise a longer
            expression is an error.
        source: where the examples came from (e.g. the file), for the dataset's ``repr`` and so for messages.
    """
    ids = torch.zeros(len(examples), seq_len, dtype=torch.long)
    for n, (tokens, _) in enumerate(examples):
        if len(tokens) > seq_len:
            if not truncate:
                raise ValueError(f"an expression has {len(tokens)} tokens > seq_len={seq_len}: raise seq_len")
            tokens = tokens[:seq_len]
        ids[n, : len(tokens)] = torch.tensor([TOKEN_IDS[t] for t in tokens])
    return ListOpsSet(ids, torch.tensor([v for _, v in examples], dtype=torch.long), source)


def to_lra_string(tokens: list[str]) -> str:
    """An expression in LRA's written form: every partial application in parentheses, as LRA's ``to_string`` writes
    the binary tree its generator builds (``[MAX 2 9 ]`` -> ``( ( ( [MAX 2 ) 9 ) ] )``)."""
    pos = 0

    def node() -> str:
        nonlocal pos
        t = tokens[pos]
        pos += 1
        if t not in OPERATORS:
            return t
        text = f"( {t} {node()} )"  # (op, first argument)
        while tokens[pos] != END:
            text = f"( {text} {node()} )"  # ((op, a1), a2) ...
        pos += 1
        return f"( {text} {END} )"

    text = node()
    if pos != len(tokens):
        raise ValueError(f"trailing tokens after a complete expression: {' '.join(tokens)[:80]}")
    return text


def parse_row(line: str, where: str = "row") -> tuple[list[str], int]:
    """One ``expression<TAB>value`` row of LRA's TSV -> ``(tokens, value)``, parentheses dropped.

    Args:
        line: the row, without its line break.
        where: names the row in errors (``"basic_train.tsv line 7"``).

    Raises:
        ValueError: not two tab-separated fields, a value that is not a digit 0-9, a token outside :data:`VOCAB`,
            operators and ``]`` that do not pair up, tokens that are not one expression (``[MAX ]``, ``3 4 5``), or an
            expression whose value (:func:`evaluate_tokens`) is not the row's value; the message names ``where``.
    """
    fields = line.split("\t")
    if len(fields) != 2:
        raise ValueError(f"{where}: expected 'expression<TAB>value', got {len(fields)} tab-separated field(s)")
    source, target = fields
    tokens = source.replace("(", " ").replace(")", " ").split()
    if not target.strip().isdigit() or not 0 <= int(target) <= 9:
        raise ValueError(f"{where}: the value must be a digit 0-9, got {target.strip()[:20]!r}")
    unknown = sorted({t for t in tokens if t not in TOKEN_IDS or t == VOCAB[0]})
    if unknown:
        raise ValueError(f"{where}: unknown token(s) {unknown[:5]} (expected {list(VOCAB[1:])})")
    depth = 0
    for t in tokens:
        depth += (t in OPERATORS) - (t == END)
        if depth < 0:
            break
    if not tokens or depth != 0:
        raise ValueError(f"{where}: operators and ']' do not pair up (or no token): {source.strip()[:80]!r}")
    try:
        value = evaluate_tokens(tokens)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    if value != int(target):
        raise ValueError(
            f"{where}: the expression's value is {value}, not the row's {int(target)}: {' '.join(tokens)[:80]!r}"
        )
    return tokens, int(target)


#: Refused rows a message names (with its file and line) before it counts the rest.
SHOWN_BAD_ROWS = 3


def _text(raw: bytes, path: Path, line: int) -> str:
    """One line of ``path`` as text (its line break dropped); bytes that are not UTF-8 are an error naming the line."""
    try:
        return raw.decode("utf-8").rstrip("\r\n")
    except UnicodeDecodeError as e:
        raise ValueError(
            f"{path} line {line}: not UTF-8 text (byte {raw[e.start]:#04x} at column {e.start + 1}): expected LRA's "
            f"ListOps TSV ({TSV_HEADER!r} header, then one expression<TAB>value a line)"
        ) from None


def read_listops_tsv(path: str | Path) -> list[tuple[list[str], int]]:
    """Every ``(tokens, value)`` of a ListOps TSV file in LRA's format (header ``Source<TAB>Target``).

    Every row is checked (:func:`parse_row`): one that does not parse or whose expression's value is not its label
    cannot be right, and a file holding any is refused with their count and the first few, by file and line.

    Raises:
        ValueError: a missing header, bytes that are not UTF-8, or rows :func:`parse_row` rejects, naming the file
            and the line (1-based, the header is line 1).
    """
    path = Path(path)
    out: list[tuple[list[str], int]] = []
    bad: list[str] = []
    rows = 0
    with path.open("rb") as f:
        header = _text(f.readline(), path, 1)
        if header != TSV_HEADER:
            raise ValueError(f"{path} line 1: expected the header {TSV_HEADER!r}, got {header[:40]!r}")
        for n, raw in enumerate(f, start=2):
            line = _text(raw, path, n)
            if not line.strip():
                continue
            rows += 1
            try:
                out.append(parse_row(line, f"{path.name} line {n}"))
            except ValueError as e:
                bad.append(str(e))
    if bad:
        more = f"; and {len(bad) - SHOWN_BAD_ROWS} more" if len(bad) > SHOWN_BAD_ROWS else ""
        raise ValueError(
            f"{path}: {len(bad)} of {rows} rows cannot be right (fix or drop them): "
            + "; ".join(bad[:SHOWN_BAD_ROWS])
            + more
        )
    return out


def write_listops_tsv(path: str | Path, examples: Iterable[tuple[list[str], int]]) -> None:
    """Writes ``(tokens, value)`` pairs as LRA's TSV (header, then :func:`to_lra_string` and the value a line); the
    file appears whole or not at all."""
    lines = [TSV_HEADER, *(f"{to_lra_string(tokens)}\t{value}" for tokens, value in examples)]
    atomic_write_text(Path(path), "\n".join(lines) + "\n")
