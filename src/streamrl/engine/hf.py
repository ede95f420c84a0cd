"""The default engine: batched sampling with a KV cache on plain PyTorch/transformers.

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
lengths decode side by side exactly as they would apart.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch

from streamrl.config_sections import RolloutConfig
from streamrl.engine.base import GenRequest, GenResult
from streamrl.engine.draft_tree import choose_drafts, prompt_trees
from streamrl.engine.kv_cache import GrowingLayer, growing_cache, next_rows
from streamrl.engine.prefix_cache import PrefixCache
from streamrl.engine.sampling import sample_rows
from streamrl.engine.speculative import tree_forward, verify_drafts
from streamrl.engine.windows import column_positions, forward_masks, on_device, sliding_window
from streamrl.models.cache_kwarg import cache_kwargs
from streamrl.models.frozen import contiguous_head_input, freeze
from streamrl.models.precision import cast_params

PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}
FIRST_COLUMNS = 256  # KV columns reserved past the prompt before the first doubling


class DecodeBatch:
    """Rows decoded together, each with its request's temperature and top-p. Prompts are left-padded
    (after the prefix they share, if it is cached); one forward per step."""

    def __init__(self, engine: HFEngine, requests: list[GenRequest]) -> None:
        self.engine = engine
        self.results = [GenResult(request=r) for r in requests]
        self.active = list(range(len(requests)))  # result index of each row
        # rows -> [R]: the KV-cache row of each row (rows with identical tokens so far share one);
        # attn, next_pos and _logits are per cache row
        self.rows = torch.arange(len(requests))
        # speculative rollouts: the drafts are verified in the prompts' prefill (engine/speculative.py);
        # greedy rows take none; a lenient row's draft is chosen first and kept whole in the tree
        drafts = [
            tuple(d.token_ids[: r.max_new_tokens] for d in r.drafts) if r.temperature > 0 else ()
            for r in requests
        ]
        self._chosen, whole = choose_drafts(requests, engine.generator)
        self._prefill([r.prompt_ids for r in requests], share=engine.share_rows, drafts=drafts, whole=whole)
        self._early = verify_drafts(self) if self._trees else []  # finished there; step() returns them

    def _prefill(
        self,
        seqs: list[list[int]],
        share: bool = True,
        drafts: Sequence[tuple[tuple[int, ...], ...]] = (),
        whole: Sequence[tuple[tuple[int, ...], ...]] = (),
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
        hidden = None
        if extra:
            logits, hidden = tree_forward(self, ids[:, n:], positions[:, n:], attn, trees)
        else:
            logits = self._forward(ids[:, n:], positions[:, n:], attn)
        if share or len(distinct) == len(seqs):
            self.rows, self.attn, self._logits = inverse, attn, logits
        else:
            self.cache.batch_select_indices(inverse.to(eng.device))
            self.rows, self.attn, positions = torch.arange(len(seqs)), attn[inverse], positions[inverse]
            self._logits = logits[inverse.to(logits.device)]
            trees = [trees[k] for k in inverse.tolist()]
            hidden = None if hidden is None else hidden[inverse.to(hidden.device)]
        self._trees = trees if extra else []
        self._tree_hidden = hidden
        self.next_pos = positions[:, -1] + 1
        self._versions = [self._logits_version] * len(self._logits)
        self._unfed: torch.Tensor | None = None  # [C] a token to forward per cache row (-1: none)

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

    @property
    def done(self) -> bool:
        return not self.active and not self._early

    def step(self) -> list[GenResult]:
        """Sample one token for every active row, drop finished rows from the cache; returns those. A
        row whose last token is not forwarded yet (verification's, see `_feed`) samples nothing: its
        token goes through the model in this step's forward with the others'."""
        finished, self._early = self._early, []
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
                tokens[sel], logprobs[sel] = tok.to(tokens.dtype), lp.to(logprobs.dtype)
        versions = [self._versions[k] for k in self.rows.tolist()]
        keep: list[int] = []
        for row, res_idx in enumerate(self.active):
            if waiting[row]:  # emitted already
                keep.append(row)
            elif self._emit(self.results[res_idx], int(tokens[row]), float(logprobs[row]), versions[row]):
                finished.append(self.results[res_idx])
            else:
                keep.append(row)
        self._feed(tokens, keep)
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

    def _feed(self, tokens: torch.Tensor, keep: list[int], defer: bool = False) -> None:
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
        self._logits = self._forward(torch.tensor(fed)[:, None], self.next_pos[:, None], self.attn)
        self._versions = [self._logits_version] * len(fed)
        self.next_pos = self.next_pos + 1

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
        Columns no row attends to any more (padding of rows that left) are dropped on the way."""
        assert self.can_merge(other)
        if self._unfed is not None or other._unfed is not None:
            self._unfed = torch.cat([b._unfed_tokens() for b in (self, other)])
        skip = int(self.attn.argmax(dim=1).min())  # every cache row's first real column is at or past it
        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.absorb(theirs, skip)
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


class HFEngine:
    """Engine over a transformers causal LM.

    dtype None (or the model's own dtype): the engine decodes with `model` itself (in the colocated
    loop, the trainer's module). Another dtype (bf16: ~2x fp32 decode on CPU): the engine keeps its own
    copy in that dtype, `owns_weights` is True and new weights must be passed to `update_weights`.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        max_batch: int = 128,
        seed: int = 0,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        share_rows: bool = True,
        prefix_cache: bool = True,
        branch_min: int = RolloutConfig.spec_branch_min,
    ) -> None:
        self.owns_weights = dtype is not None and dtype != next(model.parameters()).dtype
        if self.owns_weights:
            model = freeze(cast_params(copy.deepcopy(model), dtype))
        else:
            contiguous_head_input(model)  # the caller's model (the policy itself when shared)
        self.model = model
        self.device = device
        self.window = sliding_window(model.config)  # sliding-window layers: the engine builds their masks
        self.max_batch = max_batch
        self.share_rows = share_rows  # rows with identical tokens so far share a KV row (DecodeBatch)
        self.branch_min = branch_min  # draft trees keep nodes this many drafts pass (engine/speculative.py)
        # the KV of the prefix the prompts share, prefilled once per weights (engine/prefix_cache.py)
        self.prefix_cache = PrefixCache() if prefix_cache else None
        self.version = 0
        self.pad_id = int(tokenizer.pad_token_id)
        self.stop_ids = stop_token_ids(model, tokenizer)
        self.generator = torch.Generator().manual_seed(seed)
        self._pending: dict[int, GenRequest] = {}
        self._done: dict[int, GenResult] = {}
        self._next_handle = 0
        self._paused = False
        # summed over decode steps: the sequences decoded and the KV-cache rows forwarded for them
        # (shared rows: fewer); their ratio is the simulator's row_share (sim/fit.py)
        self.decode_rows = 0
        self.decode_cache_rows = 0

    def submit(self, request: GenRequest) -> int:
        if not request.prompt_ids:
            raise ValueError("GenRequest.prompt_ids is empty")
        handle = self._next_handle
        self._next_handle += 1
        self._pending[handle] = request
        return handle

    def abort(self, handle: int) -> None:
        req = self._pending.pop(handle, None)
        if req is not None:
            self._done[handle] = GenResult(request=req, finish_reason="abort")

    def wait(self, handles: list[int]) -> list[GenResult]:
        if self._paused:
            raise RuntimeError("engine is paused; call resume() before wait()")
        # similar prompt lengths together: less left padding per batch
        todo = sorted(
            (h for h in handles if h in self._pending), key=lambda h: len(self._pending[h].prompt_ids)
        )
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.inference_mode():
                for i in range(0, len(todo), self.max_batch):
                    chunk = todo[i : i + self.max_batch]
                    batch = DecodeBatch(self, [self._pending[h] for h in chunk])
                    while not batch.done:
                        batch.step()
                    for h, res in zip(chunk, batch.results):
                        del self._pending[h]
                        self._done[h] = res
        finally:
            self.model.train(was_training)
        return [self._done.pop(h) for h in handles]

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return self.wait([self.submit(r) for r in requests])

    def update_weights(self, state: dict[str, Any] | None, version: int) -> None:
        """state None: the weights are already in `model` (shared module or copied in by the caller)."""
        if state is not None:
            self.model.load_state_dict(state, strict=False)  # casts to the engine's dtype
        elif self.owns_weights and version != self.version:
            raise RuntimeError(
                "this engine keeps its own weights (rollout.precision differs from the trainer's model): "
                "pass the new state to update_weights"
            )
        self.version = version

    def pause(self) -> None:
        self._paused = True

    def resume(self) -> None:
        self._paused = False


def stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    """EOS of the tokenizer and the generation config, plus ChatML's end-of-turn token if present."""
    ids = {int(tokenizer.eos_token_id)} if tokenizer.eos_token_id is not None else set()
    gen_eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    if isinstance(gen_eos, int):
        ids.add(gen_eos)
    elif gen_eos:
        ids.update(int(i) for i in gen_eos)
    im_end = tokenizer.convert_tokens_to_ids("<|im_end|>")
    if isinstance(im_end, int) and im_end != tokenizer.unk_token_id:
        ids.add(im_end)
    return ids


def stop_ids_from_dir(model_dir: Any, tokenizer: Any) -> set[int]:
    """stop_token_ids without loading the weights (engines that load the checkpoint themselves)."""
    from types import SimpleNamespace

    from transformers import GenerationConfig

    try:
        gen = GenerationConfig.from_pretrained(model_dir)
    except OSError:  # no generation_config.json: the tokenizer's EOS and <|im_end|> only
        gen = None
    return stop_token_ids(SimpleNamespace(generation_config=gen), tokenizer)
