"""Rows that repeat an earlier row's prompt (data/columns.py row_key), and the one warning about them.

A source held in memory reads each prompt once:

- an exact duplicate (the same record again) is read once, silently;
- a math row that gives the prompt another answer adds its answers to the first row's as accepted
  alternatives (data/answers.py), the first row's other columns kept;
- any other repeat (other tests, another kind, only other columns such as an id) keeps the first row.

The merged and kept repeats are each named in one warning at set-up: how many, and the first few as
`row N (as row M)` (rows passed from code as passed, `train_data[4] (as train_data[1])`:
data/row_names.py). A streamed source reads each row as a problem of its own (data/streamed.py); its
set-up read warns the same way when its rows give one prompt other answers or tests.
"""

from __future__ import annotations

from typing import Any

from streamrl.data.row_names import Label
from streamrl.data.row_task import SHOWN_WARNINGS, log


def _answers(row: dict[str, Any]) -> list[str]:
    return list(row["answers"] or [row["answer"]])


def _mergeable(first: dict[str, Any], row: dict[str, Any]) -> bool:
    return first["kind"] == row["kind"] == "math" and bool(first["answer"]) and bool(row["answer"])


def conflicts(first: dict[str, Any], row: dict[str, Any]) -> bool:
    """Do two rows of one prompt score it differently (other answers, tests or kind)?"""
    if first["kind"] != row["kind"] or first["tests"] != row["tests"]:
        return True
    return _mergeable(first, row) and set(_answers(first)) != set(_answers(row))


class Repeats:
    """The repeats of one source's rows, met in row order (`label` names the source and its rows)."""

    def __init__(self, label: Label) -> None:
        self.label = label
        self.first: dict[str, int] = {}  # a prompt's key -> the row it was first read from
        self.records: dict[str, list[Any]] = {}  # a repeated prompt's key -> the records read for it
        self.merged: list[tuple[int, int]] = []  # (first row, repeating row)
        self.kept: list[tuple[int, int]] = []

    def read(self, rows: dict[str, dict[str, Any]], row: dict[str, Any], i: int) -> bool:
        """Whether row i (parsed) is a new prompt, for `rows` (key -> the row read for it) to take; a
        repeat is merged into the row of its prompt or dropped here."""
        first = rows.get(row["key"])
        if first is None:
            self.first[row["key"]] = i
            return True
        records = self.records.setdefault(row["key"], [first["columns"]])
        if row["columns"] in records:  # an exact duplicate
            return False
        records.append(row["columns"])
        new = [a for a in _answers(row) if a not in _answers(first)]
        if new and _mergeable(first, row):
            first["answers"] = _answers(first) + new
            self.merged.append((self.first[row["key"]], i))
        else:
            self.kept.append((self.first[row["key"]], i))
        return False

    def report(self) -> None:
        """One warning for the merged repeats and one for the dropped ones, if any."""
        if self.merged:
            log.warning(
                "%s: %d row(s) give the prompt of an earlier row another answer (%s): a prompt is read "
                "once, its answers merged as accepted alternatives",
                self.label,
                len(self.merged),
                pairs(self.label, self.merged),
            )
        if self.kept:
            log.warning(
                "%s: %d row(s) repeat the prompt of an earlier row with other tests, kind or columns "
                "(%s): the earlier row is kept",
                self.label,
                len(self.kept),
                pairs(self.label, self.kept),
            )


def pairs(label: Label, found: list[tuple[int, int]]) -> str:
    """`row 5 (as row 2), row 9 (as row 4)` (`train_data[4] (as train_data[1])`, ...) for the first few
    repeats, and how many more."""
    shown = ", ".join(f"{label.row(i)} (as {label.row(first)})" for first, i in found[:SHOWN_WARNINGS])
    more = len(found) - SHOWN_WARNINGS
    return shown + (f" and {more} more" if more > 0 else "")


def streamed_conflicts(label: Label, rows: list[tuple[int, dict[str, Any]]]) -> None:
    """One warning when rows a streamed source read at set-up ((row number, parsed row), in order) give
    one prompt other answers or tests: each is a problem of its own there, scored by its own."""
    first: dict[str, tuple[int, dict[str, Any]]] = {}
    found = []
    for i, row in rows:
        j, earlier = first.setdefault(row["key"], (i, row))
        if earlier is not row and conflicts(earlier, row):
            found.append((j, i))
    if found:
        log.warning(
            "%s: %d row(s) read at set-up give the prompt of an earlier row other answers or tests (%s): "
            "a streamed source reads each row as a problem of its own, scored by its own answer; give a "
            "prompt one row (with a list of accepted answers), or read the source without streaming",
            label,
            len(found),
            pairs(label, found),
        )
