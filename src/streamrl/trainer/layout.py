"""The layout a batch trains in: padded rows (batching.py), packed rows (train.packing, packing.py) or
shared-prompt groups (train.shared_prompt, shared_prompt.py); each cuts the batch under
train.token_budget and collates its own MicroBatch."""

from __future__ import annotations

from streamrl.config import TrainConfig
from streamrl.trainer.batching import MicroBatch, collate, split_by_token_budget
from streamrl.trainer.packing import collate_packed, pack_by_token_budget
from streamrl.trainer.shared_prompt import collate_shared, shareable, split_shared
from streamrl.types import TrainBatch


def shares_prompts(train: TrainConfig, batch: TrainBatch) -> bool:
    """train.shared_prompt on a batch whose groups repeat prompts (one trainer rank, no packing:
    DDP/FSDP2 expect one forward per backward)."""
    t = train
    return t.shared_prompt and not t.packing and t.strategy == "single" and shareable(batch.trajectories)


def split_batch(train: TrainConfig, batch: TrainBatch) -> list[list[int]]:
    """The trajectory indices of each micro-batch."""
    trajs, budget = batch.trajectories, train.token_budget
    lengths = [(len(t.prompt_ids), len(t.completion_ids)) for t in trajs]
    if train.packing:
        return pack_by_token_budget([p + c for p, c in lengths], budget)
    if shares_prompts(train, batch):
        return split_shared([tuple(t.prompt_ids) for t in trajs], [c for _, c in lengths], budget)
    return split_by_token_budget(lengths, budget)


def collate_group(train: TrainConfig, batch: TrainBatch, group: list[int], pad_id: int) -> MicroBatch:
    """One micro-batch of split_batch: the trajectories `group` indexes, with their advantages."""
    trajs, adv = [batch.trajectories[i] for i in group], [batch.advantages[i] for i in group]
    if train.packing:
        return collate_packed(trajs, adv, pad_id)
    if shares_prompts(train, batch):
        return collate_shared(trajs, adv, pad_id)
    return collate(trajs, adv, pad_id)
