"""Configuration: a flat dataclass filled from defaults, a YAML file and ``key=value`` overrides.

Precedence, lowest first: the dataclass defaults (or a saved run's config, ``load_config(..., defaults=saved)``) < the
YAML file (and its ``base:`` chain) < ``--set key=value`` overrides. Every value is checked against the field's
annotation, and an unknown key is an error that names the file, lists the valid keys and suggests the closest one. A
YAML file may name one ``base: other.yaml`` (a path relative to the including file); the base may have a base of its
own, the including file's keys win, and a cycle is an error. ``base`` is therefore a reserved key, not a config
field. An override may set one entry of a ``dict`` field with a dotted key: ``--set model_kwargs.mixer=hydra`` (the
rest of the dict is kept). YAML anchors and aliases (``&name`` / ``*name``, and so ``<<:`` merges) are refused in
files and overrides: nested aliases expand exponentially; so are lists and mappings nested deeper than
:data:`MAX_DEPTH` levels. Error messages show at most :data:`MAX_SHOWN` characters of a value.

Supported annotations: ``int``, ``float``, ``str``, ``bool``, ``pathlib.Path``, ``Literal[...]``, ``X | None``,
``list[X]``, ``tuple[X, ...]``, ``tuple[X, Y]``, ``dict`` and ``Any``. Coercions are deliberately few: an int is
accepted for a float, a YAML string such as ``1e-3`` (PyYAML reads exponents without a dot as strings) is parsed as
a float for a float field, lists become tuples for tuple fields, and an override's raw text is kept for a ``str``
field (``--set name=123`` gives ``"123"``). ``bool`` is strict: ``1`` or ``"yes"`` are rejected for a bool field.

Example::

    @dataclass
    class TrainConfig:
        lr: float = 1e-3
        dims: list[int] = field(default_factory=lambda: [64, 128])

    cfg = load_config(TrainConfig, "configs/pointcloud/modelnet40_centroid_t1.yaml", ["lr=3e-4"])
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import difflib
import inspect
import io
import logging
import reprlib
import shutil
import textwrap
import tokenize
import types
from collections.abc import Sequence
from pathlib import Path, PurePath
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

import yaml

from measure.atomic import atomic_write_text

__all__ = [
    "FieldHelp",
    "add_config_args",
    "add_overrides_arg",
    "config_from_args",
    "config_help",
    "config_to_dict",
    "describe_config",
    "load_config",
    "load_yaml_with_base",
    "parse_overrides",
    "save_config",
    "shorten",
]

logger = logging.getLogger(__name__)

T = TypeVar("T")
BASE_KEY = "base"
_NoneType = type(None)


class _Mismatch(Exception):
    """Internal: a value does not fit an annotation."""


#: Longest value shown in an error message; longer ones are cut (a config value can be a large list).
MAX_SHOWN = 200
#: Deepest nesting of lists and mappings in a config file or override (the top-level mapping is level 1). A config is
#: flat, its values a few levels deep; PyYAML composes nodes recursively, so a few kilobytes of ``[[[[...]]]]`` would
#: otherwise end in a ``RecursionError``.
MAX_DEPTH = 32
ANCHORS_REFUSED = "config files may not use YAML anchors/aliases (&name / *name): write the value out"


class _AnchorUsed(Exception):
    """Internal: the YAML text uses an anchor or alias (at ``mark``)."""

    def __init__(self, mark: Any) -> None:
        super().__init__(f"line {mark.line + 1}, column {mark.column + 1}")


class _TooDeep(Exception):
    """Internal: the YAML text nests lists or mappings deeper than :data:`MAX_DEPTH` (at ``mark``)."""

    def __init__(self, mark: Any) -> None:
        super().__init__(f"line {mark.line + 1}, column {mark.column + 1}")


class _PlainLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` without anchors and aliases: a few hundred bytes of nested aliases expand to gigabytes
    (a "billion laughs"), and a config has no need to share nodes. Nodes nested deeper than :data:`MAX_DEPTH` are
    refused too."""

    _depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            raise _AnchorUsed(event.start_mark)
        if self._depth >= MAX_DEPTH:
            raise _TooDeep(event.start_mark)
        self._depth += 1
        try:
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


