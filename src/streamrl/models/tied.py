"""Tied weights: one parameter under several state-dict names (an LM head sharing the input embedding).

A state dict names a tied weight once per alias, and loading it copies each name in turn into the one
tensor, so the last name's values win. When a state gives the aliases different values (an output
embedding trained apart from the input embedding it is tied to), the engine would sample from a policy
that is neither the trained one nor the base: `aliases_to_skip` refuses such a state before anything is
copied. Aliases that are one tensor (a plain model's state dict) cost nothing; distinct tensors (views of
a shared buffer) are compared once each, in place of the second copy that loading them would make.
"""

from __future__ import annotations

from typing import Any

import torch


def tied_groups(model: torch.nn.Module) -> list[tuple[str, ...]]:
    """The state-dict names of each parameter the model holds under more than one name."""
    names: dict[int, list[str]] = {}
    for name, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), []).append(name)
    return [tuple(group) for group in names.values() if len(group) > 1]


def _same_tensor(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.data_ptr() == b.data_ptr() and a.shape == b.shape and a.stride() == b.stride()


def aliases_to_skip(model: torch.nn.Module, state: dict[str, Any]) -> set[str]:
    """The names of `state` a load into `model` need not copy (a tied weight's second alias: its first
    copies the values), after checking they hold their first alias's values; ValueError (one line)
    when they do not."""
    skip: set[str] = set()
    for group in tied_groups(model):
        given = [n for n in group if n in state]
        if len(given) < 2:
            continue
        first = state[given[0]]
        for other in given[1:]:
            value = state[other]
            if not _same_tensor(first, value) and not torch.equal(
                first, value.to(device=first.device, dtype=first.dtype)
            ):
                raise ValueError(
                    f"new weights give {given[0]} and {other} different values, but the model ties them "
                    "(one tensor): it would sample from neither; train the output embedding only in a "
                    "model with untied embeddings (LoRA: leave it out of train.lora_targets)"
                )
            skip.add(other)
    return skip


def copy_state(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy `tensors` into `model`'s weights in place (copy_ casts to their dtype and device), each tied
    weight once; a state whose tied aliases differ is refused first (aliases_to_skip)."""
    skip = aliases_to_skip(model, tensors)
    state = model.state_dict()
    with torch.no_grad():
        for name, t in tensors.items():
            if name not in skip:
                state[name].copy_(t)
