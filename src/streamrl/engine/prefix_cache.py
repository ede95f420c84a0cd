"""Prompt prefix caching: the KV of the tokens a task's prompts all start with, computed once per weights.

A task's prompts share their chat template's opening (the system prompt, the instruction, few-shot
examples): in the default job 37 of about 49 prompt tokens. Prefilling them for every request computes
the same keys and values again and again. The engine keeps the KV of one such prefix; a batch whose
prompts all start with it prefills only what follows, laid out as

    [prefix: P columns, the same KV in every row][left padding][the rest of the prompt]

(the attention mask hides the padding; positions count real tokens, so every token sits at the same
position as in a plain left-padded prefill and the logits are those of a full prefill, up to the
floating-point order of a smaller GEMM).

Which prefix: the longest one the batch's prompts share with the cached prefix, if that is at least
MIN_PREFIX tokens; otherwise the longest one they share with each other or with the previous batch's
first prompt (a new task, a new template), which is then computed and cached. Every row keeps at least
one token of its own to forward (its logits come from it).

The KV belongs to the weights that computed it: it is recomputed when the weights change, checked by
the engine's policy version and by the parameters themselves (their in-place version counters and
storage), so weights changed under the engine (a shared module the trainer steps) are never mixed
with a prefix computed before.
"""

from __future__ import annotations

from typing import Any

import torch

from streamrl.engine.base import MIN_PREFIX
from streamrl.engine.kv_cache import growing_cache
from streamrl.models.cache_kwarg import cache_kwargs


def shared_length(ref: list[int], prompts: list[list[int]]) -> int:
    """How many leading tokens `ref` and every prompt have in common."""
    n = len(ref)
    for p in prompts:
        n = min(n, len(p))
        for i in range(n):
            if p[i] != ref[i]:
                n = i
                break
    return n


def weights_key(model: torch.nn.Module, version: int) -> tuple[int, int, int]:
    """Changes whenever the weights do: the engine's version, the parameters' in-place update counters
    (an optimizer step, load_state_dict) and their storage (parameters replaced)."""
    params = list(model.parameters())
    return version, sum(p._version for p in params), sum(p.data_ptr() for p in params)


class PrefixCache:
    """The KV of one prompt prefix under one set of weights; `hits` counts the batches it served as it was."""

    def __init__(self) -> None:
        self.tokens: list[int] = []
        self.kv: list[tuple[torch.Tensor, torch.Tensor]] = []  # per layer: keys, values [1, Hkv, P, D]
        self.key: tuple[int, int, int] | None = None
        self.last: list[int] = []  # the previous batch's first prompt: where a new prefix is found
        self.hits = 0

    def prefix(self, model: torch.nn.Module, prompts: list[list[int]], version: int, device: Any) -> int:
        """The length P of the cached prefix `prompts` (the batch's distinct sequences) start with, after
        (re)computing it if needed; 0 when they share none of at least MIN_PREFIX tokens."""
        cap = min(len(p) for p in prompts) - 1  # every row forwards at least its last token
        last, self.last = self.last, list(prompts[0])
        key = weights_key(model, version)
        n = min(shared_length(self.tokens, prompts), cap)
        if n < MIN_PREFIX:  # the cached prefix does not serve this batch: look for a new one
            refs = [last] + ([prompts[0]] if len(prompts) > 1 else [])
            n = min(max(shared_length(r, prompts) for r in refs), cap)
            if n < MIN_PREFIX:
                return 0
            self._compute(model, prompts[0][:n], key, device)
        elif self.key != key:  # new weights: the same prefix, recomputed
            self._compute(model, self.tokens[:n], key, device)
        else:
            self.hits += 1
        return n

    @torch.no_grad()
    def _compute(
        self, model: torch.nn.Module, tokens: list[int], key: tuple[int, int, int], device: Any
    ) -> None:
        cache = growing_cache(len(tokens), len(tokens))
        ids = torch.tensor([tokens], device=device)
        decoder = model.get_decoder()  # the KV is all it keeps: no LM head
        decoder(
            input_ids=ids,
            attention_mask=torch.ones_like(ids),
            position_ids=torch.arange(len(tokens), device=device)[None],
            **cache_kwargs(decoder, cache),
            use_cache=True,
        )
        self.tokens, self.key = list(tokens), key
        self.kv = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]

    def seed(self, cache: Any, n: int, rows: int) -> None:
        """Write the first n columns of the prefix's KV into every one of `rows` rows of an empty cache."""
        for i, (k, v) in enumerate(self.kv):
            cache.update(k[:, :, :n].expand(rows, -1, -1, -1), v[:, :, :n].expand(rows, -1, -1, -1), i)
