"""Screening (rollout.screen_samples): a group's first samples are drawn and scored first, the rest only
when their rewards differ; in the colocated loop's rollout_groups and in the asynchronous worker."""

from __future__ import annotations

import queue
import threading
from typing import Any

import pytest
from scripted_worker import StillWeights
from tiny_args import TINY

from streamrl.config import ConfigError, load_config, to_dict
from streamrl.data.prompts import render_prompt_ids
from streamrl.engine.hf import HFEngine
from streamrl.rollout.generate import rollout_groups
from streamrl.rollout.trajectory import RolloutSettings
from streamrl.rollout.worker import STOP, GroupRequest, serve
from streamrl.tasks import task_from_config
from streamrl.types import Problem

QUESTION = [{"role": "user", "content": "What is 2 + 3?"}]


class CountingEngine:
    """An HFEngine that records how many requests each generate call asked for."""

    def __init__(self, engine: HFEngine) -> None:
        self.engine, self.calls = engine, []

    def generate(self, requests: list[Any]) -> list[Any]:
        self.calls.append(len(requests))
        return self.engine.generate(requests)


class ScriptedScoring:
    """Rewards by problem id: "same" 1 for every sample, "mixed" 0, 1, 0, 1, ... in scoring order,
    "baseline" 1 for the samples and 0 for the greedy baseline."""

    task = None  # neither an env nor an agent task

    def __init__(self) -> None:
        self.scored: dict[str, int] = {}

    def score(self, pairs: list[tuple[Problem, Any]]) -> None:
        for problem, traj in pairs:
            n = self.scored.get(problem.id, 0)
            self.scored[problem.id] = n + 1
            if problem.id == "mixed":
                traj.reward = float(n % 2)
            elif problem.id == "baseline":
                traj.reward = 0.0 if traj.sample_id.endswith("greedy") else 1.0
            else:
                traj.reward = 1.0


def _settings(screen: int, greedy: bool = False) -> RolloutSettings:
    return RolloutSettings(8, 4, 1.0, 1.0, 64, greedy, False, 0.0, screen=screen)


@pytest.fixture
def engine(tiny: Any) -> CountingEngine:
    model, tokenizer = tiny
    return CountingEngine(HFEngine(model, tokenizer, max_batch=64, seed=0))


def _run(engine: CountingEngine, tiny: Any, ids: list[str], settings: RolloutSettings) -> list[Any]:
    problems = [Problem(pid, QUESTION, "5") for pid in ids]
    groups, _ = rollout_groups(engine, tiny[1], ScriptedScoring(), problems, settings, step=1)
    return groups


def test_colocated_groups_alike_in_their_first_samples_stop_there(engine: CountingEngine, tiny: Any) -> None:
    same, mixed = _run(engine, tiny, ["same", "mixed"], _settings(screen=4))
    assert engine.calls == [8, 4]  # 2 groups x 4 screening samples, then the mixed group's other 4
    assert [t.sample_id for t in same.trajectories] == [f"s1-0-same-{k}" for k in range(4)]
    assert same.rewards == [1.0] * 4 and same.uninformative
    assert [t.sample_id for t in mixed.trajectories] == [f"s1-1-mixed-{k}" for k in range(8)]
    assert mixed.rewards == [0.0, 1.0] * 4


def test_colocated_screen_counts_the_greedy_baseline(engine: CountingEngine, tiny: Any) -> None:
    """ReMax: the baseline is screened with the first samples and counts as dynamic sampling counts it:
    samples all 1 but a baseline of 0 is a group worth finishing."""
    same, base = _run(engine, tiny, ["same", "baseline"], _settings(screen=4, greedy=True))
    assert engine.calls == [10, 4]
    assert len(same.trajectories) == 4 and same.baseline is not None
    assert len(base.trajectories) == 8 and base.baseline is not None and base.baseline.reward == 0.0


def test_colocated_without_screening_every_group_is_whole(engine: CountingEngine, tiny: Any) -> None:
    same, mixed = _run(engine, tiny, ["same", "mixed"], _settings(screen=0))
    assert engine.calls == [16]
    assert len(same.trajectories) == len(mixed.trajectories) == 8


def test_worker_finishes_only_the_groups_whose_first_samples_disagree() -> None:
    cfg = load_config(
        None,
        [
            *TINY,
            "rollout.samples_per_prompt=8",
            "rollout.screen_samples=4",
            "reward.fn=reward_scorers:parity_unless_even_prompt",
        ],
    )
    task = task_from_config(cfg)
    from streamrl.models import load_tokenizer, resolve_model_dir

    tokenizer = load_tokenizer(resolve_model_dir(cfg.model, cfg.seed))
    stream = task.train_stream(cfg.seed, set())
    requests: queue.Queue[Any] = queue.Queue()
    results: queue.Queue[Any] = queue.Queue()
    n = 10
    for i in range(n):
        p = next(stream)
        requests.put(GroupRequest(f"g{i}", p, render_prompt_ids(tokenizer, p.messages), 8, 0))
    worker = threading.Thread(
        target=serve, args=(0, to_dict(cfg), requests, results, StillWeights(), lambda: False)
    )
    worker.start()
    try:
        out = [results.get(timeout=300) for _ in range(n)]
    finally:
        requests.put(STOP)
        worker.join(timeout=60)
    assert not [r.error for r in out if r.error]
    sizes = {}
    for r in out:
        trajs = r.group.trajectories
        assert [t.sample_id for t in trajs] == [f"{r.group_id}-{k}" for k in range(len(trajs))]
        first = {t.reward for t in trajs[:4]}
        # alike in the first 4: stopped there; else all 8, whatever the other 4 scored
        assert len(trajs) == (4 if len(first) == 1 else 8), (r.group_id, [t.reward for t in trajs])
        sizes[r.group_id] = len(trajs)
    assert sorted(sizes) == sorted(f"g{i}" for i in range(n))  # each group returned once
    assert set(sizes.values()) == {4, 8}  # both ways were taken


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["rollout.screen_samples=1"], r"'rollout.screen_samples' is 1: .* set 2 or more"),
        (["rollout.screen_samples=8"], r"'rollout.screen_samples' is 8, not fewer than .*=8: set 2 \.\. 7"),
        (
            ["rollout.screen_samples=4", "rollout.dynamic_sampling=false"],
            r"only dynamic sampling does: set rollout.dynamic_sampling=true",
        ),
        (["rollout.screen_samples=4", "task=env:python_tool"], r"task=env:python_tool runs multi-turn"),
    ],
)
def test_screening_settings_it_cannot_apply_are_refused(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(None, overrides)


def test_screening_is_off_by_default_and_on_as_set() -> None:
    assert RolloutSettings.from_config(load_config(None, [])).screen == 0
    assert RolloutSettings.from_config(load_config(None, ["rollout.screen_samples=4"])).screen == 4
