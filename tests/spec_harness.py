"""The harness of the speculative-rollout tests (tests/ is on sys.path): a Llama of vocabulary 4 (token 1
ends a response) whose responses to PROMPT have exact probabilities from teacher-forced forwards, seeded
draws from the engine compared with them by Pearson's chi-square test, and the drafts' tree as the
token paths to its nodes."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from streamrl.engine.base import Draft, GenRequest, GenResult
from streamrl.engine.hf import HFEngine
from streamrl.engine.sampling import sampling_probs

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


def teacher_forced(model, r: GenResult, temperature: float) -> list[float]:
    ids = torch.tensor([r.request.prompt_ids + r.token_ids])
    with torch.no_grad():
        logits = model(ids).logits[0, len(r.request.prompt_ids) - 1 : -1]
    probs = sampling_probs(logits, temperature, 1.0)
    return probs.gather(-1, torch.tensor(r.token_ids)[:, None]).squeeze(-1).log().tolist()


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
