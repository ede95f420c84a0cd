"""Typed parsing of config values: dotted keys onto dataclass sections, YAML scalars, one-line errors."""

from __future__ import annotations

import dataclasses
import datetime
import difflib
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal

import yaml

from streamrl.brief import brief


class ConfigError(ValueError):
    """Bad configuration; the message is one line naming the key and the fix."""


_LEADING_ZERO = re.compile(r"[+-]?0[0-9_]+")  # 010: octal in YAML 1.1
_DECIMAL = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")  # 1e-5, 3.0E4, .5
# keys that moved to another section: an old key fails with its new name
MOVED_KEYS = {"train.save_checkpoint": "checkpoint.save", "train.checkpoint_every": "checkpoint.every"}


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (PyYAML silently keeps the last)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: dict[Any, int] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            line = key_node.start_mark.line + 1
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key '{key}' given twice (first at line {seen[key]})", key_node.start_mark
                )
            seen[key] = line
        return super().construct_mapping(node, deep=deep)


def read_yaml(path: str | Path, what: str = "config file") -> Any:
    """The YAML document in `path`; a syntax error, a duplicate key or a file that is not UTF-8 text
    raises ConfigError with one line naming the file, the line and column, and the problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{what} '{path}' is not UTF-8 text") from None
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = brief(str(e.problem or e.context or "invalid YAML"))
        if e.context and e.problem and e.context_mark and e.problem_mark:
            problem += f" ({brief(e.context)} at line {e.context_mark.line + 1})"
        raise ConfigError(f"{what} '{path}'{where}: {problem}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"{what} '{path}': {brief(str(e))}") from None


def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(cls)}


def _describe(tp: Any) -> str:
    if typing.get_origin(tp) is Literal:
        return "one of " + ", ".join(repr(a) for a in typing.get_args(tp))
    if dataclasses.is_dataclass(tp):
        return "a section with keys " + ", ".join(_field_types(tp))
    return getattr(tp, "__name__", str(tp))


def _coerce(key: str, value: Any, tp: Any) -> Any:
    """Check `value` against type `tp` (converting lossless cases such as int -> float)."""
    origin = typing.get_origin(tp)
    bad = ConfigError(f"config key '{key}' expects {_describe(tp)}, got {value!r}")
    if origin is Literal:
        if value not in typing.get_args(tp):
            raise bad
        return value
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(tp):
            try:
                return _coerce(key, value, arg)
            except ConfigError:
                continue
        raise bad
    if tp is type(None):
        if value is not None:
            raise bad
        return None
    if tp is bool:
        if not isinstance(value, bool):
            raise bad
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad
        return value
    if tp is float:
        if isinstance(value, str) and _DECIMAL.fullmatch(value.strip()):  # YAML 1.1 reads 1e-5 as a string
            return float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise bad
        return float(value)
    if tp is str:
        if isinstance(value, os.PathLike):  # a Path (as a Run gives its run_dir and checkpoint): its text
            value = os.fspath(value)
        if not isinstance(value, str):
            raise bad
        return value
    if origin is tuple and typing.get_args(tp)[-1] is Ellipsis:  # any length: "1,2,4", [1, 2, 4] or 4
        items = value.split(",") if isinstance(value, str) else value
        items = items if isinstance(items, (list, tuple)) else [items]
        elem = typing.get_args(tp)[0]
        try:
            items = [yaml.safe_load(v) if isinstance(v, str) else v for v in items]
        except yaml.YAMLError:
            raise bad from None
        return tuple(_coerce(f"{key}[{i}]", v, elem) for i, v in enumerate(items))
    if origin is tuple:
        args = typing.get_args(tp)
        if isinstance(value, str):  # "0.9,0.95", as the CLI gives a pair
            try:
                value = [yaml.safe_load(v) for v in value.split(",")]
            except yaml.YAMLError:
                raise bad from None
        if not isinstance(value, (list, tuple)) or len(value) != len(args):
            raise bad
        return tuple(_coerce(f"{key}[{i}]", v, a) for i, (v, a) in enumerate(zip(value, args)))
    if origin is dict or tp is dict:
        if not isinstance(value, dict):
            raise bad
        return dict(value)
    raise bad


def field_value(section: Any, name: str, key: str, value: Any) -> Any:
    """`value` as field `name` of the dataclass `section` takes it (ConfigError naming `key` if it cannot):
    for settings given outside the dataclass, such as a mixture source's data keys."""
    return _coerce(key, value, _field_types(type(section))[name])


def apply_key(obj: Any, key: str, value: Any, prefix: str = "") -> None:
    """Set dotted `key` on dataclass `obj`; dict values update nested sections key by key."""
    head, _, rest = key.partition(".")
    fields = _field_types(type(obj))
    full = f"{prefix}{head}"
    if head not in fields:
        if full in MOVED_KEYS:
            raise ConfigError(f"config key '{full}' is now '{MOVED_KEYS[full]}': rename it")
        hint = difflib.get_close_matches(head, fields, n=1)
        where = f"section '{prefix[:-1]}'" if prefix else "the top level"
        suggestion = f" (did you mean '{prefix}{hint[0]}'?)" if hint else ""
        raise ConfigError(
            f"unknown config key '{full}'{suggestion}; valid keys at {where}: {', '.join(fields)}"
        )
    tp = fields[head]
    if dataclasses.is_dataclass(tp):
        section = getattr(obj, head)
        if rest:
            apply_key(section, rest, value, f"{full}.")
        elif isinstance(value, dict):
            for k, v in value.items():
                apply_key(section, str(k), v, f"{full}.")
        else:
            raise ConfigError(f"config key '{full}' is {_describe(tp)}; set e.g. '{full}.<key>=value'")
        return
    if rest:
        if typing.get_origin(tp) is dict or tp is dict:
            getattr(obj, head)[rest] = value
            return
        raise ConfigError(f"config key '{full}' is not a section; use '{full}=value'")
    setattr(obj, head, _coerce(full, value, tp))


YAML_NULLS = ("null", "Null", "NULL", "~")  # what an override spells to mean None


def parse_override(text: str) -> tuple[str, Any]:
    """'train.lr=1e-5' -> ('train.lr', 1e-05); values are parsed as YAML scalars/lists/dicts."""
    if "=" not in text:
        raise ConfigError(f"override '{text}' must look like key=value (for example max_steps=10)")
    key, raw = text.split("=", 1)
    # a plain value (not a [list], a {mapping} or quoted) that YAML would cut or turn into a mapping is
    # meant as the text it is (an instruction, a system prompt): '... #### ...', 'Reply as: N', 'Answer:'
    plain = raw.strip()
    is_text = bool(plain) and plain[0] not in "[{\"'"
    if is_text and (plain.startswith("#") or " #" in plain):  # a YAML comment would drop the rest
        return key.strip(), plain
    try:
        value = yaml.safe_load(raw) if plain else ""
    except yaml.YAMLError:
        value = raw
    if is_text and (isinstance(value, dict) or (value is None and plain not in YAML_NULLS)):
        return key.strip(), plain
    # YAML 1.1 reads 2024-05-01 as a date and 010 as octal 8: both are meant as written (a run name, 10)
    if is_text and (
        isinstance(value, datetime.date) or (isinstance(value, int) and _LEADING_ZERO.fullmatch(plain))
    ):
        return key.strip(), plain
    # YAML reads 1e-5 as a string (it wants 1.0e-5); accept the usual float spelling.
    if isinstance(value, str):
        try:
            value = float(value) if any(c in value.lower() for c in ".e") else value
        except ValueError:
            pass
    return key.strip(), value
