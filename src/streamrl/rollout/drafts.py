"""The draft store of speculative rollouts: the most recent responses to each prompt, offered as drafts
when the prompt comes round again (engine/speculative.py verifies them).

Bounded twice: `per_prompt` responses per problem id (the newest replace the oldest) and `prompts`
problem ids (the one stored least recently is dropped first). Token ids and the generating policy's
log-probs are kept as compact arrays (8 bytes a token): where the lenient rule decided a token, the
verifying policy's log p, which the lenient rule reads as p_draft when the prompt comes round again,
not the mixture's log b the token was trained with (a store saved before they were told apart holds
log b there, and loads as it is). The loop that sees every finished group keeps the store and
saves it with the run state (`state_dict` / `load_state_dict`), so a resumed run offers the same drafts.
"""

from __future__ import annotations

from array import array
from collections import OrderedDict
from typing import Any

from streamrl.engine.base import Draft
from streamrl.types import Group

_Entry = tuple[array, array]  # (token ids 'i', log-probs 'f')


class DraftStore:
    def __init__(self, per_prompt: int, prompts: int) -> None:
        if per_prompt < 1 or prompts < 1:
            raise ValueError(f"DraftStore: per_prompt and prompts must be >= 1, got {per_prompt}, {prompts}")
        self.per_prompt = per_prompt
        self.prompts = prompts
        self._store: OrderedDict[str, list[_Entry]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._store)

    def add(self, group: Group) -> None:
        """Keep the group's responses (not its greedy baseline) as the newest ones of its problem."""
        new = [
            (array("i", t.completion_ids), array("f", t.policy_logprobs or t.behaviour_logprobs))
            for t in group.trajectories
            if t.completion_ids
        ]
        if not new:
            return
        pid = group.problem.id
        kept = self._store.pop(pid, [])
        self._store[pid] = (kept + new)[-self.per_prompt :]
        while len(self._store) > self.prompts:
            self._store.popitem(last=False)

    def drafts(self, problem_id: str) -> tuple[Draft, ...]:
        """The stored responses to this problem, oldest first (empty when there are none)."""
        return tuple(Draft(tuple(ids), tuple(lps)) for ids, lps in self._store.get(problem_id, []))

    def state_dict(self) -> list[list[Any]]:
        """[[problem id, [[token ids], [log-probs]], ...], ...], least recently stored first."""
        return [
            [pid, [[ids.tolist(), lps.tolist()] for ids, lps in entries]]
            for pid, entries in self._store.items()
        ]

    def load_state_dict(self, state: list[list[Any]]) -> None:
        self._store.clear()
        for pid, entries in state:
            self._store[pid] = [(array("i", ids), array("f", lps)) for ids, lps in entries][
                -self.per_prompt :
            ]
        while len(self._store) > self.prompts:
            self._store.popitem(last=False)


def draft_store(spec_drafts: int, spec_prompts: int, saved: list[list[Any]]) -> DraftStore | None:
    """The run's store (rollout.spec_drafts, rollout.spec_prompts) with a resumed run's saved content;
    None when speculative rollouts are off."""
    if not spec_drafts:
        return None
    store = DraftStore(spec_drafts, spec_prompts)
    store.load_state_dict(saved)
    return store
