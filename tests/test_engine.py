import pytest
import torch

from streamrl.engine.base import GenRequest
from streamrl.engine.hf import HFEngine
from streamrl.engine.sampling import sample_inverse_cdf, sample_next, sampling_probs


def _prompts(tok):
    return [
        tok(s).input_ids for s in ["<|im_start|>user\n1+1<|im_end|>\n", "hi", "a much longer prompt, 12345"]
    ]


def test_greedy_matches_transformers_generate(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok, max_batch=8)
    prompts = _prompts(tok)
    res = eng.generate([GenRequest(p, max_new_tokens=12, temperature=0.0) for p in prompts])
    for p, r in zip(prompts, res):
        # one prompt at a time: no padding, the reference path of transformers
        out = model.generate(
            torch.tensor([p]),
            max_new_tokens=12,
            do_sample=False,
            eos_token_id=sorted(eng.stop_ids),
            pad_token_id=tok.pad_token_id,
        )
        assert r.token_ids == out[0, len(p) :].tolist()[: len(r.token_ids)]
        assert len(r.token_ids) == 12 or r.finish_reason == "stop"


def test_logprobs_and_versions_match_a_full_forward(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok, max_batch=2, seed=3)  # batches of 2: exercises padding and compaction
    eng.update_weights(None, version=7)
    res = eng.generate([GenRequest(p, max_new_tokens=10, temperature=0.7) for p in _prompts(tok)])
    for r in res:
        ids = torch.tensor([r.request.prompt_ids + r.token_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(r.request.prompt_ids) - 1 : -1] / 0.7
        ref = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(ref, torch.tensor(r.logprobs), atol=1e-4)
        assert r.versions == [7] * len(r.token_ids)
        assert len(r.token_ids) <= 10


def test_sampling_is_reproducible_per_seed(tiny):
    model, tok = tiny
    reqs = lambda: [GenRequest(p, max_new_tokens=8, temperature=1.0) for p in _prompts(tok)]  # noqa: E731
    a = HFEngine(model, tok, seed=1).generate(reqs())
    b = HFEngine(model, tok, seed=1).generate(reqs())
    c = HFEngine(model, tok, seed=2).generate(reqs())
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]


def test_stop_token_ends_a_sequence(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok)
    eng.stop_ids = set(range(len(tok)))  # every token stops
    (r,) = eng.generate([GenRequest(_prompts(tok)[0], max_new_tokens=5)])
    assert len(r.token_ids) == 1 and r.finish_reason == "stop"


def test_abort_and_pause(tiny):
    model, tok = tiny
    eng = HFEngine(model, tok)
    h1 = eng.submit(GenRequest(_prompts(tok)[0], 4))
    h2 = eng.submit(GenRequest(_prompts(tok)[1], 4))
    eng.abort(h2)
    eng.pause()
    with pytest.raises(RuntimeError, match="paused"):
        eng.wait([h1])
    eng.resume()
    r1, r2 = eng.wait([h1, h2])
    assert len(r1.token_ids) == 4 and r2.finish_reason == "abort" and r2.token_ids == []
    with pytest.raises(ValueError, match="prompt_ids is empty"):
        eng.submit(GenRequest([], 4))


def test_sample_next_greedy_and_top_p():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    tok, lp = sample_next(logits, 0.0, 1.0, None)
    assert tok.item() == 0 and lp.item() == pytest.approx(torch.log(torch.tensor(0.5)).item())
    g = torch.Generator().manual_seed(0)
    # top_p 0.7 keeps {0.5, 0.3}: renormalised 0.625 / 0.375; token 2 never drawn
    draws = [sample_next(logits, 1.0, 0.7, g) for _ in range(200)]
    assert all(t.item() in (0, 1) for t, _ in draws)
    for t, lp in draws[:5]:
        assert lp.item() == pytest.approx(torch.log(torch.tensor([0.625, 0.375]))[t.item()].item(), abs=1e-6)


def test_inverse_cdf_sampling_matches_the_distribution_and_never_draws_zero_weight():
    probs = torch.tensor([0.1, 0.0, 0.6, 0.3])
    g = torch.Generator().manual_seed(1)
    n = 200_000
    tokens = sample_inverse_cdf(probs.expand(n, 4).contiguous() * 7.0, g)  # unnormalised weights
    freq = torch.bincount(tokens, minlength=4).double() / n
    assert freq[1].item() == 0.0
    # 4.5 standard errors of a binomial proportion at n = 200k: fails for a biased sampler
    assert torch.allclose(freq, probs.double(), atol=4.5 * (0.25 / n) ** 0.5)


