"""lra: the ListOps generator (determinism, values by an independent evaluator, LRA lengths), the encoding, and runs
with other mixers through ``engine.main`` (what ``tools/lra_listops.py`` calls); the run itself follows the shared CLI
contract (tests/tools/test_cli_contract.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import engine
import lra
from lra.data import (
    OPERATORS,
    encode,
    evaluate_tokens,
    generate_listops,
    parse_row,
    read_listops_tsv,
    to_lra_string,
    write_listops_tsv,
)
from lra.testing import TINY_LISTOPS_SETS

TINY = ["--set", *TINY_LISTOPS_SETS, "--no-progress", "--device", "cpu"]


def _parse(tokens: list[str], i: int = 0) -> tuple[object, int]:
    """Recursive descent into nested (op, [args]) tuples: a second reading of the grammar."""
    if tokens[i].startswith("["):
        op, args, i = tokens[i][1:], [], i + 1
        while tokens[i] != "]":
            arg, i = _parse(tokens, i)
            args.append(arg)
        return (op, args), i + 1
    return int(tokens[i]), i + 1


def _value(tree: object) -> int:
    if isinstance(tree, int):
        return tree
    op, args = tree
    vals = [_value(a) for a in args]
    return {"MAX": max, "MIN": min, "MED": lambda v: int(np.median(v)), "SM": lambda v: sum(v) % 10}[op](vals)


def test_known_expressions() -> None:
    for text, value in [
        ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
        ("[MED 2 5 ]", 3),  # int(np.median([2, 5])) = int(3.5)
        ("[MED 1 8 3 ]", 3),
        ("[SM 7 8 9 ]", 4),
        ("[MIN [SM 5 5 ] [MAX 1 2 ] ]", 0),
        ("6", 6),
    ]:
        assert evaluate_tokens(text.split()) == value, text
    with pytest.raises(ValueError, match="malformed"):
        evaluate_tokens("[MAX 1 2".split())


def test_generator_is_seeded_and_labels_match_an_independent_evaluator() -> None:
    a = generate_listops(200, seed=3, min_length=5, max_length=200, max_depth=6, max_args=6)
    b = generate_listops(200, seed=3, min_length=5, max_length=200, max_depth=6, max_args=6)
    c = generate_listops(200, seed=4, min_length=5, max_length=200, max_depth=6, max_args=6)
    assert a == b and a != c
    ops = set()
    for tokens, label in a:
        tree, end = _parse(tokens)
        assert end == len(tokens)
        assert _value(tree) == label
        assert 5 <= len(tokens) <= 200
        ops.update(t for t in tokens if t.startswith("["))
    assert ops == set(OPERATORS)
    assert len({label for _, label in a}) == 10
    with pytest.raises(ValueError, match="min_length <= max_length"):
        generate_listops(1, 0, min_length=10, max_length=5)


def test_long_expressions_reach_lra_lengths() -> None:
    ex = generate_listops(3, seed=0, min_length=500, max_length=2000, max_depth=10, max_args=10)
    assert all(500 <= len(t) <= 2000 and _value(_parse(t)[0]) == v for t, v in ex)
    ds = encode(ex, 2000)
    assert ds.tensors[0].shape == (3, 2000) and (ds.tensors[0][:, :500] != 0).all()


@pytest.mark.parametrize("mixer", ["fsat", "hydra"])
def test_other_mixers_run(tmp_path: Path, mixer: str) -> None:
    out = engine.main(
        lra.ListOpsRecipe, [*TINY, "--set", f"mixer={mixer}", "--epochs", "1", "--output-dir", str(tmp_path)]
    )
    assert out["mixer"] == mixer and np.isfinite(out["test_loss"])
    # the script's last log line: accuracy beside the majority-class baseline
    assert (
        lra.report(out)
        == f"test_acc={out['test_acc']:.2f}% (majority class: {out['majority_acc']:.2f}%), {mixer} mixer"
    )


def test_lengths_and_sizes_are_checked_before_the_data_is_drawn(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exc:
        engine.main(lra.ListOpsRecipe, [*TINY, "--set", "max_length=100", "test_size=0", "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert exc.value.code == 2
    assert "need 1 <= min_length <= max_length <= seq_len, got 10, 100, 24" in err
    assert "train_size and test_size must be >= 1, got 64 and 0" in err
    assert not (tmp_path / "log.jsonl").exists()


def test_model_knobs_and_model_kwargs_reach_the_classifier() -> None:
    """The config's model fields reach ListOpsClassifier; model_kwargs adds any other keyword and wins."""
    cfg = lra.ListOpsConfig(width=24, depth=3, seq_len=32, model_kwargs={"num_classes": 7, "depth": 1})
    model = lra.ListOpsRecipe(cfg, ctx=None).build_model()
    assert len(model.blocks) == 1 and model.pos.shape == (1, 32, 24) and model.head.out_features == 7
    with pytest.raises(ValueError, match="no_such_knob"):
        lra.ListOpsRecipe(lra.ListOpsConfig(model_kwargs={"no_such_knob": 1}), ctx=None).build_model()


