"""The first message of each kind of failure, shown once: a step record keeps, next to its counts by
reason (`reward_error_reasons`, `verdict_error_reasons`, `episode_error_reasons`), the first message
of each reason in that step (`reward_error_examples`, ...: {reason: message}); the train job prints a
reason's message the first time the run meets it, so thousands of failures of one kind print one line.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

# the step record's {reason: first message} tables, and what each counts
EXAMPLE_KEYS: dict[str, str] = {
    "reward_error_examples": "reward error (scored 0)",
    "verdict_error_examples": "task verdict error (counted wrong)",
    "episode_error_examples": "agent episode error",
}


class ErrorExamples:
    """`update(record)` -> one line per reason the run had not met yet (later failures of a reason are
    only counted); `history`: a resumed run's earlier records (a reason they met is not shown again)."""

    def __init__(self, history: Sequence[Mapping[str, Any]] = ()) -> None:
        self.seen: set[tuple[str, str]] = set()
        for record in history:
            self.update(record)

    def update(self, record: Mapping[str, Any]) -> list[str]:
        out = []
        for key, what in EXAMPLE_KEYS.items():
            examples = record.get(key)
            if not isinstance(examples, Mapping):
                continue
            for reason, message in examples.items():
                if (key, reason) in self.seen:
                    continue
                self.seen.add((key, reason))
                out.append(f"{what} at step {record.get('step')}, the first {reason}: {message}")
        return out
