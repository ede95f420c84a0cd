"""Advantage estimators: every expected value below is derived by hand in the comments next to it."""

from __future__ import annotations

import pytest
import torch

from streamrl.algo import registry
from streamrl.algo.advantages import dr_grpo, grpo, reinforce_pp, reinforce_pp_baseline, remax, rloo
from streamrl.algo.advantages_token import gae

OUTCOME = [grpo, dr_grpo, rloo, reinforce_pp, reinforce_pp_baseline]


def close(actual: torch.Tensor, expected: list, atol: float = 1e-5) -> None:
    torch.testing.assert_close(actual, torch.tensor(expected, dtype=actual.dtype), atol=atol, rtol=0)


def test_registered_names_are_the_expected_set():
    import streamrl.algo  # noqa: F401  (registers every module)

    expected = {
        "grpo",
        "dr_grpo",
        "rloo",
        "reinforce_pp",
        "reinforce_pp_baseline",
        "remax",
        "gae",
        "reinforce_pp_token",
    }
    for name in registry.ADVANTAGES:
        assert name in expected
    assert expected <= set(registry.ADVANTAGES)


@pytest.mark.parametrize("fn", OUTCOME + [remax])
def test_outcome_estimators_accept_and_ignore_unknown_kwargs(fn):
    r = torch.tensor([[1.0, 0.0]])
    extra = {"baseline_rewards": torch.tensor([0.0])} if fn is remax else {}
    a = fn(r, std_normalize=True, not_a_real_option=3, **extra)
    assert a.shape == (1, 2)


@pytest.mark.parametrize("fn", OUTCOME)
def test_outcome_estimators_do_not_modify_rewards(fn):
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 0.0, 0.0, 0.0]])
    fn(r)
    assert r.tolist() == [[1.0, 0.0, 0.0, 1.0], [3.0, 0.0, 0.0, 0.0]]


# ---------------------------------------------------------------- Dr.GRPO


def test_dr_grpo_hand_values():
    # group 1: mean 0.5 -> [0.5, -0.5, -0.5, 0.5]; group 2 all equal -> 0;
    # group 3: mean 3/4 = 0.75 -> [3 - 0.75, -0.75, -0.75, -0.75] = [2.25, -0.75, -0.75, -0.75].
    # No std division.
    a = dr_grpo(torch.tensor([[1.0, 0.0, 0.0, 1.0], [2.0, 2.0, 2.0, 2.0], [3.0, 0.0, 0.0, 0.0]]))
    close(a, [[0.5, -0.5, -0.5, 0.5], [0.0, 0.0, 0.0, 0.0], [2.25, -0.75, -0.75, -0.75]])


def test_dr_grpo_ignores_std_normalize_and_single_sample_group_is_zero():
    # std_normalize=True must not divide: [1, 3] mean 2 -> [-1, 1] (GRPO would give -/+ 1/sqrt(2) = 0.70711)
    close(dr_grpo(torch.tensor([[1.0, 3.0]]), std_normalize=True), [[-1.0, 1.0]])
    assert dr_grpo(torch.tensor([[3.0], [1.0]])).tolist() == [[0.0], [0.0]]


# ---------------------------------------------------------------- RLOO


def test_rloo_hand_values_and_leave_one_out_identity():
    # G = 4, group [1, 0, 0, 1], sum 2:
    #   r=1: baseline (2-1)/3 = 1/3 -> A = 2/3;   r=0: baseline (2-0)/3 = 2/3 -> A = -2/3
    #   identity G/(G-1)*(r - mean) = 4/3 * (+-0.5) = +-2/3  (same numbers)
    # group [3, 0, 0, 0], sum 3:
    #   r=3: baseline 0/3 = 0 -> A = 3;   r=0: baseline 3/3 = 1 -> A = -1
    #   identity: 4/3 * (3 - 0.75) = 4/3 * 2.25 = 3;   4/3 * (0 - 0.75) = -1
    # group [2, 2, 2, 2]: baseline 2 for everyone -> 0
    a = rloo(torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]]))
    two_thirds = 2.0 / 3.0
    close(a, [[two_thirds, -two_thirds, -two_thirds, two_thirds], [3.0, -1.0, -1.0, -1.0], [0.0] * 4])


def test_rloo_two_samples_and_single_sample():
    # G = 2: each sample's baseline is the other one: [1 - 3, 3 - 1] = [-2, 2]  (= 2/1 * (r - 2))
    close(rloo(torch.tensor([[1.0, 3.0]])), [[-2.0, 2.0]])
    # G = 1: no other sample -> 0
    assert rloo(torch.tensor([[5.0], [1.0]])).tolist() == [[0.0], [0.0]]


# ---------------------------------------------------------------- REINFORCE++


