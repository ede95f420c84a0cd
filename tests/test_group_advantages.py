"""From groups to a TrainBatch: estimators see [num_groups, G] rewards (ReMax also its greedy baselines)."""

import pytest
from trajectories import make_traj

from streamrl.config import load_config
from streamrl.loop.step import group_advantages
from streamrl.types import Group, Problem


def _group(rewards, greedy=None):
    trajs = [make_traj(i, [1], [2, 3], reward=r) for i, r in enumerate(rewards)]
    base = make_traj(9, [1], [2], reward=greedy) if greedy is not None else None
    return Group(Problem("p", [], "1"), trajs, base)


def test_remax_subtracts_each_groups_greedy_reward():
    cfg = load_config(None, ["algo=remax"])
    batch = group_advantages([_group([1.0, 0.0, 1.1], greedy=1.0), _group([0.0, 0.1, 0.0], greedy=0.0)], cfg)
    assert batch.advantages == pytest.approx([0.0, -1.0, 0.1, 0.0, 0.1, 0.0])
    assert len(batch.trajectories) == 6  # the greedy responses are baselines, not training samples


def test_remax_without_a_baseline_names_the_problem():
    with pytest.raises(ValueError, match="greedy baseline for group of problem p"):
        group_advantages([_group([1.0, 0.0])], load_config(None, ["algo=remax"]))


def test_grpo_ignores_baselines():
    batch = group_advantages([_group([1.0, 0.0], greedy=1.0)], load_config(None, ["algo=grpo"]))
    # (1 - 0.5) / (std([1, 0]) = 0.7071 + 1e-6)
    assert batch.advantages == pytest.approx([0.70710578, -0.70710578])


@pytest.mark.parametrize(
    "rewards, greedy, expected",
    [([1.0, 1.0], None, True), ([1.0, 0.0], None, False), ([1.0, 1.0], 1.0, True), ([1.0, 1.0], 0.0, False)],
)
def test_uninformative_groups_have_zero_advantage_under_their_estimator(rewards, greedy, expected):
    assert _group(rewards, greedy).uninformative is expected
