"""Requests that join together (engine/joins.py, engine/continuous.py): where the engine packs, each
prompt with a draft tree gets a prefill rectangle of its own columns (its prompt and its own tree, not
the longest prompt and the largest tree of the join), the rectangles run in one forward with the
running batch's step, the running batch takes them in one merge, and every token is still the full
sequence's log-prob. The exactness of such joins is tests/test_speculative_batches.py's."""

from __future__ import annotations

import pytest
from test_packed import _assert_full_sequence_logprobs  # tests/ is on sys.path (rootdir conftest)

from streamrl.engine import continuous
from streamrl.engine.base import Draft, GenRequest
from streamrl.engine.continuous import ContinuousDecoder
from streamrl.engine.decode_batch import DecodeBatch
from streamrl.engine.hf import HFEngine
from streamrl.engine.joins import buckets, join_groups, padding

# a tree of 7 nodes (branch_min 1): 30, 31; 30 40, 31 40; 30 40 41, 30 40 42, 31 40 43
BIG = tuple(Draft((t, 40, u), (-1.0, -1.0, -1.0)) for t, u in ((30, 41), (30, 42), (31, 43)))
SMALL = (Draft((50, 51), (-1.0, -1.0)),)  # a tree of 2 nodes


def test_padding_and_buckets():
    """A prompt joins the last batch while the padding it adds is under `slack` columns."""
    assert padding([(5, 7), (9, 2)]) == 2 * (9 + 7) - (12 + 11)
    sizes = [(4, 10), (4, 10), (5, 10), (9, 0), (3, 40)]
    assert buckets(sizes) == [[3], [0, 1], [2], [4]]  # (5, 10) would add 2 columns to (4, 10) x 2
    assert buckets(sizes, slack=3) == [[3], [0, 1, 2], [4]]
    assert buckets([(6, 3)]) == [[0]] and buckets([]) == []


def test_join_groups_keep_a_prompts_rows_together_and_plain_joins_whole():
    a, b = [7, 8, 9], [7, 8, 9, 10, 11]
    reqs = [GenRequest(a, 6, 1.0, drafts=BIG), GenRequest(b, 6, 1.0, drafts=SMALL), GenRequest(a, 6, 1.0)]
    assert join_groups(reqs, 1) == [[reqs[1]], [reqs[0], reqs[2]]]  # by columns: 5 + 2, then 3 + 7
    plain = [GenRequest(a, 6, 1.0), GenRequest(b, 6, 1.0)]
    assert join_groups(plain, 1) == [plain]
    greedy = [GenRequest(a, 6, 0.0, drafts=BIG), GenRequest(b, 6, 0.0, drafts=SMALL)]  # take no drafts
    assert join_groups(greedy, 1) == [greedy]


def _spy(monkeypatch) -> tuple[list[list[tuple[int, int]]], list[DecodeBatch]]:
    """The packed forwards' segment shapes, and the batch each merge went into."""
    forwards: list[list[tuple[int, int]]] = []
    into: list[DecodeBatch] = []
    pack, merge = continuous.packed_hidden, DecodeBatch.merge
    monkeypatch.setattr(
        continuous,
        "packed_hidden",
        lambda m, segs, d: forwards.append([tuple(s.ids.shape) for s in segs]) or pack(m, segs, d),
    )
    monkeypatch.setattr(DecodeBatch, "merge", lambda self, other: into.append(self) or merge(self, other))
    return forwards, into


def _joining(tok) -> tuple[list[GenRequest], list[tuple[int, int]]]:
    """Two prompts of different lengths, one with a large tree, one with a small one -> the requests
    and each prompt's own prefill rectangle."""
    short, long = tok("7*8=").input_ids, tok("what is 12+30? say it").input_ids
    reqs = [GenRequest(short, 6, 1.0, drafts=BIG, tag="big") for _ in range(2)]
    reqs += [GenRequest(long, 6, 1.0, drafts=SMALL, tag="small") for _ in range(2)]
    return reqs, [(1, len(short) + 7), (1, len(long) + 2)]


def _finish(dec: ContinuousDecoder, out: list) -> list:
    for _ in range(30):
        out += dec.step()
        if dec.idle:
            break
    return out


def test_prompts_joining_a_running_batch_prefill_their_own_columns_in_its_forward(tiny, monkeypatch):
    model, tok = tiny
    engine = HFEngine(model, tok, max_batch=64, seed=3, pack=True, branch_min=1)
    dec = ContinuousDecoder(engine)
    dec.add([GenRequest(tok("1+1").input_ids, 6, 1.0, tag="running") for _ in range(2)])
    out = dec.step()
    host = dec.batches[0]
    forwards, into = _spy(monkeypatch)
    reqs, own = _joining(tok)
    dec.add(reqs)
    out += dec.step()
    (forward,) = forwards  # the running rows' step and both prefills: one forward
    (running, one), *prefills = forward
    assert one == 1 and sorted(prefills) == sorted(own)
    assert into.count(host) == 1 and dec.batches == [host]  # the joining batches merged first
    monkeypatch.undo()
    out = _finish(dec, out)
    assert sorted(r.request.tag for r in out) == ["big"] * 2 + ["running"] * 2 + ["small"] * 2
    _assert_full_sequence_logprobs(model, out)


def test_prompts_joining_no_running_batch_prefill_in_one_packed_forward(tiny, monkeypatch):
    model, tok = tiny
    engine = HFEngine(model, tok, max_batch=64, seed=3, pack=True, branch_min=1)
    dec = ContinuousDecoder(engine)
    forwards, _ = _spy(monkeypatch)
    reqs, own = _joining(tok)
    dec.add(reqs)
    out = dec.step()
    assert [sorted(f) for f in forwards] == [sorted(own)]
    assert len(dec.batches) == 1 and engine.decode_rows > 0  # one batch, which stepped at once
    monkeypatch.undo()
    out = _finish(dec, out)
    assert sorted(r.request.tag for r in out) == ["big"] * 2 + ["small"] * 2
    _assert_full_sequence_logprobs(model, out)


@pytest.mark.parametrize("running", [True, False])
def test_plain_prompts_join_as_one_batch(tiny, monkeypatch, running):
    """Without drafts the join is as it was: one rectangle of every prompt (prefilled alone when no
    batch runs)."""
    model, tok = tiny
    engine = HFEngine(model, tok, max_batch=64, seed=3, pack=True)
    dec = ContinuousDecoder(engine)
    if running:
        dec.add([GenRequest(tok("1+1").input_ids, 6, 1.0) for _ in range(2)])
        dec.step()
    forwards, _ = _spy(monkeypatch)
    prompts = [tok("7*8=").input_ids, tok("what is 12+30? say it").input_ids]
    dec.add([GenRequest(p, 6, 1.0) for p in prompts])
    dec.step()
    width = max(map(len, prompts))
    assert [f[1:] for f in forwards] == ([[(2, width)]] if running else [])
