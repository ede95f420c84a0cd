"""Which requests that join the running work together share one joining batch (engine/continuous.py).

A batch's prefill is one rectangle: its D distinct prompts, each left-padded to the longest, each with
room for the largest draft tree's nodes (engine/speculative.py: tree_inputs), so every prompt pays for
the longest prompt and the largest tree, through every layer. Where the engine packs, several joining
batches cost one forward anyway (engine/packed.py lays their rectangles end to end), so the requests
are split: the rows of one prompt always stay together (they share its prefill and its tree), and
prompts go into one batch only while that pads fewer than SEGMENT_COLUMNS columns more than giving
each its own segment (a segment has its own attention call and KV-cache writes in every layer).

Without any draft tree the requests stay one batch: prompt padding alone seldom pays for the extra
segments and the merges that follow.
"""

from __future__ import annotations

from streamrl.engine.base import GenRequest
from streamrl.engine.draft_tree import prompt_trees, row_drafts

SEGMENT_COLUMNS = 2  # a packed segment's own overhead, in padded columns of one row


def join_groups(requests: list[GenRequest], branch_min: int) -> list[list[GenRequest]]:
    """The joining batches of `requests`: each the requests of one or more whole prompts (see the
    module docstring). branch_min: the engine's (engine/draft_tree.py)."""
    by_prompt: dict[tuple[int, ...], list[GenRequest]] = {}
    for req in requests:
        by_prompt.setdefault(tuple(req.prompt_ids), []).append(req)
    order = {p: k for k, p in enumerate(by_prompt)}
    inverse = [order[tuple(r.prompt_ids)] for r in requests]
    trees = prompt_trees(inverse, len(order), row_drafts(requests), (), branch_min)
    if not any(map(len, trees)):
        return [requests]
    groups = list(by_prompt.values())
    sizes = [(len(p), len(t)) for p, t in zip(by_prompt, trees, strict=True)]
    return [[r for k in bucket for r in groups[k]] for bucket in buckets(sizes)]


def buckets(sizes: list[tuple[int, int]], slack: int = SEGMENT_COLUMNS) -> list[list[int]]:
    """sizes: each prompt's (prompt columns, tree nodes) -> the prompts of each batch (indices). Going
    through the prompts by columns + nodes, a prompt joins the last batch when the padding that adds is
    under `slack` columns (its own segment would have none), else it starts the next batch."""
    out: list[list[int]] = []
    for k in sorted(range(len(sizes)), key=lambda k: (sum(sizes[k]), k)):
        last = [sizes[j] for j in out[-1]] if out else []
        if last and padding([*last, sizes[k]]) - padding(last) < slack:
            out[-1].append(k)
        else:
            out.append([k])
    return out


def padding(sizes: list[tuple[int, int]]) -> int:
    """The padded columns of one prefill rectangle of these prompts: D x (longest prompt + largest
    tree) less their own columns."""
    width = max(p for p, _ in sizes) + max(n for _, n in sizes)
    return len(sizes) * width - sum(p + n for p, n in sizes)
