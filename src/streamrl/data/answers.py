"""A row's answer cell -> the text of its accepted answers, or a ValueError naming the column.

- A scalar (text, a number, a boolean) is the reference answer. A float that holds an exact integer
  reads as that integer: a CSV column of whole numbers with one empty cell is read as floats, and
  `42.0` would otherwise reach few-shot examples ("The answer is 42.0.").
- A list of scalars holds accepted alternatives: a response is correct if it matches any of them,
  few-shot examples show the first, and your own reward functions receive the list as `answer`.
- Anything else (a mapping, a list inside the list, an empty list) is refused.

Each answer that holds a GSM8K-style solution is reduced to what follows its last `####`
(rewards/extract.py reference_answer).
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from streamrl.rewards.extract import reference_answer

EXACT_INTEGERS = 2**53  # floats below this in magnitude hold every integer exactly


def is_blank(value: Any) -> bool:
    """An empty cell: None, blank text, or a float NaN (how a table reads a missing number)."""
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    return isinstance(value, float) and math.isnan(value)


def scalar_text(value: Any) -> str:
    """A scalar cell as text; a float holding an exact integer as that integer ('42', not '42.0')."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        f = float(value)
        if f.is_integer() and abs(f) < EXACT_INTEGERS:
            return str(int(f))
    return str(value)


def _is_scalar(value: Any) -> bool:
    return isinstance(value, (str, numbers.Number))


def _refusal(value: Any, column: str, inside: bool) -> ValueError:
    if isinstance(value, dict):
        return ValueError(
            f"column '{column}' holds a mapping{' in its list' if inside else ''}: an answer is text, a "
            f"number or a list of them (map a field inside it: task_config.columns.answer={column}.<field>)"
        )
    what = "a list inside its list" if inside and isinstance(value, list) else type(value).__name__
    return ValueError(
        f"column '{column}' holds {what}: an answer is text, a number or a list of accepted answers"
    )


def accepted_answers(value: Any, column: str) -> tuple[list[str], bool]:
    """(the accepted answers, in order and distinct; whether the cell was a list) of a math row's answer
    cell. ValueError: an empty cell, an empty list, or a value that is no answer."""
    listed = isinstance(value, (list, tuple))
    if listed and not value:
        raise ValueError(f"column '{column}' is an empty list: give at least one accepted answer")
    out: list[str] = []
    for item in value if listed else [value]:
        if is_blank(item):
            raise ValueError(f"column '{column}' {'holds an empty answer' if listed else 'is empty'}")
        if not _is_scalar(item):
            raise _refusal(item, column, listed)
        text = reference_answer(scalar_text(item))
        if not text:
            raise ValueError(f"column '{column}' has nothing after '####'")
        if text not in out:
            out.append(text)
    return out, listed


def code_answer(value: Any, column: str) -> str:
    """A code row's answer cell (its reference program, shown by few-shot examples; the tests score the
    row): "" when left out."""
    if is_blank(value) or value == []:
        return ""
    if not _is_scalar(value):
        kind = type(value).__name__
        raise ValueError(f"column '{column}' holds {kind}: a code row's answer is its program (text)")
    return str(value)


def reference_text(problem: Any) -> str:
    """The reference answer as one text (for a judge): the first accepted answer, the others named."""
    others = (problem.meta.get("answers") or [])[1:]
    return f"{problem.answer} (also accepted: {'; '.join(others)})" if others else problem.answer


def answers_of(problem: Any) -> list[str]:
    """The accepted answers of a problem: its alternatives, or its one reference answer."""
    return list(problem.meta.get("answers") or [problem.answer])
