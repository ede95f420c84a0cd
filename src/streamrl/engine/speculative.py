"""Speculative rollouts: earlier responses to the same prompt are verified under the current weights in
the prompt's own prefill forward, and decoding goes on from where a response leaves them (SPEC-RL).

The drafts offered for a prompt form a token tree (`DraftTree`, a trie: drafts that start alike share
nodes). The tree's nodes ride the prompt's prefill as extra columns under a tree attention mask (each
node sees the prompt and its own ancestors, at position prompt length + depth), so one forward gives
the policy's next-token distribution after the prompt and after every node, whatever the number of
drafts; the LM head runs over every node in the same product as the prompts' last columns (and a
packed running batch's rows: `head_rows`), or level by level, on the nodes some row reaches, when the
logits would pass HEAD_ELEMENTS. Each row then walks the tree from its root.

Exact verification (`lenience` 0) is speculative sampling with, at each node, the proposal q = the
empirical distribution of the next token among the drafts through that node (its children, weighted by
how many drafts pass through each). The row draws x ~ q and accepts it with probability
min(1, p(x) / q(x)); otherwise it draws the token from the residual max(0, p - q), renormalised. p is
the current policy's sampling distribution (temperature and top-p applied as in plain sampling), so
each emitted token is distributed exactly as p given the tokens before it; q depends on the drafts and
the tokens emitted so far only. Whichever way the token came, a row whose token is a child of its node
walks on to that child (a rejected draft hands over to another draft that agrees with the correction),
and leaves the tree otherwise; at a node without children it draws a plain sample from p. A response
is therefore a plain sample from the current policy, its tokens carry log p and the verifying weights'
version, and the rows of a group decide independently, each with its own uniforms.

Why not the recorded log-probs in the exact rule: the residual needs the draft policy's whole
distribution at the rejected position, and a stored response keeps only the probability of its own
token. Accepting with min(1, p(x) / p_draft(x)) and drawing from anything computable from that one
number is biased (three tokens, p uniform, p_draft (1/2, 1/2, 0) or (1/2, 0, 1/2): no rule can tell
which mass is missing). The proposal above is what the drafts define exactly.

Lenient verification (`lenience` > 0, SPEC-RL's rule, biased): the row follows one of its drafts,
picked uniformly at random before the prefill (the tree keeps it whole); its token x is accepted with
probability a = min(1, lenience * p(x) / p_draft(x)), p_draft(x) the draft's recorded behaviour
probability; else the token is drawn from p (drawing x again counts as accepting it) and the row leaves
the draft. The token then came from b = a [y = x] + (1 - a) p(y), and log b is recorded as its
behaviour log-prob, so the decoupled-PPO weight pi_prox / pi_behav corrects the bias token by token.

Every row emits at least one token here (the last one drawn where it left the tree, unless it finished);
that token goes through the model in the next decode step (DecodeBatch._feed with defer). Rows that end
at the same node share a cache row, which keeps the prompt's columns and those of the row's path
(the rest of the tree is dropped); the next step forks it by token.

The tree (engine/draft_tree.py) keeps a node only where at least `branch_min` drafts pass through it,
and every node of the drafts lenient rows chose. A cut tree stays exact: the proposal at a node covers
the children kept, and where none is kept the row samples plainly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from streamrl.engine.base import Draft, GenResult
from streamrl.engine.draft_tree import ROOT, DraftTree
from streamrl.engine.sampling import sample_inverse_cdf, sample_next, sampling_probs
from streamrl.engine.windows import column_positions, layer_masks, on_device
from streamrl.models.cache_kwarg import cache_kwargs
from streamrl.models.head import check_head, head_logits

HEAD_ELEMENTS = 1 << 27  # every node's logits at once up to this (256 MB in bf16, 512 in fp32), else by level


def tree_inputs(
    batch: Any, ids: torch.Tensor, positions: torch.Tensor, attn: torch.Tensor, trees: list[DraftTree]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The prefill of D distinct prompts with their draft trees' nodes as extra columns.
    ids, positions [D, P]: the prompt columns forwarded (after any cached prefix); attn [D, W]: every
    column's padding mask (W >= P) -> (ids, positions [D, P + N], visible [D, 1, P + N, W + N] bool,
    key positions [D, W + N]), N = the largest tree. Node columns see the prompt and their own
    ancestors; the KV cache ends with the N node columns of every row."""
    eng = batch.engine
    check_head(
        eng.model, eng.device, "rollout.spec_drafts > 0", "speculative rollouts", "set rollout.spec_drafts=0"
    )
    d, p = ids.shape
    w, n = attn.shape[1], max(len(t) for t in trees)
    node_ids = torch.full((d, n), eng.pad_id)
    depth = torch.zeros(d, n, dtype=torch.long)
    mask = torch.zeros(d, 1, p + n, w + n, dtype=torch.bool)
    real = attn.bool()
    mask[:, 0, :p, :w] = torch.ones(p, w, dtype=torch.bool).tril(w - p) & real[:, None, :]
    mask[:, 0, p:, :w] = real[:, None, :]
    for k, tree in enumerate(trees):
        if len(tree):
            node_ids[k, : len(tree)] = torch.tensor(tree.tokens)
            depth[k, : len(tree)] = torch.tensor(tree.depth)
        mask[k, 0, p:, w:] = tree.ancestry(n)
    node_pos = positions[:, -1:] + 1 + depth
    k_pos = torch.cat([column_positions(attn), node_pos], 1)
    return torch.cat([ids, node_ids], 1), torch.cat([positions, node_pos], 1), mask, k_pos


