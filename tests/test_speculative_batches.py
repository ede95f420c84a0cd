"""Speculative rollouts beside the engine's other work (engine/speculative.py, engine/continuous.py):
rows with left padding and trees of different sizes, weight updates arriving after verification (in
flight and by interrupt), a prompt's rows verified once in its prefill, and a verified batch joining a
running one, packed into its forward or not. Every token carries the verifying weights' log-prob on the
full sequence and their version, and the joined responses stay exactly the current policy's. The
harness (a Llama of vocabulary 4, exact response probabilities, seeded goodness-of-fit tests) is
tests/spec_harness.py."""

from __future__ import annotations

import copy

import pytest
from spec_harness import (  # tests/ is on sys.path (rootdir conftest)
    FIT,
    PROMPT,
    N,
    _Tok,
    as_draft,
    draw,
    fit_pvalue,
    in_tree,
    nodes,
    offered_drafts,
    old_responses,
    response_probs,
    small_lm,
    teacher_forced,
    tree_prefixes,
)

from streamrl.engine.base import GenRequest, GenResult
from streamrl.engine.continuous import ContinuousDecoder
from streamrl.engine.hf import HFEngine
from streamrl.models.attention import register


def _mixed_requests(lms, temperature: float, max_new: int) -> list[GenRequest]:
    """Prompts of three lengths (left padding), drafts of the current policy (long accepted runs) and of
    the other weights, and a request without drafts, in one batch."""
    own = [
        as_draft(r)
        for r in draw(
            lms[0], [GenRequest([2] * k, max_new, temperature) for k in (1, 2, 4) for _ in range(3)], 7
        )
    ]
    other = old_responses(lms, 4, max_new=max_new, temperature=temperature)
    reqs = []
    for j, k in enumerate((1, 2, 4)):
        for n in range(4):
            drafts = tuple(own[3 * j : 3 * j + 3]) if n < 2 else (other[n],)
            reqs.append(GenRequest([2] * k, max_new, temperature, drafts=drafts))
    reqs.append(GenRequest([3, 2], max_new, temperature))
    return reqs


@pytest.mark.parametrize("share", [True, False])
def test_tokens_carry_the_verifying_weights_logprobs_and_version(lms, share):
    """Batched rows with left padding and trees of different sizes: every token's log-prob is the
    current policy's on the full sequence (tree columns off a row's path are invisible to it, positions
    run on from the nodes it reached) and its version the verifying weights'; with rows sharing their
    prompt's cache row and with a cache row each."""
    temperature, max_new = 0.5, 8
    reqs = _mixed_requests(lms, temperature, max_new)
    results = draw(lms[0], reqs, seed=5, version=7, branch_min=1, share=share)
    assert max(r.draft_accepted for r in results) > 2
    assert sum(r.draft_tokens > r.draft_accepted for r in results) >= 1  # some were rejected
    assert results[-1].draft_tokens == 0
    for k in (1, 2, 4):  # each prompt's tree branches: every row's path leaves nodes it must not see
        offered = {d.token_ids for q in reqs if q.prompt_ids == [2] * k for d in q.drafts}
        assert nodes(list(offered), 1) > max(map(len, offered))
    for r in results:
        assert r.versions == [7] * len(r.token_ids)
        assert r.logprobs == pytest.approx(teacher_forced(lms[0], r, temperature), abs=1e-5)


@pytest.mark.parametrize("mode", ["inflight", "interrupt"])
def test_weight_updates_after_verification(lms, mode):
    """The first decoder step verifies under version 0: each row emits its tokens along the tree plus
    the first one outside it, and the step forwards that last token. New weights then arrive: in
    flight the next token still comes from logits computed before them; by interrupt the cache is
    recomputed and it comes from the new weights. Every version-0 token is the old policy's on the
    full sequence, every version-1 token after an interrupt the new one's."""
    old, new = small_lm(0), small_lm(2)
    temperature, max_new = 0.5, 8
    engine = HFEngine(old, _Tok(), max_batch=64, seed=6, branch_min=1)
    engine.stop_ids = set()  # every row runs to max_new_tokens: a fixed version script
    dec = ContinuousDecoder(engine, mode)
    reqs = _mixed_requests((old, lms[1]), temperature, max_new)
    dec.add(reqs)
    out = dec.step()
    old.load_state_dict(new.state_dict())
    before = small_lm(0)
    dec.update_weights(None, version=1)
    while not dec.idle:
        out.extend(dec.step())
    assert sum(r.draft_accepted for r in out) > len(out)
    for r in out:
        kept = tree_prefixes(offered_drafts(reqs, r.request.prompt_ids), 1)
        assert r.tree_tokens == (in_tree(r.token_ids, kept) if r.request.drafts else 0)
        verified = r.tree_tokens + 1
        zeros = min(max_new, verified + (1 if mode == "inflight" else 0))
        assert r.versions == [0] * zeros + [1] * (max_new - zeros)
        assert r.logprobs[:zeros] == pytest.approx(teacher_forced(before, r, temperature)[:zeros], abs=1e-5)
        if mode == "interrupt":
            assert r.logprobs[zeros:] == pytest.approx(teacher_forced(new, r, temperature)[zeros:], abs=1e-5)


