"""A request never decodes past the model's context: its completion is cut to the positions left, and a
prompt that fills the context finishes at once, in one-shot generation and in continuous decoding."""

import copy

import pytest

from streamrl.engine.base import GenRequest, generate, model_context, within_context
from streamrl.engine.continuous import ContinuousDecoder
from streamrl.engine.hf import HFEngine


def _engine(tiny, context: int) -> HFEngine:
    model = copy.deepcopy(tiny[0])
    model.config.max_position_embeddings = context
    engine = HFEngine(model, tiny[1], max_batch=4, seed=0)
    engine.stop_ids = set()  # every row runs to its limit
    return engine


def test_within_context_cuts_the_completion_to_the_positions_left():
    req = GenRequest(list(range(10)), max_new_tokens=8)
    assert within_context(req, None) is req and within_context(req, 18) is req
    assert within_context(req, 15).max_new_tokens == 5
    assert within_context(req, 10).max_new_tokens == 0 and within_context(req, 7).max_new_tokens == 0
    assert req.max_new_tokens == 8  # the caller's request is not changed


def test_model_context_reads_the_config(tiny):
    assert model_context(tiny[0].config) == tiny[0].config.max_position_embeddings > 0
    assert model_context(object()) is None


def test_generation_stops_at_the_models_context(tiny):
    engine = _engine(tiny, 20)
    prompts = [list(range(5, 17)), list(range(5, 25)), list(range(5, 10))]  # 12, 20 and 5 tokens
    out = generate(engine, [GenRequest(p, max_new_tokens=10) for p in prompts])
    assert [len(r.token_ids) for r in out] == [8, 0, 10]
    assert [r.finish_reason for r in out] == ["length", "length", "length"]
    assert [len(r.request.prompt_ids) + len(r.token_ids) for r in out] == [20, 20, 15]


def test_an_empty_prompt_is_refused_before_it_joins_a_batch(tiny):
    dec = ContinuousDecoder(_engine(tiny, 20))
    with pytest.raises(ValueError, match="GenRequest.prompt_ids is empty: give every request a prompt"):
        dec.add([GenRequest(list(range(5, 9)), max_new_tokens=2), GenRequest([], max_new_tokens=3)])
    assert dec.idle  # nothing of the refused call was queued
    dec.add([GenRequest(list(range(5, 9)), max_new_tokens=2)])
    done = []
    while not dec.idle:
        done += dec.step()
    assert [len(r.token_ids) for r in done] == [2]


def test_continuous_decoding_stops_at_the_models_context(tiny):
    dec = ContinuousDecoder(_engine(tiny, 20))
    dec.add([GenRequest(list(range(5, 25)), max_new_tokens=10, tag="full")])
    dec.add([GenRequest(list(range(5, 17)), max_new_tokens=10, tag="cut")])
    done, steps = {}, 0
    while not dec.idle and steps < 50:  # bounded: a request never returned must fail, not hang
        for res in dec.step():
            done[res.request.tag] = res
        steps += 1
    assert {t: len(r.token_ids) for t, r in done.items()} == {"full": 0, "cut": 8}
    assert done["full"].finish_reason == "length" and steps == 8
