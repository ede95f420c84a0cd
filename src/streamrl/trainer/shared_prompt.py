"""Shared-prompt micro-batches (train.shared_prompt): a group's G samples share one prompt forward.

GRPO-style batches hold G completions of each prompt; the padded layout runs the prompt G times.
Here each distinct prompt (minus its last token) runs once with use_cache=True; its KV cache is
index-selected per row and the completions run on top of it, each row's input being
[last prompt token, completion[:-1]], so position j predicts completion token j. Gradients flow
through the selected cache back into the single prompt forward: the function computed is the same as
the padded path's (tests/test_shared_prompt.py checks log-probs and gradients), with
~(G - 1) / G of the prompt tokens removed from the forward and backward. Identical samples (the same
prompt and completion, frequent once a policy is confident about a short answer) run their completion
once too: the distinct rows are forwarded and their log-probs indexed per sample, so each sample keeps
its own advantage, mask and behaviour log-probs in the loss, and the gradient (summed through the
index) is the same function's.

Layout: prefix_ids / prefix_mask [U, P'] (U distinct prompts, left-padded, P' = longest prompt - 1),
prompt_rows [B] (each row's prefix), input_ids / position_ids [B, C] (right-padded),
attention_mask [B, P' + C]; the per-token tensors [B, C] as in batching.MicroBatch; with repeated
samples, distinct_rows [D] (one row of each distinct sample) and sample_rows [B] (each row's index
into them).
"""

from __future__ import annotations

from typing import Any

import torch

from streamrl.models.cache_kwarg import cache_kwargs, returned_cache
from streamrl.models.head import check_head, head_logits
from streamrl.trainer.batching import MicroBatch, check_fits, per_token
from streamrl.trainer.fused_logprobs import token_logprobs_entropy
from streamrl.types import Trajectory


def shareable(trajs: list[Trajectory]) -> bool:
    """Every prompt has >= 2 tokens (a prefix to cache) and some prompt repeats (else nothing to share)."""
    prompts = {tuple(t.prompt_ids) for t in trajs}
    return all(len(t.prompt_ids) >= 2 for t in trajs) and len(prompts) < len(trajs)


# a micro-batch's fixed cost (Python and per-layer calls of one forward + backward), in tokens: on
# SmolLM2 with 1 thread ~0.1 s, the time of ~64 trained tokens
MICRO_BATCH_OVERHEAD = 64


def split_shared(
    prompts: list[tuple[int, ...]],
    completions: list[int],
    budget: int,
    overhead: int = MICRO_BATCH_OVERHEAD,
) -> list[list[int]]:
    """Index lists, each costing U * P' + rows * C <= `budget` (U distinct prefixes of longest P', rows
    completion rows padded to the longest C), with the least total cost + `overhead` per micro-batch.

    Samples are ordered by completion length (then prompt) and cut optimally by dynamic programming:
    one batch of ragged completions pads every row to the longest (a 48-token truncated sample among
    ~12-token answers makes 3/4 of [B, C] padding), while each extra micro-batch repeats its prefixes
    and pays `overhead`. A sample longer than the budget on its own raises ValueError (check_fits)."""
    check_fits([len(p) + max(c, 1) for p, c in zip(prompts, completions)], budget)
    n = len(prompts)
    order = sorted(range(n), key=lambda i: (max(completions[i], 1), len(prompts[i]), prompts[i], i))
    best = [0.0] + [float("inf")] * n  # best[j]: least cost of order[:j]
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        c = max(completions[order[j - 1]], 1)  # the longest completion of any segment ending at j
        seen: set[tuple[int, ...]] = set()
        max_p = 0
        for i in range(j - 1, -1, -1):
            p = prompts[order[i]]
            seen.add(p)
            max_p = max(max_p, len(p) - 1)
            cost = len(seen) * max_p + (j - i) * c
            if cost > budget and i < j - 1:
                break  # longer segments only cost more
            if best[i] + overhead + cost < best[j]:
                best[j], cut[j] = best[i] + overhead + cost, i
    out: list[list[int]] = []
    j = n
    while j > 0:
        out.append(order[cut[j] : j])
        j = cut[j]
    return out[::-1]