def test_inverse_cdf_sampling_stays_in_range_at_u_close_to_one():
    """A block's sum and the running sum inside it round differently: here the block sum is 2 ulp above
    the running sum's last value, so the largest uniform below 1 aims past every running sum of the
    block; the draw must still be a token of the vocabulary with a positive weight."""
    g = torch.Generator().manual_seed(123)
    w = torch.rand(1, 256, generator=g) * torch.rand(1, 256, generator=g) ** 4
    assert w.sum(-1).item() > w.cumsum(-1)[0, -1].item()  # the rounding this test is about
    orig = torch.rand
    try:
        torch.rand = lambda *a, **k: torch.full((1, 1), 1.0 - 2**-24)  # type: ignore[assignment]
        tok = sample_inverse_cdf(w, None)
    finally:
        torch.rand = orig
    assert 0 <= tok.item() < 256 and w[0, tok.item()] > 0


def test_a_tiny_temperature_samples_the_top_token_without_nan():
    """logits / T overflows fp32 at T = 1e-39 (|logit| / T > 3.4e38): the distribution must still be
    the one-hot limit, not NaN, whatever the other rows' temperatures."""
    logits = torch.tensor([[1.0, 3.0, -2.0, float("-inf")], [0.5, 0.2, 100.0, -50.0]])
    for t in (1e-6, 1e-39, 1e-46):
        for top_p in (1.0, 0.9):
            probs = sampling_probs(logits, t, top_p)
            assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0], [0.0, 0.0, 1.0, 0.0]]
            tok, lp = sample_next(logits, t, top_p, torch.Generator().manual_seed(0))
            assert tok.tolist() == [1, 2] and lp.tolist() == [0.0, 0.0]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sampling_at_a_temperature_leaves_the_callers_logits_untouched(dtype):
    """Tempering works in place on a copy: fp32 logits are copied once, bf16 ones only by .float()."""
    logits = (torch.randn(2, 40, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)
    before = logits.clone()
    probs = sampling_probs(logits, 0.5, 1.0)
    assert torch.equal(logits, before)
    assert torch.allclose(probs, torch.softmax(before.float() / 0.5, dim=-1), atol=1e-6)


def test_sampled_logprobs_equal_log_softmax_at_temperature():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(0)) * 3
    tok, lp = sample_next(logits, 0.7, 1.0, torch.Generator().manual_seed(2))
    ref = torch.log_softmax(logits / 0.7, dim=-1).gather(-1, tok[:, None]).squeeze(-1)
    assert torch.allclose(lp, ref, atol=1e-6)


def test_two_level_sampling_over_a_ragged_vocabulary():
    # 700 tokens = 2 full blocks of 256 + a padded one; mass only in a few tokens across blocks
    w = torch.zeros(700)
    w[3], w[300], w[699] = 1.0, 2.0, 1.0
    g = torch.Generator().manual_seed(3)
    n = 100_000
    tokens = sample_inverse_cdf(w.expand(n, 700).contiguous(), g)
    freq = torch.bincount(tokens, minlength=700).double() / n
    assert set(tokens.unique().tolist()) == {3, 300, 699}
    expected = torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64)
    assert torch.allclose(freq[[3, 300, 699]], expected, atol=4.5 * (0.25 / n) ** 0.5)


def test_shared_prompts_are_prefilled_once_and_decode_as_if_alone(tiny):
    model, tok = tiny
    prompts = _prompts(tok)
    # 3 distinct prompts x 3 samples, interleaved: one prefill forward over 3 rows instead of 9
    reqs = [GenRequest(prompts[i % 3], max_new_tokens=6, temperature=0.0) for i in range(9)]
    eng = HFEngine(model, tok, max_batch=16)
    rows: list[int] = []
    hook = model.register_forward_pre_hook(
        lambda m, a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True
    )
    try:
        res = eng.generate(reqs)
    finally:
        hook.remove()
    assert rows[0] == 3 and all(r <= 9 for r in rows[1:])
    alone = HFEngine(model, tok, max_batch=1).generate([GenRequest(p, 6, temperature=0.0) for p in prompts])
    for i, r in enumerate(res):
        assert r.token_ids == alone[i % 3].token_ids
        assert r.logprobs == pytest.approx(alone[i % 3].logprobs, abs=1e-5)


