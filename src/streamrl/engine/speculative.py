"""Speculative rollouts: an earlier response to the same prompt is verified under the current weights in
one forward pass, and decoding goes on from the first rejected token (SPEC-RL).

Exact verification (`lenience` 0) is speculative sampling whose proposal is known in full. A row picks
one of its request's drafts uniformly at random; at position i the proposal q is the empirical
distribution of the next token among the drafts that match the tokens emitted so far and go on past
them (a single draft: a point mass on its token). The draft's token x is accepted with probability
min(1, p(x) / q(x)); at the first rejection the token is drawn from the residual max(0, p - q),
renormalised, and verification ends. p is the current policy's sampling distribution (temperature and
top-p applied as in plain sampling). Each emitted token is then distributed exactly as p given the
tokens before it, whatever the drafts are and however they were chosen, so a response is a plain
sample from the current policy: its tokens carry log p and the verifying weights' version.

Why not the recorded log-probs in the exact rule: the residual needs the draft policy's whole
distribution at the rejected position, and a stored response keeps only the probability of its own
token. Accepting with min(1, p(x) / p_draft(x)) and drawing from anything computable from that one
number is biased (three tokens, p uniform, p_draft (1/2, 1/2, 0) or (1/2, 0, 1/2): no rule can tell
which mass is missing). The proposal above is what the drafts define exactly.

Lenient verification (`lenience` > 0, SPEC-RL's rule, biased): x is accepted with probability
a = min(1, lenience * p(x) / p_draft(x)), p_draft(x) the draft's recorded behaviour probability; else
the token is drawn from p (drawing x again counts as accepting it). The token then came from
b = a [y = x] + (1 - a) p(y), and log b is recorded as its behaviour log-prob, so the decoupled-PPO
weight pi_prox / pi_behav corrects the bias token by token.

Rows that share a prompt's cache row (a GRPO group's samples) and picked the same draft share one
verify row: its logits are the same for each of them, and each still decides with its own uniforms.
After verification a verify row forks into one cache row per number of tokens accepted, which the next
step forks again by sampled token (engine/hf.py): a confident policy's repeated answers are verified once.

The drafts' tokens are forwarded in column chunks of at most VERIFY_COLUMNS columns and VERIFY_ELEMENTS
logits: every chunk costs a forward over all the verify rows, so a batch whose drafts are mostly short
does not pay for its longest one. Verification stops once fewer than a quarter of the rows are still on
their drafts (another chunk would then cost more than the decode steps it saves); a row still on its
draft then decodes on from its last accepted token, a plain sample from there, so the stopping rule
(which never looks at a row's own future tokens, nor at the drafts ahead) keeps every response exact.
Lenient rows are verified to the end of their drafts. Accepted columns stay in the KV cache; rejected
ones are masked out.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from streamrl.engine.base import GenResult
from streamrl.engine.sampling import sample_inverse_cdf, sample_next, sampling_probs
from streamrl.models.cache_kwarg import cache_kwargs

VERIFY_ELEMENTS = 1 << 26  # logits per verify forward (rows x columns x vocabulary): 128 MB in bf16
VERIFY_COLUMNS = 8  # draft columns per verify forward


class VerifiedBatch(Protocol):
    """What verification reads and advances of a DecodeBatch (engine/hf.py) right after its prefill."""

    engine: Any
    results: list[GenResult]
    active: list[int]
    rows: torch.Tensor
    cache: Any
    attn: torch.Tensor
    next_pos: torch.Tensor
    _logits: torch.Tensor
    _logits_version: int

    def _emit(self, res: GenResult, tok: int, logprob: float, version: int) -> bool: ...

    def _feed(self, tokens: torch.Tensor, keep: list[int], defer: bool = False) -> None: ...

    def _select_cache_rows(self, src: list[int]) -> None: ...


@dataclass
class _Row:
    res: GenResult
    draft: tuple[int, ...]  # the chosen draft, cut at the row's room
    draft_logprobs: tuple[float, ...]
    alive: list[tuple[int, ...]]  # the drafts matching the tokens emitted so far (exact rule's proposal)
    lenience: float
    params: tuple[float, float]  # (temperature, top_p) of the row's request; temperature 0: greedy
    pos: int = 0  # the next position to decide
    accepted: int = 0  # draft tokens accepted in this verification
    stopped: bool = False  # left the draft: rejected, sampled past it, or finished
    finished: bool = False
    tokens: list[int] = field(default_factory=list)
    key: int = 0  # the verify row (then the cache row) whose logits the row reads


def verify_drafts(batch: VerifiedBatch) -> list[GenResult]:
    """Verify every row's draft and emit its accepted tokens plus one more (the correction drawn at the
    rejection, or the next token past an accepted draft; a row without a draft gets a plain sample; a row
    still on its draft when verification stops, none). Leaves the batch as after a step whose tokens are
    not forwarded yet (the next step forwards them, with any batch this one joins); returns the results
    that finished."""
    gen = batch.engine.generator
    version = batch._logits_version
    rows = [_pick(batch.results[i], gen) for i in batch.active]
    parents = batch.rows.tolist()
    first: dict[tuple[int, tuple[float, float]], torch.Tensor] = {}
    for r, row in enumerate(rows):
        logits = batch._logits[parents[r] : parents[r] + 1]
        if row.params[0] == 0:  # greedy: the argmax, its log-prob at temperature 1 (as sample_next)
            tok, logprob = sample_next(logits, 0.0, 1.0, None)
            _emit(batch, row, int(tok[0]), float(logprob[0]), version, accepted=None)
            continue
        if (parents[r], row.params) not in first:
            first[parents[r], row.params] = sampling_probs(logits, *row.params)
        _decide_run(batch, row, first[parents[r], row.params], version)
    # one verify row per distinct (cache row, draft) still on its draft: rows that share a prompt's cache
    # row and picked the same draft read the same logits (a confident policy's answers repeat); a row
    # already off its draft takes any verify row of its prompt: it attends to none of the draft columns
    # (one that accepted its first token and stopped has finished: it keeps no cache row)
    keys: dict[tuple[int, tuple[int, ...]], int] = {}
    for r, row in enumerate(rows):
        if not row.stopped:
            row.key = keys.setdefault((parents[r], row.draft), len(keys))
    of_parent = {p: k for (p, _), k in keys.items()}
    for r, row in enumerate(rows):
        if row.stopped:
            row.key = of_parent.get(parents[r], -1)
            if row.key < 0:
                row.key = of_parent[parents[r]] = keys.setdefault((parents[r], ()), len(keys))
    _select(batch, [p for p, _ in keys], torch.zeros(len(keys), dtype=torch.long), 0)
    forwarded = _verify_columns(batch, rows, [d for _, d in keys], version)
    # accepted draft tokens stay in the KV cache, the columns past them are masked out: one cache row per
    # distinct (verify row, tokens accepted); a row stopped on its draft has its last accepted token past
    # the forwarded columns: it is fed below like a sample
    ends: dict[tuple[int, int], int] = {}
    for row in rows:  # a finished row keeps no cache row (it reads row 0's, and leaves in _feed)
        row.key = 0 if row.finished else ends.setdefault((row.key, min(row.accepted, forwarded)), len(ends))
    if ends:
        _select(batch, [k for k, _ in ends], torch.tensor([a for _, a in ends]), forwarded)
    batch.rows = torch.tensor([row.key for row in rows])
    keep = [r for r, row in enumerate(rows) if not row.finished]
    last = torch.tensor([row.tokens[-1] for row in rows])
    batch._feed(last, keep, defer=True)  # forwarded by the next step, with the batch it joins
    return [row.res for row in rows if row.finished]


def _select(batch: VerifiedBatch, src: list[int], accepted: torch.Tensor, forwarded: int) -> None:
    """The batch's cache rows become `src` (copies where one repeats); the last `forwarded` KV columns
    (verified draft tokens) stay visible to the first `accepted` of them in each new cache row."""
    batch._select_cache_rows(src)
    if forwarded:
        block = (torch.arange(forwarded)[None, :] < accepted[:, None]).to(batch.attn.dtype)
        batch.attn = torch.cat([batch.attn[:, :-forwarded], block], dim=1)
        batch.next_pos = batch.next_pos + accepted


def _pick(res: GenResult, gen: torch.Generator) -> _Row:
    req = res.request
    params = (req.temperature, req.top_p)
    room = req.max_new_tokens - len(res.token_ids)
    drafts = [d for d in req.drafts if d.token_ids]
    if not drafts or room <= 0:
        return _Row(res, (), (), [], req.lenience, params)
    chosen = drafts[int(torch.randint(len(drafts), (1,), generator=gen))]
    alive = [d.token_ids[:room] for d in drafts]
    return _Row(res, chosen.token_ids[:room], chosen.logprobs[:room], alive, req.lenience, params)


def _verify_columns(
    batch: VerifiedBatch, rows: list[_Row], drafts: list[tuple[int, ...]], version: int
) -> int:
    """Forward the verify rows' drafts chunk by chunk while enough rows are still on their drafts; each
    chunk's logits decide the positions after its columns for every row of that verify row (row.key).
    Returns the columns forwarded; batch.attn then ends with them."""
    width = max((len(d) for d in drafts), default=0)
    ids = torch.full((len(drafts), width), batch.engine.pad_id)
    for k, draft in enumerate(drafts):
        ids[k, : len(draft)] = torch.tensor(draft, dtype=ids.dtype)
    vocab = batch._logits.shape[-1]
    # the chunk width and the stopping rule count rows, not verify rows: how many verify rows there are
    # depends on the drafts the rows picked, i.e. on their future proposals, and a rule that looked at
    # them would make verifying a position depend on what is proposed there (no longer exact)
    step = max(1, min(VERIFY_COLUMNS, VERIFY_ELEMENTS // (len(rows) * vocab)))
    real = torch.zeros(len(drafts), width, dtype=batch.attn.dtype)
    start = 0
    while start < width and _worth_a_chunk(rows):
        end = min(width, start + step)
        for row in rows:
            if not row.stopped:
                real[row.key, start : min(end, len(row.draft))] = 1
        logits = _forward(batch, ids[:, start:end], start, torch.cat([batch.attn, real[:, :end]], dim=1))
        probs: dict[tuple[int, tuple[float, float]], torch.Tensor] = {}
        for row in rows:
            cols = min(end, len(row.draft)) - start
            if not row.stopped and cols > 0:
                if (row.key, row.params) not in probs:
                    probs[row.key, row.params] = sampling_probs(logits[row.key, :cols], *row.params)
                _decide_run(batch, row, probs[row.key, row.params], version)
        start = end
    batch.attn = torch.cat([batch.attn, real[:, :start]], dim=1)
    return start


def _worth_a_chunk(rows: list[_Row]) -> bool:
    """Whether enough rows are still on their drafts for another verify forward; if not, the rest stop
    there and decode on (exact: the rule depends on the rows' decisions so far, never on a row's own
    next tokens or the drafts ahead)."""
    on_draft = [row for row in rows if not row.stopped]
    if on_draft and (4 * len(on_draft) >= len(rows) or any(row.lenience > 0 for row in on_draft)):
        return True  # lenient rows keep SPEC-RL's rule along their whole drafts
    for row in rows:
        row.stopped = True
    return False


def _forward(batch: VerifiedBatch, ids: torch.Tensor, start: int, attn: torch.Tensor) -> torch.Tensor:
    """ids [R, C]: draft columns start.. of every row -> logits [R, C, V] (the C positions after them)."""
    batch._logits_version = batch.engine.version
    dev = batch.engine.device
    positions = batch.next_pos[:, None] + torch.arange(start, start + ids.shape[1])[None, :]
    out = batch.engine.model(
        input_ids=ids.to(dev),
        attention_mask=attn.to(dev),
        position_ids=positions.to(dev),
        **cache_kwargs(batch.engine.model, batch.cache),
        use_cache=True,
        logits_to_keep=0,
    )
    return out.logits


def _decide_run(batch: VerifiedBatch, row: _Row, probs: torch.Tensor, version: int) -> None:
    """probs [n, V]: the sampling distributions at the row's next n positions (n = 1 before the first
    forward). Decides them in order until the row leaves its draft."""
    n = probs.shape[0]
    on_draft = [row.draft[row.pos + j] for j in range(n) if row.pos + j < len(row.draft)]
    p_draft_tokens = probs[torch.arange(len(on_draft)), on_draft].tolist() if on_draft else []
    uniforms = torch.rand(n, generator=batch.engine.generator, dtype=torch.float64).tolist()
    for j in range(n):
        if row.stopped:
            return
        if row.pos >= len(row.draft):  # past the draft (or none): a plain sample
            tok = int(sample_inverse_cdf(probs[j : j + 1], batch.engine.generator)[0])
            _emit(batch, row, tok, math.log(float(probs[j, tok])), version, accepted=None)
            row.stopped = True
            return
        x, px, u = row.draft[row.pos], p_draft_tokens[j], uniforms[j]
        rule = _lenient if row.lenience > 0 else _exact
        tok, logprob, accepted = rule(row, probs[j], x, px, u, batch.engine.generator)
        _emit(batch, row, tok, logprob, version, accepted)


def _exact(
    row: _Row, p: torch.Tensor, x: int, px: float, u: float, gen: torch.Generator
) -> tuple[int, float, bool]:
    """Speculative sampling against the drafts' empirical proposal q at this position -> (token,
    log p(token), accepted)."""
    i = row.pos
    going_on = [d for d in row.alive if len(d) > i]  # the chosen draft is one of them
    counts = Counter(d[i] for d in going_on)
    if u * counts[x] < px * len(going_on):  # u < p(x) / q(x)
        row.alive = [d for d in going_on if d[i] == x]
        return x, math.log(px), True
    residual = p.clone()
    for y, c in counts.items():
        residual[y] = (p[y] - c / len(going_on)).clamp(min=0.0)
    if not float(residual.sum()) > 0:  # p <= q everywhere: a rejection of probability 0 (rounding)
        residual = p
    tok = int(sample_inverse_cdf(residual[None], gen)[0])
    return tok, math.log(float(p[tok])), False


def _lenient(
    row: _Row, p: torch.Tensor, x: int, px: float, u: float, gen: torch.Generator
) -> tuple[int, float, bool]:
    """SPEC-RL's acceptance -> (token, log b(token) of the mixture it was drawn from, accepted)."""
    p_old = math.exp(row.draft_logprobs[row.pos])
    a = min(1.0, row.lenience * px / p_old) if p_old > 0 else 1.0
    tok = x if u < a else int(sample_inverse_cdf(p[None], gen)[0])
    behaviour = (1.0 - a) * float(p[tok]) + (a if tok == x else 0.0)
    return tok, math.log(behaviour), tok == x


def _emit(
    batch: VerifiedBatch, row: _Row, tok: int, logprob: float, version: int, accepted: bool | None
) -> None:
    """accepted: None for a token sampled past the draft (not a verified one)."""
    row.tokens.append(tok)
    row.finished = batch._emit(row.res, tok, logprob, version)
    if accepted is not None:
        row.res.draft_tokens += 1
        row.res.draft_accepted += int(accepted)
        row.accepted += int(accepted)
    row.pos += 1
    row.stopped = row.finished or accepted is not True