def _yaml_load(stream: Any) -> Any:
    """``yaml.safe_load`` that raises ``_AnchorUsed`` on an anchor or alias and ``_TooDeep`` past :data:`MAX_DEPTH`."""
    loader = _PlainLoader(stream)
    try:
        return loader.get_single_data()
    finally:
        loader.dispose()


def shorten(value: Any, limit: int = MAX_SHOWN) -> str:
    """``repr(value)`` cut to about ``limit`` characters, computed in bounded time (for error messages)."""
    short = reprlib.Repr()
    short.maxlevel, short.maxstring, short.maxother, short.maxlong = 3, limit, limit, limit
    for name in ("maxtuple", "maxlist", "maxarray", "maxdict", "maxset", "maxfrozenset", "maxdeque"):
        setattr(short, name, 20)
    text = short.repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


def load_yaml_with_base(path: str | Path) -> tuple[dict[str, Any], dict[str, Path]]:
    """Reads a YAML mapping and the chain of files it names with ``base:``.

    Args:
        path: The YAML file.

    Returns:
        The merged mapping (the including file's keys win) and, for each key, the file it came from.

    Raises:
        FileNotFoundError: The file or one of its bases does not exist.
        ValueError: A file is not a mapping, ``base`` is not a string, or the chain has a cycle.
    """
    return _load_chain(Path(path), ())


def _load_chain(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], dict[str, Path]]:
    resolved = path.resolve()
    if resolved in chain:
        cycle = " -> ".join(str(p) for p in (*chain, resolved))
        raise ValueError(f"config base cycle: {cycle}")
    if not path.is_file():
        via = f" (base of {chain[-1]})" if chain else ""
        raise FileNotFoundError(f"config file not found: {path}{via}")
    with open(path, encoding="utf-8") as f:
        data = _parse_yaml(f, f"config file {path}")
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ValueError(f"config file {path} must hold a mapping of key: value, got {type(data).__name__}")
    data = dict(data)
    merged: dict[str, Any] = {}
    origin: dict[str, Path] = {}
    base = data.pop(BASE_KEY, None)
    if base is not None:
        if not isinstance(base, str) or not base:
            raise ValueError(f"config file {path}: 'base' must be a file name relative to it, got {shorten(base)}")
        merged, origin = _load_chain(path.parent / base, (*chain, resolved))
    for key, value in data.items():
        merged[str(key)] = value
        origin[str(key)] = path
    return merged, origin


def _parse_yaml(stream: Any, source: str) -> Any:
    """The YAML document in ``stream`` (text or a file); a ValueError naming ``source`` if it is not valid YAML, uses
    anchors / aliases or nests deeper than :data:`MAX_DEPTH`."""
    try:
        return _yaml_load(stream)
    except _AnchorUsed as e:
        raise ValueError(f"{source} ({e}): {ANCHORS_REFUSED}") from None
    except _TooDeep as e:
        raise ValueError(
            f"{source} ({e}): lists and mappings nested deeper than {MAX_DEPTH} levels; a config holds flat keys whose "
            "values are a few levels deep"
        ) from None
    except yaml.YAMLError as e:
        raise ValueError(f"{source} is not valid YAML ({e})") from e


def parse_overrides(overrides: Sequence[str]) -> dict[str, tuple[Any, str]]:
    """Parses ``key=value`` strings; each value as YAML (``yaml.safe_load`` without anchors and aliases).

    Args:
        overrides: Strings such as ``"lr=1e-3"``, ``"dims=[64,128]"``, ``"flag=true"``, ``"x=null"``.

    Returns:
        ``{key: (parsed value, raw text)}``; a key given twice keeps the last value.

    Raises:
        ValueError: An item has no ``=``, an empty key, or a value that is not valid YAML.
    """
    if isinstance(overrides, str):
        raise TypeError(f"overrides must be a sequence of 'key=value' strings, got the single string {overrides!r}")
    parsed: dict[str, tuple[Any, str]] = {}
    for item in overrides:
        key, sep, text = str(item).partition("=")
        key = key.strip()
        if not sep or not key:
            raise ValueError(f"malformed override {shorten(item)}: expected KEY=VALUE, e.g. lr=1e-3 or dims=[64,128]")
        value = _parse_yaml(text, f"override {shorten(item)}")
        parsed[key] = (value, text.strip())
    return parsed


