"""Thread boundaries inside a pass: the trainer may re-size its threads before every decoder layer.

Elastic cores (placement/cores.py) change a process's threads only at its boundaries. A trainer
micro-batch takes seconds on a CPU, so with boundaries only between micro-batches a core a rollout
worker lends sits idle until the next one, and a worker that wants its core back waits as long.
`install(model, fn)` calls `fn()` before each decoder layer's forward (the log-prob passes included)
and before its backward (a hook on the layer's output gradient), so a lent core is taken, and given
back, within one layer's time (tens of milliseconds). `fn` is the async loop's `ThreadSetter.work`:
a lock and a few shared integers, and `torch.set_num_threads` only when the count changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The model's repeated blocks: its longest ModuleList (a Llama's model.layers, GPT-2's h; under
    PEFT the same list inside the wrapper). [] for a model without one."""
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList)]
    return list(max(lists, key=len)) if lists else []


def install(model: Any, fn: Callable[[], object]) -> Callable[[], None]:
    """Call `fn()` before each decoder layer's forward and backward; returns the function that removes
    the hooks again."""

    def before_backward(grad: torch.Tensor) -> None:
        fn()

    def before_forward(module: torch.nn.Module, args: Any) -> None:
        fn()

    def after_forward(module: torch.nn.Module, args: Any, out: Any) -> None:
        hidden = out[0] if isinstance(out, tuple) else out
        if isinstance(hidden, torch.Tensor) and hidden.requires_grad:
            hidden.register_hook(before_backward)

    handles = []
    for layer in decoder_layers(model):
        handles.append(layer.register_forward_pre_hook(before_forward))
        handles.append(layer.register_forward_hook(after_forward))

    def remove() -> None:
        for h in handles:
            h.remove()

    return remove
