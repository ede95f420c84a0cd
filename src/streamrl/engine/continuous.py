"""Keep the engine busy: several DecodeBatches stepped in turn, new requests joining as rows finish.

A DecodeBatch only loses rows, so when a batch's long tail leaves it small, a fresh batch of waiting
requests is started next to it instead of waiting for the tail. Weight updates happen between steps:
`inflight` keeps every KV cache (PipelineRL); `interrupt` recomputes them with the new weights (AReaL).
"""

from __future__ import annotations

from typing import Any

import torch

from streamrl.engine.base import GenRequest, GenResult, check_weight_mode
from streamrl.engine.hf import DecodeBatch, HFEngine


class ContinuousDecoder:
    def __init__(self, engine: HFEngine, weight_mode: str = "inflight") -> None:
        check_weight_mode(weight_mode)
        self.engine = engine
        self.weight_mode = weight_mode
        self.waiting: list[GenRequest] = []
        self.batches: list[DecodeBatch] = []

    @property
    def version(self) -> int:
        """The policy version of the weights the next tokens come from."""
        return self.engine.version

    @property
    def active_rows(self) -> int:
        return sum(len(b.active) for b in self.batches)

    @property
    def idle(self) -> bool:
        return not self.batches and not self.waiting

    def add(self, requests: list[GenRequest]) -> None:
        self.waiting.extend(requests)

    def update_weights(self, state: dict[str, Any] | None, version: int) -> None:
        """Take new weights between steps (state None: already copied into the engine's model)."""
        self.engine.update_weights(state, version)
        if self.weight_mode == "interrupt":
            with torch.inference_mode():
                for b in self.batches:
                    b.recompute()

    def step(self) -> list[GenResult]:
        """Start a batch from waiting requests if there is room, then advance every batch one token."""
        room = self.engine.max_batch - self.active_rows
        with torch.inference_mode():
            # a new batch when nothing runs, or when it would be at least a quarter full: each batch costs
            # one forward per token, so requests arriving one group at a time must not each start their
            # own (8 batches of 8 rows cost ~8x the per-step overhead of one batch of 64)
            quarter = max(1, self.engine.max_batch // 4)
            if (
                self.waiting
                and (not self.batches or len(self.waiting) >= quarter)
                and room >= min(len(self.waiting), quarter)
            ):
                take, self.waiting = self.waiting[:room], self.waiting[room:]
                take.sort(key=lambda r: len(r.prompt_ids))
                self.batches.append(DecodeBatch(self.engine, take))
            finished: list[GenResult] = []
            for b in self.batches:
                finished.extend(b.step())
            self.batches = [b for b in self.batches if not b.done]
        return finished
