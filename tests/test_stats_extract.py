import math
import threading

import pytest

from streamrl.eval.stats import (
    Z95,
    paired_difference_interval,
    replicate_difference_interval,
    t_quantile,
    wilson_interval,
)
from streamrl.rewards.extract import EXTRACTORS, ends_with_answer, extract_answer, reference_answer
from streamrl.rewards.math import math_equal


def test_wilson_hand_value():
    # p = 0.5, n = 100, z = 1.96: centre 0.5, half = 1.96*sqrt(0.0025 + 0.000096)/1.038416 = 0.096170
    lo, hi = wilson_interval(50, 100)
    assert (lo, hi) == pytest.approx((0.403830, 0.596170), abs=1e-5)
    assert wilson_interval(0, 10)[0] == 0.0
    assert wilson_interval(10, 10)[1] == pytest.approx(1.0)


def test_paired_difference_hand_value():
    z2 = Z95**2
    # no problem changes (100 both, 100 neither): the lost share under delta > 0 is 0, so the score is
    # -delta / sqrt(delta (1 - delta) / n), and |score| = z at delta = z^2 / (n + z^2) = 0.018845
    same = [True] * 100 + [False] * 100
    assert paired_difference_interval(same, same) == pytest.approx((0.0, -z2 / (200 + z2), z2 / (200 + z2)))
    # every problem flipped up: lost share (1 - delta) / 2, score sqrt(3 (1 - delta) / (1 + delta)) = z
    up = paired_difference_interval([False] * 3, [True] * 3)
    assert up == pytest.approx((1.0, (3 - z2) / (3 + z2), 1.0))  # (1, -0.122994, 1): a width at n = 3
    assert paired_difference_interval([True] * 3, [False] * 3) == pytest.approx(
        (-1.0, -1.0, (z2 - 3) / (3 + z2))
    )
    # positively correlated pairs narrow it: 8 both, 8 neither, 2 gained, 2 lost vs. 5 and 5
    corr = paired_difference_interval(
        [True] * 10 + [False] * 10, [True] * 8 + [False] * 2 + [True] * 2 + [False] * 8
    )
    indep = paired_difference_interval([True] * 10 + [False] * 10, [True, False] * 10)
    assert corr[0] == indep[0] == 0.0 and corr[2] - corr[1] < indep[2] - indep[1]
    with pytest.raises(ValueError, match="equal lengths"):
        paired_difference_interval([True], [])


def _score_by_search(lost: int, gained: int, n: int, delta: float) -> float:
    """Tango's score at delta with the lost share found by a grid search of the likelihood (not the
    closed-form root the interval uses)."""
    neither = n - lost - gained
    lo, hi = max(0.0, -delta), (1 - delta) / 2
    best, share = -math.inf, lo
    for i in range(1, 20000):
        x = lo + (hi - lo) * i / 20000
        cells = [(lost, x), (gained, x + delta), (neither, 1 - 2 * x - delta)]
        if any(k and p <= 0 for k, p in cells):
            continue
        ll = sum(k * math.log(p) for k, p in cells if k)
        if ll > best:
            best, share = ll, x
    return ((gained - lost) / n - delta) / math.sqrt((2 * share + delta - delta**2) / n)


@pytest.mark.parametrize("lost, gained, n", [(1, 1, 4), (1, 3, 8), (5, 2, 20), (3, 9, 30), (12, 30, 200)])
def test_paired_difference_bounds_are_where_the_score_is_z(lost, gained, n):
    both = (n - lost - gained) // 2
    neither = n - lost - gained - both
    before = [True] * (both + lost) + [False] * (gained + neither)
    after = [True] * both + [False] * lost + [True] * gained + [False] * neither
    mean, lo, hi = paired_difference_interval(before, after)
    assert mean == pytest.approx((gained - lost) / n)
    assert _score_by_search(lost, gained, n, lo) == pytest.approx(Z95, abs=2e-3)
    assert _score_by_search(lost, gained, n, hi) == pytest.approx(-Z95, abs=2e-3)
    assert lo < mean < hi


@pytest.mark.parametrize(
    "df, table", [(1, 12.7062), (2, 4.3027), (3, 3.1824), (5, 2.5706), (10, 2.2281), (30, 2.0423)]
)
def test_t_quantile_matches_the_table(df, table):
    assert t_quantile(0.975, df) == pytest.approx(table, abs=1e-4)
    assert t_quantile(0.5, df) == pytest.approx(0.0, abs=1e-9)


