"""How warnings and errors name a tabular source and its rows.

A file or dataset is named by its label (the file, or `NAME[split]`) and a row by its 1-based position
(`FILE:row 3`, `row 5 (as row 2)`). Rows passed from code (`train_data=` / `eval_data=`, api.py) are
written to a file of the cache named after the argument and their content (code_rows_file); its rows
are named as they were passed, by the argument and a 0-based index (`train_data[2]`, `train_data[4]
(as train_data[1])`), as the API's own checks name them. A run recorded before the file was named
after the argument names it `<digest>.jsonl`: the same rows resume it (resumed_rows_file).

`datasets` reads a .jsonl row that leaves out a key other rows have as if it held null. When a source
is one local .jsonl file, a refused row with a null is marked at once (failure), and the lines of the
few such rows the warning shows are read again (json_lines.raw_rows): a row without the key is told so
(`no 'answer' key (other rows have it): add it or drop the row`), not that its column is empty. A
skipped row past those keeps the message its record gave.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.data.columns import MissingColumn, parse_row
from streamrl.data.json_lines import raw_rows
from streamrl.data.row_task import SHOWN_WARNINGS

CODE_ROWS = re.compile(r"(train_data|eval_data)-[0-9a-f]{16}\.jsonl")


def code_rows_file(key: str, digest: str) -> Path:
    """The cache's file of rows passed from code as `key` (train_data / eval_data); `digest`: 16 hex
    digits naming their content."""
    from streamrl.models.cache import cache_dir

    return cache_dir() / "data" / f"{key}-{digest}.jsonl"


def resumed_rows_file(saved: str, path: Path) -> Path | None:
    """The file a resumed run's `saved` spec (its task `data:PATH`, or its eval_data PATH) names when it
    holds the rows whose file is now `path` (code_rows_file): the same digest, under that name or the
    one such files had before (`<digest>.jsonl`); else None."""
    before = path.name.rpartition("-")[2]  # `<digest>.jsonl`
    named = Path(saved.removeprefix("data:"))
    return named if named.name in (path.name, before) else None


@dataclass(frozen=True)
class Label:
    """A source as warnings and errors name it (str(label)) and how they name its rows."""

    name: str  # the file, `NAME[split]`, or train_data / eval_data for rows passed from code
    from_code: bool = False  # rows passed from code: row i is `name[i - 1]`
    jsonl: Path | None = None  # the one local .jsonl file the rows are read from, if so

    def __str__(self) -> str:
        return self.name

    def at(self, i: int) -> str:
        """Row i (1-based, in the source's order) with its source: `FILE:row 3` or `train_data[2]`."""
        return f"{self.name}[{i - 1}]" if self.from_code else f"{self.name}:row {i}"

    def row(self, i: int) -> str:
        """Row i in a message that names the source first: `row 3`, or `train_data[2]` as passed."""
        return self.at(i) if self.from_code else f"row {i}"

    def two_rows(self, i: int, j: int) -> str:
        """Rows i and j with their source: `FILE: rows 1 and 3`, or `train_data[0] and train_data[2]`."""
        return f"{self.at(i)} and {self.at(j)}" if self.from_code else f"{self.name}: rows {i} and {j}"


def label_of(name: str, spec: str) -> Label:
    """The label of the source a `data:PATH` / PATH / `hf:NAME` spec opened as `name`."""
    path = Path(spec.removeprefix("data:")).expanduser()
    if spec.startswith("hf:") or not (path.suffix == ".jsonl" and path.is_file()):
        return Label(name)
    if found := CODE_ROWS.fullmatch(path.name):
        return Label(found.group(1), True, path)
    return Label(name, jsonl=path)


def _has_null(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_null(v) for v in value.values())
    return value is None


def failure(label: Label, i: int, record: Any, e: ValueError) -> tuple[int, str, bool]:
    """What skipped_rows keeps of refused row i: (i, why, whether its own line is to be read again: a
    local .jsonl file's row whose record holds a null, which may be a key its line leaves out)."""
    # datasets fills in a key some row has: a record without the column is no row's, only a null may be
    again = label.jsonl is not None and not isinstance(e, MissingColumn) and _has_null(record)
    return i, str(e), again


def skipped_rows(label: Label, failed: list[tuple[int, str, bool]], columns: dict[str, str]) -> list[str]:
    """`where: why` for each refused row (failure), in order; of the rows the warning shows
    (SHOWN_WARNINGS), one whose own line leaves out a key its record holds as null (other rows have
    it) is named as missing it."""
    again = {i for i, _, read in failed[:SHOWN_WARNINGS] if read}
    own = raw_rows(label.jsonl, again) if label.jsonl else {}
    missing: dict[int, str] = {}
    for i, raw in own.items():
        try:
            parse_row(raw, columns)
        except MissingColumn as e:
            missing[i] = f"no '{e.column}' key (other rows have it): add it or drop the row"
        except ValueError:
            continue
    return [f"{label.at(i)}: {missing.get(i, why)}" for i, why, _ in failed]