def collate_shared(trajs: list[Trajectory], advantages: list[float], pad_id: int) -> MicroBatch:
    """-> a MicroBatch with prefix_ids / prefix_mask / prompt_rows set (see the module docstring)."""
    keys: dict[tuple[int, ...], int] = {}
    for t in trajs:
        keys.setdefault(tuple(t.prompt_ids), len(keys))
    U, B = len(keys), len(trajs)
    Pp = max(len(k) for k in keys) - 1
    prefix = torch.full((U, Pp), pad_id, dtype=torch.long)
    pmask = torch.zeros(U, Pp, dtype=torch.long)
    for k, u in keys.items():
        n = len(k) - 1
        prefix[u, Pp - n :] = torch.tensor(k[:-1])
        pmask[u, Pp - n :] = 1
    rows = torch.tensor([keys[tuple(t.prompt_ids)] for t in trajs])
    samples: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
    first: list[int] = []
    sample_rows = []
    for i, t in enumerate(trajs):
        key = (tuple(t.prompt_ids), tuple(t.completion_ids))
        if key not in samples:
            samples[key] = len(first)
            first.append(i)
        sample_rows.append(samples[key])
    repeats = len(first) < B
    tok = per_token(trajs, advantages, pad_id)
    C = tok["completion_ids"].shape[1]
    ids = torch.full((B, C), pad_id, dtype=torch.long)
    cmask = torch.zeros(B, C, dtype=torch.long)
    pos = torch.zeros(B, C, dtype=torch.long)
    for i, t in enumerate(trajs):
        p, n = len(t.prompt_ids), max(len(t.completion_ids), 1)
        # a row with no completion still feeds its last prompt token (loss mask 0)
        ids[i, :n] = torch.tensor([t.prompt_ids[-1], *t.completion_ids[: n - 1]])
        cmask[i, :n] = 1
        pos[i] = torch.arange(p - 1, p - 1 + C)
    return MicroBatch(
        input_ids=ids,
        attention_mask=torch.cat([pmask[rows], cmask], dim=1),
        position_ids=pos,
        prompt_width=Pp,
        prefix_ids=prefix,
        prefix_mask=pmask,
        prompt_rows=rows,
        completion_lengths=torch.tensor([len(t.completion_ids) for t in trajs]),
        distinct_rows=torch.tensor(first) if repeats else None,
        sample_rows=torch.tensor(sample_rows) if repeats else None,
        **tok,
    )


def shared_forward(
    model: Any,
    mb: MicroBatch,
    temperature: float,
    return_entropy: bool,
    entropy_grad: bool,
    return_hidden: bool,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """-> (logprobs [B, C], entropy [B, C] or None, hidden [B, C, H] or None), as completion_forward.

    The decoder runs the prefixes (no LM head), then the distinct completion rows on their selected
    caches; the LM head and the log-softmax run on the real completion tokens only (not on the padding
    of ragged completions, which at a 48-token cap and ~15-token answers is most of [B, C]). Zeros
    elsewhere. Repeated samples take their distinct row's outputs (sample_rows)."""
    assert mb.prefix_ids is not None and mb.prefix_mask is not None and mb.prompt_rows is not None
    assert mb.attention_mask is not None and mb.completion_lengths is not None
    distinct = mb.distinct_rows

    def run(x: torch.Tensor) -> torch.Tensor:  # [B, ...] -> the rows the completion forward runs
        return x if distinct is None else x[distinct]

    dev = next(model.parameters()).device
    check_head(
        model, dev, "train.shared_prompt", "the shared-prompt forward", "set train.shared_prompt=false"
    )
    body = model.get_decoder()
    pmask = mb.prefix_mask.to(dev)
    pre = body(
        input_ids=mb.prefix_ids.to(dev),
        attention_mask=pmask,
        position_ids=(pmask.cumsum(-1) - 1).clamp(min=0),
        use_cache=True,
    )
    cache = returned_cache(pre)
    # [U, ...] -> [R, ...] (R = B, or D distinct rows), differentiable indexing
    prefixes = run(mb.prompt_rows)
    cache.batch_select_indices(prefixes.to(dev))
    R, C = len(prefixes), mb.completion_ids.shape[1]
    out = body(
        input_ids=run(mb.input_ids).to(dev),
        attention_mask=run(mb.attention_mask).to(dev),
        position_ids=run(mb.position_ids).to(dev),
        **cache_kwargs(body, cache),
        use_cache=True,
    )
    hidden = out.last_hidden_state  # [R, C, H]: row position j is the state before completion token j
    real = (torch.arange(C)[None, :] < run(mb.completion_lengths)[:, None]).to(dev)  # [R, C]
    logits = head_logits(model, hidden[real])  # [N, V], N = real completion tokens
    tokens = run(mb.completion_ids).to(dev)[real]
    lp_real, ent_real = token_logprobs_entropy(logits, tokens, temperature, return_entropy, entropy_grad)
    lp = torch.zeros(R, C, dtype=lp_real.dtype, device=dev).masked_scatter(real, lp_real)
    entropy = None
    if ent_real is not None:
        entropy = torch.zeros(R, C, dtype=ent_real.dtype, device=dev).masked_scatter(real, ent_real)
    if mb.sample_rows is not None:  # [D, ...] -> [B, ...]: each sample takes its distinct row's values
        idx = mb.sample_rows.to(dev)
        lp = lp[idx]
        entropy = entropy[idx] if entropy is not None else None
        hidden = hidden[idx] if return_hidden else hidden
    return lp, entropy, hidden if return_hidden else None