def test_replicate_difference_hand_value():
    before = [[True, False, False, False], [True, True, False, False], [False] * 4]
    after = [[True, True, False, False], [True, True, True, False], [True, True, False, False]]
    # d = 1/4, 1/4, 1/2: mean 1/3, sd sqrt(((1/12)^2 * 2 + (1/6)^2) / 2) = 1/sqrt(48), t(0.975, 2) 4.302653
    mean, lo, hi = replicate_difference_interval(before, after)
    half = 4.302653 / 48**0.5 / 3**0.5
    assert (mean, lo, hi) == pytest.approx((1 / 3, 1 / 3 - half, 1 / 3 + half), abs=1e-5)
    assert replicate_difference_interval(before[:1], after[:1]) == (0.25, float("-inf"), float("inf"))
    with pytest.raises(ValueError, match="the same runs in both arms, got 1 and 3"):
        replicate_difference_interval(before[:1], after)
    with pytest.raises(ValueError, match="t_quantile needs 0.5 <= p < 1 and df >= 1, got p=0.2, df=2"):
        t_quantile(0.2, 2)


@pytest.mark.parametrize(
    "text, style, expected",
    [
        ("58 + 26 = 84. The answer is 84.", "answer_is", "84"),
        ("The answer is -17", "answer_is", "-17"),
        ("the answer is: 1,234.", "answer_is", "1234"),
        ("The answer is $12.5$", "answer_is", "12.5"),
        ("I think 84", "answer_is", None),
        ("so \\boxed{\\frac{1}{2}} done", "boxed", "\\frac{1}{2}"),
        ("\\boxed{1} then \\boxed{2}", "boxed", "2"),
        ("\\boxed{unclosed", "boxed", None),
        ("a 3 then 7.", "last_number", "7"),
        ("The answer is 3. No wait, the answer is 5.", "answer_is", "5"),  # the last statement wins
        ("\\boxed{}", "boxed", None),  # an empty box is no answer (not 0)
        ("\\boxed{7} and finally \\boxed{ }", "boxed", "7"),  # an empty box states nothing: the one before
        ("The answer is \u22125", "answer_is", "-5"),  # U+2212, the typographic minus
        ("it drops to \u22120.25", "last_number", "-0.25"),
        ("The answer is 1e3", "answer_is", "1e3"),
        ("so x = 2.5E-4", "last_number", "2.5E-4"),
        ("The answer is .5", "answer_is", ".5"),
        ("half: .5", "last_number", ".5"),
        ("3 eggs", "last_number", "3"),
        ("She pays 2 * 9 = $<<2*9=18>>18.\n#### 18", "gsm8k", "18"),
        ("#### 1,234 then #### -7.5", "gsm8k", "-7.5"),  # the last '####' wins
        ("so\n#### $1,234,567.", "gsm8k", "1234567"),
        ("The answer is 18.", "gsm8k", None),  # no '####': format not followed
        ("#### eighteen", "gsm8k", None),
        # digits of other scripts, full-width forms and vulgar fractions come back in ASCII
        ("The answer is \uff13.", "answer_is", "3"),  # full-width 3
        ("The answer is \u0663", "answer_is", "3"),  # Arabic-Indic 3
        ("\u0627\u0644\u062c\u0648\u0627\u0628 \u0661\u0662\u0663", "last_number", "123"),
        ("#### \u0663\u066b\u0665", "gsm8k", "3.5"),  # the Arabic decimal separator
        ("x = \uff13\uff0e\uff15", "last_number", "3.5"),  # full-width 3.5
        ("#### \uff11\uff0c\uff12\uff13\uff14", "gsm8k", "1234"),  # full-width thousands comma
        ("The answer is \u0967\u0966", "answer_is", "10"),  # Devanagari 10
        ("The answer is \u00bd.", "answer_is", "1/2"),
        ("The answer is 1\u00bd cups", "answer_is", "3/2"),  # a mixed number
        ("The answer is 2 \u00be", "answer_is", "11/4"),  # with a space between
        ("it drops to \u22121\u00bd", "last_number", "-3/2"),
        ("pour \u2153 then \u2154", "last_number", "2/3"),
        ("#### 12\u215e", "gsm8k", "103/8"),
        ("\\boxed{\\frac{\uff11}{\uff12}}", "boxed", "\\frac{1}{2}"),
        ("\\boxed{1\u00bd}", "boxed", "3/2"),
        ("x\u00b2 = 9, so x = 3", "last_number", "3"),  # a superscript is not a digit
        ("The answer is x\u00b2", "answer_is", None),
        # fractions and powers are whole answers, not their first number
        ("The answer is 3/4.", "answer_is", "3/4"),
        ("The answer is 3 / 4", "answer_is", "3 / 4"),
        ("The answer is 10^6.", "answer_is", "10^6"),
        ("The answer is 2^{-3}", "answer_is", "2^{-3}"),
        ("so it is 3/4", "last_number", "3/4"),
        # LaTeX's thousands separator; a comma that does not group by three is kept
        ("The answer is $1{,}000$.", "answer_is", "1000"),
        ("The answer is 2,3", "answer_is", "2,3"),
        ("The answer is 1,2345", "answer_is", "1,2345"),
        ("The answer is 5, since 2 + 3 = 5", "answer_is", "5"),  # a comma after it is not part of it
        ("The answer is 1,234, which", "answer_is", "1234"),
        ("I count 42, then stop", "last_number", "42"),
        # markdown, math delimiters and a box around the answer
        ("The answer is **42**.", "answer_is", "42"),
        ("The answer is __7__", "answer_is", "7"),
        ("The answer is \\(42\\).", "answer_is", "42"),
        ("The answer is \\[ 42 \\]", "answer_is", "42"),
        ("The answer is $\\boxed{42}$.", "answer_is", "42"),
    ],
)
def test_extract(text, style, expected):
    assert extract_answer(text, style) == expected


