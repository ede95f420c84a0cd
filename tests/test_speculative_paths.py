"""Speculative rollouts' less travelled paths (engine/speculative.py, models/head.py): the draft tree
built by hand and cut at its node limit, the LM head level by level, lenient rows choosing among
several drafts, greedy rows beside a prompt's tree, the logits of a model family whose forward scales
them, and the one-line refusal of a model whose logits the engine cannot reproduce. The harness (a
Llama of vocabulary 4, exact response probabilities, seeded goodness-of-fit tests) is
tests/spec_harness.py."""

from __future__ import annotations

import copy

import pytest
import torch
from spec_harness import (
    FIT,
    PROMPT,
    SMALL,
    N,
    as_draft,
    draw,
    fit_pvalue,
    in_tree,
    nodes,
    old_responses,
    response_probs,
    teacher_forced,
    tree_prefixes,
)
from transformers import GraniteConfig, GraniteForCausalLM

from streamrl.engine import draft_tree, speculative
from streamrl.engine.base import Draft, GenRequest


def test_the_head_level_by_level_leaves_the_policy_exact(lms, monkeypatch):
    """Logits past HEAD_ELEMENTS come level by level, only for the nodes some row reaches: the same
    distribution, and each response's first tokens along the tree counted as tree tokens."""
    monkeypatch.setattr(speculative, "HEAD_ELEMENTS", 0)
    drafts = tuple(old_responses(lms, 6))
    results = draw(lms[0], [GenRequest(PROMPT, 3, drafts=drafts) for _ in range(N)], seed=31)
    kept = tree_prefixes([d.token_ids for d in drafts])
    assert sum(r.draft_accepted for r in results) > 0.2 * N
    assert all(r.tree_tokens == in_tree(r.token_ids, kept) for r in results)
    assert fit_pvalue(results, response_probs(lms[0], 3)) > FIT


@pytest.mark.parametrize("branch_min", [1, 2])
def test_lenient_rows_follow_each_of_several_drafts(lms, branch_min):
    """With a lenience no ratio can fall under, every lenient row copies the draft it chose, chosen
    uniformly: two drafts, 400 rows, each copied by 200 +- 40 (the seed fixes the count). The drafts
    share no token, so a tree cut to shared branches (branch_min 2) would hold none of them: the
    chosen drafts are kept whole."""
    drafts = (Draft((3, 3, 2), (-1.0, -1.0, -1.0)), Draft((2, 2, 3), (-1.0, -1.0, -1.0)))
    assert nodes([d.token_ids for d in drafts], branch_min=2) == 0
    reqs = [GenRequest(PROMPT, 3, drafts=drafts, lenience=1e9) for _ in range(400)]
    results = draw(lms[0], reqs, seed=32, branch_min=branch_min)
    copied = [tuple(r.token_ids) for r in results]
    assert set(copied) == {(3, 3, 2), (2, 2, 3)}
    assert abs(copied.count((3, 3, 2)) - 200) <= 40
    assert all(r.draft_accepted == r.draft_tokens == r.tree_tokens == 3 for r in results)


def test_a_greedy_row_beside_a_prompts_tree_decodes_as_alone(lms):
    """A greedy request (it takes no drafts) shares its prompt's prefill with sampled rows that verify a
    tree: its response, log-probs and tree tokens are those of the greedy request alone."""
    drafts = tuple(old_responses(lms, 6, max_new=6))
    alone = draw(lms[0], [GenRequest(PROMPT, 6, temperature=0.0)], seed=33)[0]
    reqs = [GenRequest(PROMPT, 6, temperature=0.0, drafts=drafts)]
    reqs += [GenRequest(PROMPT, 6, drafts=drafts) for _ in range(8)]
    mixed = draw(lms[0], reqs, seed=33)
    assert sum(r.draft_accepted for r in mixed[1:]) > 0  # the tree was there
    assert (mixed[0].token_ids, mixed[0].tree_tokens) == (alone.token_ids, 0)
    assert mixed[0].logprobs == pytest.approx(alone.logprobs, abs=1e-6)


def _granite() -> GraniteForCausalLM:
    torch.manual_seed(0)
    config = GraniteConfig(**SMALL, logits_scaling=0.25)  # the forward divides the head's output by it
    model = GraniteForCausalLM(config).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(6)
    return model