def test_rows_of_one_prompt_are_verified_once_in_its_prefill(lms):
    """A GRPO group's rows share their prompt's cache row, and the drafts of a prompt are one tree whose
    nodes ride the prompt's prefill: 24 rows of 2 prompts verify in a single forward of 2 rows (24
    unshared) whose columns are the longer prompt and the larger tree. Same seed, same tokens,
    log-probs and versions as with every row on its own cache row; the log-probs are the current
    policy's on the full sequence."""
    temperature, max_new = 0.7, 6
    prompts = [PROMPT, [2, 2] + PROMPT]
    own = draw(lms[0], [GenRequest(p, max_new, temperature) for p in prompts for _ in range(3)], seed=12)
    offered = [tuple(as_draft(r) for r in own[3 * j : 3 * j + 3]) for j in range(2)]
    reqs = [
        GenRequest(p, max_new, temperature, drafts=offered[j])
        for j, p in enumerate(prompts)
        for _ in range(12)
    ]
    width = len(prompts[1]) + max(nodes([d.token_ids for d in ds], 1) for ds in offered)
    shapes: list[tuple[int, int]] = []
    hook = lms[0].model.register_forward_pre_hook(
        lambda _m, _a, kw: shapes.append(tuple(kw["input_ids"].shape)), with_kwargs=True
    )
    outs = {}
    try:
        for share in (True, False):
            engine = HFEngine(lms[0], _Tok(), max_batch=1000, seed=13, share_rows=share, branch_min=1)
            engine.update_weights(None, 3)
            shapes.clear()
            outs[share] = engine.generate(reqs)
            assert shapes[0] == (2, width)
            assert all(cols == 1 for _, cols in shapes[1:])  # then decode steps only
    finally:
        hook.remove()
    shared, alone = outs[True], outs[False]
    assert sum(r.draft_accepted for r in shared) > len(reqs)
    assert sum(r.draft_tokens > r.draft_accepted for r in shared) >= 2
    for a, b in zip(shared, alone):
        assert (a.token_ids, a.versions, a.draft_tokens, a.draft_accepted) == (
            b.token_ids,
            b.versions,
            b.draft_tokens,
            b.draft_accepted,
        )
        assert a.logprobs == pytest.approx(b.logprobs, abs=1e-6)
        assert a.logprobs == pytest.approx(teacher_forced(lms[0], a, temperature), abs=1e-5)


def test_a_verified_batch_joins_a_running_one_and_its_last_tokens_ride_its_forward(lms):
    """Rows verified while another batch decodes join it, and the last token each emitted during
    verification goes through the model in the running batch's next forward: the step in which they
    join runs the prefill with the drafts' tree and one single-column forward for the running and the
    joined rows together. The joined responses are still exactly the current policy's (goodness of
    fit), and every token's log-prob, the running rows' included, is the teacher-forced one on the full
    sequence."""
    temperature, max_new = 1.0, 3
    drafts = tuple(old_responses(lms, 6))
    dec, running, out = _running_batch(HFEngine(lms[0], _Tok(), max_batch=10**5, seed=21), temperature)
    columns: list[int] = []
    hook = lms[0].model.register_forward_pre_hook(
        lambda _m, _a, kw: columns.append(kw["input_ids"].shape[1]), with_kwargs=True
    )
    try:
        dec.add([GenRequest(PROMPT, max_new, temperature, drafts=drafts) for _ in range(N)])
        out += dec.step()
        assert len(dec.batches) == 1  # joined the running batch
        # the prompt with the drafts' tree, then the running rows' and the joined rows' tokens
        assert columns == [len(PROMPT) + nodes([d.token_ids for d in drafts]), 1], columns
    finally:
        hook.remove()
    _decode_on_and_check(lms[0], dec, out, running, max_new, temperature)


