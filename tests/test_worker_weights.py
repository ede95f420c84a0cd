"""The rollout worker's loop takes newer weights between decode steps, mid-generation (in flight), and
stamps each token with the version that produced it. Runs the loop in a thread with plain queues."""

from __future__ import annotations

import copy

import pytest
from scripted_worker import one_group_in_a_thread
from tiny_args import TINY

from streamrl.config import load_config
from streamrl.data.prompts import render_prompt_ids
from streamrl.rollout.worker import GroupRequest
from streamrl.types import Problem


class BumpingWeights:
    """A WeightSource whose version goes 0 -> 1 after `after` polls (one poll per decode step)."""

    def __init__(self, model, after: int) -> None:
        self.model, self.after, self.polls = model, after, 0

    @property
    def version(self) -> int:
        self.polls += 1
        return 1 if self.polls > self.after else 0

    def load_into(self, model) -> int:
        model.load_state_dict(self.model.state_dict())
        return 1 if self.polls > self.after else 0

    def read(self, consume, timeout: float = 60.0) -> int:  # pragma: no cover - vLLM only
        raise NotImplementedError


@pytest.mark.parametrize("mode", ["inflight", "interrupt"])
def test_worker_takes_new_weights_mid_generation(tiny, mode):
    cfg = load_config(
        None,
        [*TINY, "rollout.max_new_tokens=40", f"runtime.weight_update={mode}", "rollout.temperature=1.0"],
    )
    problem = Problem(id="p0", messages=[{"role": "user", "content": "1 + 1 = ?"}], answer="2")
    req = GroupRequest("g0", problem, render_prompt_ids(tiny[1], problem.messages), 2, 0)
    res = one_group_in_a_thread(cfg, req, BumpingWeights(copy.deepcopy(tiny[0]), after=8))
    assert not res.error
    for t in res.group.trajectories:
        v = t.versions
        assert len(v) == len(t.completion_ids) > 12, "the sample stopped before the weights changed"
        k = v.index(1)  # the first token of the new weights: later tokens never go back
        assert 0 < k < len(v) and v == [0] * k + [1] * (len(v) - k)


class FixedWeights:
    """A WeightSource that always holds `version` (the weights themselves never change)."""

    def __init__(self, model, version: int) -> None:
        self.model, self.version = model, version

    def load_into(self, model) -> int:
        model.load_state_dict(self.model.state_dict())
        return self.version

    def read(self, consume, timeout: float = 60.0) -> int:  # pragma: no cover - vLLM only
        raise NotImplementedError


def test_a_worker_started_on_later_weights_draws_other_random_numbers(tiny):
    """A resumed run's workers start on the saved version: seeded from it, they do not sample with the
    random numbers the run's first steps used; a start on the same version draws the same tokens."""
    cfg = load_config(None, [*TINY, "rollout.max_new_tokens=12", "rollout.temperature=1.0"])
    problem = Problem(id="p0", messages=[{"role": "user", "content": "1 + 1 = ?"}], answer="2")
    req = GroupRequest("g0", problem, render_prompt_ids(tiny[1], problem.messages), 4, 0)

    def tokens(version: int) -> list[list[int]]:
        res = one_group_in_a_thread(cfg, copy.deepcopy(req), FixedWeights(tiny[0], version))
        assert not res.error
        return [t.completion_ids for t in res.group.trajectories]

    first = tokens(0)
    assert tokens(0) == first  # the same run seed, worker and weights: the same draw
    assert tokens(5) != first  # the same weights under a later version: another draw
