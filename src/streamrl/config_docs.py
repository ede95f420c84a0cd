"""`streamrl config [SECTION]`: every config key with its type, default, accepted range and meaning.

The meaning is the field's comment in config.py or config_sections.py, the one place it is written: the
comment at the end of the field's line, else the comment lines right above it (a blank line or code in
between ends them). A dataclass docstring describes its section.
"""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import tokenize
import typing
from functools import cache
from typing import Any, Literal

from streamrl import config, config_sections
from streamrl.config import Config
from streamrl.config_bounds import BOUNDS
from streamrl.config_parse import ConfigError


@dataclasses.dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted: train.lr
    type: str  # float, int, bool, str, fp32|bf16, list of int, mapping ...
    default: Any
    accepts: str  # the range of a numeric key ('> 0'), else ''
    description: str

    def line(self) -> str:
        kind = f"{self.type} {self.accepts}" if self.accepts else self.type
        return f"{self.key} ({kind}, default {show_default(self.default)}): {self.description}"


@cache
def field_comments() -> dict[tuple[str, str], str]:
    """(class name, field name) -> its comment in config.py or config_sections.py, joined into one line."""
    out: dict[tuple[str, str], str] = {}
    for module in (config, config_sections):
        out.update(_module_comments(inspect.getsource(module)))
    return out


def _module_comments(source: str) -> dict[tuple[str, str], str]:
    """field_comments of one module's source."""
    comments: dict[int, str] = {}  # line -> comment text
    code_lines: set[int] = set()  # lines holding anything but a comment
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            comments[tok.start[0]] = tok.string.lstrip("#").strip()
        elif tok.type not in (tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT):
            code_lines.update(range(tok.start[0], tok.end[0] + 1))
    out: dict[tuple[str, str], str] = {}
    for cls in ast.parse(source).body:
        if not isinstance(cls, ast.ClassDef):
            continue
        for node in cls.body:
            if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
                continue
            end = node.end_lineno or node.lineno
            own = [comments[n] for n in range(node.lineno, end + 1) if n in comments]
            if not own:  # the block of comment-only lines right above
                n = node.lineno - 1
                while n in comments and n not in code_lines:
                    own.insert(0, comments[n])
                    n -= 1
            out[(cls.name, node.target.id)] = " ".join(own)
    return out


def type_name(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal:
        return "|".join(str(a) for a in args)
    if origin is tuple and args and args[-1] is Ellipsis:
        return f"list of {type_name(args[0])}"
    if origin is tuple:
        return "[" + ", ".join(type_name(a) for a in args) + "]"
    if origin is dict or tp is dict:
        return "mapping"
    return getattr(tp, "__name__", str(tp))


def show_default(value: Any) -> str:
    """A default as it would be written in a key=value override or YAML."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return value if value and value.strip() == value and " " not in value else repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(show_default(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {show_default(v)}" for k, v in value.items()) + "}"
    return repr(value)


def sections() -> dict[str, type]:
    """Section name -> its dataclass, in the order of Config."""
    hints = typing.get_type_hints(Config)
    return {
        f.name: hints[f.name] for f in dataclasses.fields(Config) if dataclasses.is_dataclass(hints[f.name])
    }


def key_docs(cls: type = Config, prefix: str = "") -> list[KeyDoc]:
    """The keys of one dataclass (not those of its sections), in field order."""
    hints, comments, defaults = typing.get_type_hints(cls), field_comments(), cls()
    out = []
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if dataclasses.is_dataclass(tp):
            continue
        key = prefix + f.name
        bound = BOUNDS.get(key)
        accepts = bound.text() if bound else ""
        out.append(
            KeyDoc(key, type_name(tp), getattr(defaults, f.name), accepts, comments[(cls.__name__, f.name)])
        )
    return out


def render(section: str | None = None) -> str:
    """All keys (top level first, then each section), or one section's; ConfigError for an unknown one."""
    secs = sections()
    if section is not None and section not in secs:
        raise ConfigError(f"unknown config section '{section}'; sections: {', '.join(secs)}")
    chosen = [section] if section else [None, *secs]
    blocks = []
    for name in chosen:
        cls = secs[name] if name else Config
        head = f"[{name}]" if name else "[top level]"
        doc = " ".join((cls.__doc__ or "").split()) if name else ""
        if doc.startswith(f"{cls.__name__}("):  # the signature dataclasses writes when there is no docstring
            doc = ""
        lines = [f"{head} {doc}" if doc else head]
        lines += [d.line() for d in key_docs(cls, f"{name}." if name else "")]
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
