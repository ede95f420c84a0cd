"""Sequence packing (train.packing): several trajectories in one row, no padding tokens.

A packed micro-batch is one row [1, T] (T <= train.token_budget):
prompt + completion of each trajectory back to back, position_ids restarting at 0 for each. With
attention_mask=None, transformers (masking_utils.find_packed_sequence_indices) reads the restarts as
sequence boundaries and builds a block-diagonal causal mask, so no token attends across trajectories
(tests/test_packing.py checks packed == padded log-probs). The per-trajectory tensors keep the
padded [B, C] layout and `packed_index` [B, C] says which row position predicts each completion
token, so the loss code is unchanged.
"""

from __future__ import annotations

import torch

from streamrl.trainer.batching import MicroBatch, check_fits, per_token
from streamrl.types import Trajectory


def pack_by_token_budget(lengths: list[int], budget: int) -> list[list[int]]:
    """lengths: tokens per sample -> index lists whose total fits `budget` (first-fit decreasing; a
    sample longer than the budget on its own raises ValueError: batching.check_fits)."""
    check_fits(lengths, budget)
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    bins: list[list[int]] = []
    room: list[int] = []
    for i in order:
        for b, free in enumerate(room):
            if lengths[i] <= free:
                bins[b].append(i)
                room[b] -= lengths[i]
                break
        else:
            bins.append([i])
            room.append(budget - lengths[i])
    return bins


def collate_packed(trajs: list[Trajectory], advantages: list[float], pad_id: int) -> MicroBatch:
    """One packed row: input_ids/position_ids [1, T], attention_mask None; the rest [B, C]."""
    tok = per_token(trajs, advantages, pad_id)
    B, C = tok["completion_ids"].shape
    ids: list[int] = []
    pos: list[int] = []
    index = torch.zeros(B, C, dtype=torch.long)
    for i, t in enumerate(trajs):
        p, c = len(t.prompt_ids), len(t.completion_ids)
        start = len(ids)
        ids += list(t.prompt_ids) + list(t.completion_ids)
        pos += list(range(p + c))
        if c:  # the logit at row position start + p - 1 + j predicts completion token j
            index[i, :c] = torch.arange(start + p - 1, start + p - 1 + c)
    return MicroBatch(
        input_ids=torch.tensor([ids]),
        attention_mask=None,
        position_ids=torch.tensor([pos]),
        prompt_width=0,
        packed_index=index,
        **tok,
    )
