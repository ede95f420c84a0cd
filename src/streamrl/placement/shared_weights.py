"""Weights from the trainer to rollout workers on one machine through shared memory.

The trainer copies its parameters into one flat shared buffer per dtype (one copy per step, no
pickling); workers copy out of it into their own model between decode steps. A seqlock-style
version pair makes a torn read detectable: the writer bumps `begin`, copies, then sets `end`;
a reader that sees begin != end, or a change of `begin` during its copy, reads again.
"""

from __future__ import annotations

import multiprocessing as mp
import time
from collections.abc import Callable
from typing import Any

import torch

from streamrl.models.tied import copy_state


def _state(source: torch.nn.Module | dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return source.state_dict() if isinstance(source, torch.nn.Module) else source


class SharedWeights:
    """source: a module or its engine-facing state dict (Trainer.policy_state(): LoRA merged)."""

    def __init__(self, source: torch.nn.Module | dict[str, torch.Tensor], ctx: Any = None) -> None:
        ctx = ctx or mp.get_context("spawn")
        state = dict(_state(source))
        self.names = list(state)
        self.shapes = [tuple(v.shape) for v in state.values()]
        self.dtypes = [v.dtype for v in state.values()]
        numel = sum(v.numel() for v in state.values())
        dtype = state[self.names[0]].dtype
        if any(d != dtype for d in self.dtypes):
            raise ValueError("SharedWeights needs a single parameter dtype (load the model in one dtype)")
        self.flat = torch.empty(numel, dtype=dtype).share_memory_()
        self.begin = ctx.Value("q", -1, lock=False)
        self.end = ctx.Value("q", -1, lock=False)
        self.publish(state, version=0)

    def _views(self) -> list[torch.Tensor]:
        out, off = [], 0
        for shape in self.shapes:
            n = 1
            for s in shape:
                n *= s
            out.append(self.flat[off : off + n].view(shape))
            off += n
        return out

    def publish(self, source: torch.nn.Module | dict[str, torch.Tensor], version: int) -> None:
        self.begin.value = version
        with torch.no_grad():
            state = _state(source)
            for name, view in zip(self.names, self._views()):
                view.copy_(state[name].detach().to("cpu"))
        self.end.value = version

    @property
    def version(self) -> int:
        return int(self.end.value)

    def load_into(self, model: torch.nn.Module, timeout: float = 60.0) -> int:
        """Copy the newest complete weights into `model` (a tied weight once; tied aliases with different
        values refused: models/tied.py); returns their version."""
        return self.read(lambda views, version: copy_state(model, views), timeout)

    def read(self, consume: Callable[[dict[str, torch.Tensor], int], None], timeout: float = 60.0) -> int:
        """Hand the newest complete weights and their version to `consume`, as views into the shared
        buffer (valid only during the call; consume copies what it keeps); returns that version. If a
        publish overlapped the call, `consume` runs again with the newer weights."""
        deadline = time.monotonic() + timeout
        while True:
            v = self.begin.value
            if v == self.end.value:
                consume(dict(zip(self.names, self._views())), int(v))
                if self.begin.value == v:  # no publish started during our copy
                    return int(v)
            if time.monotonic() > deadline:
                raise TimeoutError(f"weights never settled within {timeout:.0f} s (writer stuck at {v})")
            time.sleep(0.001)
