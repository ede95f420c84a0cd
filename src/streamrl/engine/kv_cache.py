"""A KV cache that writes each new token in place instead of re-concatenating the whole cache.

transformers' DynamicLayer does `torch.cat([keys, new])` per layer per token: every decode step copies
the entire cache (O(length) per step, O(length^2) per sequence), ~12% of a batch-64 step on SmolLM2 at
60 tokens and growing with length. `GrowingLayer` keeps a buffer with spare columns and hands attention
a view of the filled part; it doubles (up to `limit`) when full, so copies are O(length) per sequence.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer


class GrowingLayer(DynamicLayer):
    """keys / values: [B, H, L, D] views of buffers [B', H, capacity, D], B' >= B (rows that left keep
    their place in the buffer until a later row moves in or the buffer is replaced)."""

    def __init__(self, initial: int, limit: int) -> None:
        super().__init__()
        self.initial = initial
        self.limit = limit
        self.length = 0
        self.rows = 0  # the rows in use: the first `rows` of the buffers
        self._k: torch.Tensor | None = None
        self._v: torch.Tensor | None = None

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        new = key_states.shape[-2]
        end = self.length + new
        if self._k is None or end > self._k.shape[-2]:
            self._grow(key_states, value_states, end)
        assert self._k is not None and self._v is not None
        self.rows = key_states.shape[0]
        self._k[: self.rows, :, self.length : end].copy_(key_states)
        self._v[: self.rows, :, self.length : end].copy_(value_states)
        self.length = end
        self._views()
        return self.keys, self.values

    def _views(self) -> None:
        assert self._k is not None and self._v is not None
        self.keys, self.values = (
            self._k[: self.rows, :, : self.length],
            self._v[: self.rows, :, : self.length],
        )

    def _grow(self, key_states: torch.Tensor, value_states: torch.Tensor, needed: int) -> None:
        old = 0 if self._k is None else self._k.shape[-2]
        capacity = max(needed, min(max(self.initial, 2 * old), max(self.limit, needed)))
        b, h, _, d = key_states.shape
        k = key_states.new_empty(b, h, capacity, d)
        v = value_states.new_empty(b, value_states.shape[1], capacity, value_states.shape[-1])
        if self._k is not None and self._v is not None and self.length:
            k[:, :, : self.length].copy_(self._k[:b, :, : self.length])
            v[:, :, : self.length].copy_(self._v[:b, :, : self.length])
        self._k, self._v = k, v

    def get_seq_length(self) -> int:
        return self.length

    def batch_select_indices(self, indices: torch.Tensor, moved: torch.Tensor | None = None) -> None:
        """Row i becomes row indices[i] (a row repeated: copies). In place: only the rows whose index
        changes are copied, filled columns only (a decode step where one row of many finishes moves
        one row, not the cache); a new buffer, capacity kept, only when the rows outgrow it. moved:
        moved_rows(indices) if the caller has it (GrowingCache finds them once for every layer)."""
        if self._k is None or self._v is None:
            return
        m = len(indices)
        if m > self._k.shape[0]:
            k = self._k.new_empty(m, *self._k.shape[1:])
            v = self._v.new_empty(m, *self._v.shape[1:])
            k[:, :, : self.length] = self._k[indices, :, : self.length]
            v[:, :, : self.length] = self._v[indices, :, : self.length]
            self._k, self._v = k, v
        else:
            moved = moved_rows(indices) if moved is None else moved
            if len(moved):  # the sources are gathered before any row is overwritten
                src = indices[moved]
                self._k[moved, :, : self.length] = self._k[src, :, : self.length]
                self._v[moved, :, : self.length] = self._v[src, :, : self.length]
        self.rows = m
        self._views()

    def select_columns(self, rows: torch.Tensor, columns: torch.Tensor) -> None:
        """rows [R], columns [R, L']: row r of the result holds row rows[r]'s columns columns[r] (in that
        order), capacity kept. Keys carry their positions (rotary embeddings are applied before
        caching), so the order of a row's columns does not matter to attention, only its mask."""
        if self._k is None or self._v is None:
            return
        r, width = columns.shape
        for name in ("_k", "_v"):
            x = getattr(self, name)
            idx = columns[:, None, :, None].expand(r, x.shape[1], width, x.shape[-1])
            buf = x.new_empty(r, x.shape[1], max(x.shape[-2], width), x.shape[-1])
            buf[:, :, :width] = torch.gather(x[rows, :, : self.length], 2, idx)
            setattr(self, name, buf)
        self.length, self.rows = width, r
        self._views()

    def absorb(self, other: GrowingLayer, skip: int) -> int:
        """Append `other`'s rows below this layer's, both right-aligned (a row's newest column is the
        last); the shorter side is left-padded with zeros, which the caller's attention mask hides
        (zeros, not stale memory: a NaN there would reach the output through 0 * NaN). This layer's
        first `skip` columns are padding to every row. -> the columns actually dropped: `skip` when
        the buffers are rebuilt, 0 when `other`'s rows are written in place below this layer's (they
        fit in the spare rows and are no wider, and the dead columns are under a quarter of the
        width): then a join copies only the new rows, not the whole cache."""
        assert self._k is not None and self._v is not None and other._k is not None and other._v is not None
        a, b, theirs = self.rows, other.rows, other.length
        if self._k.shape[0] >= a + b and theirs <= self.length and 4 * skip < self.length:
            pad = self.length - theirs
            for x, y in ((self._k, other._k), (self._v, other._v)):
                x[a : a + b, :, :pad].zero_()
                x[a : a + b, :, pad : self.length].copy_(y[:b, :, :theirs])
            self.limit = max(self.limit, self.length + other.limit - other.length)
            self.rows = a + b
            self._views()
            return 0
        mine = self.length - skip
        width = max(mine, theirs)
        spare = max(self._k.shape[-2] - self.length, other._k.shape[-2] - other.length)
        for name in ("_k", "_v"):
            x, y = getattr(self, name), getattr(other, name)
            buf = x.new_empty(max(a + b, x.shape[0]), x.shape[1], width + spare, x.shape[-1])
            buf[: a + b, :, : width - min(mine, theirs)].zero_()
            buf[:a, :, width - mine : width] = x[:a, :, skip : self.length]
            buf[a : a + b, :, width - theirs : width] = y[:b, :, :theirs]
            setattr(self, name, buf)
        self.limit = width + max(self.limit - self.length, other.limit - other.length)
        self.length, self.rows = width, a + b
        self._views()
        return skip

    def reset(self) -> None:
        self._k = self._v = None
        self.length = self.rows = 0
        super().reset()

    def crop(self, tokens_to_remove: int) -> None:
        if tokens_to_remove < 0 and self._k is not None and self._v is not None:
            self.length = max(0, self.length + tokens_to_remove)
            self._views()

    def batch_repeat_interleave(self, repeats: int) -> None:
        raise NotImplementedError("GrowingLayer is for sampling, not beam search")


def moved_rows(indices: torch.Tensor) -> torch.Tensor:
    """The rows i with indices[i] != i: those batch_select_indices(indices) copies into."""
    return (indices != torch.arange(len(indices), device=indices.device)).nonzero().flatten()


class GrowingCache(DynamicCache):
    """A DynamicCache of GrowingLayers whose row selection finds the moved rows once, not per layer (on
    a GPU, `nonzero` waits for the device: once per step instead of once per layer)."""

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        moved = moved_rows(indices)
        for layer in self.layers:
            if isinstance(layer, GrowingLayer):
                layer.batch_select_indices(indices, moved)
            else:
                layer.batch_select_indices(indices)


def growing_cache(initial: int, limit: int) -> DynamicCache:
    """A GrowingCache: `initial` columns at first (prompt + a first share of the completion), doubling
    when full but not past `limit` (prompt + max_new_tokens) unless a write needs more."""
    cache = GrowingCache()
    cache.layer_class_to_replicate = lambda: GrowingLayer(initial, limit)  # type: ignore[assignment]
    return cache


def next_rows(parents: list[int], tokens: list[int], share: bool) -> tuple[list[int], list[int], list[int]]:
    """Row r continues cache row parents[r] with tokens[r] -> (rows, src, fed): the cache row of each row
    after this step, and for each such cache row the one it continues and the token it forwards. With
    `share` the rows that continue one cache row with one token share a cache row (those that drew
    different tokens fork it). A continuation stays in its parent's cache row where it can (its first one
    when the parent forks), the rest fill the rows that left: batch_select_indices(src) then moves only
    those."""
    if share:
        seqs: dict[tuple[int, int], int] = {}
        which = [seqs.setdefault(pt, len(seqs)) for pt in zip(parents, tokens)]
        pairs = list(seqs)
    else:
        which, pairs = list(range(len(parents))), list(zip(parents, tokens))
    m = len(pairs)
    slot, taken = [-1] * m, [False] * m
    for k, (parent, _) in enumerate(pairs):
        if parent < m and not taken[parent]:
            slot[k], taken[parent] = parent, True
    free = (i for i in range(m) if not taken[i])
    slot = [s if s >= 0 else next(free) for s in slot]
    src, fed = [0] * m, [0] * m
    for (parent, tok), s in zip(pairs, slot):
        src[s], fed[s] = parent, tok
    return [slot[k] for k in which], src, fed
