"""Whether lending cores pays: the bound of ideal sharing and the gain measured from timed boundaries,
against hand-derived values."""

import pytest

from streamrl.placement.core_policy import PhaseTimes, bound, lend_gain


def test_the_bound_when_both_phases_run_twice_as_fast_on_two_cores_is_alternating():
    # alternating: 1 / (0.5 + 0.5) = 1; the split: 1 / max(1, 1) = 1; no mix of the two does better
    assert bound(1.0, 0.5, 1.0, 0.5) == pytest.approx(1.0)


def test_the_bound_when_generation_gains_nothing_from_a_second_core_is_the_split():
    # alternating: 1 / (1 + 0.5) = 2/3; side by side on one core each: 1 / max(1, 1) = 1
    assert bound(1.0, 1.0, 1.0, 0.5) == pytest.approx(1.0)


def test_the_bound_gives_the_slow_phase_both_cores_part_of_the_time():
    # g1 = 1, t1 = 2, t2 = 1 (training doubles), generation does not scale (g2 = 1). With x of the time
    # side by side and 1 - x training on both: x/1 = x/2 + (1 - x)/1 -> x = 2/3, r = 2/3
    assert bound(1.0, 1.0, 2.0, 1.0) == pytest.approx(2 / 3)
    # alternating would give 1 / (1 + 1) = 1/2; the split 1/2
    assert bound(1.0, 1.0, 2.0, 1.0) > 1 / (1.0 + 1.0)


def test_a_phase_speed_up_and_one_core_seconds():
    p = PhaseTimes(own_s=6.0, own_n=3, all_s=4.0, all_n=4)  # 2 s per boundary alone, 1 s on both cores
    assert p.speedup() == pytest.approx(2.0)
    assert p.own_seconds() == pytest.approx(6.0 + 4.0 * 2.0)


def test_the_gain_of_lending_from_timed_boundaries():
    doubles = PhaseTimes(own_s=2.0, own_n=2, all_s=0.5, all_n=1)  # speed-up 2: 3 one-core seconds
    flat = PhaseTimes(own_s=2.0, own_n=2, all_s=1.0, all_n=1)  # speed-up 1: 3 one-core seconds
    # g1 = g2 = 3, t1 = 3, t2 = 1.5: bound 1/3, alternating 1/4.5 -> 1.5
    assert lend_gain(flat, doubles) == pytest.approx(1.5)
    assert lend_gain(doubles, doubles) == pytest.approx(1.0)  # nothing to win side by side
