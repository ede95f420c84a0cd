"""Speculative rollouts in the engine (engine/speculative.py): verified drafts leave the responses
distributed exactly as plain sampling from the current policy, every token carries the verifying
weights' log-prob and version, and weight updates, stop tokens and max_new_tokens work as without drafts.

The distribution tests use a Llama of vocabulary 4 (token 1 ends a response) and responses of at most 3
tokens: 40 possible responses whose exact probabilities come from teacher-forced forwards. Many seeded
draws are compared with them by Pearson's chi-square test; the seeds are fixed, so each p-value is a
fixed number, and the thresholds leave orders of magnitude to the p-values of the correct rule and of
the deliberate bugs of tests/mutations.yaml.
"""

from __future__ import annotations

import copy
import math
from collections import Counter
from collections.abc import Callable

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from streamrl.engine.base import Draft, GenRequest, GenResult
from streamrl.engine.continuous import ContinuousDecoder
from streamrl.engine.hf import HFEngine
from streamrl.engine.sampling import sampling_probs
from streamrl.models.attention import register
from streamrl.models.head import check_head

VOCAB, STOP = 4, 1
PROMPT = [2, 3, 3]
N = 4000  # draws per distribution test
BATCH = 1000  # rows per engine batch in draw()
FIT = 1e-3  # a correct sampler's p-value stays above this (fixed seeds: fixed p-values)


class _Tok:
    """What HFEngine reads of a tokenizer."""

    pad_token_id = 0
    eos_token_id = STOP
    unk_token_id = None

    def convert_tokens_to_ids(self, token: str) -> None:
        return None


# the sizes of every small model here (other families add their own keys)
SMALL = dict(
    vocab_size=VOCAB,
    hidden_size=16,
    intermediate_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    max_position_embeddings=64,
    tie_word_embeddings=False,
    eos_token_id=STOP,
    pad_token_id=0,
)


def small_lm(seed: int) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**SMALL)).eval()
    with torch.no_grad():
        model.lm_head.weight.mul_(25)  # logits a few nats apart: far from uniform
    return model


@pytest.fixture(scope="module")
def lms() -> tuple[LlamaForCausalLM, LlamaForCausalLM]:
    """(the current policy, other weights the drafts come from), their heads checked once here (the
    check's own forward would otherwise show up in the tests that count forwards)."""
    models = small_lm(0), small_lm(1)
    for m in models:
        check_head(m, "cpu", "rollout.spec_drafts > 0", "speculative rollouts", "set rollout.spec_drafts=0")
    return models


def next_probs(model, ids: list[int], temperature: float = 1.0, top_p: float = 1.0) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1]
    return sampling_probs(logits[None], temperature, top_p)[0]


Rule = Callable[[tuple[int, ...], torch.Tensor], torch.Tensor]


def response_probs(
    model, max_new: int, temperature: float = 1.0, top_p: float = 1.0, rule: Rule | None = None
):
    """Every response to PROMPT with its exact probability; `rule(prefix, p)` changes the distribution
    the next token is drawn from (the lenient rule's mixture)."""
    out: dict[tuple[int, ...], float] = {}

    def walk(prefix: tuple[int, ...], prob: float) -> None:
        p = next_probs(model, PROMPT + list(prefix), temperature, top_p)
        if rule is not None:
            p = rule(prefix, p)
        for tok in range(VOCAB):
            q = prob * float(p[tok])
            if q == 0:
                continue
            seq = (*prefix, tok)
            if tok == STOP or len(seq) == max_new:
                out[seq] = q
            else:
                walk(seq, q)

    walk((), 1.0)
    return out


