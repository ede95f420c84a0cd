"""Keep the engine busy: new requests join the running batch between steps, as rows finish.

Waiting requests are prefilled together and merged into the running DecodeBatch (DecodeBatch.merge),
so each step is one forward over every row, and a long tail never decodes alone while requests wait.
Where the engine packs, the requests that join together are split by prompt (engine/joins.py: each
prompt's prefill then pays for its own prompt and draft tree only) and their prefills run as one forward.
Each row samples with its own request's parameters (ReMax's greedy baseline decodes next to its
group's samples, sharing their prompt's KV row). Weight updates happen between steps: `inflight`
keeps every KV cache (PipelineRL); `interrupt` recomputes them with the new weights (AReaL).
"""

from __future__ import annotations

from typing import Any

import torch

from streamrl.engine.base import GenRequest, GenResult, check_weight_mode, within_context
from streamrl.engine.decode_batch import DecodeBatch
from streamrl.engine.hf import HFEngine
from streamrl.engine.joins import join_groups
from streamrl.engine.packed import packed_hidden
from streamrl.models.head import head_logits


class ContinuousDecoder:
    def __init__(self, engine: HFEngine, weight_mode: str = "inflight") -> None:
        check_weight_mode(weight_mode)
        self.engine = engine
        self.weight_mode = weight_mode
        self.waiting: list[GenRequest] = []
        self.batches: list[DecodeBatch] = []
        self.filled: list[GenResult] = []  # prompts that fill the context: the next step returns them

    @property
    def version(self) -> int:
        """The policy version of the weights the next tokens come from."""
        return self.engine.version

    @property
    def active_rows(self) -> int:
        return sum(len(b.active) for b in self.batches)

    @property
    def idle(self) -> bool:
        return not self.batches and not self.waiting and not self.filled

    def add(self, requests: list[GenRequest]) -> None:
        if any(not req.prompt_ids for req in requests):  # its prefill would fail every row's step
            raise ValueError("GenRequest.prompt_ids is empty: give every request a prompt token")
        for req in requests:
            req = within_context(req, self.engine.context)
            if req.max_new_tokens < 1:
                self.filled.append(GenResult(request=req, finish_reason="length"))
            else:
                self.waiting.append(req)

    def update_weights(self, state: dict[str, Any] | None, version: int) -> None:
        """Take new weights between steps (state None: already copied into the engine's model)."""
        self.engine.update_weights(state, version)
        if self.weight_mode == "interrupt":
            with torch.inference_mode():
                for b in self.batches:
                    b.recompute()

    def step(self) -> list[GenResult]:
        """Start or join batches from waiting requests if there is room, then advance every batch one
        token. Where the engine packs (engine/packed.py), the requests are split into joining batches
        (engine/joins.py) whose prefills run in one forward with the running batch's step; they join
        after that forward."""
        room = self.engine.max_batch - self.active_rows
        finished, self.filled = self.filled, []
        with torch.inference_mode():
            host, joining = None, []
            if self.waiting and room > 0:
                take, self.waiting = self.waiting[:room], self.waiting[room:]
                take.sort(key=lambda r: len(r.prompt_ids))
                host = next((b for b in self.batches if b.active), None)
                joining = self._start(take, host is not None)
            for b in self.batches:
                finished.extend(b.step(hold=bool(joining) and b is host))
            if joining:
                run_pending(self.engine, [b for b in (host, *joining) if b is not None])
                for j in joining:
                    finished.extend(j.take_finished())  # answered in verification: done now
                self._join_all(joining)
            self.batches = [b for b in self.batches if not b.done]
        return finished

    def _start(self, take: list[GenRequest], running: bool) -> list[DecodeBatch]:
        """The joining batches of `take` whose prefills wait for the running batch's step (none: they
        have joined already). Where the engine packs, one batch per group of join_groups, their
        prefills in one forward (now if no batch is running: the new rows step at once); elsewhere one
        batch, prefilled now."""
        groups = join_groups(take, self.engine.branch_min) if self.engine.pack else [take]
        if not ((running or len(groups) > 1) and self.engine.packs()):
            self._join(DecodeBatch(self.engine, take))
            return []
        joining = [DecodeBatch(self.engine, g, hold=True) for g in groups]
        if running:
            return joining
        run_pending(self.engine, joining)
        self._join_all(joining)
        return []

    def _join_all(self, new: list[DecodeBatch]) -> None:
        """Join batches prefilled together: merged with each other first, so the running batch takes
        one merge (a merge can rebuild its whole KV cache), then as _join."""
        merged: list[DecodeBatch] = []
        for b in new:
            into = next((m for m in merged if m.can_merge(b)), None)
            if into is not None:
                into.merge(b)
            else:
                merged.append(b)
        for b in merged:
            self._join(b)

    def _join(self, new: DecodeBatch) -> None:
        host = next((b for b in self.batches if b.can_merge(new)), None)
        if host is not None:
            host.merge(new)
        else:
            self.batches.append(new)


def run_pending(engine: HFEngine, batches: list[DecodeBatch]) -> None:
    """Run the forwards the batches hold as one (packed_hidden), then the LM head once over every
    batch's head rows (each product streams the whole head), and hand each its hidden states and
    logits."""
    held = [b.pending for b in batches if b.pending is not None]
    if not held:
        return
    for b in batches:
        b.pending = None
    hidden = packed_hidden(engine.model, [p.segment for p in held], engine.device)
    rows = [p.rows(h) for p, h in zip(held, hidden, strict=True)]
    logits = head_logits(engine.model, torch.cat(rows)).split([len(r) for r in rows])
    for p, h, lg in zip(held, hidden, logits, strict=True):
        p.done(h, lg)
