"""In-flight and interrupt weight updates stamp the right policy version on every token."""

import copy

import pytest
import torch

from streamrl.engine.base import Draft, GenRequest
from streamrl.engine.continuous import ContinuousDecoder
from streamrl.engine.hf import HFEngine
from streamrl.engine.sampling import sampling_probs


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


@pytest.mark.parametrize("pack", [True, False])
def test_requests_arriving_while_a_batch_runs_join_it_and_decode_as_if_alone(tiny, pack):
    """Later requests (a longer prompt, then shorter ones) are prefilled and merged into the running
    batch: packed, in the running batch's decode forward (engine/packed.py), one forward per step
    whatever the arrivals; unpacked, in a forward of their own before the step's decode forward. Every
    token's log-prob is the full sequence's, its version that of the weights that computed it, and the
    columns only departed rows needed are dropped at the next merge."""
    (model, new), tok = _two_policies(tiny), tiny[1]
    engine = HFEngine(model, tok, max_batch=16, seed=0, pack=pack)
    engine.stop_ids = set()
    dec = ContinuousDecoder(engine, "inflight")
    short, long = tok("1+1").input_ids, tok("<|im_start|>user\nwhat is 12+30?<|im_end|>\n").input_ids
    # tag -> (prompt, max_new_tokens, arrival step); the weights change before step 4
    plan = {"A": (short, 10, 0), "B": (long, 3, 2), "C": (short, 5, 4), "D": (short, 3, 6)}
    assert engine.packs() == pack  # (its one-time check forwards before the hook)
    calls: list[int] = []  # the tokens of every forward (the embedding runs once per forward, packed or not)
    hook = model.get_input_embeddings().register_forward_pre_hook(lambda m, a: calls.append(a[0].numel()))
    out, per_step, decoded = [], [], []
    try:
        for step in range(12):
            if step == 4:
                model.load_state_dict(new.state_dict())
                dec.update_weights(None, version=1)
            for tag, (prompt, n, at) in plan.items():
                if at == step:
                    dec.add([GenRequest(prompt, n, 1.0, tag=tag) for _ in range(3 if tag == "B" else 2)])
            before, rows = len(calls), engine.decode_cache_rows
            out.extend(dec.step())
            per_step.append(calls[before:])
            decoded.append(engine.decode_cache_rows - rows)  # the cache rows this step's decode fed
            assert len(dec.batches) <= 1
            if step == 6:  # A and C are left, each behind padding that B's wider prompt needed
                b = dec.batches[0]
                real = [len(b.results[i].request.prompt_ids) + len(b.results[i].token_ids) for i in b.active]
                assert b.attn.shape[1] == max(real)
    finally:
        hook.remove()
    assert dec.idle and len(out) == 9
    # the first requests find no running batch: a prefill forward, then the decode forward; later
    # arrivals' prompt columns (one distinct prompt each: a group's samples share it) ride the decode
    # forward of the step they arrive in, or run before it unpacked; the last step samples the last
    # tokens and forwards nothing
    arrivals = {2: len(long), 4: len(short), 6: len(short)}
    assert per_step[0] == [len(short), decoded[0]]
    if pack:
        assert [len(c) for c in per_step] == [2, 1, 1, 1, 1, 1, 1, 1, 1, 0, 0, 0]
        assert [sum(c) for c in per_step[1:]] == [arrivals.get(s, 0) + decoded[s] for s in range(1, 12)]
    else:
        assert [len(c) for c in per_step] == [2, 1, 2, 1, 2, 1, 2, 1, 1, 0, 0, 0]
        assert all(per_step[s] == [n, decoded[s]] for s, n in arrivals.items())
    # sampled at steps before 5 from old logits; packed, an arrival samples its first token in the
    # next step, unpacked in the step it arrives in
    old_tokens = {"A": 4 - 0 + 1, "B": 4 - 2 + (not pack), "C": 0, "D": 0}
    for r in out:
        tag = r.request.tag
        k = old_tokens[tag]
        assert len(r.token_ids) == plan[tag][1]
        assert r.versions == [0] * k + [1] * (len(r.token_ids) - k)
        ref_old = _full_forward_logprobs(tiny[0], r)
        assert torch.allclose(ref_old[:k], torch.tensor(r.logprobs[:k]), atol=1e-4)
        if k == 0:  # prefilled and decoded on the new weights only
            assert torch.allclose(_full_forward_logprobs(new, r), torch.tensor(r.logprobs), atol=1e-4)


@pytest.mark.parametrize("drafts", [False, True])
def test_rows_of_different_sampling_parameters_decode_in_one_batch(tiny, drafts):
    """ReMax's greedy baseline next to its group's samples, and rows at another temperature and top-p,
    all in one batch (one decode forward per step, sharing the prompt's KV row): the greedy row gives
    the greedy tokens with log-probs at temperature 1 and takes no drafts; every sampled row's
    log-probs are its own (temperature, top-p) distribution's on the full sequence."""
    model, tok = tiny
    prompt = tok("hello there").input_ids
    greedy = HFEngine(model, tok).generate([GenRequest(prompt, 8, 0.0)])[0]
    own = HFEngine(model, tok, seed=3).generate([GenRequest(prompt, 8, 1.0) for _ in range(2)])
    spec = tuple(Draft(tuple(r.token_ids), tuple(r.logprobs)) for r in own) if drafts else ()
    params = {0: (1.0, 1.0), 1: (1.0, 1.0), 2: (0.7, 0.9), 3: (1.3, 1.0), "g": (0.0, 1.0)}
    # branch_min=1: the two drafts (a random model's) share no prefix, and each is verified all the same
    dec = ContinuousDecoder(HFEngine(model, tok, seed=1, branch_min=1), "inflight")
    dec.add([GenRequest(prompt, 8, t, p, tag=k, drafts=spec) for k, (t, p) in params.items()])
    calls: list[int] = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: calls.append(1), with_kwargs=True)
    out, per_step = [], []
    try:
        while not dec.idle:
            before = len(calls)
            out.extend(dec.step())
            per_step.append(len(calls) - before)
            assert len(dec.batches) <= 1
    finally:
        hook.remove()
    # after the first step (prefill, verification), one forward per step; none once every row is done
    assert set(per_step[1:-1]) == {1} and per_step[-1] == 0
    by_tag = {r.request.tag: r for r in out}
    g = by_tag.pop("g")
    assert (g.token_ids, g.draft_tokens) == (greedy.token_ids, 0)
    assert torch.allclose(_full_forward_logprobs(model, g), torch.tensor(g.logprobs), atol=1e-4)
    assert len({tuple(r.token_ids) for r in by_tag.values()} | {tuple(g.token_ids)}) > 1
    if drafts:
        assert sum(r.draft_tokens for r in by_tag.values()) > 0
    for tag, r in by_tag.items():
        ids = torch.tensor([r.request.prompt_ids + r.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(r.request.prompt_ids) - 1 : -1]
        probs = sampling_probs(logits, *params[tag])
        ref = probs.gather(-1, torch.tensor(r.token_ids)[:, None]).squeeze(-1).log()
        assert torch.allclose(ref, torch.tensor(r.logprobs), atol=1e-4), tag