def tree_forward(
    batch: Any, ids: torch.Tensor, positions: torch.Tensor, attn: torch.Tensor, trees: list[DraftTree]
) -> tuple[torch.Tensor, torch.Tensor]:
    """tree_inputs' forward -> (logits after each prompt [D, V], hidden states of the nodes [D, N, H])."""
    eng = batch.engine
    all_ids, q_pos, mask, k_pos = tree_inputs(batch, ids, positions, attn, trees)
    batch._logits_version = eng.version
    model, dev = eng.model, eng.device
    decoder = model.get_decoder()
    out = decoder(
        input_ids=all_ids.to(dev),
        attention_mask=on_device(layer_masks(model.config, mask, q_pos, k_pos), dev),
        position_ids=q_pos.to(dev),
        **cache_kwargs(decoder, batch.cache),
        use_cache=True,
    )
    hidden = out.last_hidden_state
    p = ids.shape[1]
    return head_logits(model, head_rows(model, hidden, p, trees)), hidden[:, p:]


def head_rows(model: Any, hidden: torch.Tensor, p: int, trees: list[DraftTree]) -> torch.Tensor:
    """hidden [D, P + N, H] of tree_inputs' columns -> the rows the LM head runs on, [D + M, H]: each
    prompt's last column, then the M nodes of every tree (tree by tree, breadth-first) while their
    logits fit in HEAD_ELEMENTS ([D, H] otherwise: verify_drafts runs the head on the nodes level by
    level). One product serves the prompts and the nodes; on a CPU each product streams the whole head,
    so engine/continuous.py also adds a packed running batch's rows to it."""
    nodes = [(k, v) for k, tree in enumerate(trees) for v in range(len(tree))]
    if not nodes or len(nodes) * model.get_output_embeddings().weight.shape[0] > HEAD_ELEMENTS:
        return hidden[:, p - 1]
    idx = torch.tensor(nodes, device=hidden.device)
    return torch.cat([hidden[:, p - 1], hidden[idx[:, 0], p + idx[:, 1]]])


def node_logits(
    logits: torch.Tensor, trees: list[DraftTree], prompt_of: list[int]
) -> dict[tuple[int, int], torch.Tensor]:
    """logits [M, V]: the node rows of head_rows' logits (M = 0: it left them out); trees: each prompt's;
    prompt_of: the prompt each cache row holds -> {(cache row, node): logits [V]}."""
    if not len(logits):
        return {}
    start = [0]
    for tree in trees:
        start.append(start[-1] + len(tree))
    return {(c, v): logits[start[k] + v] for c, k in enumerate(prompt_of) for v in range(len(trees[k]))}


class VerifiedBatch(Protocol):
    """What verification reads and advances of a DecodeBatch (engine/decode_batch.py) right after its
    prefill."""

    engine: Any
    results: list[GenResult]
    active: list[int]
    rows: torch.Tensor
    cache: Any
    attn: torch.Tensor
    next_pos: torch.Tensor
    _logits: torch.Tensor
    _logits_version: int
    _trees: list[DraftTree]  # per cache row
    _tree_hidden: torch.Tensor | None  # [C, N, H] the nodes' hidden states
    _node_logits: dict[tuple[int, int], torch.Tensor]  # (cache row, node) -> logits [V], if computed
    _chosen: list[Draft | None]  # per result: the draft a lenient row follows (choose_drafts)

    def _emit(self, res: GenResult, tok: int, logprob: float, version: int) -> bool: ...

    def _feed(self, tokens: torch.Tensor, keep: list[int], defer: bool = False) -> None: ...


