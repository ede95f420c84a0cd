"""A trajectory's per-token lists: the loss mask defaults to every completion token, and lists of unequal
lengths are one line naming the sample."""

from __future__ import annotations

import pytest

from streamrl.types import Trajectory


def _traj(**kw) -> Trajectory:
    base = dict(
        problem_id="p",
        group_id="g",
        sample_id="g-0",
        prompt_ids=[1, 2],
        completion_ids=[3, 4, 5],
        behaviour_logprobs=[-0.1, -0.2, -0.3],
        versions=[0, 0, 1],
        finish_reason="stop",
    )
    return Trajectory(**{**base, **kw})


def test_the_loss_mask_defaults_to_every_completion_token() -> None:
    assert _traj().loss_mask == [1, 1, 1]
    assert _traj(loss_mask=[1, 0, 1]).loss_mask == [1, 0, 1]


@pytest.mark.parametrize(
    "field, value, lengths",
    [
        ("behaviour_logprobs", [-0.1], "3, 1, 3, 3"),
        ("versions", [0, 0], "3, 3, 2, 3"),
        ("loss_mask", [1, 1, 1, 1], "3, 3, 3, 4"),
    ],
)
def test_per_token_lists_of_unequal_lengths_name_the_sample(field: str, value: list, lengths: str) -> None:
    with pytest.raises(ValueError) as e:
        _traj(**{field: value})
    assert str(e.value) == (
        "trajectory g-0: completion_ids, behaviour_logprobs, versions and loss_mask must have equal "
        f"lengths, got {lengths}"
    )
