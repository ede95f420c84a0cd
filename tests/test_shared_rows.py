"""Shared rows (engine/hf.py): rows with identical tokens so far share one KV-cache row and one forward,
and the responses are those of unshared rows drawn with the same uniforms."""

import pytest
import torch

from streamrl.engine.base import GenRequest
from streamrl.engine.decode_batch import DecodeBatch
from streamrl.engine.hf import HFEngine


def _requests(tok, samples: int, temperature: float, top_p: float = 1.0, max_new: int = 12):
    prompts = [tok(s).input_ids for s in ["<|im_start|>user\n1+1<|im_end|>\n", "a longer prompt, 12345"]]
    return [
        GenRequest(p, max_new, temperature, top_p, i) for i, p in enumerate(prompts) for _ in range(samples)
    ]


def _decode_rows(model) -> tuple[list[int], object]:
    rows: list[int] = []

    def hook(module, args, kwargs):
        if kwargs["input_ids"].shape[1] == 1:
            rows.append(kwargs["input_ids"].shape[0])

    return rows, model.register_forward_pre_hook(hook, with_kwargs=True)


@pytest.mark.parametrize("temperature,top_p", [(0.05, 1.0), (0.6, 0.9), (1.0, 1.0)])
def test_shared_rows_draw_what_unshared_rows_draw_with_the_same_seed(tiny, temperature, top_p):
    model, tok = tiny
    out = {}
    forwarded = {}
    for share in (True, False):
        rows, hook = _decode_rows(model)
        try:
            out[share] = HFEngine(model, tok, seed=5, share_rows=share).generate(
                _requests(tok, 6, temperature, top_p)
            )
        finally:
            hook.remove()
        forwarded[share] = sum(rows)
    for a, b in zip(out[True], out[False]):
        assert a.token_ids == b.token_ids
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-5)
        assert a.versions == b.versions and a.finish_reason == b.finish_reason
    # a cold policy's samples share their first tokens; a hot one's part at the first draw
    assert forwarded[True] < forwarded[False] if temperature < 0.1 else forwarded[True] <= forwarded[False]


@pytest.mark.parametrize("share, cache_rows", [(True, 8), (False, 16)])
def test_the_engine_counts_the_sequences_and_cache_rows_of_its_decode_steps(tiny, share, cache_rows):
    """Greedy, 3 samples of one prompt and 1 of another, 5 tokens each (no stop token): 4 decode
    forwards (the 5th token is never fed), each of 4 sequences on 2 cache rows when shared (identical
    greedy samples never fork), on 4 unshared."""
    model, tok = tiny
    engine = HFEngine(model, tok, seed=0, share_rows=share)
    engine.stop_ids = set()
    a, b = (tok(s).input_ids for s in ["<|im_start|>user\n1+1<|im_end|>\n", "a longer prompt, 12345"])
    engine.generate([GenRequest(p, 5, 0.0) for p in (a, a, a, b)])
    assert (engine.decode_rows, engine.decode_cache_rows) == (16, cache_rows)


def _check_rows(batch: DecodeBatch) -> None:
    """Every cache row holds exactly one distinct sequence, and every distinct sequence has one."""
    seqs = [tuple(batch.results[i].request.prompt_ids + batch.results[i].token_ids) for i in batch.active]
    held: dict[int, set] = {}
    for r, k in enumerate(batch.rows.tolist()):
        held.setdefault(k, set()).add(seqs[r])
    assert all(len(s) == 1 for s in held.values()), "a cache row is shared by different sequences"
    assert sorted(held) == list(range(len(batch.next_pos)))
    assert len(batch.next_pos) == len(set(seqs)), "identical sequences on separate cache rows"
    assert batch.cache.layers[0].keys.shape[0] == len(batch.next_pos)


def test_cache_rows_fork_when_rows_draw_different_tokens_and_survive_a_recompute(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok, seed=2)
    eng.update_weights(None, version=3)
    batch = DecodeBatch(eng, _requests(tok, 8, temperature=0.1, max_new=14))
    counts = [len(batch.next_pos)]
    steps = 0
    with torch.inference_mode():
        while not batch.done:
            batch.step()
            steps += 1
            if batch.active:
                _check_rows(batch)
                counts.append(len(batch.next_pos))
            if steps == 5:
                eng.update_weights(None, version=4)
                batch.recompute()  # interrupt mode: the cache is rebuilt, still one row per sequence
                _check_rows(batch)
    assert counts[0] == 2 and max(counts) > 2  # two prompts, then forks
    for r in batch.results:
        ids = torch.tensor([r.request.prompt_ids + r.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(r.request.prompt_ids) - 1 : -1] / 0.1
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(ref, torch.tensor(r.logprobs), atol=1e-4)
        assert set(r.versions[:5]) == {3} and set(r.versions[5:]) <= {4}
