"""A prompt's drafts as a token tree (a trie: drafts that start alike share nodes), which
engine/speculative.py forwards in the prompt's prefill and walks each row through.

The tree keeps a node only where at least `branch_min` drafts pass through it (HFEngine's, from
rollout.spec_branch_min; 2 by default): a branch one stored response took alone is rarely walked by
a new sample, yet it costs a forwarded column like any other node. A lenient row follows one draft,
chosen before the prefill (`choose_drafts`), and its tree keeps that draft whole, so the row can copy
it to its end. A tree has at most TREE_NODES nodes (kept in breadth-first order).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from streamrl.engine.base import Draft, GenRequest

TREE_NODES = 1024  # nodes per prompt's draft tree (bounds the verify forward's columns and mask)
ROOT = -1  # the node before the first response token


class DraftTree:
    """The trie of a prompt's drafts. Nodes in breadth-first order: tokens [N], parent [N] (ROOT for the
    first tokens), depth [N] (0 for the first tokens), count [N] (drafts through the node); `children`
    maps a node (ROOT included) to {token: child}. Only nodes at least `branch_min` drafts pass through
    are kept (all of a lone draft's), and every node of the drafts in `whole` (lenient rows' chosen
    drafts, which they follow to their end), at most `limit`."""

    def __init__(
        self,
        drafts: list[tuple[int, ...]],
        limit: int | None = None,
        branch_min: int = 1,
        whole: tuple[tuple[int, ...], ...] = (),
    ) -> None:
        limit = TREE_NODES if limit is None else limit
        drafts = [d for d in drafts if d]
        least = min(branch_min, len(drafts))  # a node needs this many drafts through it (a lone draft: 1)
        chosen = set(whole)
        kept = {id(d) for d in drafts if d in chosen}  # by identity: no tuple hashed per node
        self.tokens: list[int] = []
        self.parent: list[int] = []
        self.depth: list[int] = []
        self.count: list[int] = []
        self.children: dict[int, dict[int, int]] = {ROOT: {}}
        level = [(ROOT, drafts)]
        while level and len(self.tokens) < limit:
            nxt = []
            for node, through in level:
                by_token: dict[int, list[tuple[int, ...]]] = {}
                for d in through:
                    by_token.setdefault(d[self._depth_after(node)], []).append(d)
                for tok, ds in by_token.items():
                    if len(self.tokens) == limit:
                        break
                    if len(ds) < least and not any(id(d) in kept for d in ds):
                        continue
                    child = self._add(node, tok, len(ds))
                    nxt.append((child, [d for d in ds if len(d) > self.depth[child] + 1]))
            level = nxt

    def _depth_after(self, node: int) -> int:
        return 0 if node == ROOT else self.depth[node] + 1

    def _add(self, parent: int, token: int, count: int) -> int:
        node = len(self.tokens)
        self.tokens.append(token)
        self.parent.append(parent)
        self.depth.append(self._depth_after(parent))
        self.count.append(count)
        self.children[parent][token] = node
        self.children[node] = {}
        return node

    def __len__(self) -> int:
        return len(self.tokens)

    def ancestry(self, width: int) -> torch.Tensor:
        """[width, width] bool: row i marks node i and its ancestors (rows past the tree: only i)."""
        out = torch.eye(width, dtype=torch.bool)
        for node, parent in enumerate(self.parent):  # breadth-first: a parent's row is complete
            if parent != ROOT:
                out[node] |= out[parent]
        return out

    def path(self, node: int) -> list[int]:
        """The nodes from the first token down to `node` ([] for ROOT)."""
        out = []
        while node != ROOT:
            out.append(node)
            node = self.parent[node]
        return out[::-1]


def row_drafts(requests: Sequence[GenRequest]) -> list[tuple[tuple[int, ...], ...]]:
    """Each request's drafts for its prompt's tree, cut at its max_new_tokens; none for a greedy one."""
    return [
        tuple(d.token_ids[: r.max_new_tokens] for d in r.drafts) if r.temperature > 0 else ()
        for r in requests
    ]


def prompt_trees(
    inverse: list[int],
    n: int,
    drafts: Sequence[tuple[tuple[int, ...], ...]],
    whole: Sequence[tuple[tuple[int, ...], ...]],
    branch_min: int,
) -> list[DraftTree]:
    """The tree of each of n distinct prompts from its rows' drafts (row r's prompt: inverse[r]; each
    distinct set of drafts counted once) keeping its rows' `whole` drafts whole."""
    offered: list[dict[tuple[tuple[int, ...], ...], None]] = [{} for _ in range(n)]
    kept: list[dict[tuple[int, ...], None]] = [{} for _ in range(n)]
    for k, ds, w in zip(inverse, drafts, whole or [()] * len(drafts)):
        offered[k][ds] = None
        kept[k].update(dict.fromkeys(w))
    return [
        DraftTree([d for ds in sets for d in ds], branch_min=branch_min, whole=tuple(keep))
        for sets, keep in zip(offered, kept)
    ]


def choose_drafts(
    requests: Sequence[GenRequest], gen: torch.Generator
) -> tuple[list[Draft | None], list[tuple[tuple[int, ...], ...]]]:
    """The draft each lenient request follows, uniformly among its non-empty ones (None: an exact
    request, or one without drafts), chosen before the prefill; and per request the drafts its prompt's
    tree must keep whole (DraftTree's `whole`): a sampled lenient request's chosen one, cut at its
    max_new_tokens, else none."""
    chosen: list[Draft | None] = []
    whole: list[tuple[tuple[int, ...], ...]] = []
    for req in requests:
        drafts = [d for d in req.drafts if d.token_ids] if req.lenience > 0 else []
        pick = drafts[int(torch.randint(len(drafts), (1,), generator=gen))] if drafts else None
        chosen.append(pick)
        whole.append((pick.token_ids[: req.max_new_tokens],) if pick and req.temperature > 0 else ())
    return chosen, whole