def test_reinforce_pp_normalises_across_groups_not_per_group():
    # all four rewards together: mean 1.5, deviations [-1.5, -0.5, 0.5, 1.5], sum of squares 5,
    # unbiased var 5/3, std sqrt(5/3) = 1.290994
    # -> A = dev / 1.290994 = [-1.161895, -0.387298, 0.387298, 1.161895]
    r = torch.tensor([[0.0, 1.0], [2.0, 3.0]])
    close(reinforce_pp(r), [[-1.161895, -0.387298], [0.387298, 1.161895]])
    # per-group normalisation (GRPO) would give +-0.5 / sqrt(0.5) = +-0.707107 in BOTH groups instead
    close(grpo(r), [[-0.707107, 0.707107], [-0.707107, 0.707107]])


def test_reinforce_pp_all_equal_group_is_not_zeroed():
    # no per-prompt baseline: [[2, 2], [0, 2]]: mean 1.5, deviations [0.5, 0.5, -1.5, 0.5],
    # sum of squares 0.25*3 + 2.25 = 3, unbiased var 3/3 = 1, std 1 -> A = deviations (up to eps = 1e-6)
    close(reinforce_pp(torch.tensor([[2.0, 2.0], [0.0, 2.0]])), [[0.5, 0.5], [-1.5, 0.5]])


def test_reinforce_pp_degenerate_batches():
    assert reinforce_pp(torch.tensor([[5.0]])).tolist() == [[0.0]]  # one element -> 0
    # whole batch equal: deviations 0, std 0 -> 0 / (0 + eps) = 0
    assert reinforce_pp(torch.tensor([[1.0, 1.0], [1.0, 1.0]])).tolist() == [[0.0, 0.0], [0.0, 0.0]]


# ---------------------------------------------------------------- REINFORCE++-baseline


def test_reinforce_pp_baseline_all_equal_group_is_zero():
    # [[2, 2], [0, 2]] minus group means [2, 1] -> c = [[0, 0], [-1, 1]]; mean_all(c) = 0;
    # sum of squares 2, unbiased var 2/3, std 0.816497 -> A = c / 0.816497 = [[0, 0], [-1.224745, 1.224745]]
    close(reinforce_pp_baseline(torch.tensor([[2.0, 2.0], [0.0, 2.0]])), [[0.0, 0.0], [-1.224745, 1.224745]])


def test_reinforce_pp_baseline_hand_values():
    # c = [[0.5, -0.5, -0.5, 0.5], [2.25, -0.75, -0.75, -0.75]] (group means 0.5 and 0.75); mean_all(c) = 0
    # sum of squares 4*0.25 + 5.0625 + 3*0.5625 = 7.75; unbiased var 7.75/7 = 1.107143; std 1.052209
    # A = c / 1.052209: 0.5 -> 0.475191, 2.25 -> 2.138359, 0.75 -> 0.712786
    a = reinforce_pp_baseline(torch.tensor([[1.0, 0.0, 0.0, 1.0], [3.0, 0.0, 0.0, 0.0]]))
    close(
        a,
        [[0.475191, -0.475191, -0.475191, 0.475191], [2.138359, -0.712786, -0.712786, -0.712786]],
    )


def test_reinforce_pp_baseline_single_sample_groups_are_zero():
    # a group of one is its own mean -> c = 0 everywhere -> 0 / (0 + eps) = 0
    assert reinforce_pp_baseline(torch.tensor([[3.0], [1.0]])).tolist() == [[0.0], [0.0]]


# ---------------------------------------------------------------- ReMax


def test_remax_subtracts_greedy_reward_per_prompt():
    # prompt 1 greedy reward 0.5: [1 - 0.5, 0 - 0.5, 1 - 0.5]; prompt 2 all equal to greedy 1 -> 0;
    # prompt 3 greedy 0: rewards unchanged
    r = torch.tensor([[1.0, 0.0, 1.0], [1.0, 1.0, 1.0], [0.0, 2.0, 0.0]])
    a = remax(r, baseline_rewards=torch.tensor([0.5, 1.0, 0.0]), std_normalize=True)
    close(a, [[0.5, -0.5, 0.5], [0.0, 0.0, 0.0], [0.0, 2.0, 0.0]])


def test_remax_without_baseline_raises():
    with pytest.raises(ValueError, match=r"ReMax needs the greedy-decode reward .*baseline_rewards"):
        remax(torch.tensor([[1.0, 0.0]]), std_normalize=True)


def test_remax_baseline_shape_mismatch_raises():
    with pytest.raises(
        ValueError, match=r"baseline_rewards must have shape \[num_groups\]=\[2\], got \[2, 1\]"
    ):
        remax(torch.tensor([[1.0], [0.0]]), baseline_rewards=torch.tensor([[0.0], [0.0]]))


# ---------------------------------------------------------------- GAE


def test_gae_gamma_lam_one_terminal_reward_is_return_minus_value():
    # gamma = lam = 1 (defaults), reward 1 on the last token: deltas telescope, A_t = R - V_t = 1 - V_t
    # V = [0.2, 0.4, 0.7, 0.9] -> A = [0.8, 0.6, 0.3, 0.1]; returns = A + V = R = 1 on every token
    r = torch.tensor([[0.0, 0.0, 0.0, 1.0]])
    v = torch.tensor([[0.2, 0.4, 0.7, 0.9]])
    adv, ret = gae(r, v, torch.ones(1, 4))
    close(adv, [[0.8, 0.6, 0.3, 0.1]])
    close(ret, [[1.0, 1.0, 1.0, 1.0]])


