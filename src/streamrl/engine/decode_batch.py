"""A batch of rows the default engine (engine/hf.py) decodes together with a KV cache.

A `DecodeBatch` advances all its rows one token per `step()`; finished rows are compacted out of the
KV cache so a long tail does not pay for the whole batch. Steps are the points where new weights can
be taken (in-flight) and where each token's policy version is stamped.

Shared rows: rows whose tokens so far are identical (a GRPO group's samples share their prompt, and a
confident policy's samples often share their first tokens or the whole answer) have one KV-cache row
and one forward between them. Each row still draws its own next token from that row's logits, so every
response is distributed exactly as when each row is forwarded alone; a cache row forks (a copy of its
KV) when its rows draw different tokens. The forward then costs per distinct sequence, not per sample.

Joining: a batch of new requests, once prefilled (and its drafts verified), can be merged into the
running batch (`merge`), so the engine runs one forward per step however the requests arrived and
whatever their sampling parameters (each row samples with its own temperature and top-p): a decode
step streams all the weights whatever its row count, so a long tail of a few rows costs nearly what a
full batch does. Each cache row keeps its own positions and attention mask, so rows of different
lengths decode side by side exactly as they would apart. The new batch's prefill itself rides the
running batch's decode forward where the engine packs (`hold`: the forward waits in `pending`,
engine/packed.py runs both); the new rows then sample their first token in the next step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

import torch

from streamrl.engine.base import GenRequest, GenResult
from streamrl.engine.draft_tree import DraftTree, choose_drafts, prompt_trees, row_drafts
from streamrl.engine.kv_cache import GrowingLayer, growing_cache, next_rows
from streamrl.engine.packed import Segment
from streamrl.engine.sampling import sample_rows
from streamrl.engine.speculative import head_rows, node_logits, tree_forward, tree_inputs, verify_drafts
from streamrl.engine.windows import causal_visible, column_positions, forward_masks, on_device
from streamrl.models.cache_kwarg import cache_kwargs

FIRST_COLUMNS = 256  # KV columns reserved past the prompt before the first doubling


class Held(NamedTuple):
    """A forward held for a packed run (engine/packed.py, engine/continuous.py: run_pending): its
    inputs, the rows of its hidden states [R, C, H] the LM head runs on, and what to do with the
    hidden states and those rows' logits. The held batches' head rows go through one product."""

    segment: Segment
    rows: Callable[[torch.Tensor], torch.Tensor]
    done: Callable[[torch.Tensor, torch.Tensor], None]


class DecodeBatch:
    """Rows decoded together, each with its request's temperature and top-p. Prompts are left-padded
    (after the prefix they share, if it is cached); one forward per step."""

    def __init__(self, engine: Any, requests: list[GenRequest], hold: bool = False) -> None:
        """engine: the HFEngine (engine/hf.py) whose model, generator, version and prefix cache the batch
        uses. hold: the prefill's forward waits in `pending` (engine/packed.py runs it with another batch's);
        the batch is ready once it has run."""
        self.engine = engine
        self.pending: Held | None = None  # a forward held for a packed run
        self._early: list[GenResult] = []  # finished in verification; step() returns them
        self.results = [GenResult(request=r) for r in requests]
        self.active = list(range(len(requests)))  # result index of each row
        # rows -> [R]: the KV-cache row of each row (rows with identical tokens so far share one);
        # attn, next_pos and _logits are per cache row
        self.rows = torch.arange(len(requests))
        # speculative rollouts: the drafts are verified in the prompts' prefill (engine/speculative.py);
        # greedy rows take none; a lenient row's draft is chosen first and kept whole in the tree
        self._chosen, whole = choose_drafts(requests, engine.generator)
        self._prefill(
            [r.prompt_ids for r in requests],
            share=engine.share_rows,
            drafts=row_drafts(requests),
            whole=whole,
            hold=hold,
        )

    def _prefill(
        self,
        seqs: list[list[int]],
        share: bool = True,
        drafts: Sequence[tuple[tuple[int, ...], ...]] = (),
        whole: Sequence[tuple[tuple[int, ...], ...]] = (),
        hold: bool = False,
    ) -> None:
        """seqs: each active row's tokens so far. Distinct sequences are prefilled once (a GRPO group's G
        samples share one prompt); with `share` the rows that repeat one then share its cache row,
        otherwise its KV and last logits are copied to each of them. A prefix every distinct sequence
        starts with comes from the engine's prefix cache (engine/prefix_cache.py) and is not forwarded
        again. `drafts`: each row's drafts; those of the rows of one sequence form its draft tree, whose
        nodes ride this forward (`_trees`, `_tree_hidden`: what verify_drafts reads), those of `whole`
        (each row's drafts to keep whole) all of them."""
        eng = self.engine
        order = {s: k for k, s in enumerate(dict.fromkeys(map(tuple, seqs)))}
        inverse = torch.tensor([order[tuple(s)] for s in seqs])
        distinct = [list(s) for s in order]
        trees = prompt_trees(inverse.tolist(), len(distinct), drafts, whole, eng.branch_min)
        extra = max(map(len, trees), default=0)
        n = eng.prefix_cache.prefix(eng.model, distinct, eng.version, eng.device) if eng.prefix_cache else 0
        width = max(len(s) for s in seqs)
        # [shared prefix][left padding][the rest]: positions count real tokens only
        ids = torch.tensor([s[:n] + [eng.pad_id] * (width - len(s)) + s[n:] for s in distinct])
        attn = torch.tensor([[1] * n + [0] * (width - len(s)) + [1] * (len(s) - n) for s in distinct])
        room = max(
            self.results[i].request.max_new_tokens - len(self.results[i].token_ids) for i in self.active
        )
        self.cache = growing_cache(
            initial=width + extra + min(room, FIRST_COLUMNS), limit=width + extra + room
        )
        if n:
            eng.prefix_cache.seed(self.cache, n, len(distinct))
        positions = column_positions(attn)

        def prefilled(logits: torch.Tensor, hidden: torch.Tensor | None) -> None:
            self._prefilled(logits, hidden, inverse, attn, positions, trees if extra else [], share)

        if hold:  # the same forward, run later with another batch's (engine/packed.py)
            self._logits_version = eng.version
            if extra:
                t_ids, t_pos, visible, _ = tree_inputs(self, ids[:, n:], positions[:, n:], attn, trees)
                p = width - n
                seg = Segment(t_ids, t_pos, visible, self.cache)
                self.pending = Held(
                    seg, lambda h: head_rows(eng.model, h, p, trees), lambda h, lg: prefilled(lg, h[:, p:])
                )
            else:
                seg = Segment(ids[:, n:], positions[:, n:], causal_visible(attn, width - n), self.cache)
                self.pending = Held(seg, lambda h: h[:, -1], lambda h, lg: prefilled(lg, None))
        elif extra:
            prefilled(*tree_forward(self, ids[:, n:], positions[:, n:], attn, trees))
        else:
            prefilled(self._forward(ids[:, n:], positions[:, n:], attn), None)

    def _prefilled(
        self,
        logits: torch.Tensor,
        hidden: torch.Tensor | None,
        inverse: torch.Tensor,
        attn: torch.Tensor,
        positions: torch.Tensor,
        trees: list[DraftTree],
        share: bool,
    ) -> None:
        """The state after a prefill's forward (see _prefill); the drafts' trees are verified here.
        logits: the head's rows of head_rows (one per distinct sequence, then the nodes if it kept them)."""
        eng, n_rows = self.engine, len(inverse)
        by_prompt, logits, nodes = trees, logits[: len(attn)], logits[len(attn) :]
        prompt_of = list(range(len(attn)))  # the prompt each cache row holds
        if share or int(inverse.max()) + 1 == n_rows:
            self.rows, self.attn, self._logits = inverse, attn, logits
        else:
            prompt_of = inverse.tolist()
            self.cache.batch_select_indices(inverse.to(eng.device))
            self.rows, self.attn, positions = torch.arange(n_rows), attn[inverse], positions[inverse]
            self._logits = logits[inverse.to(logits.device)]
            trees = [trees[k] for k in inverse.tolist()] if trees else []
            hidden = None if hidden is None else hidden[inverse.to(hidden.device)]
        self._trees = trees
        self._tree_hidden = hidden
        self._node_logits = node_logits(nodes, by_prompt, prompt_of)
        self.next_pos = positions[:, -1] + 1
        self._versions = [self._logits_version] * len(self._logits)
        self._unfed: torch.Tensor | None = None  # [C] a token to forward per cache row (-1: none)
        if trees:
            self._early = verify_drafts(self)

    def recompute(self) -> None:
        """Interrupt mode: rebuild the KV cache of every active row (prompt + tokens so far) with the
        engine's current weights, so the next token already comes from the new policy."""
        if not self.active:
            return
        seqs = [self.results[i].request.prompt_ids + self.results[i].token_ids for i in self.active]
        self._prefill(seqs, share=self.engine.share_rows)

    def _forward(self, ids: torch.Tensor, positions: torch.Tensor, attn: torch.Tensor) -> torch.Tensor:
        # the version of the weights that computed these logits: the tokens sampled from them carry it
        self._logits_version = self.engine.version
        dev = self.engine.device
        mask: Any = attn.to(dev)
        if self.engine.window is not None:  # positions, not columns, bound the window
            mask = on_device(forward_masks(self.engine.model.config, attn, positions), dev)
        out = self.engine.model(
            input_ids=ids.to(dev),
            attention_mask=mask,
            position_ids=positions.to(dev),
            **cache_kwargs(self.engine.model, self.cache),
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :]

    def take_finished(self) -> list[GenResult]:
        """The results verification finished (step() returns them otherwise), handed over once."""
        finished, self._early = self._early, []
        return finished

    @property
    def done(self) -> bool:
        return not self.active and not self._early

    def step(self, hold: bool = False) -> list[GenResult]:
        """Sample one token for every active row, drop finished rows from the cache; returns those. A
        row whose last token is not forwarded yet (verification's, see `_feed`) samples nothing: its
        token goes through the model in this step's forward with the others'. hold: that forward waits
        in `pending` (engine/packed.py runs it with another batch's)."""
        finished = self.take_finished()
        if not self.active:
            return finished
        params = [(self.results[i].request.temperature, self.results[i].request.top_p) for i in self.active]
        waiting = [False] * len(self.active)
        if self._unfed is None:
            tokens, logprobs = sample_rows(self._logits, params, self.engine.generator, rows=self.rows)
        else:
            tokens = self._unfed[self.rows]
            waiting = (tokens >= 0).tolist()
            ready = [r for r, w in enumerate(waiting) if not w]
            logprobs = torch.zeros(len(waiting))
            if ready:
                sel = torch.tensor(ready)
                tok, lp = sample_rows(
                    self._logits, [params[r] for r in ready], self.engine.generator, rows=self.rows[sel]
                )
                tokens[sel] = tok.to(tokens.device, tokens.dtype)  # the logits' device (a GPU) to the host's
                logprobs[sel] = lp.to(logprobs.device, logprobs.dtype)
        versions = [self._versions[k] for k in self.rows.tolist()]
        keep: list[int] = []
        for row, res_idx in enumerate(self.active):
            if waiting[row]:  # emitted already
                keep.append(row)
            elif self._emit(self.results[res_idx], int(tokens[row]), float(logprobs[row]), versions[row]):
                finished.append(self.results[res_idx])
            else:
                keep.append(row)
        self._feed(tokens, keep, hold=hold)
        return finished

    def _emit(self, res: GenResult, tok: int, logprob: float, version: int) -> bool:
        """Append one token to a result; True when that finishes it (an end token or max_new_tokens)."""
        res.token_ids.append(tok)
        res.logprobs.append(logprob)
        res.versions.append(version)
        if tok in self.engine.stop_ids:
            res.finish_reason = "stop"
            return True
        if len(res.token_ids) >= res.request.max_new_tokens:
            res.finish_reason = "length"
            return True
        return False

    def _feed(self, tokens: torch.Tensor, keep: list[int], defer: bool = False, hold: bool = False) -> None:
        """tokens [R]: every active row's newest token. Rows not in `keep` (finished) leave; each kept
        row's cache row goes on with its new token, one cache row per distinct (cache row, token) pair
        (a cache row whose rows drew different tokens forks), and those tokens go through the model,
        whose logits the next step samples from. `defer`: the tokens wait in `_unfed` and go through
        the model in the next step's forward (after verification: a batch that joins a running one then
        costs no forward of its own)."""
        if not keep:
            self.active = []
            return
        rows, src, fed = next_rows(self.rows[keep].tolist(), tokens[keep].tolist(), self.engine.share_rows)
        self._select_cache_rows(src)
        self.active = [self.active[r] for r in keep]
        self.rows = torch.tensor(rows)
        if defer:
            self._unfed = torch.tensor(fed)
            self._logits = self._logits.new_zeros(len(fed), self._logits.shape[-1])  # none yet
            self._versions = [self._logits_version] * len(fed)
            return
        self._unfed = None
        self.engine.decode_rows += len(keep)
        self.engine.decode_cache_rows += len(src)
        self.attn = torch.cat([self.attn, torch.ones(len(src), 1, dtype=self.attn.dtype)], dim=1)
        ids, positions = torch.tensor(fed)[:, None], self.next_pos[:, None]
        if hold:
            self._logits_version = self.engine.version
            seg = Segment(ids, positions, causal_visible(self.attn, 1), self.cache)
            self.pending = Held(seg, lambda h: h[:, -1], self._decoded)
        else:
            self._logits = self._forward(ids, positions, self.attn)
        self._versions = [self._logits_version] * len(fed)
        self.next_pos = self.next_pos + 1

    def _decoded(self, hidden: torch.Tensor, logits: torch.Tensor) -> None:
        """A held decode step's logits [C, V] (of hidden [C, 1, H]): what the next step samples from."""
        self._logits = logits

    def _select_cache_rows(self, src: list[int]) -> None:
        """The cache rows become `src` (copies where one repeats), with their masks and positions."""
        if src != list(range(len(self.next_pos))):  # a cache row left, forked or moved
            idx = torch.tensor(src)
            self.cache.batch_select_indices(idx.to(self.engine.device))
            self.attn, self.next_pos = self.attn[idx], self.next_pos[idx]

    def _unfed_tokens(self) -> torch.Tensor:
        """[C] the token each cache row waits to forward, -1 for none."""
        return self._unfed if self._unfed is not None else torch.full((len(self.next_pos),), -1)

    def can_merge(self, other: DecodeBatch) -> bool:
        """Whether `other` can join this batch: both decoding, KV caches of GrowingLayers (the default
        engine's)."""
        layers = [*self.cache.layers, *other.cache.layers]
        return (
            bool(self.active and other.active)
            and len(self.cache.layers) == len(other.cache.layers)
            and all(isinstance(x, GrowingLayer) for x in layers)
        )

    def merge(self, other: DecodeBatch) -> None:
        """Take over `other`'s requests (see can_merge): its rows join this batch's cache, logits and
        masks; its results finished during verification are returned by this batch's next step.
        Columns no row attends to any more (padding of rows that left) are dropped on the way when the
        cache is rebuilt (GrowingLayer.absorb)."""
        assert self.can_merge(other)
        if self._unfed is not None or other._unfed is not None:
            self._unfed = torch.cat([b._unfed_tokens() for b in (self, other)])
        dead = int(self.attn.argmax(dim=1).min())  # every cache row's first real column is at or past it
        # every layer has the same shapes, so each drops the same columns
        skip = [mine.absorb(theirs, dead) for mine, theirs in zip(self.cache.layers, other.cache.layers)][0]
        width = self.cache.layers[0].length
        left = self.attn[:, skip:]

        def pad(attn: torch.Tensor) -> torch.Tensor:
            return torch.nn.functional.pad(attn, (width - attn.shape[1], 0))

        self.attn = torch.cat([pad(left), pad(other.attn)])
        self.rows = torch.cat([self.rows, other.rows + len(self.next_pos)])
        self.next_pos = torch.cat([self.next_pos, other.next_pos])
        self._logits = torch.cat([self._logits, other._logits.to(self._logits.device)])
        self._versions = self._versions + other._versions
        offset = len(self.results)
        self.active += [offset + i for i in other.active]
        self.results += other.results
        self._early += other._early