@pytest.mark.parametrize(
    "text, style, expected",
    [
        # a currency sign before the number, LaTeX's escaped dollar included
        ("The answer is \\$18.", "answer_is", "18"),
        ("The answer is **\\$18**.", "answer_is", "18"),
        ("The answer is: \\(\\$18\\).", "answer_is", "18"),
        ("The answer is -\\$5.", "answer_is", "-5"),
        ("The answer is \\$-5", "answer_is", "-5"),
        ("The answer is -$5.", "answer_is", "-5"),
        ("The answer is $\\$1,250$", "answer_is", "1250"),
        ("\\$-5", "last_number", "-5"),
        ("it cost 3 apples, or -\\$4.50", "last_number", "-4.50"),
        ("#### \\$18", "gsm8k", "18"),
        ("#### -\\$18", "gsm8k", "-18"),
        ("The answer is \u20ac18.", "answer_is", "18"),  # euro
        ("The answer is \u00a318", "answer_is", "18"),  # pound
        ("The answer is \u00a5 1,000", "answer_is", "1000"),  # yen, a space after the sign
        ("The answer is \u20ac\u00bd", "answer_is", "1/2"),
        # scientific notation is one number, in e-notation
        ("The answer is 2.5\u00d710^3.", "answer_is", "2.5e3"),
        ("so 2.5 \\times 10^3", "last_number", "2.5e3"),
        ("The answer is $2.5 \\times 10^{3}$", "answer_is", "2.5e3"),
        ("The answer is -1.2 \\cdot 10^{-4}", "answer_is", "-1.2e-4"),
        ("The answer is 3*10^8", "answer_is", "3e8"),
        ("The answer is 6 x 10^23", "answer_is", "6e23"),
        ("#### 4 \\times 10^6", "gsm8k", "4e6"),
        ("3 x 10 = 30", "last_number", "30"),  # no power of ten: a product, and its last number
        # a hyphen right after a digit is not a minus sign
        ("The result is 2022-2023", "last_number", "2023"),
        ("pages 10-12", "last_number", "12"),
        ("7 - 9 = -2", "last_number", "-2"),
        ("x=-4", "last_number", "-4"),
        ("The answer is 2022-2023", "answer_is", "2022"),
        # digits grouped by three with spaces (no-break and thin spaces too) are one number
        ("1 000 000", "last_number", "1000000"),
        ("The answer is 12 345.", "answer_is", "12345"),
        ("#### 1\u00a0234\u202f567", "gsm8k", "1234567"),
        ("The answer is 1\u2009000.5", "answer_is", "1000.5"),
        ("scores 12 34", "last_number", "34"),  # not a group of three: two numbers
        ("then 1234 567", "last_number", "567"),  # a group after four digits: two numbers
        ("The answer is 2 \u00be", "answer_is", "11/4"),  # a mixed number still
        # the last box with content; an empty one states nothing; an open one is a cut answer
        ("\\boxed{72} \\boxed{}", "boxed", "72"),
        ("\\boxed{1} \\boxed{2} \\boxed{ } \\boxed{}", "boxed", "2"),
        ("\\boxed{72} \\boxed{8", "boxed", None),
        ("\\boxed{} \\boxed{ }", "boxed", None),
    ],
)
def test_extract_currency_notations_and_boxes(text, style, expected):
    assert extract_answer(text, style) == expected


