"""Speculative rollouts in the engine (engine/speculative.py): verified drafts leave the responses
distributed exactly as plain sampling from the current policy, lenient acceptance samples the mixture
whose probabilities it records, and stop tokens and max_new_tokens work as without drafts.

The distribution tests use a Llama of vocabulary 4 (token 1 ends a response) and responses of at most 3
tokens: 40 possible responses whose exact probabilities come from teacher-forced forwards. Many seeded
draws are compared with them by Pearson's chi-square test; the seeds are fixed, so each p-value is a
fixed number, and the thresholds leave orders of magnitude to the p-values of the correct rule and of
the deliberate bugs of tests/mutations.yaml. The harness is tests/spec_harness.py.
"""

from __future__ import annotations

import math

import pytest
import torch
from spec_harness import (  # tests/ is on sys.path (rootdir conftest)
    BATCH,
    FIT,
    PROMPT,
    STOP,
    N,
    draw,
    fit_pvalue,
    in_tree,
    next_probs,
    offered_drafts,
    old_responses,
    response_probs,
    tree_prefixes,
)

from streamrl.engine.base import Draft, GenRequest
from streamrl.engine.speculative import _lenient


def test_plain_sampling_fits_the_exact_distribution(lms):
    """The harness itself: plain sampling passes, a sampler from the other weights does not."""
    reqs = [GenRequest(PROMPT, 3) for _ in range(N)]
    exact = response_probs(lms[0], 3)
    assert fit_pvalue(draw(lms[0], reqs, seed=1), exact) > FIT
    assert fit_pvalue(draw(lms[1], reqs, seed=1), exact) < 1e-9


def _cases(lms) -> dict[str, tuple[list[tuple[Draft, ...]], float, float, int]]:
    """name -> (each request's drafts, temperature, top_p, the engine's branch_min)"""
    greedy: list[int] = []  # the current policy's most likely response: its tokens are often accepted
    while len(greedy) < 3 and STOP not in greedy:
        greedy.append(int(next_probs(lms[0], PROMPT + greedy).argmax()))
    fixed = Draft(tuple(greedy), tuple([math.log(0.5)] * len(greedy)))
    per_row = old_responses(lms, N)
    shared = tuple(old_responses(lms, 6))
    shared_cold = tuple(old_responses(lms, 6, temperature=0.7, top_p=0.85))
    return {
        "one fixed draft": ([(fixed,)] * N, 1.0, 1.0, 2),
        "a draft per row from other weights": ([(d,) for d in per_row], 1.0, 1.0, 2),
        "a shared set of drafts from other weights": ([shared] * N, 1.0, 1.0, 2),
        "a shared set, every branch kept": ([shared] * N, 1.0, 1.0, 1),
        "temperature 0.7 and top-p 0.85": ([shared_cold] * N, 0.7, 0.85, 2),
    }


CASES = [
    "one fixed draft",
    "a draft per row from other weights",
    "a shared set of drafts from other weights",
    "a shared set, every branch kept",
    "temperature 0.7 and top-p 0.85",
]


@pytest.mark.parametrize("case", CASES)
def test_verified_drafts_leave_the_current_policy_exact(lms, case):
    drafts, temperature, top_p, branch_min = _cases(lms)[case]
    reqs = [GenRequest(PROMPT, 3, temperature, top_p, drafts=d) for d in drafts]
    results = draw(lms[0], reqs, seed=2, branch_min=branch_min)
    verified = sum(r.draft_tokens for r in results)
    accepted = sum(r.draft_accepted for r in results)
    # the drafts were really used: many tokens accepted, many rejected
    assert accepted > 0.2 * N and verified - accepted > 0.1 * N
    if case == "a shared set, every branch kept":  # a rejected row walks on along another draft
        assert sum(r.draft_tokens - r.draft_accepted >= 2 for r in results) > 0.01 * N
    # the drafts of the requests of one prompt in one batch form one tree, cut to the nodes at least
    # branch_min of them pass: a response walks it exactly as far as its tokens follow that tree
    for start in range(0, N, BATCH):
        offered = offered_drafts(reqs[start : start + BATCH], PROMPT)
        kept = tree_prefixes(offered, branch_min)
        if branch_min > 1 and case != "one fixed draft":
            assert len(tree_prefixes(offered, 1)) > len(kept) > 0  # a cut tree
        assert all(r.tree_tokens == in_tree(r.token_ids, kept) for r in results[start : start + BATCH])
    assert fit_pvalue(results, response_probs(lms[0], 3, temperature, top_p)) > FIT


@pytest.mark.parametrize("p_old", [0.0, 0.25])
def test_a_lenient_draft_token_the_current_policy_excludes_is_never_copied(p_old):
    """p_now(x) = 0 (outside the top-p nucleus, or a -inf logit): whatever the stored probability, the
    token is redrawn from p, and the recorded behaviour log-prob is that of the token drawn."""
    p = torch.tensor([0.5, 0.5, 0.0])
    for seed in range(20):
        tok, logb = _lenient(p, 2, p_old, 2.0, 0.0, torch.Generator().manual_seed(seed))
        assert tok in (0, 1) and logb == math.log(0.5)


