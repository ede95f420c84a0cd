"""Prompt prefix caching (engine/prefix_cache.py): the KV of the prefix a batch's prompts share is computed
once per set of weights and reused; responses, log-probs and versions are those of full prefills."""

import copy

import pytest
import torch

from streamrl.engine.base import Draft, GenRequest
from streamrl.engine.continuous import ContinuousDecoder
from streamrl.engine.decode_batch import DecodeBatch
from streamrl.engine.hf import HFEngine
from streamrl.engine.prefix_cache import MIN_PREFIX, shared_length

SYSTEM = "<|im_start|>system\nYou are a calculator. Reply in the form 'The answer is <number>.'<|im_end|>\n"


def _prompt(tok, question: str) -> list[int]:
    return tok(f"{SYSTEM}<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n").input_ids


@pytest.fixture
def tiny64(tiny):
    """The tiny model in float64: a prefix computed apart and a full prefill agree to ~1e-15, so seeded
    draws from the two are the same tokens."""
    model, tok = tiny
    return copy.deepcopy(model).double(), tok


def _prefill_tokens(model) -> tuple[list[tuple[int, int]], object]:
    """Records (rows, columns) of every forward of the decoder, the LM head's included or not (a
    DecodeBatch's construction prefills, decodes nothing)."""
    shapes: list[tuple[int, int]] = []

    def hook(module, args, kwargs):
        shapes.append(tuple(kwargs["input_ids"].shape))

    return shapes, model.get_decoder().register_forward_pre_hook(hook, with_kwargs=True)


def test_shared_length():
    assert shared_length([1, 2, 3, 4], [[1, 2, 3, 9], [1, 2, 7]]) == 2
    assert shared_length([1, 2], [[1, 2, 3]]) == 2
    assert shared_length([], [[1]]) == 0
    assert shared_length([5], [[1, 2], [5]]) == 0


def test_prefix_is_computed_once_per_weights_and_only_the_rest_is_prefilled(tiny64):
    model, tok = tiny64
    eng = HFEngine(model, tok, seed=0)
    prompts = [_prompt(tok, f"{a} + {a + 3} =") for a in range(1, 6)]
    p = shared_length(prompts[0], prompts[1:])
    assert p >= MIN_PREFIX
    shapes, hook = _prefill_tokens(model)
    heads: list[int] = []  # the prefix's logits are never used: its forward skips the head
    head_hook = model.get_output_embeddings().register_forward_pre_hook(lambda m, a: heads.append(1))
    try:
        for i, prompt in enumerate(prompts[:3]):
            DecodeBatch(eng, [GenRequest(prompt, 4, 1.0, 1.0, i)] * 4)  # one group: one distinct prompt
        assert len(heads) == 3
        # first batch: nothing to share with yet; second: the prefix found with the first, computed
        # (one row of p tokens) and the rest prefilled; third: the rest only
        full = len(prompts[0])
        assert shapes == [(1, full), (1, p), (1, len(prompts[1]) - p), (1, len(prompts[2]) - p)]
        assert eng.prefix_cache.hits == 1
        shapes.clear()
        eng.update_weights(None, version=1)  # new weights: the prefix is computed again, once
        DecodeBatch(eng, [GenRequest(prompts[3], 4, 1.0, 1.0, 0)])
        DecodeBatch(eng, [GenRequest(prompts[4], 4, 1.0, 1.0, 0)])
        assert shapes == [(1, p), (1, len(prompts[3]) - p), (1, len(prompts[4]) - p)]
        shapes.clear()
        with torch.no_grad():  # weights changed under the engine, version unchanged (a shared module)
            next(model.parameters()).add_(0.01)
        DecodeBatch(eng, [GenRequest(prompts[3], 4, 1.0, 1.0, 0)])
        assert shapes == [(1, p), (1, len(prompts[3]) - p)]
        assert len(heads) == 6
    finally:
        hook.remove()
        head_hook.remove()


def test_a_batch_of_several_prompts_finds_their_prefix_and_every_row_forwards_a_token(tiny64):
    model, tok = tiny64
    eng = HFEngine(model, tok, seed=0)
    a, b = _prompt(tok, "1 + 2 ="), _prompt(tok, "3 + 4 =")
    p = shared_length(a, [b])
    shapes, hook = _prefill_tokens(model)
    try:
        DecodeBatch(eng, [GenRequest(a, 4, 1.0, 1.0, 0), GenRequest(b, 4, 1.0, 1.0, 1)])
        assert shapes == [(1, p), (2, len(a) - p)]
        shapes.clear()
        # a prompt that is the cached prefix and one token more: that token is still forwarded
        short = a[: p + 1]
        DecodeBatch(eng, [GenRequest(short, 4, 1.0, 1.0, 0), GenRequest(a, 4, 1.0, 1.0, 1)])
        assert shapes == [(2, len(a) - p)]
        shapes.clear()
        DecodeBatch(eng, [GenRequest(a[:p], 4, 1.0, 1.0, 0)])  # the prefix itself: its last token forwards
        assert shapes == [(1, 1)]
        shapes.clear()
        other = tok("something else entirely, with no template at all").input_ids
        DecodeBatch(eng, [GenRequest(other, 4, 1.0, 1.0, 0)])  # shares nothing: a plain prefill
        assert shapes == [(1, len(other))]
    finally:
        hook.remove()