def test_reference_answer_of_a_gsm8k_solution():
    solution = "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nShe sold 48+24 = <<48+24=72>>72.\n#### 1,072"
    assert reference_answer(solution) == "1072"
    assert reference_answer("#### \\frac{1}{2}") == "\\frac{1}{2}"  # not a number: the text after ####
    assert reference_answer("\\frac{1}{2}") == "\\frac{1}{2}"  # no '####': unchanged
    assert reference_answer("72") == "72"


def test_every_extractor_is_listed_wherever_extractors_are():
    from typing import get_args, get_type_hints

    from streamrl.config import RewardConfig
    from streamrl.data.prompts import SHOT_TEMPLATES
    from streamrl.envs.python_tool import _FORMATS

    assert get_args(get_type_hints(RewardConfig)["extract"]) == EXTRACTORS
    assert tuple(SHOT_TEMPLATES) == EXTRACTORS and tuple(_FORMATS) == EXTRACTORS
    shot = SHOT_TEMPLATES["gsm8k"].format(answer="1234")
    assert shot == "#### 1234" and extract_answer(shot, "gsm8k") == "1234"


def test_extract_unknown_style():
    with pytest.raises(ValueError, match="unknown answer format 'xml'"):
        extract_answer("x", "xml")


@pytest.mark.parametrize(
    "pred, ref, equal",
    [
        ("84", "84", True),
        ("0.5", "\\frac{1}{2}", True),
        ("85", "84", False),
        ("\\{1,2\\}", "\\{2,1\\}", True),
        ("\\{1,3\\}", "\\{1,2\\}", False),
        ("(1, 2]", "(1, 2]", True),
        ("[1, 2]", "(1, 2]", False),
        ("\\frac{2}{4}", "0.5", True),
        ("\\sqrt{4}", "2", True),
        ("2/3", "0.6667", False),
        ("1e3", "1000", True),
        (".5", "0.5", True),
        ("-5", "5", False),
        # digits of other scripts, full-width forms and vulgar fractions compare as their values
        ("\u00bd", "0.5", True),
        ("0.5", "\u00bd", True),
        ("\u00bd", "\\frac{1}{2}", True),
        ("\u00bd", "1/3", False),
        ("1\u00bd", "1.5", True),
        ("1\u00bd", "3/2", True),
        ("1\u00bd", "0.5", False),  # the whole part counts
        ("-2\u00be", "-2.75", True),
        ("\u2153", "\\frac{1}{3}", True),
        ("\u215e", "0.875", True),
        ("\uff13", "3", True),  # full-width 3
        ("\u0663", "3", True),  # Arabic-Indic 3
        ("\u0664", "3", False),
        ("\u0663\u066b\u0665", "3.5", True),  # Arabic-Indic 3.5 with the Arabic decimal separator
        ("\uff13\uff0e\uff15", "3.5", True),  # full-width 3.5
        ("\\frac{\uff11}{\uff12}", "0.5", True),
        ("\uff11\uff0c\uff10\uff10\uff10", "1000", True),
        ("\u2212\uff12", "-2", True),
        ("2\u00b2", "22", False),  # a superscript is not a digit
        ("1,234", "1234", True),  # thousands
        ("2,3", "23", False),  # a pair (or a decimal comma), not twenty-three
        ("-2,1", "-21", False),
        ("3/4", "3", False),
        ("3/4", "0.75", True),
        ("10^6", "1000000", True),
    ],
)
def test_math_verify_equivalence(pred, ref, equal):
    assert math_equal(pred, ref) is equal


