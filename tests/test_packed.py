"""Packed forwards (engine/packed.py): several batches' inputs in one pass of the layers compute what
each batch's own forward computes, a joining batch's held prefill leaves it as an ordinary prefill
would, and a model whose decoder does more than the packed loop is never packed."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from streamrl.engine import packed as packed_module
from streamrl.engine.base import Draft, GenRequest
from streamrl.engine.continuous import ContinuousDecoder, run_pending
from streamrl.engine.decode_batch import DecodeBatch
from streamrl.engine.hf import HFEngine
from streamrl.engine.kv_cache import growing_cache
from streamrl.engine.packed import Segment, packable, packed_hidden
from streamrl.models.cache_kwarg import cache_kwargs


def _decoder_alone(model, seg: Segment) -> torch.Tensor:
    decoder = model.get_decoder()
    out = decoder(
        input_ids=seg.ids,
        attention_mask=seg.mask,
        position_ids=seg.positions,
        use_cache=True,
        **cache_kwargs(decoder, seg.cache),
    )
    return out.last_hidden_state


def _cache_with(model, ids: torch.Tensor) -> object:
    """A cache holding the KV of ids [R, L] (no padding)."""
    cache = growing_cache(32, 64)
    pos = torch.arange(ids.shape[1]).expand_as(ids)
    _decoder_alone(
        model, Segment(ids, pos, torch.ones(ids.shape[0], 1, ids.shape[1], ids.shape[1]).tril().bool(), cache)
    )
    return cache


def _segments(model) -> list[Segment]:
    """A left-padded prefill (fresh cache; its padding queries see no key), a decode step of three rows
    over four cached columns, and a tree-like forward: six columns after a three-column prefix, each
    seeing the prefix and an arbitrary set of earlier new columns plus itself."""
    g = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    # more columns than SHORT_QUERIES (models/attention.py): the prefill's attention runs SDPA
    attn = torch.tensor([[0] * 6 + [1] * 14, [1] * 20])
    prefill = Segment(
        torch.randint(1, vocab, (2, 20), generator=g),
        (attn.cumsum(-1) - 1).clamp(min=0),
        torch.ones(20, 20).tril().bool()[None, None] & attn.bool()[:, None, None, :],
        growing_cache(32, 64),
    )
    decode = Segment(
        torch.randint(1, vocab, (3, 1), generator=g),
        torch.full((3, 1), 4),
        torch.ones(3, 1, 1, 5).bool(),
        _cache_with(model, torch.randint(1, vocab, (3, 4), generator=g)),
    )
    own = torch.rand(6, 6, generator=g) < 0.5
    tree = torch.cat([torch.ones(6, 3).bool(), (own.tril(-1) | torch.eye(6).bool())], 1)
    nodes = Segment(
        torch.randint(1, vocab, (1, 6), generator=g),
        torch.tensor([[3, 4, 4, 5, 5, 6]]),
        tree[None, None],
        _cache_with(model, torch.randint(1, vocab, (1, 3), generator=g)),
    )
    return [prefill, decode, nodes]


def test_packed_hidden_is_each_segments_own_forward(tiny):
    model = tiny[0].eval()
    alone = _segments(model)
    packed = _segments(model)  # the same inputs, caches of their own
    with torch.no_grad():
        want = [_decoder_alone(model, s) for s in alone]
        got = packed_hidden(model, packed, "cpu")
    for w, h, a, p in zip(want, got, alone, packed, strict=True):
        assert h.shape == w.shape
        real = a.mask.any(-1)[:, 0]  # left-padding queries see nothing: never read
        assert torch.allclose(h[real], w[real], atol=1e-5), float((h[real] - w[real]).abs().max())
        # every cache extended alike, at the columns of real tokens (a padding column's KV is never read)
        cols = torch.cat(
            [torch.ones(real.shape[0], a.cache.layers[0].length - real.shape[1]).bool(), real], 1
        )
        for la, lp in zip(a.cache.layers, p.cache.layers, strict=True):
            assert la.length == lp.length
            for x, y in ((la.keys, lp.keys), (la.values, lp.values)):
                assert torch.allclose(x.transpose(1, 2)[cols], y.transpose(1, 2)[cols], atol=1e-5)
    assert packable(model, "cpu", 0)


@torch.inference_mode()
def test_a_held_prefill_run_with_a_decode_step_leaves_both_batches_as_run_apart(tiny):
    """Two engines on one model and one seed: the first holds a joining batch's prefill and the running
    batch's decode step and runs them packed, the second runs each alone. Same sampled tokens, same
    logits, same KV caches."""
    model, tok = tiny
    # the joining prompts share a prefix (the prefix cache seeds it: the held prefill starts past it)
    system = "you are a calculator. reply with the answer. "
    prompts = [
        tok("12+3=").input_ids,
        tok(system + "12+3").input_ids,
        tok(system + "what is 7 times 8").input_ids,
    ]
    batches = []
    for hold in (True, False):
        engine = HFEngine(model, tok, max_batch=64, seed=5)
        running = DecodeBatch(engine, [GenRequest(prompts[0], 8, 1.0) for _ in range(3)])
        running.step()
        new = DecodeBatch(engine, [GenRequest(p, 8, 1.0) for p in prompts[1:]], hold=hold)
        assert engine.prefix_cache.prefix(model, prompts[1:], 0, "cpu") >= len(tok(system).input_ids)
        assert (new.pending is not None) == hold
        running.step(hold=hold)
        assert (running.pending is not None) == hold
        run_pending(engine, [running, new])
        assert running.pending is None and new.pending is None
        batches.append((running, new))
    (r1, n1), (r2, n2) = batches
    assert [r.token_ids for r in r1.results] == [r.token_ids for r in r2.results]
    for a, b in ((r1, r2), (n1, n2)):
        assert torch.allclose(a._logits, b._logits, atol=1e-4)
        assert a._logits_version == b._logits_version
        real = a.attn.bool()  # the columns of tokens (a padding column's KV is never read)
        assert torch.equal(real, b.attn.bool())
        for la, lb in zip(a.cache.layers, b.cache.layers, strict=True):
            assert la.length == lb.length
            assert torch.allclose(la.keys.transpose(1, 2)[real], lb.keys.transpose(1, 2)[real], atol=1e-5)


def _decoder_plus_one(model):
    """A copy of `model` whose decoder adds 1 to its output: more than the packed loop does."""
    odd = copy.deepcopy(model)
    vars(odd).pop("_streamrl_packable", None)  # the copy's own check, not the one it inherited
    decoder = odd.get_decoder()
    forward = decoder.forward

    def shifted(*args, **kwargs):
        out = forward(*args, **kwargs)
        out.last_hidden_state = out.last_hidden_state + 1
        return out

    decoder.forward = shifted
    return odd


def test_a_model_the_packed_loop_does_not_reproduce_is_not_packed(tiny):
    model, tok = tiny
    odd = _decoder_plus_one(model)
    engine = HFEngine(odd, tok, max_batch=64, seed=0)
    assert not engine.packs()
    sdpa = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=16,
            hidden_size=16,
            intermediate_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            num_key_value_heads=1,
        )
    )
    assert not packable(sdpa, "cpu", 0)  # its attention does not know packed masks
    # unpacked, a step with arrivals runs the prefill and then the decode step
    calls: list[int] = []
    hook = odd.get_input_embeddings().register_forward_pre_hook(lambda m, a: calls.append(a[0].numel()))
    try:
        dec = ContinuousDecoder(engine)
        dec.add([GenRequest(tok("1+1").input_ids, 4, 1.0)])
        dec.step()
        calls.clear()
        dec.add([GenRequest(tok("2+2=").input_ids, 4, 1.0)])
        dec.step()
        assert len(calls) == 2
    finally:
        hook.remove()


def test_a_model_whose_layers_fail_on_packed_inputs_runs_unpacked(tiny, monkeypatch):
    """Any error of the one-time check (a layer of another architecture that takes other arguments)
    leaves the model unpacked, not the worker failed."""
    model, tok = tiny
    odd = copy.deepcopy(model)
    vars(odd).pop("_streamrl_packable", None)

    def unknown(*args, **kwargs):
        raise KeyError("a layer argument the packed loop does not pass")

    monkeypatch.setattr(packed_module, "packed_hidden", unknown)
    assert not HFEngine(odd, tok, max_batch=8).packs()


def _assert_full_sequence_logprobs(model, results) -> None:
    """Every token's recorded log-prob is the model's on the whole sequence (prompt + tokens before)."""
    for r in results:
        ids = torch.tensor([r.request.prompt_ids + r.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(r.request.prompt_ids) - 1 : -1]
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(ref, torch.tensor(r.logprobs), atol=1e-4)


@pytest.mark.parametrize("pack", [True, False])
def test_every_token_of_joined_requests_is_the_full_sequences_logprob(tiny, pack):
    model, tok = tiny
    engine = HFEngine(model, tok, max_batch=64, seed=3, pack=pack)
    assert engine.packs() == pack
    dec = ContinuousDecoder(engine)
    prompts = [tok(t).input_ids for t in ("1+1", "what is 12+30?", "7*8=", "hello")]
    out = []
    for step in range(40):
        if step < len(prompts):
            dec.add([GenRequest(prompts[step], 6, 1.0, tag=step) for _ in range(2)])
        out += dec.step()
        if dec.idle:
            break
    assert sorted(r.request.tag for r in out) == [0, 0, 1, 1, 2, 2, 3, 3]
    _assert_full_sequence_logprobs(model, out)


def test_a_join_step_runs_the_lm_head_once_for_the_running_rows_the_prompt_and_its_tree(tiny, monkeypatch):
    """Each LM-head product streams the whole head: a step where a prompt with drafts joins a running
    batch computes the running rows' logits, the prompt's and every tree node's in one product, and
    the tokens are still the full sequences' log-probs."""
    from streamrl.engine import continuous, speculative

    model, tok = tiny
    engine = HFEngine(model, tok, max_batch=64, seed=3, pack=True, branch_min=1)
    dec = ContinuousDecoder(engine)
    dec.add([GenRequest(tok("1+1").input_ids, 6, 1.0, tag="running") for _ in range(2)])
    out = dec.step()  # the running batch's prefill
    heads, segments = [], []
    head, pack = continuous.head_logits, continuous.packed_hidden
    monkeypatch.setattr(continuous, "head_logits", lambda m, h: heads.append(len(h)) or head(m, h))
    monkeypatch.setattr(speculative, "head_logits", lambda m, h: heads.append(-1) or head(m, h))
    monkeypatch.setattr(
        continuous,
        "packed_hidden",
        lambda m, segs, d: segments.extend(s.ids.shape for s in segs) or pack(m, segs, d),
    )
    drafts = tuple(Draft((t, 40, u), (-1.0, -1.0, -1.0)) for t, u in ((30, 41), (30, 42), (31, 43)))
    dec.add([GenRequest(tok("7*8=").input_ids, 6, 1.0, drafts=drafts, tag="joining") for _ in range(2)])
    out += dec.step()
    (running, _), (prompts, columns) = segments  # the running rows' decode step, the prompt's prefill
    nodes = 7  # 30, 31; 30 40, 31 40; 30 40 41, 30 40 42, 31 40 43
    assert prompts == 1 and columns == len(tok("7*8=").input_ids) + nodes
    assert heads == [running + prompts + nodes]
    monkeypatch.undo()
    for _ in range(20):
        out += dec.step()
        if dec.idle:
            break
    assert sorted(r.request.tag for r in out) == ["joining"] * 2 + ["running"] * 2
    _assert_full_sequence_logprobs(model, out)