def load_config(
    cls: type[T],
    path: str | Path | None = None,
    overrides: Sequence[str] = (),
    defaults: dict[str, Any] | None = None,
    defaults_source: str = "the saved config",
) -> T:
    """Builds a config dataclass from its defaults, a YAML file and ``key=value`` overrides.

    Args:
        cls: A dataclass whose fields are flat (see the module docstring for the supported annotations).
        path: Optional YAML file; may name a ``base:`` file.
        overrides: ``key=value`` strings applied last.
        defaults: Values that replace the dataclass defaults before the file and the overrides apply: the config a run
            was trained with (its checkpoint's ``config``), so that a command that opens the run rebuilds that run.
            A key ``cls`` no longer has is skipped with a warning.
        defaults_source: Names ``defaults`` in messages (e.g. the checkpoint's path).

    Returns:
        An instance of ``cls``.

    Raises:
        ValueError: Unknown key, value of the wrong type, malformed override, or a required field left unset.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"load_config expects a dataclass type, got {cls!r}")
    hints = get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    values: dict[str, Any] = {}
    for key, value in (defaults or {}).items():
        if key not in names:
            logger.warning("%s sets %r, which %s does not have: ignored", defaults_source, key, cls.__name__)
            continue
        values[key] = _coerce_field(value, hints[key], key, defaults_source, raw=None)
    if path is not None:
        data, origin = load_yaml_with_base(path)
        for key, value in data.items():
            source = f"config file {origin[key]}"
            _check_known(cls, key, names, source)
            values[key] = _coerce_field(value, hints[key], key, source, raw=None)
    for key, (value, raw) in parse_overrides(overrides).items():
        shown = raw if len(raw) <= MAX_SHOWN else f"{raw[:MAX_SHOWN]}..."
        source = f"override '{key}={shown}'"
        head, dot, rest = key.partition(".")
        if dot and head in names and _is_dict_type(hints[head]):  # model_kwargs.mixer=hydra: one entry of a dict
            current = values[head] if head in values else _default(cls, head)
            merged = dict(current or {})
            _set_path(merged, rest.split("."), value, source)
            values[head] = merged
            continue
        _check_known(cls, key, names, source)
        values[key] = _coerce_field(value, hints[key], key, source, raw=raw)
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in values
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ValueError(f"{cls.__name__}: required keys not set: {', '.join(missing)} (set them in YAML or --set)")
    return cls(**values)


def _is_dict_type(tp: Any) -> bool:
    return tp is dict or get_origin(tp) is dict or any(a is dict or get_origin(a) is dict for a in get_args(tp))


def _default(cls: type, name: str) -> Any:
    f = next(f for f in dataclasses.fields(cls) if f.name == name)
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return None


def _set_path(target: dict[str, Any], path: list[str], value: Any, source: str) -> None:
    for part in path[:-1]:
        nested = target.setdefault(part, {})
        if not isinstance(nested, dict):
            raise ValueError(f"{source}: {part!r} holds {shorten(nested)}, not a mapping")
        target = nested
    if not path[-1]:
        raise ValueError(f"{source}: empty key after '.'")
    target[path[-1]] = value


def _check_known(cls: type, key: str, names: list[str], source: str) -> None:
    if key in names:
        return
    close = difflib.get_close_matches(key, names, n=1)
    hint = f" (did you mean {close[0]!r}?)" if close else ""
    raise ValueError(
        f"unknown config key {shorten(key)} in {source}{hint}; valid keys of {cls.__name__}: {', '.join(names)}"
    )


def _coerce_field(value: Any, tp: Any, key: str, source: str, raw: str | None) -> Any:
    try:
        return _coerce(value, tp, raw)
    except _Mismatch as e:
        detail = f" ({e})" if str(e) else ""
        raise ValueError(
            f"{source}: key {key!r} expects {_type_name(tp)}, got {type(value).__name__} {shorten(value)}{detail}"
        ) from None


def _coerce(value: Any, tp: Any, raw: str | None = None) -> Any:
    """Returns ``value`` checked against (and mildly converted to) the annotation ``tp``; raises ``_Mismatch``."""
    origin = get_origin(tp)
    args = get_args(tp)
    if tp is Any:
        return value
    if origin is Union or origin is types.UnionType:
        if value is None and _NoneType in args:
            return None
        for arg in args:
            if arg is _NoneType:
                continue
            try:
                return _coerce(value, arg, raw)
            except _Mismatch:
                pass
        raise _Mismatch()
    if origin is Literal:
        for choice in args:
            if value == choice and type(value) is type(choice):
                return value
        raise _Mismatch(f"choose one of {', '.join(repr(a) for a in args)}")
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise _Mismatch("use true or false")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise _Mismatch()
    if tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        if isinstance(value, str):
            try:
                return float(value)
            except ValueError:
                pass
        raise _Mismatch()
    if tp is str:
        if isinstance(value, str):
            return value
        if raw is not None and not isinstance(value, (list, dict)):
            return raw
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        raise _Mismatch("quote it in YAML")
    if isinstance(tp, type) and issubclass(tp, PurePath):
        if isinstance(value, (str, PurePath)):
            return tp(value)
        raise _Mismatch()
    if origin is list or tp is list:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch("write a YAML list such as [1, 2]")
        item_tp = args[0] if args else Any
        return [_coerce(v, item_tp) for v in value]
    if origin is tuple or tp is tuple:
        if not isinstance(value, (list, tuple)):
            raise _Mismatch("write a YAML list such as [1, 2]")
        if not args or (len(args) == 2 and args[1] is Ellipsis):
            item_tp = args[0] if args else Any
            return tuple(_coerce(v, item_tp) for v in value)
        if args == ((),):  # tuple[()]
            args = ()
        if len(value) != len(args):
            raise _Mismatch(f"need exactly {len(args)} items")
        return tuple(_coerce(v, a) for v, a in zip(value, args))
    if origin is dict or tp is dict:
        if isinstance(value, dict):
            return dict(value)
        raise _Mismatch()
    if isinstance(tp, type):
        if isinstance(value, tp):
            return value
        raise _Mismatch()
    raise TypeError(f"unsupported config annotation {tp!r}; see engine.config for the supported ones")


def _type_name(tp: Any) -> str:
    if isinstance(tp, type) and not get_args(tp):
        return tp.__name__
    return str(tp).replace("typing.", "").replace("pathlib.", "")


def _to_plain(value: Any) -> Any:
    """Converts a field value to plain YAML types (tuples to lists, paths to strings)."""
    if isinstance(value, (list, tuple)):
        return [_to_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _to_plain(v) for k, v in value.items()}
    if isinstance(value, PurePath):
        return str(value)
    return value


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """Returns a config dataclass as a plain dict in field order (tuples as lists, paths as strings)."""
    if isinstance(cfg, dict):
        return {str(k): _to_plain(v) for k, v in cfg.items()}
    if not (dataclasses.is_dataclass(cfg) and not isinstance(cfg, type)):
        raise TypeError(f"config_to_dict expects a dataclass instance or a dict, got {type(cfg).__name__}")
    return {f.name: _to_plain(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}


def save_config(cfg: Any, path: str | Path) -> None:
    """Writes a config (dataclass or dict) as YAML in field order, atomically; :func:`load_config` reads it back."""
    text = yaml.safe_dump(config_to_dict(cfg), sort_keys=False, default_flow_style=None, allow_unicode=True)
    atomic_write_text(path, text)


def add_config_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds ``--config PATH`` and ``--set KEY=VALUE [KEY=VALUE ...]`` (repeatable) to a CLI's parser.

    The parsed namespace has ``config`` (a ``Path`` or ``None``) and ``overrides`` (a list of strings); pass it to
    :func:`config_from_args`.
    """
    parser.add_argument("--config", type=Path, default=None, metavar="PATH", help="YAML config file")
    add_overrides_arg(
        parser, "override config keys, e.g. --set lr=1e-3 dims=[64,128]; repeatable; applied after --config"
    )
    return parser