def _requests(tok, drafts: bool = False) -> list[GenRequest]:
    out = []
    for i, q in enumerate(["1 + 2 =", "30 - 4 =", "7 * 8 =", "2 + 2 ="]):
        prompt = _prompt(tok, q)
        ids = tuple(tok(" The answer is 3.<|im_end|>").input_ids)
        d = (Draft(ids, (-1.0,) * len(ids)),) if drafts else ()
        for temperature, top_p in ((1.0, 1.0), (0.7, 0.9), (0.0, 1.0)):
            out.append(GenRequest(prompt, 10, temperature, top_p, (i, temperature), drafts=d))
    return out


@pytest.mark.parametrize("drafts", [False, True])
@pytest.mark.parametrize("mode", ["inflight", "interrupt"])
def test_responses_are_those_of_full_prefills(tiny64, drafts, mode):
    """The continuous decoder (requests arriving in several batches, joined to the running one, a weight
    update part-way, drafts verified) draws the same tokens with the same log-probs and versions with
    and without the prefix cache."""
    model, tok = tiny64
    out = {}
    for cached in (True, False):
        m = copy.deepcopy(model)
        eng = HFEngine(m, tok, seed=3, prefix_cache=cached)
        dec = ContinuousDecoder(eng, mode)
        reqs = _requests(tok, drafts)
        results, steps = [], 0
        for start in range(0, len(reqs), 3):
            dec.add(reqs[start : start + 3])
            results += dec.step()
            steps += 1
            if steps == 3:
                with torch.no_grad():
                    for prm in m.parameters():
                        prm.mul_(1.05)
                dec.update_weights(None, version=1)
        while not dec.idle:
            results += dec.step()
        out[cached] = sorted(results, key=lambda r: r.request.tag)
        if cached:  # batches after the first take the prefix; the weight update recomputes it
            assert eng.prefix_cache.hits >= 1 and eng.prefix_cache.key[0] == 1
    assert len(out[True]) == len(out[False]) == 12
    for a, b in zip(out[True], out[False]):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-9)
        assert a.versions == b.versions and a.finish_reason == b.finish_reason


def test_logits_after_a_cached_prefix_match_a_full_prefill(tiny64):
    model, tok = tiny64
    prompts = [_prompt(tok, q) for q in ("1 + 2 =", "30 - 4 =", "7 * 8 =")]
    logits = {}
    for cached in (True, False):
        eng = HFEngine(model, tok, seed=0, prefix_cache=cached)
        with torch.inference_mode():
            DecodeBatch(eng, [GenRequest(prompts[0], 4, 1.0, 1.0, 0)])  # warms the cache
            batch = DecodeBatch(eng, [GenRequest(p, 4, 1.0, 1.0, i) for i, p in enumerate(prompts[1:])])
        logits[cached] = batch._logits
        if cached:  # the second batch computed the prefix with the first prompt and forwarded the rest
            assert len(eng.prefix_cache.tokens) == shared_length(prompts[0], prompts[1:]) >= MIN_PREFIX
    torch.testing.assert_close(logits[True], logits[False], rtol=0, atol=1e-10)


class _Built(Exception):
    pass


@pytest.mark.parametrize("on", [True, False])
def test_rollout_engine_settings_reach_the_engine_of_the_job_and_of_a_rollout_worker(monkeypatch, on):
    """rollout.prefix_cache and rollout.spec_branch_min (engine/speculative.py's tree cut)."""
    from tiny_args import TINY  # tests/ is on sys.path

    from streamrl.config import load_config, to_dict
    from streamrl.engine import hf
    from streamrl.loop import job
    from streamrl.rollout.worker import serve

    branch_min = 3 if on else 1
    cfg = load_config(
        None,
        [
            *TINY,
            f"rollout.prefix_cache={str(on).lower()}",
            "rollout.spec_drafts=4",
            f"rollout.spec_branch_min={branch_min}",
        ],
    )
    engine = job.build_components(cfg).engine
    assert (engine.prefix_cache is not None, engine.branch_min) == (on, branch_min)
    built, errors, real = [], [], hf.HFEngine

    def engine(*args, **kwargs):  # the worker's engine: recorded, then the worker stops
        built.append(real(*args, **kwargs))
        raise _Built

    monkeypatch.setattr(hf, "HFEngine", engine)
    sink = type("Sink", (), {"put": lambda self, r: errors.append(r.error)})()
    serve(0, to_dict(cfg), None, sink, None, lambda: True)
    assert len(built) == 1 and "_Built" in errors[0]
    assert (built[0].prefix_cache is not None, built[0].branch_min) == (on, branch_min)
