"""In-flight and interrupt weight updates stamp the right policy version on every token."""

import copy

import pytest
import torch

from streamrl.engine.base import GenRequest
from streamrl.engine.continuous import ContinuousDecoder
from streamrl.engine.hf import DecodeBatch, HFEngine


def _two_policies(tiny):
    """(a copy of the tiny model, the same with every weight x 1.5: the next version's weights)."""
    model = copy.deepcopy(tiny[0])
    new = copy.deepcopy(model)
    with torch.no_grad():
        for p in new.parameters():
            p.mul_(1.5)
    return model, new


def _run(tiny, mode: str, update_after: int):
    (model, new), tok = _two_policies(tiny), tiny[1]
    engine = HFEngine(model, tok, max_batch=4, seed=0)
    engine.stop_ids = set()  # run every row to max_new_tokens: a fixed script
    dec = ContinuousDecoder(engine, mode)
    prompts = [tok("12+3=").input_ids, tok("hello there").input_ids]
    dec.add([GenRequest(p, max_new_tokens=6, temperature=1.0) for p in prompts])
    out, steps = [], 0
    while not dec.idle:
        if steps == update_after:
            model.load_state_dict(new.state_dict())
            dec.update_weights(None, version=1)
        out.extend(dec.step())
        steps += 1
    return out, new


def test_inflight_keeps_cache_and_stamps_the_logits_version(tiny):
    out, _ = _run(tiny, "inflight", update_after=2)
    # tokens 1-2 sampled before the update; token 3 from logits computed before it (old KV, old
    # weights) -> version 0; tokens 4-6 from forwards with the new weights -> version 1
    assert [r.versions for r in out] == [[0, 0, 0, 1, 1, 1]] * 2


def test_interrupt_recomputes_so_the_next_token_is_new(tiny):
    out, new = _run(tiny, "interrupt", update_after=2)
    assert [r.versions for r in out] == [[0, 0, 1, 1, 1, 1]] * 2
    # after the recompute every new token's log-prob is exactly the new policy's on the full sequence
    for r in out:
        ids = torch.tensor([r.request.prompt_ids + r.token_ids])
        with torch.no_grad():
            logits = new(ids).logits[0, len(r.request.prompt_ids) - 1 : -1]
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(ref[2:], torch.tensor(r.logprobs[2:]), atol=1e-4)
        assert not torch.allclose(ref[:2], torch.tensor(r.logprobs[:2]), atol=1e-4)


def test_unknown_mode():
    with pytest.raises(ValueError, match="unknown weight update mode 'lazy'"):
        ContinuousDecoder(None, "lazy")  # type: ignore[arg-type]


def _full_forward_logprobs(model, r, temperature: float = 1.0) -> torch.Tensor:
    ids = torch.tensor([r.request.prompt_ids + r.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(r.request.prompt_ids) - 1 : -1] / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids)[:, None]).squeeze(-1)


def test_requests_arriving_while_a_batch_runs_join_it_and_decode_as_if_alone(tiny):
    """One forward per step whatever the arrivals: later requests (a longer prompt, then shorter ones)
    are prefilled and merged into the running batch; every token's log-prob is the full sequence's,
    and the columns only departed rows needed are dropped at the next merge."""
    (model, new), tok = _two_policies(tiny), tiny[1]
    engine = HFEngine(model, tok, max_batch=16, seed=0)
    engine.stop_ids = set()
    dec = ContinuousDecoder(engine, "inflight")
    short, long = tok("1+1").input_ids, tok("<|im_start|>user\nwhat is 12+30?<|im_end|>\n").input_ids
    # tag -> (prompt, max_new_tokens, arrival step); the weights change before step 4
    plan = {"A": (short, 10, 0), "B": (long, 3, 2), "C": (short, 5, 4), "D": (short, 3, 6)}
    calls: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: calls.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    out, per_step = [], []
    try:
        for step in range(12):
            if step == 4:
                model.load_state_dict(new.state_dict())
                dec.update_weights(None, version=1)
            for tag, (prompt, n, at) in plan.items():
                if at == step:
                    dec.add([GenRequest(prompt, n, 1.0, tag=tag) for _ in range(3 if tag == "B" else 2)])
            before = len(calls)
            out.extend(dec.step())
            per_step.append(calls[before:])
            assert len(dec.batches) <= 1
            if step == 6:  # A and C are left, each behind padding that B's wider prompt needed
                b = dec.batches[0]
                real = [len(b.results[i].request.prompt_ids) + len(b.results[i].token_ids) for i in b.active]
                assert b.attn.shape[1] == max(real)
    finally:
        hook.remove()
    assert dec.idle and len(out) == 9
    # arrivals add one prefill forward (the prompt's columns) to the step's one decode forward
    assert [len(c) for c in per_step] == [2, 1, 2, 1, 2, 1, 2, 1, 1, 0, 0, 0]
    assert [per_step[s][0] for s in (0, 2, 4, 6)] == [len(short), len(long), len(short), len(short)]
    assert all(c[-1] == 1 for c in per_step if c)
    old_tokens = {"A": 4 - 0 + 1, "B": 4 - 2 + 1, "C": 0, "D": 0}  # sampled at steps before 5 from old logits
    for r in out:
        tag = r.request.tag
        k = old_tokens[tag]
        assert len(r.token_ids) == plan[tag][1]
        assert r.versions == [0] * k + [1] * (len(r.token_ids) - k)
        ref_old = _full_forward_logprobs(tiny[0], r)
        assert torch.allclose(ref_old[:k], torch.tensor(r.logprobs[:k]), atol=1e-4)
        if k == 0:  # prefilled and decoded on the new weights only
            assert torch.allclose(_full_forward_logprobs(new, r), torch.tensor(r.logprobs), atol=1e-4)


def test_a_greedy_request_next_to_sampled_ones_stays_greedy(tiny):
    """ReMax's baseline joins its group's samples in the decoder: it runs at temperature 0 all the same."""
    model, tok = tiny
    prompt = tok("hello there").input_ids
    greedy = HFEngine(model, tok).generate([GenRequest(prompt, 8, 0.0)])[0]
    dec = ContinuousDecoder(HFEngine(model, tok, seed=1), "inflight")
    dec.add([GenRequest(prompt, 8, 1.0, tag=k) for k in range(3)] + [GenRequest(prompt, 8, 0.0, tag="g")])
    out = []
    while not dec.idle:
        out.extend(dec.step())
    by_tag = {r.request.tag: r for r in out}
    assert by_tag["g"].token_ids == greedy.token_ids
    assert len({tuple(by_tag[k].token_ids) for k in range(3)} | {tuple(greedy.token_ids)}) > 1
    with pytest.raises(ValueError, match=r"requests of one \(temperature, top_p\)"):
        DecodeBatch(HFEngine(model, tok), [GenRequest(prompt, 8, 1.0), GenRequest(prompt, 8, 0.0)])
