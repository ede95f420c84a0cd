"""A chat call's stop sequences: the completion is cut after the fewest tokens whose text holds one."""

from __future__ import annotations

import math
import random

from streamrl.envs.chat_completion import cut_at_stop


def _reference(tok, ids: list[int], stops: list[str]) -> tuple[int, str] | None:
    """The definition, token by token."""
    for k in range(1, len(ids) + 1):
        text = tok.decode(ids[:k], skip_special_tokens=True)
        hits = [text.find(s) for s in stops if s in text]
        if hits:
            return k, text[: min(hits)]
    return None


class _Counting:
    def __init__(self, tok):
        self.tok, self.decodes = tok, 0

    def decode(self, ids, **kw):
        self.decodes += 1
        return self.tok.decode(ids, **kw)


def test_the_cut_is_the_fewest_tokens_holding_a_stop_sequence(tiny):
    _, tok = tiny
    rng = random.Random(0)
    for _ in range(200):
        text = "".join(rng.choice("ab \n") for _ in range(rng.randint(1, 60)))
        ids = tok(text, add_special_tokens=False).input_ids
        stops = rng.sample(["ab", "b\n", "  ", "aaa", "\n\n"], rng.randint(1, 3))
        assert cut_at_stop(tok, ids, stops) == _reference(tok, ids, stops), (text, stops)
    assert cut_at_stop(tok, tok("abc", add_special_tokens=False).input_ids, []) is None


def test_a_long_completion_is_cut_in_a_logarithmic_number_of_decodes(tiny):
    _, tok = tiny
    ids = tok("x" * 2047 + "!", add_special_tokens=False).input_ids
    counting = _Counting(tok)
    k, text = cut_at_stop(counting, ids, ["!"])
    assert (k, text) == (len(ids), "x" * 2047)
    assert counting.decodes <= 2 + math.ceil(math.log2(len(ids)))  # 2048 tokens one by one: 2048