def test_a_batch_with_drafts_packed_into_a_running_ones_step_stays_exact(lms):
    """Where the engine packs (the streamrl attention), the joining batch's prefill with its drafts'
    tree rides the running batch's decode forward: the step in which it joins runs one forward of the
    tree's columns and the running rows' tokens. Its responses are still exactly the current policy's
    (goodness of fit), and every token's log-prob is the teacher-forced one."""
    temperature, max_new = 1.0, 3
    drafts = tuple(old_responses(lms, 6))
    engine = _packing_engine(lms, seed=21)  # (its one-time check forwards before the hook)
    dec, running, out = _running_batch(engine, temperature)
    tokens: list[int] = []
    hook = engine.model.get_input_embeddings().register_forward_pre_hook(
        lambda _m, a: tokens.append(a[0].numel())
    )
    try:
        dec.add([GenRequest(PROMPT, max_new, temperature, drafts=drafts) for _ in range(N)])
        rows = engine.decode_cache_rows
        out += dec.step()
        assert tokens == [
            len(PROMPT) + nodes([d.token_ids for d in drafts]) + engine.decode_cache_rows - rows
        ]
        assert len(dec.batches) == 1  # joined the running batch after that forward
        # the responses verification finished are returned by that step
        assert any(r.request.prompt_ids == PROMPT for r in out)
    finally:
        hook.remove()
    _decode_on_and_check(lms[0], dec, out, running, max_new, temperature)


def test_prompts_with_and_without_a_tree_joining_together_prefill_apart_and_stay_exact(lms, monkeypatch):
    """A prompt with a draft tree and a longer one without drafts join a running batch in one step: where
    the engine packs, each prefills its own rectangle (its prompt; the tree's columns only for the
    prompt that has drafts) in the running batch's forward. The responses with the tree are still
    exactly the current policy's, and every token's log-prob is the teacher-forced one."""
    from streamrl.engine import continuous

    temperature, max_new = 1.0, 3
    drafts = tuple(old_responses(lms, 6))
    dec, running, out = _running_batch(_packing_engine(lms, seed=22), temperature)
    other = [GenRequest([3, 2] + PROMPT, max_new, temperature) for _ in range(8)]
    forwards: list[list[tuple[int, ...]]] = []
    pack = continuous.packed_hidden
    monkeypatch.setattr(
        continuous,
        "packed_hidden",
        lambda m, segs, d: forwards.append([tuple(s.ids.shape) for s in segs]) or pack(m, segs, d),
    )
    dec.add([GenRequest(PROMPT, max_new, temperature, drafts=drafts) for _ in range(N)] + other)
    out += dec.step()
    monkeypatch.undo()
    (forward,) = forwards
    tree = (1, len(PROMPT) + nodes([d.token_ids for d in drafts]))
    assert sorted(forward[1:]) == sorted([tree, (1, len(PROMPT) + 2)])
    assert len(dec.batches) == 1
    _decode_on_and_check(lms[0], dec, out, running + other, max_new, temperature)


def _packing_engine(lms, seed: int) -> HFEngine:
    """An engine that packs (the streamrl attention) on a copy of the current policy: a joining batch's
    prefill rides the running batch's forward."""
    model = copy.deepcopy(lms[0])
    model.config._attn_implementation = register()
    vars(model).pop("_streamrl_packable", None)
    engine = HFEngine(model, _Tok(), max_batch=10**5, seed=seed)
    assert engine.packs()
    return engine


def _running_batch(
    engine: HFEngine, temperature: float
) -> tuple[ContinuousDecoder, list[GenRequest], list[GenResult]]:
    """A decoder on `engine` whose batch of 8 rows of a longer prompt has run one step: the batch the
    tests' requests join -> (decoder, the running requests, that step's results)."""
    dec = ContinuousDecoder(engine)
    running = [GenRequest([2, 2, 2] + PROMPT, 8, temperature) for _ in range(8)]
    dec.add(running)
    return dec, running, dec.step()


def _decode_on_and_check(
    model,
    dec: ContinuousDecoder,
    out: list[GenResult],
    running: list[GenRequest],
    max_new: int,
    temperature: float,
) -> None:
    """Decode to the end; the joined requests (prompt PROMPT) must be exactly the current policy's
    responses (goodness of fit) and every token's log-prob, the running rows' too, the teacher-forced one."""
    while not dec.idle:
        out += dec.step()
    joined = [r for r in out if r.request.prompt_ids == PROMPT]
    assert len(joined) == N and sum(r.draft_accepted for r in joined) > N // 2
    assert fit_pvalue(joined, response_probs(model, max_new, temperature)) > FIT
    for r in [r for r in out if r.request in running] + joined[:200]:
        assert r.logprobs == pytest.approx(teacher_forced(model, r, temperature), abs=1e-5)
