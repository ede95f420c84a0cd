"""The metrics records a diagnostics monitor has seen, with each key's series kept as records arrive: a
rule reading a series costs O(1) at step 10 and at step 10000 (given a plain list, it recomputes it)."""

from __future__ import annotations

import bisect
import math
import statistics
from collections.abc import Sequence
from typing import Any

Record = dict[str, Any]


def number(r: Record, key: str) -> float | None:
    v = r.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        return None
    return float(v)


def series(history: Sequence[Record], key: str) -> list[float]:
    """The finite numbers logged under `key`, oldest first."""
    if isinstance(history, History):
        return history.series(key)
    return [v for v in (number(r, key) for r in history) if v is not None]


class History(list[Record]):
    """The records so far, with each key's series (and its sorted values) kept up to date as records are
    appended: a rule reading a series costs O(1) instead of a pass over the whole stream."""

    def __init__(self) -> None:
        super().__init__()
        self._series: dict[str, list[float]] = {}
        self._sorted: dict[str, list[float]] = {}

    def append(self, record: Record) -> None:
        super().append(record)
        for key, values in self._series.items():
            if (v := number(record, key)) is not None:
                values.append(v)
                if key in self._sorted:
                    bisect.insort(self._sorted[key], v)

    def series(self, key: str) -> list[float]:
        """Shared, not copied: callers must not change it."""
        if key not in self._series:
            self._series[key] = [v for v in (number(r, key) for r in self) if v is not None]
        return self._series[key]

    def sorted_series(self, key: str) -> list[float]:
        if key not in self._sorted:
            self._sorted[key] = sorted(self.series(key))
        return self._sorted[key]


def median_before_last(history: Sequence[Record], key: str) -> tuple[float | None, int]:
    """(median, count) of `key` over every record but the last, which holds a value of `key`."""
    if not isinstance(history, History):
        before = series(history[:-1], key)
        return (statistics.median(before) if before else None), len(before)
    values, last = history.sorted_series(key), history.series(key)[-1]
    n, skip = len(values) - 1, bisect.bisect_left(values, last)  # drop one copy of the last value

    def at(j: int) -> float:
        return values[j] if j < skip else values[j + 1]

    if n <= 0:
        return None, 0
    return (at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2), n
