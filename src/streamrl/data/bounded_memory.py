"""What a sampler remembers per prompt: at most `limit` entries, the least recently set forgotten first,
and its contents as of a mark, rebuilt only when asked for.

A loop that may have to save the stream's state from before a step (a step whose rollouts fail draws
its problems again on resume, loop/colocated.py) marks the start of every step. Copying every entry at
each mark would cost a step what is remembered (up to data/sampler_base.py MEMORY); instead the memory
keeps, from the mark on, each changed entry's value and place before its first change, and rebuilds the
contents as of the mark from them when a state is taken. Entries are kept in the order they were last
set, each with a rising sequence number, so an entry's place is its number. Not thread-safe: its
sampler's lock guards it.
"""

from __future__ import annotations

import heapq
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from typing import TypeVar

V = TypeVar("V")


class BoundedMemory(Mapping[str, V]):
    def __init__(self, limit: int, items: Iterable[tuple[str, V]] = ()) -> None:
        """`items`: the entries in the order they were set (a saved state's; none is forgotten)."""
        self.limit = limit
        self._entries: OrderedDict[str, tuple[V, int]] = OrderedDict()  # key -> (value, sequence number)
        for seq, (key, value) in enumerate(items):
            self._entries[key] = (value, seq)
        self._next = len(self._entries)
        # since the mark: key -> its entry before its first change (None: it had none); None: no mark
        self._before: dict[str, tuple[V, int] | None] | None = None

    def __getitem__(self, key: str) -> V:
        return self._entries[key][0]

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str, default: V | None = None) -> V | None:  # type: ignore[override]
        entry = self._entries.get(key)
        return default if entry is None else entry[0]

    def _remember(self, key: str, entry: tuple[V, int] | None) -> None:
        if self._before is not None and key not in self._before:
            self._before[key] = entry

    def put(self, key: str, value: V) -> None:
        """Set `key` as the most recent entry; past the limit, the least recent one is forgotten."""
        self._remember(key, self._entries.get(key))
        self._entries[key] = (value, self._next)
        self._next += 1
        self._entries.move_to_end(key)
        if len(self._entries) > self.limit:
            old, entry = self._entries.popitem(last=False)
            self._remember(old, entry)

    def pop(self, key: str) -> None:
        """Forget `key` (KeyError if it is not remembered)."""
        entry = self._entries.pop(key)
        self._remember(key, entry)

    def mark(self) -> None:
        """From now on, `items_at_mark()` is the contents as of now (until the next mark)."""
        self._before = {}

    def items_at_mark(self) -> list[tuple[str, V]]:
        """The entries as of the last mark, least recent first (the current ones if never marked)."""
        if self._before is None:
            return [(key, value) for key, (value, _) in self._entries.items()]
        before = self._before
        kept = ((seq, key, value) for key, (value, seq) in self._entries.items() if key not in before)
        changed = sorted((e[1], key, e[0]) for key, e in before.items() if e is not None)  # numbers differ
        merged = heapq.merge(kept, changed, key=lambda t: t[0])
        return [(key, value) for _, key, value in merged]