def add_overrides_arg(parser: argparse.ArgumentParser, help: str) -> argparse.ArgumentParser:
    """Adds ``--set KEY=VALUE [KEY=VALUE ...]`` (repeatable; the namespace's ``overrides``, a list of strings): the one
    override grammar of every CLI, parsed by :func:`parse_overrides` (each value as YAML)."""
    parser.add_argument(
        "--set", dest="overrides", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help=help
    )
    return parser


def config_from_args(cls: type[T], args: argparse.Namespace) -> T:
    """Shortcut for ``load_config(cls, args.config, args.overrides)`` after :func:`add_config_args`."""
    return load_config(cls, getattr(args, "config", None), getattr(args, "overrides", None) or ())


# --------------------------------------------------------------------------------------------------------------------
# Help: what each key means, read from the comments in the config class
# --------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FieldHelp:
    """One config key as ``--help`` shows it.

    Attributes:
        name: The key.
        default: Its default as YAML flow text (what ``--set name=...`` would take), or ``"(required)"``.
        meaning: The comment at the end of the field's line; empty when it has none.
        section: The comment line(s) above the group of fields it belongs to; ``None`` before the first one.
    """

    name: str
    default: str
    meaning: str
    section: str | None


def config_help(cls: type) -> list[FieldHelp]:
    """The keys of a config dataclass with their defaults and meanings, in field order.

    The meanings live in the class body, where researchers read them: a comment at the end of a field's line says
    what the key means, and a comment on a line of its own starts a section (``# optimization``) that groups the
    fields below it::

        @dataclass
        class TrainConfig:
            # optimization
            lr: float = 1e-3  # peak learning rate
            epochs: int = 10  # epochs to train

    Inherited fields take their meaning from the class that declares them. A class whose source cannot be read
    (built at run time) gives empty meanings.
    """
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise TypeError(f"config_help expects a dataclass type, got {cls!r}")
    comments: dict[str, tuple[str | None, str]] = {}
    for klass in reversed(cls.__mro__):
        if dataclasses.is_dataclass(klass):
            comments.update(_class_comments(klass))
    out = []
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        section, meaning = comments.get(f.name, (None, ""))
        out.append(FieldHelp(f.name, _default_text(f), meaning, section))
    return out