@dataclass
class _Row:
    res: GenResult
    cache_row: int
    tree: DraftTree
    params: tuple[float, float]  # (temperature, top_p) of the row's request; temperature 0: greedy
    lenience: float
    draft: tuple[int, ...] = ()  # lenient rows: the draft they follow
    draft_logprobs: tuple[float, ...] = ()
    node: int = ROOT  # the last tree node the row's tokens reached
    stopped: bool = False  # left the tree (or finished)
    finished: bool = False
    tokens: list[int] = field(default_factory=list)


def verify_drafts(batch: VerifiedBatch) -> list[GenResult]:
    """Walk every row through its prompt's draft tree (see the module docstring) and emit its tokens up
    to and including the first one outside the tree. Leaves the batch as after a step whose tokens are not
    forwarded yet (the next step forwards them, with any batch this one joins); returns the results that
    finished."""
    version = batch._logits_version
    parents = batch.rows.tolist()
    rows = [
        _start(batch.results[i], parents[r], batch._trees[parents[r]], batch._chosen[i])
        for r, i in enumerate(batch.active)
    ]
    # every node's logits came with the prefill's (head_rows) unless there were too many: then by level
    logits: dict[tuple[int, int], torch.Tensor] = dict(batch._node_logits)
    live = rows
    while live:  # each pass takes every live row one level deeper: a node is visited in one pass only
        here = sorted({(r.cache_row, r.node) for r in live})
        _head(batch, [(c, v) for c, v in here if v != ROOT and (c, v) not in logits], logits)
        logits.update((key, batch._logits[key[0]]) for key in here if key[1] == ROOT)
        probs: dict[tuple[int, int, tuple[float, float]], torch.Tensor] = {}
        for row in live:
            if row.params[0] == 0:  # greedy: the argmax, its log-prob at temperature 1 (as sample_next)
                tok, logprob = sample_next(logits[row.cache_row, row.node][None], 0.0, 1.0, None)
                _emit(batch, row, int(tok[0]), float(logprob[0]), version, accepted=None)
                continue
            key = (row.cache_row, row.node, row.params)
            if key not in probs:
                probs[key] = sampling_probs(logits[key[:2]][None], *row.params)[0]
            _decide(batch, row, probs[key], version)
        for key in here:  # no row comes back to this level
            del logits[key]
        live = [r for r in live if not r.stopped]
    # one cache row per distinct (prompt row, node reached), holding the prompt and the nodes on its
    # path (the rest of the tree dropped); a finished row keeps no cache row (it leaves in _feed)
    ends: dict[tuple[int, int], int] = {}
    for row in rows:
        row.cache_row = 0 if row.finished else ends.setdefault((row.cache_row, row.node), len(ends))
    if ends:
        _keep_paths(batch, [(batch._trees[c], c, v) for c, v in ends])
    batch._trees, batch._tree_hidden, batch._node_logits = [], None, {}
    batch.rows = torch.tensor([row.cache_row for row in rows])
    keep = [r for r, row in enumerate(rows) if not row.finished]
    last = torch.tensor([row.tokens[-1] for row in rows])
    batch._feed(last, keep, defer=True)  # forwarded by the next step, with the batch it joins
    return [row.res for row in rows if row.finished]


def _head(batch: VerifiedBatch, nodes: list[tuple[int, int]], logits: dict) -> None:
    """logits[(cache row, node)] for `nodes`, from the nodes' hidden states."""
    if nodes:
        assert batch._tree_hidden is not None
        idx = torch.tensor(nodes).to(batch._tree_hidden.device)
        logits.update(zip(nodes, head_logits(batch.engine.model, batch._tree_hidden[idx[:, 0], idx[:, 1]])))


def _keep_paths(batch: VerifiedBatch, ends: list[tuple[DraftTree, int, int]]) -> None:
    """The cache rows become one per (tree, prompt cache row, node): the prompt's columns, then those of
    the node's path (breadth-first order puts a node's columns at W + node), then masked padding."""
    width = batch.attn.shape[1]
    paths = [tree.path(node) for tree, _, node in ends]
    longest = max(map(len, paths))
    columns = torch.zeros(len(ends), width + longest, dtype=torch.long)
    columns[:, :width] = torch.arange(width)
    block = torch.zeros(len(ends), longest, dtype=batch.attn.dtype)
    for e, path in enumerate(paths):
        columns[e, width : width + len(path)] = width + torch.tensor(path, dtype=torch.long)
        block[e, : len(path)] = 1
    src = torch.tensor([c for _, c, _ in ends])
    dev = batch.engine.device
    for layer in batch.cache.layers:
        layer.select_columns(src.to(dev), columns.to(dev))
    batch.attn = torch.cat([batch.attn[src], block], dim=1)
    batch.next_pos = batch.next_pos[src] + torch.tensor([len(p) for p in paths])