def test_a_model_whose_forward_scales_its_logits_is_verified_with_them():
    """Granite divides the head's output by logits_scaling: the root's and the nodes' logits do too, so
    verified responses are exact samples and their log-probs the teacher-forced ones."""
    model = _granite()
    own = [as_draft(r) for r in draw(model, [GenRequest(PROMPT, 3) for _ in range(6)], seed=34)]
    results = draw(model, [GenRequest(PROMPT, 3, drafts=tuple(own)) for _ in range(N)], seed=35)
    assert sum(r.draft_accepted for r in results) > 0.2 * N
    assert fit_pvalue(results, response_probs(model, 3)) > FIT
    for r in results[:50]:
        assert r.logprobs == pytest.approx(teacher_forced(model, r, 1.0), abs=1e-5)


def test_a_model_whose_logits_the_head_cannot_reproduce_is_refused_in_one_line(lms):
    """A config attribute the forward ignores (soft-capping on a Llama) makes the head's logits differ
    from the model's: the first verification refuses with the key to change, before any token."""
    model = copy.deepcopy(lms[0])
    model._streamrl_head_checked = False
    model.config.final_logit_softcapping = 0.5
    drafts = tuple(old_responses(lms, 2))
    with pytest.raises(ValueError) as err:
        draw(model, [GenRequest(PROMPT, 3, drafts=drafts)], seed=36, branch_min=1)
    assert str(err.value) == (
        "rollout.spec_drafts > 0: LlamaForCausalLM computes its logits from the decoder's output in a "
        "way speculative rollouts cannot reproduce; set rollout.spec_drafts=0"
    )
    assert draw(model, [GenRequest(PROMPT, 3)], seed=36)[0].token_ids  # plain sampling still works


def test_draft_tree_by_hand():
    """Nodes breadth-first with their parents, depths and draft counts; the node limit cuts the last
    level; ancestry marks each node's path."""
    tree = draft_tree.DraftTree([(5, 6, 7), (5, 6), (5, 8), (9,), (5, 6, 7)])
    assert tree.tokens == [5, 9, 6, 8, 7]
    assert tree.parent == [-1, -1, 0, 0, 2]
    assert tree.depth == [0, 0, 1, 1, 2]
    assert tree.count == [4, 1, 3, 1, 2]
    assert tree.children == {-1: {5: 0, 9: 1}, 0: {6: 2, 8: 3}, 1: {}, 2: {7: 4}, 3: {}, 4: {}}
    assert tree.ancestry(6).int().tolist() == [
        [1, 0, 0, 0, 0, 0],
        [0, 1, 0, 0, 0, 0],
        [1, 0, 1, 0, 0, 0],
        [1, 0, 0, 1, 0, 0],
        [1, 0, 1, 0, 1, 0],
        [0, 0, 0, 0, 0, 1],
    ]
    assert (tree.path(4), tree.path(3), tree.path(draft_tree.ROOT)) == ([0, 2, 4], [0, 3], [])
    cut = draft_tree.DraftTree([(5, 6, 7), (5, 6), (5, 8), (9,)], limit=3)
    assert (cut.tokens, cut.children[0]) == ([5, 9, 6], {6: 2})
    # branch_min: only the nodes that many drafts pass (all of a lone draft's, empty drafts aside)
    shared = draft_tree.DraftTree([(5, 6, 7), (5, 6), (5, 8), (9,), (5, 6, 7)], branch_min=2)
    assert (shared.tokens, shared.count, shared.parent) == ([5, 6, 7], [4, 3, 2], [-1, 0, 1])
    assert draft_tree.DraftTree([(5, 6, 7), (5, 6), (5, 8)], branch_min=3).tokens == [5]
    assert draft_tree.DraftTree([(), (4, 3)], branch_min=2).tokens == [4, 3]
    # whole: a lenient row's chosen draft keeps every node, the others are cut as before
    chosen = draft_tree.DraftTree([(5, 6, 7), (5, 6), (5, 8), (9,)], branch_min=2, whole=((5, 8),))
    assert (chosen.tokens, chosen.count, chosen.parent) == ([5, 6, 8], [3, 2, 1], [-1, 0, 0])


def test_a_tree_cut_at_its_node_limit_leaves_the_policy_exact(lms, monkeypatch):
    """A tree cut short proposes only the children it kept (a plain sample past them): still exact."""
    monkeypatch.setattr(draft_tree, "TREE_NODES", 4)
    drafts = tuple(old_responses(lms, 6))
    assert nodes([d.token_ids for d in drafts]) > 4
    results = draw(lms[0], [GenRequest(PROMPT, 3, drafts=drafts) for _ in range(N)], seed=14)
    assert sum(r.draft_accepted for r in results) > 0.2 * N
    assert fit_pvalue(results, response_probs(lms[0], 3)) > FIT