@pytest.mark.parametrize(
    "pred, ref, equal",
    [
        # integers and decimals compare exactly, however many digits they have
        ("1000000000", "1000000001", False),
        ("12345678901", "12345678910", False),
        ("4294967296", "4294967295", False),
        ("9007199254740993", "9007199254740992", False),  # one float apart: 2^53 + 1 and 2^53
        ("1000000000000", "1,000,000,000,001", False),
        ("12,345,678,901", "12345678901", True),
        ("0.1", "0.10000000001", False),
        ("1.0000000001", "1", False),
        ("1.50", "1.5", True),
        ("1 000 000", "1000000", True),
        ("-0", "0", True),
        # scientific notation is a decimal too
        ("2.5e3", "2500", True),
        ("2.5e3", "2501", False),
        ("2500", "2.5 \\times 10^{3}", True),
        ("2.5\u00d710^3", "2500", True),
        ("1.2345678901 \\times 10^{10}", "12345678910", False),
        ("1e3", "10^3", True),  # math-verify is given 1000, not e * 3
        ("1e-3", "\\frac{1}{1000}", True),
        # a fraction with a finite decimal expansion is that decimal, exactly
        ("0.125", "\\frac{1}{8}", True),
        ("-0.75", "-\\frac{3}{4}", True),
        ("0.5000004", "1/2", False),
        ("3/6", "\\frac{1}{2}", True),
        # one without (1/3, roots, pi) matches a decimal that agrees to 6 decimal places
        ("0.333333", "1/3", True),
        ("0.3333333333", "\\frac{1}{3}", True),
        ("0.33333", "1/3", False),
        ("0.666667", "\\frac{2}{3}", True),
        ("1.414214", "\\sqrt{2}", True),
        ("1.4142", "\\sqrt{2}", False),
        # a currency sign is not part of the value
        ("\\$18", "18", True),
        ("-\\$5", "-5", True),
        ("\u20ac18", "18", True),
        ("\\$1000000001", "1000000000", False),
    ],
)
def test_plain_numbers_compare_exactly(pred, ref, equal):
    assert math_equal(pred, ref) is equal


@pytest.mark.parametrize(
    "text, style, ref, equal",
    [
        ("The answer is 1,000,000,000,001.", "answer_is", "1000000000000", False),
        ("The answer is 1,000,000,000,000.", "answer_is", "1000000000000", True),
        ("The answer is 2.5\u00d710^3.", "answer_is", "2500", True),
        ("so 2.5 \\times 10^3", "last_number", "2500", True),
        ("The answer is \\$18.", "answer_is", "18", True),
        ("#### -\\$5", "gsm8k", "-5", True),
        ("The result is 2022-2023", "last_number", "2023", True),
        ("1 000 000", "last_number", "1000000", True),
        ("\\boxed{72} \\boxed{}", "boxed", "72", True),
    ],
)
def test_an_extracted_answer_against_its_reference(text, style, ref, equal):
    assert math_equal(extract_answer(text, style) or "", ref) is equal


def test_math_verify_works_in_a_scoring_thread():
    # math-verify's SIGALRM timeouts only work in the main thread; a thread pool must still score
    out = []
    t = threading.Thread(target=lambda: out.extend([math_equal("1/2", "0.5"), math_equal("1/3", "0.5")]))
    t.start()
    t.join()
    assert out == [True, False]


@pytest.mark.parametrize(
    "text, style, expected",
    [
        ("58 + 26 = 84. The answer is 84.", "answer_is", True),
        ("**The answer is 84.**\n", "answer_is", True),
        ("The answer is $12.5$", "answer_is", True),
        ("The answer is 17\n\nIn this example, the answer is 17, which is rounded down.", "answer_is", False),
        ("The answer is 36 inches", "answer_is", False),
        ("The answer is **3/4**.", "answer_is", True),
        ("The answer is $\\boxed{42}$.", "answer_is", True),
        ("The answer is 3/4 of a cup", "answer_is", False),
        ("The answer is 3. No wait, the answer is 5!", "answer_is", True),
        ("I think 84", "answer_is", False),
        ("so $\\boxed{\\frac{1}{2}}$.", "boxed", True),
        ("\\[\\boxed{2}\\]", "boxed", True),
        ("\\boxed{2} I hope this helps", "boxed", False),
        ("\\boxed{unclosed", "boxed", False),
        ("... #### 72", "gsm8k", True),
        ("#### 72 and more", "gsm8k", False),
        ("The answer is \\$18.", "answer_is", True),
        ("The answer is: \\(\\$18\\).", "answer_is", True),
        ("The answer is **-\\$5**", "answer_is", True),
        ("The answer is \u20ac18.", "answer_is", True),
        ("... #### \\$18", "gsm8k", True),
        ("The answer is 2.5 \\times 10^3.", "answer_is", True),
        ("The answer is 1 000 000.", "answer_is", True),
        ("\\boxed{72} \\boxed{}", "boxed", False),  # an empty box after the answer is text after it
        ("a 3 then words", "last_number", True),
        ("no digits", "last_number", False),
    ],
)
def test_a_response_follows_the_format_only_when_its_answer_ends_it(text, style, expected):
    assert ends_with_answer(text, style) is expected


def test_ends_with_answer_names_the_formats_for_an_unknown_one():
    with pytest.raises(ValueError, match="unknown answer format 'xml'; choose from answer_is, boxed"):
        ends_with_answer("x", "xml")
