"""Turn trajectories into padded tensors and split them into micro-batches under a token budget.

Layout of one micro-batch: prompts left-padded to a common width P, completions right-padded to C,
so every completion starts at column P and one `logits_to_keep = C + 1` covers all of them.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from streamrl.types import Trajectory


@dataclass
class MicroBatch:
    """input_ids, attention_mask, position_ids: [B, P + C]; the rest: [B, C].

    Packed (trainer/packing.py): input_ids, position_ids [1, T], attention_mask None, and
    packed_index [B, C]: the row position whose logit predicts each completion token.
    Shared prompt (trainer/shared_prompt.py): prefix_ids/prefix_mask [U, P'], prompt_rows [B],
    input_ids/position_ids [B, C], attention_mask [B, P' + C], completion_lengths [B]."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor | None
    position_ids: torch.Tensor
    completion_ids: torch.Tensor
    loss_mask: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    versions: torch.Tensor
    prompt_width: int
    packed_index: torch.Tensor | None = None
    prefix_ids: torch.Tensor | None = None
    prefix_mask: torch.Tensor | None = None
    prompt_rows: torch.Tensor | None = None
    completion_lengths: torch.Tensor | None = None  # [B]; shared prompt: the LM head runs on these only
    distinct_rows: torch.Tensor | None = None  # [D]; shared prompt, repeated samples: the rows forwarded
    sample_rows: torch.Tensor | None = None  # [B]; each row's index into distinct_rows

    @property
    def num_tokens(self) -> int:
        """Token positions the forward runs over, padding included."""
        extra = int(self.prefix_ids.numel()) if self.prefix_ids is not None else 0
        rows = len(self.distinct_rows) if self.distinct_rows is not None else self.input_ids.shape[0]
        return rows * int(self.input_ids.shape[1]) + extra

    @property
    def real_positions(self) -> int:
        """Of num_tokens, the positions holding a token (not padding): packed rows have none; shared
        prompts count each prefix once and each forwarded row's completion."""
        if self.attention_mask is None:  # packed
            return int(self.input_ids.numel())
        if self.prefix_mask is None:
            return int(self.attention_mask.sum())
        width = self.input_ids.shape[1]
        rows = self.attention_mask[:, -width:]
        if self.distinct_rows is not None:
            rows = rows[self.distinct_rows]
        return int(self.prefix_mask.sum()) + int(rows.sum())


def per_token(trajs: list[Trajectory], advantages: list[float], pad_id: int) -> dict[str, torch.Tensor]:
    """The [B, C] tensors every layout shares (C = longest completion, at least 1): completion_ids,
    loss_mask, old_logprobs, versions (right-padded) and advantages (one value per row, broadcast)."""
    B, C = len(trajs), max(max(len(t.completion_ids) for t in trajs), 1)
    comp = torch.full((B, C), pad_id, dtype=torch.long)
    lmask = torch.zeros(B, C)
    old = torch.zeros(B, C)
    vers = torch.zeros(B, C, dtype=torch.long)
    for i, t in enumerate(trajs):
        c = len(t.completion_ids)
        if c:
            comp[i, :c] = torch.tensor(t.completion_ids)
            lmask[i, :c] = torch.tensor(t.loss_mask, dtype=torch.float)
            old[i, :c] = torch.tensor(t.behaviour_logprobs)
            vers[i, :c] = torch.tensor(t.versions)
    adv = torch.tensor(advantages, dtype=torch.float)[:, None].expand(B, C).contiguous()
    return dict(completion_ids=comp, loss_mask=lmask, old_logprobs=old, versions=vers, advantages=adv)


def collate(trajs: list[Trajectory], advantages: list[float], pad_id: int) -> MicroBatch:
    tok = per_token(trajs, advantages, pad_id)
    P = max(len(t.prompt_ids) for t in trajs)
    B, C = tok["completion_ids"].shape
    ids = torch.full((B, P + C), pad_id, dtype=torch.long)
    attn = torch.zeros(B, P + C, dtype=torch.long)
    for i, t in enumerate(trajs):
        p, c = len(t.prompt_ids), len(t.completion_ids)
        ids[i, P - p : P] = torch.tensor(t.prompt_ids)
        attn[i, P - p : P + c] = 1
        if c:
            ids[i, P : P + c] = torch.tensor(t.completion_ids)
    pos = (attn.cumsum(-1) - 1).clamp(min=0)
    return MicroBatch(input_ids=ids, attention_mask=attn, position_ids=pos, prompt_width=P, **tok)


def check_fits(sizes: list[int], budget: int) -> None:
    """Every micro-batch fits train.token_budget only if every sample (its prompt + completion tokens,
    `sizes`) does on its own: ValueError naming the longest otherwise. Preflight keeps prompts short
    enough (data/prompt_limit.py), so this guards an invariant rather than a path a run takes."""
    longest = max(sizes, default=0)
    if longest > budget:
        raise ValueError(
            f"a sample of {longest} tokens (prompt + completion) is longer than train.token_budget={budget}, "
            "so no micro-batch can hold it: raise train.token_budget, or lower task_config.max_prompt_tokens "
            "or rollout.max_new_tokens"
        )


def split_by_token_budget(lengths: list[tuple[int, int]], budget: int) -> list[list[int]]:
    """lengths: (prompt_len, completion_len) per sample -> index lists whose padded size fits `budget`.

    Samples are sorted by total length so neighbours pad little; a micro-batch's padded size is
    rows * (max prompt + max completion), a completion at least 1 wide (collate). A sample longer than
    the budget on its own raises ValueError (check_fits).
    """
    check_fits([p + max(c, 1) for p, c in lengths], budget)
    order = sorted(range(len(lengths)), key=lambda i: (lengths[i][0] + lengths[i][1], i))
    batches: list[list[int]] = []
    cur: list[int] = []
    max_p = max_c = 0
    for i in order:
        p, c = lengths[i][0], max(lengths[i][1], 1)
        np_, nc = max(max_p, p), max(max_c, c)
        if cur and (len(cur) + 1) * (np_ + nc) > budget:
            batches.append(cur)
            cur, np_, nc = [], p, c
        cur.append(i)
        max_p, max_c = np_, nc
    if cur:
        batches.append(cur)
    return batches
