"""In-flight and interrupt weight updates stamp the right policy version on every token."""

import copy

import pytest
import torch

from streamrl.engine.base import GenRequest
from streamrl.engine.continuous import ContinuousDecoder
from streamrl.engine.hf import HFEngine


def _run(tiny, mode: str, update_after: int):
    model, tok = copy.deepcopy(tiny[0]), tiny[1]
    new = copy.deepcopy(model)
    with torch.no_grad():
        for p in new.parameters():
            p.mul_(1.5)
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


def test_requests_arriving_while_a_batch_runs_wait_for_a_quarter_batch(tiny):
    """One forward per batch per token: a group arriving alone must not start its own small batch."""
    model, tok = tiny
    engine = HFEngine(model, tok, max_batch=16, seed=0)  # a quarter = 4 rows
    dec = ContinuousDecoder(engine, "inflight")
    prompt = tok("<|im_start|>user\n1+1<|im_end|>\n").input_ids
    dec.add([GenRequest(prompt, 6) for _ in range(2)])
    dec.step()
    assert len(dec.batches) == 1  # nothing ran: the first requests start at once
    dec.add([GenRequest(prompt, 6) for _ in range(3)])
    dec.step()
    assert len(dec.batches) == 1 and len(dec.waiting) == 3  # 3 < a quarter: they wait
    dec.add([GenRequest(prompt, 6)])
    dec.step()
    assert len(dec.batches) == 2 and not dec.waiting  # 4 waiting: a quarter, a batch of their own