@pytest.mark.parametrize("rows", [16, 1])
@pytest.mark.parametrize("weights", ["engine copy", "caller's model"])
def test_a_prefill_never_copies_the_lm_head_per_row(tiny, weights, rows):
    """The last position's hidden states of a prefill are a strided [R, 1, H] view; torch's linear would
    broadcast a bf16 weight that does not require grad (the engine's copy, the rollout worker's model)
    to a contiguous [R, H, V] copy. The engine hooks its own copy and a model it is handed alike. One
    row's view [1, 1, H] counts as contiguous to torch and is copied all the same."""
    import copy

    from torch.profiler import ProfilerActivity, profile

    from streamrl.models.precision import cast_params

    model, tok = tiny
    if weights == "engine copy":
        eng = HFEngine(model, tok, max_batch=16, dtype=torch.bfloat16)  # a frozen bf16 copy
    else:  # a bf16 model without gradients that the engine does not copy
        handed = cast_params(copy.deepcopy(model), torch.bfloat16).eval().requires_grad_(False)
        eng = HFEngine(handed, tok, max_batch=16)
        assert eng.model is handed
    prompts = [tok(f"question {i}: what is {i} + {i}?").input_ids for i in range(rows)]
    head = eng.model.get_output_embeddings().weight
    per_row = head.numel() * head.element_size()  # one row's broadcast copy of the head
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        res = eng.generate([GenRequest(p, max_new_tokens=2, temperature=0.0) for p in prompts])
    assert all(1 <= len(r.token_ids) <= 2 for r in res)
    largest = max(e.cpu_memory_usage for e in prof.events())
    assert largest < max(rows, 2) * per_row / 4, f"an allocation of {largest} bytes: the head copied per row"


class _HeadOnly(torch.nn.Module):
    """A model whose LM head is a plain nn.Linear (its forward takes `input=`)."""

    def __init__(self) -> None:
        super().__init__()
        self.lm_head = torch.nn.Linear(8, 5, bias=False)

    def get_output_embeddings(self) -> torch.nn.Module:
        return self.lm_head


def test_a_frozen_head_takes_a_contiguous_input_given_either_way(tiny):
    """The hook applies to `head(x)` and `head(input=x)` (nn.Linear's keyword) alike, is added once, and
    does not stop a model from pickling."""
    import copy
    import pickle

    from streamrl.models.frozen import freeze

    for model in (freeze(copy.deepcopy(tiny[0])), freeze(_HeadOnly())):
        head = model.get_output_embeddings()
        seen: list[torch.Tensor] = []
        spy = head.register_forward_pre_hook(
            lambda _m, args, kwargs, seen=seen: seen.append(args[0] if args else kwargs["input"]),
            with_kwargs=True,
        )
        x = torch.randn(3, 5, head.in_features)[:, -1:, :]
        assert not x.is_contiguous()
        one = torch.randn(1, 5, head.in_features)[:, -1:, :]  # contiguous to torch, yet strided
        assert one.is_contiguous() and one.stride()[0] == 5 * head.in_features
        assert torch.allclose(head(one), one @ head.weight.T, atol=1e-5)
        out = head(x)
        if isinstance(model, _HeadOnly):
            assert torch.equal(head(input=x), out)
        assert len(seen) >= 2 and all(t.stride() == torch.empty(t.shape).stride() for t in seen)
        spy.remove()
        assert freeze(model) is model and len(head._forward_pre_hooks) == 1  # added once
        if isinstance(model, _HeadOnly):  # (transformers may add its own unpicklable hooks to a model)
            pickle.loads(pickle.dumps(model))


def test_a_stop_keeps_the_requests_that_already_finished(tiny):
    """A (1 token) and B (8 tokens) decode together; the stop comes after the first step: A finished
    then and keeps its token, B ends as aborted."""
    model, tok = tiny
    eng = HFEngine(model, tok, max_batch=8, seed=1)
    p = _prompts(tok)[0]
    calls = []

    def stop() -> bool:
        calls.append(1)
        return len(calls) >= 2

    a, b = eng.generate([GenRequest(p, max_new_tokens=1), GenRequest(p, max_new_tokens=8)], stop)
    assert len(a.token_ids) == 1 and a.finish_reason in ("length", "stop")
    assert b.finish_reason == "abort" and b.token_ids == []
