"""pass@k / avg@k / maj@k against hand-computed values and the exact closed form."""

from fractions import Fraction
from math import comb

import pytest

from streamrl.eval.sampling_metrics import default_ks, maj_at_k, majority_index, pass_at_k, summarize
from streamrl.rewards.math import math_equal


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (5, 1, 3, 0.6),  # 1 - C(4,3)/C(5,3) = 1 - 4/10
        (4, 1, 1, 0.25),
        (4, 1, 4, 1.0),  # n - c < k: some draw always holds the correct one
        (10, 0, 5, 0.0),  # c = 0
        (10, 10, 1, 1.0),  # c = n
        (8, 3, 1, 0.375),  # pass@1 = c / n
    ],
)
def test_pass_at_k_hand_values(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_is_exact_at_n_256():
    n = 256
    for c in (0, 1, 5, 128, 250, 255, 256):
        for k in (1, 2, 16, 128, 200, 256):
            exact = 1 - Fraction(comb(n - c, k), comb(n, k))
            assert pass_at_k(n, c, k) == pytest.approx(float(exact), abs=1e-12), (c, k)


@pytest.mark.parametrize("n, c, k", [(4, 5, 1), (4, -1, 1), (4, 2, 0), (4, 2, 5)])
def test_pass_at_k_rejects_impossible_counts(n, c, k):
    with pytest.raises(ValueError, match="pass@k needs"):
        pass_at_k(n, c, k)


def test_majority_ties_go_to_the_first_seen_answer():
    answers = ["3", "4", "4", None, "3"]
    assert majority_index(answers) == 0  # 2 votes each: "3" appeared first
    assert majority_index(answers[:3]) == 1
    assert majority_index([None, None]) is None
    assert majority_index([None, " 7", "7 "]) == 1  # grouped after stripping


def test_maj_at_k_uses_the_first_k_samples_a_custom_equivalence_and_each_samples_verdict():
    answers = ["2", "0.5", "\\frac{1}{2}", "2", "2"]
    correct = [math_equal(a, "1/2") for a in answers]
    assert maj_at_k(answers, correct, 3, same=math_equal) is True  # 0.5 == 1/2: 2 votes against 1
    assert maj_at_k(answers, correct, 3) is False  # string equality: a three-way tie, "2" first
    assert maj_at_k(answers, correct, 5, same=math_equal) is False  # "2" x3 wins
    assert maj_at_k([None, None], [False, False], 2) is False
    # the verdict is the winning cluster's first sample's (a program passing its tests, a scorer's)
    assert maj_at_k(["p", "q", "q"], [False, True, False], 3) is True
    with pytest.raises(ValueError, match="maj@k needs 1 <= k <= n=2"):
        maj_at_k([None, None], [False, False], 3)


def test_summarize_averages_over_problems():
    correct = [[True, False, False, False], [True, True, False, False]]  # c = 1 and 2 of n = 4
    out = summarize(correct, [1, 2, 4], majority=[[True, False, False], [True, True, True]])
    assert out["pass@1"] == pytest.approx((0.25 + 0.5) / 2)
    assert out["pass@2"] == pytest.approx((0.5 + (1 - 1 / 6)) / 2)  # 1 - C(3,2)/C(4,2); 1 - C(2,2)/C(4,2)
    assert out["pass@4"] == 1.0
    assert out["avg@4"] == pytest.approx(0.375)
    assert (out["maj@1"], out["maj@2"], out["maj@4"]) == (1.0, 0.5, 0.5)
    assert default_ks(8) == [1, 2, 4, 8] and default_ks(6) == [1, 2, 4, 6] and default_ks(1) == [1]