def test_gae_discounted_three_tokens_hand_values():
    # gamma = 0.9, lam = 0.8, gamma*lam = 0.72; r = [0.1, 0, 1], V = [0.5, 0.6, 0.8]
    # t=2: delta = 1 + 0.9*0 - 0.8 = 0.2                   A2 = 0.2
    # t=1: delta = 0 + 0.9*0.8 - 0.6 = 0.12                A1 = 0.12 + 0.72*0.2 = 0.264
    # t=0: delta = 0.1 + 0.9*0.6 - 0.5 = 0.14              A0 = 0.14 + 0.72*0.264 = 0.33008
    # returns = A + V = [0.83008, 0.864, 1.0]
    r = torch.tensor([[0.1, 0.0, 1.0]])
    v = torch.tensor([[0.5, 0.6, 0.8]])
    adv, ret = gae(r, v, torch.ones(1, 3), gamma=0.9, lam=0.8)
    close(adv, [[0.33008, 0.264, 0.2]])
    close(ret, [[0.83008, 0.864, 1.0]])


def test_gae_right_padded_batch_matches_unpadded_and_zeroes_padding():
    # row 0: the 3-token sequence above (no padding) -> A = [0.33008, 0.264, 0.2]
    # row 1: 2 valid tokens r = [0, 2], V = [1.0, 0.5], then one pad with junk (r 5, V 9) that must be ignored
    #   t=1: delta = 2 + 0.9*0 - 0.5 = 1.5                 A1 = 1.5
    #   t=0: delta = 0 + 0.9*0.5 - 1.0 = -0.55             A0 = -0.55 + 0.72*1.5 = 0.53
    #   returns = [0.53 + 1.0, 1.5 + 0.5] = [1.53, 2.0]; the pad gets A = 0, return 0
    r = torch.tensor([[0.1, 0.0, 1.0], [0.0, 2.0, 5.0]])
    v = torch.tensor([[0.5, 0.6, 0.8], [1.0, 0.5, 9.0]])
    m = torch.tensor([[1, 1, 1], [1, 1, 0]])
    inputs = (r.clone(), v.clone(), m.clone())
    adv, ret = gae(r, v, m, gamma=0.9, lam=0.8)
    close(adv, [[0.33008, 0.264, 0.2], [0.53, 1.5, 0.0]])
    close(ret, [[0.83008, 0.864, 1.0], [1.53, 2.0, 0.0]])
    # row 1 alone, unpadded, gives the same hand values on its valid tokens
    adv1, ret1 = gae(r[1:, :2], v[1:, :2], torch.ones(1, 2), gamma=0.9, lam=0.8)
    close(adv1, [[0.53, 1.5]])
    close(ret1, [[1.53, 2.0]])
    # inputs untouched (no in-place ops)
    for before, after in zip(inputs, (r, v, m)):
        assert torch.equal(before, after)


def test_gae_hole_in_the_middle_is_skipped_as_if_absent():
    # mask [1, 0, 1] with junk at t=1 (r 7, V 9): same as the 2-token sequence r = [0.1, 1], V = [0.5, 0.8]
    #   t=2: delta = 1 - 0.8 = 0.2                         A2 = 0.2
    #   t=0: next valid value is V2 = 0.8: delta = 0.1 + 0.9*0.8 - 0.5 = 0.32;  A0 = 0.32 + 0.72*0.2 = 0.464
    # NaN values in a padded slot must not leak either
    r = torch.tensor([[0.1, 7.0, 1.0], [0.1, 7.0, 1.0]])
    v = torch.tensor([[0.5, 9.0, 0.8], [0.5, float("nan"), 0.8]])
    adv, ret = gae(r, v, torch.tensor([[1, 0, 1], [1, 0, 1]]), gamma=0.9, lam=0.8)
    close(adv, [[0.464, 0.0, 0.2], [0.464, 0.0, 0.2]])
    close(ret, [[0.964, 0.0, 1.0], [0.964, 0.0, 1.0]])


def test_gae_returns_are_advantages_plus_values_on_valid_tokens():
    # row 0: gamma = lam = 1, r = [0, 0, 3], V = [1, 2, 2.5]: A = R - V = [2, 1, 0.5]; returns = 3 everywhere
    # row 1: 1 valid token r = [1], V = [0.25] then 2 pads: A = [0.75, 0, 0]; returns = [1.0, 0, 0]
    r = torch.tensor([[0.0, 0.0, 3.0], [1.0, 0.0, 0.0]])
    v = torch.tensor([[1.0, 2.0, 2.5], [0.25, 4.0, 4.0]])
    m = torch.tensor([[True, True, True], [True, False, False]])
    adv, ret = gae(r, v, m, std_normalize=True)
    close(adv, [[2.0, 1.0, 0.5], [0.75, 0.0, 0.0]])
    close(ret, [[3.0, 3.0, 3.0], [1.0, 0.0, 0.0]])
    torch.testing.assert_close(ret[m], (adv + v)[m])
