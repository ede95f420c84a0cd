"""The whole (unsharded) model and optimizer state of a train.strategy=fsdp2 trainer.

A run state holds them in one process's format (trainer.optimizer.state_dict() of train.strategy=single:
parameters numbered 0.. in the optimizer's order, full tensors), so the same files resume any strategy.
gather_* collect the shards on rank 0 (on the CPU); load_full hands rank 0's saved copy to every rank,
each keeping its shards. Each is a collective: every rank calls it, in the same order.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import nn

# how an optimizer runs, not what it learned: a state saved by another strategy keeps this optimizer's
IMPLEMENTATION = ("fused", "foreach")


def _options(load: bool) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    if load:  # rank 0 holds the state; the others receive their shards of it
        # strict=False: a tied weight is saved once (the model's own load_state_dict: same)
        return StateDictOptions(full_state_dict=True, broadcast_from_rank0=True, strict=False)
    return StateDictOptions(full_state_dict=True, cpu_offload=True)  # on rank 0 only


def _names(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[str]:
    """Each optimized parameter's name, in the order one process's state_dict numbers them."""
    name_of = {id(p): n for n, p in model.named_parameters()}
    return [name_of[id(p)] for g in optimizer.param_groups for p in g["params"]]


def with_implementation_of(optimizer: torch.optim.Optimizer, saved: dict[str, Any]) -> dict[str, Any]:
    """`saved` (an optimizer state_dict) with `optimizer`'s own IMPLEMENTATION keys in its groups."""
    groups = [
        {**g, **{k: mine[k] for k in IMPLEMENTATION if k in mine}}
        for g, mine in zip(saved["param_groups"], optimizer.param_groups, strict=True)
    ]
    return {**saved, "param_groups": groups}


def gather_model(model: nn.Module) -> dict[str, torch.Tensor]:
    """Rank 0: the full weights on the CPU; the other ranks: {}."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(model, options=_options(load=False))


def gather_optimizer(model: nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    """Rank 0: the optimizer's full state_dict in one process's format; the other ranks: {}."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    if not optimizer.state:  # no step yet, on any rank: torch would make its moments with a zero step
        return optimizer.state_dict() if dist.get_rank() == 0 else {}
    full = get_optimizer_state_dict(model, optimizer, options=_options(load=False))
    if dist.get_rank() != 0:
        return {}
    number = {n: i for i, n in enumerate(_names(model, optimizer))}
    return {
        "state": {number[n]: s for n, s in full["state"].items()},
        "param_groups": [{**g, "params": [number[n] for n in g["params"]]} for g in full["param_groups"]],
    }


def load_full(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    weights: dict[str, torch.Tensor],
    saved: dict[str, Any],
    moments: bool,
) -> None:
    """Rank 0 passes the saved weights and optimizer state_dict (one process's format), the other
    ranks {} and {}: every rank's shards of the model and of the optimizer's moments become the saved.
    moments: whether the saved optimizer has any (rank 0 tells the others); a state saved before the
    first step has none, and the fresh optimizer is kept (torch would make moments with a zero step)."""
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    options = _options(load=True)
    set_model_state_dict(model, dict(weights), options=options)  # torch puts its shards into the dict
    if not moments:
        return
    by_name: dict[str, Any] = {}
    if saved:
        names = _names(model, optimizer)
        by_name = {
            "state": {names[i]: s for i, s in saved["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in saved["param_groups"]],
        }
    tuples = [{k for k, v in g.items() if isinstance(v, tuple)} for g in optimizer.param_groups]
    set_optimizer_state_dict(model, optimizer, by_name, options=options)
    for group, keys in zip(optimizer.param_groups, tuples, strict=True):  # the broadcast made them lists
        group.update({k: tuple(group[k]) for k in keys})