def fit_pvalue(results: list[GenResult], probs: dict[tuple[int, ...], float]) -> float:
    """Pearson's chi-square goodness of fit of the responses to `probs`; the least likely responses are
    pooled until each bin expects at least 5. An impossible response fails at once."""
    counts = Counter(tuple(r.token_ids) for r in results)
    assert set(counts) <= set(probs), f"impossible responses: {set(counts) - set(probs)}"
    n = len(results)
    bins: list[tuple[float, float]] = []
    obs = exp = 0.0
    for seq in sorted(probs, key=probs.__getitem__):
        obs, exp = obs + counts[seq], exp + probs[seq] * n
        if exp >= 5:
            bins.append((obs, exp))
            obs = exp = 0.0
    if exp:
        o, e = bins.pop()
        bins.append((o + obs, e + exp))
    stat = sum((o - e) ** 2 / e for o, e in bins)
    df = torch.tensor((len(bins) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, torch.tensor(stat / 2, dtype=torch.float64)))


def draw(
    model, requests: list[GenRequest], seed: int, version: int = 0, branch_min: int = 2, share: bool = True
) -> list[GenResult]:
    engine = HFEngine(model, _Tok(), max_batch=BATCH, seed=seed, branch_min=branch_min, share_rows=share)
    engine.update_weights(None, version)
    return engine.generate(requests)


def as_draft(res: GenResult) -> Draft:
    return Draft(tuple(res.token_ids), tuple(res.logprobs))


def old_responses(lms, n: int, max_new: int = 3, temperature: float = 1.0, top_p: float = 1.0) -> list[Draft]:
    """n responses sampled from the other weights: the drafts a store would hold."""
    reqs = [GenRequest(PROMPT, max_new, temperature, top_p) for _ in range(n)]
    return [as_draft(r) for r in draw(lms[1], reqs, seed=99)]


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


def teacher_forced(model, r: GenResult, temperature: float) -> list[float]:
    ids = torch.tensor([r.request.prompt_ids + r.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(r.request.prompt_ids) - 1 : -1]
    probs = sampling_probs(logits, temperature, 1.0)
    return probs.gather(-1, torch.tensor(r.token_ids)[:, None]).squeeze(-1).log().tolist()


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


def offered_drafts(reqs: list[GenRequest], prompt: list[int]) -> list[tuple[int, ...]]:
    """The drafts of a prompt's tree when `reqs` are prefilled together: each distinct set of drafts
    among the requests with that prompt, once."""
    sets = dict.fromkeys(tuple(d.token_ids for d in q.drafts) for q in reqs if q.prompt_ids == prompt)
    return [d for ds in sets for d in ds]


def tree_prefixes(drafts: list[tuple[int, ...]], branch_min: int = 2) -> set[tuple[int, ...]]:
    """The nodes of the drafts' tree as the token paths to them: the non-empty prefixes at least
    min(branch_min, drafts) of them start with."""
    counts = Counter(d[:i] for d in drafts for i in range(1, len(d) + 1))
    least = min(branch_min, sum(1 for d in drafts if d))
    return {p for p, c in counts.items() if c >= least}


def in_tree(tokens: list[int], prefixes: set[tuple[int, ...]]) -> int:
    """How many first tokens of a response are a path of the tree whose nodes are `prefixes`."""
    return max((i for i in range(1, len(tokens) + 1) if tuple(tokens[:i]) in prefixes), default=0)


def nodes(drafts: list[tuple[int, ...]], branch_min: int = 2) -> int:
    """The size of the drafts' tree."""
    return len(tree_prefixes(drafts, branch_min))


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
    engine = HFEngine(lms[0], _Tok(), max_batch=10**5, seed=21)
    dec = ContinuousDecoder(engine)
    running = [GenRequest([2, 2, 2] + PROMPT, 8, temperature) for _ in range(8)]
    dec.add(running)
    out = dec.step()
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
    model = copy.deepcopy(lms[0])
    model.config._attn_implementation = register()
    vars(model).pop("_streamrl_packable", None)
    engine = HFEngine(model, _Tok(), max_batch=10**5, seed=21)
    assert engine.packs()  # (its one-time check forwards before the hook)
    dec = ContinuousDecoder(engine)
    running = [GenRequest([2, 2, 2] + PROMPT, 8, temperature) for _ in range(8)]
    dec.add(running)
    out = dec.step()
    tokens: list[int] = []
    hook = model.get_input_embeddings().register_forward_pre_hook(lambda _m, a: tokens.append(a[0].numel()))
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