def test_lenient_acceptance_is_biased_and_records_the_probability_it_sampled_with(lms):
    """SPEC-RL's rule: x accepted with a = min(1, lenience * p(x) / p_draft(x)), else drawn from p. The
    responses follow the mixture b = a [y = x] + (1 - a) p(y) along the draft, not p, and each token's
    recorded log-prob is log b of it (the decoupled-PPO weight corrects through it)."""
    lenience = 2.0
    draft = Draft((2, 3, 2), (math.log(0.6), math.log(0.3), math.log(0.9)))

    def lenient(prefix: tuple[int, ...], p: torch.Tensor) -> torch.Tensor:
        i = len(prefix)
        if i >= len(draft.token_ids) or prefix != draft.token_ids[:i]:
            return p
        x = draft.token_ids[i]
        a = min(1.0, lenience * float(p[x]) / math.exp(draft.logprobs[i]))
        b = (1 - a) * p
        b[x] += a
        return b

    reqs = [GenRequest(PROMPT, 3, drafts=(draft,), lenience=lenience) for _ in range(N)]
    results = draw(lms[0], reqs, seed=3)
    assert fit_pvalue(results, response_probs(lms[0], 3, rule=lenient)) > FIT
    assert fit_pvalue(results, response_probs(lms[0], 3)) < 1e-9  # biased: not the current policy
    for r in results[:200]:
        for i, tok in enumerate(r.token_ids):
            b = lenient(tuple(r.token_ids[:i]), next_probs(lms[0], PROMPT + r.token_ids[:i]))
            assert r.logprobs[i] == pytest.approx(math.log(float(b[tok])), abs=1e-5)


def test_a_copied_response_offers_the_policy_probability_it_was_generated_with(lms):
    """A token the lenient rule copied records log b for training but the verifying policy's log p as
    the next round's p_draft: the same policy then accepts it with min(1, p(x) / p(x)) = 1, SPEC-RL's
    rule, not with p(x) (log b of a certain copy is 0)."""
    from streamrl.rollout.drafts import DraftStore
    from streamrl.rollout.trajectory import RolloutSettings, make_trajectory
    from streamrl.types import Group, Problem

    class Decoder:
        def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
            return ""

    p_now = float(next_probs(lms[0], PROMPT)[3])  # 0.47: far from 0 and 1
    draft = Draft((3,), (math.log(p_now / 2),))  # a = min(1, p_now / (p_now / 2)) = 1: copied
    first = draw(lms[0], [GenRequest(PROMPT, 2, drafts=(draft,), lenience=1.0)], seed=0)[0]
    after = float(next_probs(lms[0], [*PROMPT, 3])[first.token_ids[1]])
    assert first.token_ids[0] == 3 and first.draft_accepted == 1
    assert first.logprobs == pytest.approx([0.0, math.log(after)], abs=1e-5)  # log b = log 1, then plain
    assert first.policy_logprobs == pytest.approx([math.log(p_now)], abs=1e-5)
    problem = Problem("p", [], "1")
    settings = RolloutSettings(1, 2, 1.0, 1.0, 8, False, False, 0.0)
    traj = make_trajectory(problem, first, Decoder(), settings, "g", 0)
    assert traj.behaviour_logprobs == first.logprobs
    assert traj.policy_logprobs == pytest.approx([math.log(p_now), math.log(after)], abs=1e-5)
    store = DraftStore(1, 1)
    store.add(Group(problem, [traj]))
    (stored,) = store.drafts("p")
    assert stored.logprobs == pytest.approx([math.log(p_now), math.log(after)], abs=1e-5)
    again = draw(lms[0], [GenRequest(PROMPT, 2, drafts=(stored,), lenience=1.0) for _ in range(400)], seed=1)
    assert all(r.token_ids == first.token_ids and r.draft_accepted == 2 for r in again)  # a = 1 each
    assert max(abs(lp) for r in again for lp in r.logprobs) < 1e-5  # log b = log 1


def test_a_draft_stops_at_its_stop_token_and_at_max_new_tokens(lms):
    """lenience 1e9 accepts every draft token: the rest is decided by the stop token and the length."""
    lp = (-1.0,) * 5
    reqs = [
        GenRequest(PROMPT, 5, drafts=(Draft((2, STOP, 3), lp[:3]),), lenience=1e9),
        GenRequest(PROMPT, 3, drafts=(Draft((2, 3, 2, 3, 2), lp),), lenience=1e9),
        GenRequest(PROMPT, 6, drafts=(Draft((3, 3), lp[:2]),), lenience=1e9),
    ]
    stop, length, short = draw(lms[0], reqs, seed=4, version=5, branch_min=1)
    assert (stop.token_ids, stop.finish_reason, stop.draft_tokens, stop.draft_accepted) == (
        [2, STOP],
        "stop",
        2,
        2,
    )
    assert (length.token_ids, length.finish_reason, length.draft_tokens) == ([2, 3, 2], "length", 3)
    assert short.token_ids[:2] == [3, 3] and (short.draft_tokens, short.draft_accepted) == (2, 2)
    # emitted along the tree, without decode steps: the stop token included, the sample past it not
    assert (stop.tree_tokens, length.tree_tokens, short.tree_tokens) == (2, 3, 2)
    assert len(short.token_ids) > 2  # decoding went on past the draft
    for r in (stop, length, short):
        assert r.versions == [5] * len(r.token_ids)
        assert r.logprobs[: r.draft_accepted] == [0.0] * r.draft_accepted  # b = 1: a = 1
