"""The first message of each kind of failure, shown once: a step record keeps, next to its counts by
reason (`reward_error_reasons`, `verdict_error_reasons`, `episode_error_reasons`), the first message
of each reason in that step (`reward_error_examples`, ...: {reason: message}); the train job prints a
reason's message the first time the run meets it, so thousands of failures of one kind print one line;
the report lists each reason's first message over the run (`run_examples`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

MESSAGE_CHARS = 500  # an error message kept in the step record is cut to this many characters
CUT = "..."  # where a kept message was cut

# the step record's {reason: first message} tables, and what each counts
EXAMPLE_KEYS: dict[str, str] = {
    "reward_error_examples": "reward error (scored 0)",
    "verdict_error_examples": "task verdict error (counted wrong)",
    "episode_error_examples": "agent episode error",
}


def one_line(text: str) -> str:
    """`text` on one line: its lines, stripped, joined by a space (empty ones dropped), after the spaces
    it starts with (a tail's " (problem ..." keeps its space); a text without a line break comes back as
    it is, one of line breaks only as ''."""
    lines = text.splitlines()
    if lines == [text]:
        return text
    joined = " ".join(line.strip() for line in lines if line.strip())
    return text[: len(text) - len(text.lstrip(" \t"))] + joined if joined else ""


def fit_message(head: str, detail: str, tail: str = "") -> str:
    """head + detail + tail on one line (one_line) in MESSAGE_CHARS characters, cutting the detail only
    (its end becomes CUT): the head names the failure, the tail where it happened (the reward function,
    the problem), and a long exception message must not cut them off. When head and tail alone do not fit
    (a problem id of hundreds of characters, say), the middle goes instead: the message's start and its
    tail's end (up to half the message) are kept. The one cut of every message a step record keeps: a
    message it returns comes back unchanged from it (fit_message("", message) == message), and a detail
    it cut reads, cut again for a head and a tail, as if cut once (no more of it is kept the second
    time)."""
    head, detail, tail = one_line(head), one_line(detail), one_line(tail)
    text = head + detail + tail
    if len(text) <= MESSAGE_CHARS:
        return text
    room = MESSAGE_CHARS - len(head) - len(tail) - len(CUT)
    if room >= 0:
        return head + detail[:room] + CUT + tail
    back = min(len(tail), (MESSAGE_CHARS - len(CUT)) // 2)
    return text[: MESSAGE_CHARS - len(CUT) - back] + CUT + text[len(text) - back :]


def entries(record: Mapping[str, Any]) -> Iterator[tuple[str, str, str]]:
    """(table key, reason, message) of each example a step record holds, in EXAMPLE_KEYS order (a table
    that is not a mapping holds none)."""
    for key in EXAMPLE_KEYS:
        examples = record.get(key)
        if isinstance(examples, Mapping):
            for reason, message in examples.items():
                yield key, str(reason), str(message)


@dataclass
class RunExample:
    """A reason's first message over a run: `what` it counts (EXAMPLE_KEYS), the step whose record first
    had it, and how many step records had that reason."""

    what: str
    reason: str
    message: str
    first_step: Any
    steps: int


def run_examples(records: Sequence[Mapping[str, Any]]) -> list[RunExample]:
    """Each (kind, reason) the run's records met, with its first message, by kind then first step."""
    found: dict[str, dict[str, RunExample]] = {key: {} for key in EXAMPLE_KEYS}
    for record in records:
        for key, reason, message in entries(record):
            if reason in found[key]:
                found[key][reason].steps += 1
            else:
                found[key][reason] = RunExample(EXAMPLE_KEYS[key], reason, message, record.get("step"), 1)
    return [example for kind in found.values() for example in kind.values()]


class ErrorExamples:
    """`update(record)` -> one line per reason the run had not met yet (later failures of a reason are
    only counted); `history`: a resumed run's earlier records (a reason they met is not shown again)."""

    def __init__(self, history: Sequence[Mapping[str, Any]] = ()) -> None:
        self.seen: set[tuple[str, str]] = set()
        for record in history:
            self.update(record)

    def update(self, record: Mapping[str, Any]) -> list[str]:
        out = []
        for key, reason, message in entries(record):
            if (key, reason) in self.seen:
                continue
            self.seen.add((key, reason))
            out.append(f"{EXAMPLE_KEYS[key]} at step {record.get('step')}, the first {reason}: {message}")
        return out