CONFIGS = sorted((Path(__file__).resolve().parents[2] / "configs" / "lra").glob("listops_*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_loads_and_builds(path: Path) -> None:
    """Each row config builds its classifier (at a short seq_len, the LRA one is costly to build) and runs."""
    from attention.mixers import MIXERS

    cfg = engine.load_config(lra.ListOpsConfig, path, ["seq_len=32"])
    assert cfg.mixer in MIXERS and cfg.train_size == 96000 and cfg.max_length == 2000
    model = lra.ListOpsRecipe(cfg, ctx=None).build_model().eval()
    assert model(torch.randint(1, 16, (2, 32))).shape == (2, 10)


FSAT_ROWS = {  # paper Table 3 row -> (config, the FourierSparseAttention attributes it sets)
    "FSAT-2": ("listops_fsat_2", {"num_edges": 2, "num_random": 2}),
    "FSAT-4": ("listops_fsat", {"num_edges": 4, "num_random": 4, "edge_set": "predicted+random"}),
    "FSAT-8": ("listops_fsat_8", {"num_edges": 8}),
    "FSAT-No Trunc.": ("listops_fsat_no_trunc", {"truncate_grad": False, "num_edges": 4}),
    "FSAT-Only Ir": ("listops_fsat_only_ir", {"edge_set": "random", "num_random": 4, "truncate_grad": True}),
    "FSAT-Only Ip": ("listops_fsat_only_ip", {"edge_set": "predicted", "num_random": 0}),
}


@pytest.mark.parametrize("row", sorted(FSAT_ROWS))
def test_fsat_ablation_configs_set_their_switch_and_halve_the_ffn(row: str) -> None:
    name, attrs = FSAT_ROWS[row]
    path = CONFIGS[0].parent / f"{name}.yaml"
    model = lra.ListOpsRecipe(engine.load_config(lra.ListOpsConfig, path, ["seq_len=32"]), ctx=None).build_model()
    mixer = model.blocks[0].mixer
    assert {k: getattr(mixer, k) for k in attrs} == attrs
    assert model.blocks[0].mlp.fc1.out_features == 64  # mlp_ratio 1.0: half the other rows' 2.0


def test_dconv5_and_fat_configs() -> None:
    from attention.mixers import FourierAttention, SeparableConvFeatureMap

    def first_block(name: str) -> torch.nn.Module:
        cfg = engine.load_config(lra.ListOpsConfig, CONFIGS[0].parent / f"{name}.yaml", ["seq_len=32"])
        return lra.ListOpsRecipe(cfg, ctx=None).build_model().blocks[0]

    f1 = first_block("listops_fsat_dconv5").mixer.cross.f1
    assert isinstance(f1, SeparableConvFeatureMap) and f1.depthwise.kernel_size == (5,)
    fat = first_block("listops_fat")
    assert isinstance(fat.mixer, FourierAttention) and fat.mlp.fc1.out_features == 128  # the full FFN


# Rows as LRA's release writes them (its to_string: every partial application in parentheses), plus the nesting of
# another writer: the reader only drops the parentheses.
LRA_ROWS = [
    ("( ( ( [MAX 2 ) 9 ) ] )", 9),
    ("( ( ( ( ( [MAX 2 ) 9 ) ( ( ( [MIN 4 ) 7 ) ] ) ) 0 ) ] )", 9),
    ("( ( [MAX 2 9 ( [MIN 4 7 ] 0 ] ) )", 9),
    ("( ( ( ( [SM 7 ) 8 ) 9 ) ] )", 4),
    ("( ( ( ( [MED 1 ) 8 ) 3 ) ] )", 3),
]


def _write(path: Path, rows: list[tuple[str, object]], header: str = "Source\tTarget") -> Path:
    path.write_text("\n".join([header, *(f"{src}\t{tgt}" for src, tgt in rows)]) + "\n")
    return path


def test_lra_tsv_rows_drop_the_parentheses(tmp_path: Path) -> None:
    examples = read_listops_tsv(_write(tmp_path / "basic_test.tsv", LRA_ROWS))
    assert examples[1] == ("[MAX 2 9 [MIN 4 7 ] 0 ]".split(), 9)
    assert examples[2] == examples[1]  # the same expression, bracketed otherwise
    assert [evaluate_tokens(t) for t, _ in examples] == [v for _, v in LRA_ROWS]


def test_lra_written_form_is_lras_to_string_and_round_trips(tmp_path: Path) -> None:
    assert to_lra_string("[MAX 2 9 [MIN 4 7 ] 0 ]".split()) == LRA_ROWS[1][0]
    assert to_lra_string(["6"]) == "6"
    generated = generate_listops(50, seed=5, min_length=5, max_length=80, max_depth=5, max_args=5)
    write_listops_tsv(tmp_path / "gen.tsv", generated)
    lines = (tmp_path / "gen.tsv").read_text().splitlines()
    assert lines[0] == "Source\tTarget" and len(lines) == 51 and lines[1].startswith("( ")
    assert read_listops_tsv(tmp_path / "gen.tsv") == generated
    assert parse_row(f"{to_lra_string(generated[0][0])}\t{generated[0][1]}") == generated[0]


@pytest.mark.parametrize(
    "row, message",
    [
        (("( ( [MAX 2 ) 9 )", 9), r"operators and '\]' do not pair up"),
        (("( )", 0), r"operators and '\]' do not pair up \(or no token\)"),
        (("( ( ( [FIRST 2 ) 9 ) ] )", 2), r"unknown token\(s\) \['\[FIRST'\]"),
        (("( ( ( [MAX 2 ) 9 ) ] )", 12), "the value must be a digit 0-9, got '12'"),
        (("( ( ( [MAX 2 ) 9 ) ] )", "nine"), "the value must be a digit 0-9"),
        (("( ( ( [MAX 2 ) 9 ) ] )\t9", 9), "expected 'expression<TAB>value', got 3"),
        # rows that pair up but cannot be right: no argument, no operator, a value that is not the expression's
        (("[MAX ]", 0), r"malformed expression \(\[MAX without arguments\)"),
        (("( [MAX ] )", 0), r"malformed expression \(\[MAX without arguments\)"),
        (("3 4 5", 3), r"malformed expression \(3 values at the top level, not one\)"),
        (("[MAX 1 2 ]", 7), r"the expression's value is 2, not the row's 7: '\[MAX 1 2 \]'"),
        (("( ( ( [MAX 1 ) 2 ) ] )", 7), "the expression's value is 2, not the row's 7"),
        (("( ( ( ( [MED 1 ) 8 ) 3 ) ] )", 4), "the expression's value is 3, not the row's 4"),  # LRA's floor median
    ],
)
def test_a_bad_row_is_named_by_file_and_line(tmp_path: Path, row: tuple, message: str) -> None:
    path = _write(tmp_path / "basic_train.tsv", [LRA_ROWS[0], row, LRA_ROWS[1]])
    with pytest.raises(
        ValueError, match=rf"basic_train.tsv: 1 of 3 rows cannot be right.*basic_train.tsv line 3: {message}"
    ):
        read_listops_tsv(path)


def test_rows_that_cannot_be_right_are_counted_and_the_first_few_named(tmp_path: Path) -> None:
    bad = [("[MAX ]", 0), ("3 4 5", 3), ("[MAX 1 2 ]", 7), ("[SM 5 6 ]", 0), ("[MIN 4 ]", 5)]
    path = _write(tmp_path / "basic_train.tsv", [*LRA_ROWS, *bad, LRA_ROWS[0]])
    with pytest.raises(ValueError) as err:
        read_listops_tsv(path)
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"{path}: 5 of 11 rows cannot be right (fix or drop them): ")
    assert [f"basic_train.tsv line {n}:" in message for n in range(7, 12)] == [True, True, True, False, False]
    assert message.endswith("; and 2 more")


def test_a_file_that_is_not_utf8_is_named_with_its_line(tmp_path: Path) -> None:
    path = _write(tmp_path / "basic_test.tsv", LRA_ROWS)
    path.write_bytes(path.read_bytes().replace(b"[SM 7", b"[SM \xff7"))
    with pytest.raises(ValueError, match=r"basic_test.tsv line 5: not UTF-8 text \(byte 0xff at column \d+\)"):
        read_listops_tsv(path)
    path.write_bytes(b"\x1f\x8b\x08\x00" + bytes(range(128, 256)))  # a gzip file, say
    with pytest.raises(ValueError, match=r"basic_test.tsv line 1: not UTF-8 text"):
        read_listops_tsv(path)


def test_an_empty_train_file_is_named(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = _release(tmp_path / "data")
    (folder / "basic_train.tsv").write_text("Source\tTarget\n")  # the header only
    with pytest.raises(SystemExit) as exc:
        engine.main(lra.ListOpsRecipe, [*TINY, "--data-root", str(folder), "--output-dir", str(tmp_path / "run")])
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert exc.value.code == 2 and line.startswith("error: the train split is empty")
    assert str(folder / "basic_train.tsv") in line


def test_a_file_without_the_header_is_refused(tmp_path: Path) -> None:
    path = _write(tmp_path / "basic_val.tsv", LRA_ROWS, header="( ( ( [MAX 2 ) 9 ) ] )\t9")
    with pytest.raises(ValueError, match=r"basic_val.tsv line 1: expected the header 'Source\\tTarget'"):
        read_listops_tsv(path)


def _release(folder: Path) -> Path:
    """A tiny release: 40 generated rows for train, 12 for val and 16 for test, one of them longer than seq_len."""
    folder.mkdir(parents=True)
    kw = dict(min_length=3, max_length=20, max_depth=3, max_args=4)
    write_listops_tsv(folder / "basic_train.tsv", generate_listops(40, 1, **kw))
    write_listops_tsv(folder / "basic_val.tsv", generate_listops(12, 2, **kw))
    long = generate_listops(1, 3, min_length=30, max_length=60, max_depth=4, max_args=6)
    write_listops_tsv(folder / "basic_test.tsv", generate_listops(15, 4, **kw) + long)
    return folder


def test_training_reads_the_lra_release(tmp_path: Path) -> None:
    """--data-root: every row of basic_train.tsv trains, basic_test.tsv (or basic_val.tsv) evaluates, rows longer
    than seq_len are cut; the folder may be the release's listops-1000/ under the root."""
    _release(tmp_path / "data" / "listops-1000")
    args = [*TINY, "--epochs", "1", "--data-root", str(tmp_path / "data")]
    out = engine.main(lra.ListOpsRecipe, [*args, "--output-dir", str(tmp_path / "run")])
    correct = out["test_acc"] * 16 / 100  # evaluated on the 16 rows of basic_test.tsv
    assert np.isfinite(out["test_loss"]) and correct == pytest.approx(round(correct))
    cfg = lra.ListOpsConfig(seq_len=24, data_root=str(tmp_path / "data"))
    train, test = lra.recipe.build_data(cfg)
    assert len(train) == 40 and len(test) == 16 and bool((test.tensors[0][-1] != 0).all())  # the long row, cut
    val = lra.recipe.build_data(lra.ListOpsConfig(seq_len=24, eval_split="val"), tmp_path / "data" / "listops-1000")[1]
    assert len(val) == 12


def test_a_missing_release_names_the_files(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "basic_train.tsv").write_text("Source\tTarget\n")
    with pytest.raises(SystemExit):
        engine.main(lra.ListOpsRecipe, [*TINY, "--data-root", str(tmp_path / "data"), "--output-dir", str(tmp_path)])
    err = capsys.readouterr().err
    assert "basic_val.tsv" in err and "basic_test.tsv" in err