def _start(res: GenResult, cache_row: int, tree: DraftTree, chosen: Draft | None) -> _Row:
    req = res.request
    row = _Row(res, cache_row, tree, (req.temperature, req.top_p), req.lenience)
    if not any(d.token_ids for d in req.drafts):
        row.tree = DraftTree([])  # a request without drafts samples plainly, whatever shares its prompt
    elif chosen is not None:  # lenient: follows the draft chosen before the prefill (choose_drafts)
        row.draft, row.draft_logprobs = chosen.token_ids, chosen.logprobs
    return row


def _decide(batch: VerifiedBatch, row: _Row, p: torch.Tensor, version: int) -> None:
    """p [V]: the sampling distribution after the row's node. Decides the next token and moves the row."""
    gen = batch.engine.generator
    children = row.tree.children.get(row.node, {})
    if row.lenience > 0:
        pos = 0 if row.node == ROOT else row.tree.depth[row.node] + 1
        x = row.draft[pos] if pos < len(row.draft) else None
        if x is None or x not in children:  # past the draft (or the tree's cut): a plain sample
            children = {}
        else:
            u = float(torch.rand(1, generator=gen, dtype=torch.float64))
            tok, logprob = _lenient(p, x, math.exp(row.draft_logprobs[pos]), row.lenience, u, gen)
            _emit(batch, row, tok, logprob, version, accepted=tok == x)
            _move(row, children if tok == x else {})
            return
    if not children:  # nothing proposed here: a plain sample, and the row leaves the tree
        tok = int(sample_inverse_cdf(p[None], gen)[0])
        _emit(batch, row, tok, math.log(float(p[tok])), version, accepted=None)
        row.stopped = True
        return
    counts = {tok: row.tree.count[node] for tok, node in children.items()}
    u = torch.rand(2, generator=gen, dtype=torch.float64).tolist()
    tok, accepted = _exact(p, counts, u, gen)
    _emit(batch, row, tok, math.log(float(p[tok])), version, accepted=accepted)
    _move(row, children)


def _move(row: _Row, children: dict[int, int]) -> None:
    """After a decided token: to its child node if the tree has it (the walk goes on unless the token
    finished the row), else out of the tree."""
    tok = row.tokens[-1]
    if tok in children:
        row.node = children[tok]
        row.res.tree_tokens += 1
    row.stopped = row.finished or tok not in children


def _exact(p: torch.Tensor, counts: dict[int, int], u: list[float], gen: torch.Generator) -> tuple[int, bool]:
    """Speculative sampling against the proposal q = counts / their total: x ~ q (uniform u[0]),
    accepted if u[1] < p(x) / q(x), else a draw from the residual max(0, p - q) -> (token, accepted)."""
    total = sum(counts.values())
    x = _propose(counts, u[0] * total)
    if u[1] * counts[x] < float(p[x]) * total:  # u < p(x) / q(x)
        return x, True
    residual = p.clone()
    for y, c in counts.items():
        residual[y] = (p[y] - c / total).clamp(min=0.0)
    if not float(residual.sum()) > 0:  # p <= q everywhere: a rejection of probability 0 (rounding)
        residual = p
    return int(sample_inverse_cdf(residual[None], gen)[0]), False


def _propose(counts: dict[int, int], target: float) -> int:
    """The token whose share of the running count holds target (0 <= target < the total)."""
    seen = 0
    for x, c in counts.items():
        seen += c
        if target < seen:
            return x
    return x


def _lenient(
    p: torch.Tensor, x: int, p_old: float, lenience: float, u: float, gen: torch.Generator
) -> tuple[int, float]:
    """SPEC-RL's acceptance -> (token, log b(token) of the mixture it was drawn from)."""
    a = min(1.0, lenience * float(p[x]) / p_old) if p_old > 0 else 1.0
    tok = x if u < a else int(sample_inverse_cdf(p[None], gen)[0])
    behaviour = (1.0 - a) * float(p[tok]) + (a if tok == x else 0.0)
    return tok, math.log(behaviour)


def _emit(
    batch: VerifiedBatch, row: _Row, tok: int, logprob: float, version: int, accepted: bool | None
) -> None:
    """accepted: None for a token sampled where nothing was proposed (not a verified one)."""
    row.tokens.append(tok)
    row.finished = batch._emit(row.res, tok, logprob, version)
    if accepted is not None:
        row.res.draft_tokens += 1
        row.res.draft_accepted += int(accepted)
    if accepted is None or row.finished:
        row.stopped = True