def describe_config(cls: type, width: int | None = None) -> str:
    """Every key of a config dataclass with its default and meaning (:func:`config_help`), grouped by section: the
    text a training CLI's ``--help`` ends with, wrapped to ``width`` columns (default: the terminal's, at most 120)."""
    if width is None:
        width = min(max(shutil.get_terminal_size().columns - 2, 60), 120)
    entries = config_help(cls)
    column = min(max((len(e.name) + len(e.default) + 1 for e in entries), default=0), 36)
    title = f"config keys of {cls.__name__} (key=default; set them in --config YAML or with --set KEY=VALUE):"
    lines = textwrap.wrap(title, width)
    section: str | None = None
    for e in entries:
        if e.section != section:
            section = e.section
            lines += ["", *textwrap.wrap(section or "", width, initial_indent="  ", subsequent_indent="    ")]
        head = f"    {e.name}={e.default}"
        indent = " " * (4 + column + 2)
        body = textwrap.wrap(e.meaning, max(width - len(indent), 20), break_on_hyphens=False) or [""]
        if len(head) > len(indent) - 2:
            lines.append(head)
            lines += [indent + b for b in body if b]
        else:
            lines.append(f"{head.ljust(len(indent))}{body[0]}".rstrip())
            lines += [indent + b for b in body[1:]]
    return "\n".join(lines)


def _default_text(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "(required)"
    text = yaml.safe_dump(_to_plain(value), default_flow_style=True, width=1_000_000, allow_unicode=True)
    return text.removesuffix("\n").removesuffix("...").strip()


def _class_comments(cls: type) -> dict[str, tuple[str | None, str]]:
    """``{field: (section, meaning)}`` from the comments in ``cls``'s own source (see :func:`config_help`)."""
    try:
        source = textwrap.dedent(inspect.getsource(cls))
        tree = ast.parse(source)
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (OSError, TypeError, SyntaxError, tokenize.TokenError):
        return {}
    trailing: dict[int, str] = {}
    standalone: dict[int, str] = {}
    for tok in tokens:
        if tok.type == tokenize.COMMENT:
            text = tok.string.lstrip("#").strip()
            own_line = not tok.line[: tok.start[1]].strip()
            (standalone if own_line else trailing)[tok.start[0]] = text
    body = next((n.body for n in tree.body if isinstance(n, ast.ClassDef)), [])
    out: dict[str, tuple[str | None, str]] = {}
    section: str | None = None
    previous_end = 0
    for node in body:
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            above = [standalone[n] for n in range(previous_end + 1, node.lineno) if n in standalone]
            if above:
                section = " ".join(above)
            meaning = " ".join(trailing[n] for n in range(node.lineno, node.end_lineno + 1) if n in trailing)
            out[node.target.id] = (section, meaning)
        previous_end = node.end_lineno or node.lineno
    return out
