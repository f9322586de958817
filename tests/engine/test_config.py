"""Tests for engine.config: precedence, base includes, unknown keys, type checks, overrides, round trip."""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass, field, make_dataclass
from pathlib import Path
from typing import Literal

import pytest
import yaml

from engine.config import (
    MAX_DEPTH,
    add_config_args,
    config_from_args,
    config_help,
    config_to_dict,
    describe_config,
    load_config,
    parse_overrides,
    save_config,
)


@dataclass
class Cfg:
    name: str = "run"
    lr: float = 0.1
    epochs: int = 10
    amp: bool = False
    dims: list[int] = field(default_factory=lambda: [64, 128])
    tags: list[str] = field(default_factory=list)
    scales: tuple[float, ...] = (1.0, 2.0)
    pair: tuple[int, str] = (1, "a")
    weight_decay: float | None = None
    mode: Literal["min", "max"] = "min"
    out: Path = Path("runs")


@dataclass
class Required:
    data_root: str
    lr: float = 0.1


def write(path: Path, data: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_defaults_only():
    assert load_config(Cfg) == Cfg()


def test_precedence_defaults_yaml_overrides(tmp_path):
    path = write(tmp_path / "exp.yaml", {"lr": 0.01, "epochs": 5})
    cfg = load_config(Cfg, path, ["lr=1e-3"])
    assert cfg.lr == 1e-3  # override beats YAML
    assert cfg.epochs == 5  # YAML beats default
    assert cfg.name == "run"  # default


def test_saved_defaults_sit_below_yaml_and_overrides(tmp_path, caplog):
    """A command that opens a run starts from the run's saved config: YAML and --set still win over it."""
    saved = config_to_dict(Cfg(name="trained", lr=0.02, epochs=7, dims=[8]))
    saved["dropped_key"] = 1  # a key the class no longer has: skipped with a warning
    path = write(tmp_path / "exp.yaml", {"epochs": 9})
    cfg = load_config(Cfg, path, ["lr=0.5"], defaults=saved, defaults_source="checkpoint x/last.pt")
    assert (cfg.name, cfg.lr, cfg.epochs, cfg.dims, cfg.scales) == ("trained", 0.5, 9, [8], (1.0, 2.0))
    assert "checkpoint x/last.pt sets 'dropped_key', which Cfg does not have" in caplog.text
    with pytest.raises(ValueError, match=r"checkpoint x/last.pt: key 'lr' expects float"):
        load_config(Cfg, defaults={"lr": "fast"}, defaults_source="checkpoint x/last.pt")


def test_base_chain_relative_to_including_file(tmp_path):
    write(tmp_path / "base.yaml", {"name": "base", "lr": 0.5, "epochs": 3})
    write(tmp_path / "mid.yaml", {"base": "base.yaml", "lr": 0.2})
    child = write(tmp_path / "sub" / "child.yaml", {"base": "../mid.yaml", "name": "child"})
    cfg = load_config(Cfg, child)
    assert (cfg.name, cfg.lr, cfg.epochs) == ("child", 0.2, 3)


def test_base_cycle_is_an_error(tmp_path):
    write(tmp_path / "a.yaml", {"base": "b.yaml", "lr": 0.1})
    write(tmp_path / "b.yaml", {"base": "a.yaml", "lr": 0.2})
    with pytest.raises(ValueError, match="cycle"):
        load_config(Cfg, tmp_path / "a.yaml")


def test_missing_base_names_the_including_file(tmp_path):
    child = write(tmp_path / "child.yaml", {"base": "nope.yaml"})
    with pytest.raises(FileNotFoundError, match=r"nope\.yaml.*child\.yaml"):
        load_config(Cfg, child)


def test_unknown_yaml_key_names_key_file_and_valid_keys(tmp_path):
    write(tmp_path / "base.yaml", {"lrr": 0.1})
    child = write(tmp_path / "child.yaml", {"base": "base.yaml", "epochs": 2})
    with pytest.raises(ValueError) as info:
        load_config(Cfg, child)
    msg = str(info.value)
    assert "'lrr'" in msg
    assert str(tmp_path / "base.yaml") in msg  # the file the key came from
    assert "did you mean 'lr'" in msg
    assert "name, lr, epochs, amp, dims" in msg


def test_unknown_override_key():
    with pytest.raises(ValueError, match=r"unknown config key 'epoch'.*did you mean 'epochs'.*valid keys of Cfg"):
        load_config(Cfg, None, ["epoch=3"])


@pytest.mark.parametrize(
    ("override", "pattern"),
    [
        ("epochs=abc", r"'epochs' expects int, got str 'abc'"),
        ("epochs=2.5", r"'epochs' expects int"),
        ("amp=1", r"'amp' expects bool.*true or false"),
        ("lr=abc", r"'lr' expects float"),
        ("lr=true", r"'lr' expects float"),
        ("dims=[1, x]", r"'dims' expects list\[int\]"),
        ("dims=3", r"'dims' expects list\[int\]"),
        ("pair=[1, a, 2]", r"'pair' expects tuple\[int, str\].*exactly 2"),
        ("mode=median", r"'mode'.*'min', 'max'"),
    ],
)
def test_type_errors_name_key_and_expected_type(override, pattern):
    with pytest.raises(ValueError, match=pattern):
        load_config(Cfg, None, [override])


def test_yaml_type_error_names_file(tmp_path):
    path = write(tmp_path / "exp.yaml", {"epochs": "ten"})
    with pytest.raises(ValueError, match=rf"{tmp_path}.*'epochs' expects int"):
        load_config(Cfg, path)


def test_override_parsing():
    cfg = load_config(
        Cfg,
        None,
        [
            "lr=1e-3",  # PyYAML reads this as a string; float fields accept it
            "name=foo",
            "dims=[64,128,256]",
            "amp=true",
            "weight_decay=0.05",
            "tags=[a, b]",
            "scales=[1, 2]",
            "pair=[3, x]",
            "mode=max",
            "out=/tmp/x",
            "epochs=7",
        ],
    )
    assert cfg.lr == 1e-3 and isinstance(cfg.lr, float)
    assert cfg.name == "foo"
    assert cfg.dims == [64, 128, 256]
    assert cfg.amp is True
    assert cfg.weight_decay == 0.05
    assert cfg.tags == ["a", "b"]
    assert cfg.scales == (1.0, 2.0)
    assert cfg.pair == (3, "x")
    assert cfg.mode == "max"
    assert cfg.out == Path("/tmp/x")
    assert cfg.epochs == 7


def test_override_null_int_for_float_and_raw_string():
    cfg = load_config(Cfg, None, ["weight_decay=0.1", "weight_decay=null", "lr=1", "name=1.10"])
    assert cfg.weight_decay is None  # last one wins
    assert cfg.lr == 1.0 and isinstance(cfg.lr, float)
    assert cfg.name == "1.10"  # a str field keeps the override's text


@pytest.mark.parametrize("bad", ["lr", "=3", "  =x"])
def test_malformed_override(bad):
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_overrides([bad])


def test_missing_required_field():
    with pytest.raises(ValueError, match="data_root"):
        load_config(Required)
    assert load_config(Required, None, ["data_root=/data"]).data_root == "/data"


def test_non_mapping_yaml(tmp_path):
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n", encoding="utf-8")
    with pytest.raises(ValueError, match="mapping"):
        load_config(Cfg, path)


def test_round_trip_keeps_values_and_field_order(tmp_path):
    cfg = load_config(Cfg, None, ["lr=3e-4", "dims=[8]", "scales=[0.5]", "pair=[2, b]", "weight_decay=1e-8"])
    save_config(cfg, tmp_path / "config.yaml")
    assert load_config(Cfg, tmp_path / "config.yaml") == cfg
    keys = list(yaml.safe_load((tmp_path / "config.yaml").read_text(encoding="utf-8")))
    assert keys == list(config_to_dict(cfg))
    assert keys[:3] == ["name", "lr", "epochs"]
    assert [p.name for p in tmp_path.iterdir()] == ["config.yaml"]  # no temp file left


def test_add_config_args(tmp_path):
    path = write(tmp_path / "exp.yaml", {"epochs": 4})
    parser = add_config_args(argparse.ArgumentParser())
    args = parser.parse_args(["--config", str(path), "--set", "lr=0.5", "name=x", "--set", "amp=true"])
    assert args.config == path
    assert args.overrides == ["lr=0.5", "name=x", "amp=true"]
    cfg = config_from_args(Cfg, args)
    assert (cfg.epochs, cfg.lr, cfg.name, cfg.amp) == (4, 0.5, "x", True)
    assert parser.parse_args([]).overrides == []


@dataclass
class WithKwargs:
    model: str = "m"
    model_kwargs: dict = field(default_factory=lambda: {"depth": 2})


def test_dotted_override_sets_one_entry_of_a_dict_field(tmp_path):
    cfg = load_config(WithKwargs, None, ["model_kwargs.mixer=hydra", "model_kwargs.opts.k=3"])
    assert cfg.model_kwargs == {"depth": 2, "mixer": "hydra", "opts": {"k": 3}}
    path = write(tmp_path / "c.yaml", {"model_kwargs": {"width": 8}})
    assert load_config(WithKwargs, path, ["model_kwargs.mixer=fsat"]).model_kwargs == {"width": 8, "mixer": "fsat"}
    with pytest.raises(ValueError, match=r"unknown config key 'model\.x'"):
        load_config(WithKwargs, None, ["model.x=1"])  # not a dict field


def _alias_bomb(levels: int) -> str:
    """A "billion laughs": each level holds 9 aliases of the one before, so the value expands to 9**levels strings."""
    items = ['&l0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    items += [f"&l{i} [{', '.join([f'*l{i - 1}'] * 9)}]" for i in range(1, levels)]
    return f"[{', '.join(items)}]"


def test_yaml_anchors_and_aliases_are_refused_at_once(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(f"dims: {_alias_bomb(7)}\n", encoding="utf-8")  # 382 bytes; 39 MB when printed in full
    start = time.perf_counter()
    with pytest.raises(ValueError, match=r"bomb\.yaml \(line 1, column \d+\): config files may not use YAML anchors"):
        load_config(Cfg, path)
    with pytest.raises(ValueError, match=r"override 'dims=.*' \(line 1, column \d+\): config files may not use YAML"):
        load_config(Cfg, None, [f"dims={_alias_bomb(7)}"])
    assert time.perf_counter() - start < 5.0
    path.write_text("name: &n run\ntags: [*n]\n", encoding="utf-8")  # a plain anchor is refused too
    with pytest.raises(ValueError, match=r"anchors/aliases \(&name / \*name\)"):
        load_config(Cfg, path)


def test_configs_nested_too_deep_are_refused_in_one_line(tmp_path):
    """10,000 nested brackets (20 KB) ended in a RecursionError of a thousand frames; now one line naming the file."""
    path = tmp_path / "deep.yaml"
    path.write_text("[" * 10_000 + "]" * 10_000, encoding="utf-8")
    with pytest.raises(ValueError, match=rf"config file {re.escape(str(path))} \(line 1, column 33\): .* nested deeper "
                       rf"than {MAX_DEPTH} levels") as info:  # fmt: skip
        load_config(Cfg, path)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=rf"override 'dims=\[\[\[.*nested deeper than {MAX_DEPTH} levels"):
        load_config(Cfg, None, ["dims=" + "[" * 2_000 + "]" * 2_000])
    path.write_text("tags: " + "[" * (MAX_DEPTH - 2) + "x" + "]" * (MAX_DEPTH - 2) + "\n", encoding="utf-8")
    with pytest.raises(ValueError, match="'tags' expects list\\[str\\]"):  # at the limit: read, then type-checked
        load_config(Cfg, path)


def test_a_long_value_is_cut_in_the_error_message(tmp_path):
    path = write(tmp_path / "exp.yaml", {"dims": ["x" * 1000] * 100})
    with pytest.raises(ValueError, match=r"'dims' expects list\[int\], got list \['xxx") as info:
        load_config(Cfg, path)
    assert len(str(info.value)) < 500
    with pytest.raises(ValueError, match=r"'dims' expects list\[int\]") as info:
        load_config(Cfg, None, ["dims=[" + ", ".join(["abc"] * 1000) + "]"])
    assert len(str(info.value)) < 700


# --------------------------------------------------------------------------------------------------------------------
# config_help / describe_config: meanings read from the class's comments


@dataclass
class Documented:
    """A config whose keys carry their meaning in comments."""

    name: str = "run"  # run name
    # optimization
    lr: float = 1e-3  # peak learning rate
    dims: list[int] = field(  # widths of the
        default_factory=lambda: [64, 128]  # two blocks
    )
    # data: a section comment
    # that spans two lines
    path: str | None = None
    flag: bool = True  # a flag # with a hash


@dataclass
class DocumentedChild(Documented):
    extra: int = 3  # declared by the subclass


def test_config_help_reads_meanings_and_sections_from_comments():
    entries = {e.name: e for e in config_help(DocumentedChild)}
    assert list(entries) == ["name", "lr", "dims", "path", "flag", "extra"]
    assert (entries["name"].meaning, entries["name"].section) == ("run name", None)
    assert (entries["lr"].meaning, entries["lr"].section) == ("peak learning rate", "optimization")
    assert entries["lr"].default == "0.001"
    assert (entries["dims"].meaning, entries["dims"].default) == ("widths of the two blocks", "[64, 128]")
    assert entries["path"].meaning == "" and entries["path"].default == "null"
    assert entries["path"].section == "data: a section comment that spans two lines"
    assert entries["flag"].meaning == "a flag # with a hash" and entries["flag"].default == "true"
    assert (entries["extra"].meaning, entries["extra"].section) == ("declared by the subclass", None)


def test_config_help_of_a_class_without_source_has_empty_meanings():
    built = make_dataclass("Built", [("lr", float, field(default=0.1))])
    assert [(e.name, e.default, e.meaning) for e in config_help(built)] == [("lr", "0.1", "")]
    with pytest.raises(TypeError, match="dataclass type"):
        config_help(Documented())


def test_describe_config_lists_key_default_and_meaning_by_section():
    text = describe_config(Documented, width=80)
    lines = text.splitlines()
    assert text.startswith("config keys of Documented") and "--set KEY=VALUE" in " ".join(lines[:2])
    assert any(line.split() == ["name=run", "run", "name"] for line in lines)
    section = lines.index("  optimization")
    assert lines[section + 1].split() == ["lr=0.001", "peak", "learning", "rate"]
    assert "    path=null" in lines
    assert all(len(line) <= 80 for line in lines)
    # defaults read back as the values --set would take
    shown = dict(re.findall(r"^    (\w+)=(.*?)(?:  |$)", text, flags=re.MULTILINE))
    assert {k: yaml.safe_load(v) for k, v in shown.items()} == config_to_dict(Documented())
