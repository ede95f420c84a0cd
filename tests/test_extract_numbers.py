"""Extraction and comparison read numbers by one grammar (rewards/number_grammar.py): whatever form an
answer writes a number in, the number extracted from a response is the one math_equal values."""

from __future__ import annotations

from decimal import Decimal
from fractions import Fraction

import pytest

from streamrl.rewards.extract import extract_answer
from streamrl.rewards.math import math_equal
from streamrl.rewards.number_grammar import canonical, is_number, value

# (a number as written, what extraction returns for it, its value)
FORMS = [
    ("10^+3", "10^3", None),  # a power: math-verify's to value
    ("10^{+3}", "10^{3}", None),
    ("10^6", "10^6", None),
    ("2^{-3}", "2^{-3}", None),
    ("2.5×10^3", "2.5e3", Decimal(2500)),
    ("2.5×10^+3", "2.5e3", Decimal(2500)),
    ("2.5 \\times 10^{+3}", "2.5e3", Decimal(2500)),
    ("-1.2 \\cdot 10^{-4}", "-1.2e-4", Decimal("-0.00012")),
    ("3*10^8", "3e8", Decimal(300000000)),
    ("2.5·10^3", "2.5e3", Decimal(2500)),  # a middle dot
    ("2.5 · 10^{3}", "2.5e3", Decimal(2500)),
    ("-1.2·10^{-4}", "-1.2e-4", Decimal("-0.00012")),
    ("2·10^3", "2e3", Decimal(2000)),
    ("2.5⋅10^3", "2.5e3", Decimal(2500)),  # a dot operator
    ("2.5 × 10^3", "2.5e3", Decimal(2500)),
    ("2.5\\times 10^{3}", "2.5e3", Decimal(2500)),
    ("2.5\\cdot10^3", "2.5e3", Decimal(2500)),
    (".5×10^3", ".5e3", Decimal(500)),
    ("1e-3", "1e-3", Decimal("0.001")),
    ("1e+3", "1e+3", Decimal(1000)),
    ("2.5E-4", "2.5E-4", Decimal("0.00025")),
    ("+5", "5", Decimal(5)),
    ("-5", "-5", Decimal(-5)),
    ("-\\$5", "-5", Decimal(-5)),
    ("\\$-5", "-5", Decimal(-5)),
    ("+\\$5", "5", Decimal(5)),
    ("-€5", "-5", Decimal(-5)),
    ("£18", "18", Decimal(18)),
    ("1 000 000", "1000000", Decimal(1000000)),
    ("1\u00a0234\u202f567", "1234567", Decimal(1234567)),
    ("1\u2009000.5", "1000.5", Decimal("1000.5")),
    ("1,000", "1000", Decimal(1000)),
    ("-1,234,567.25", "-1234567.25", Decimal("-1234567.25")),
    ("1{,}000", "1000", Decimal(1000)),
    ("\\$1,250", "1250", Decimal(1250)),
    (".5", ".5", Decimal("0.5")),
    ("3/4", "3/4", Fraction(3, 4)),
    ("-3 / 4", "-3 / 4", Fraction(-3, 4)),
    ("1½", "3/2", Fraction(3, 2)),
    ("-2 ¾", "-11/4", Fraction(-11, 4)),
]
# the reference answer of a number without a plain value
POWERS = {"10^+3": "1000", "10^{+3}": "1000", "10^6": "1000000", "2^{-3}": "0.125"}


def _reference(written: str, exact: Decimal | Fraction | None) -> str:
    if exact is None:
        return POWERS[written]
    if isinstance(exact, Decimal):
        return format(exact, "f")
    return f"\\frac{{{exact.numerator}}}{{{exact.denominator}}}"


@pytest.mark.parametrize("written, extracted, exact", FORMS)
@pytest.mark.parametrize(
    "template, style",
    [("The answer is {}.", "answer_is"), ("so it comes to {}", "last_number"), ("...\n#### {}", "gsm8k")],
)
def test_extraction_reads_the_whole_number_comparison_values(written, extracted, exact, template, style):
    """Every format reads the whole number (not its first or last part), and the answer it returns
    compares equal to the number as written and to the reference."""
    got = extract_answer(template.format(written), style)
    assert got == extracted
    reference = _reference(written, exact)
    assert math_equal(got, reference) is True
    assert math_equal(written, reference) is True
    assert math_equal(got, written) is True


@pytest.mark.parametrize("written, extracted, exact", FORMS)
def test_one_grammar_reads_and_values(written, extracted, exact):
    assert is_number(written)
    assert canonical(written) == extracted
    assert value(written) == value(extracted) == exact


@pytest.mark.parametrize(
    "text, style, expected",
    [
        ("x+5", "last_number", "5"),
        ("3+5", "last_number", "5"),  # a plus right after a digit is an operator: the number is 5
        ("x^2+3", "last_number", "3"),
        ("The answer is 10^+3 apples", "answer_is", "10^3"),
        ("C++ 11", "last_number", "11"),
    ],
)
def test_a_plus_sign_is_read_as_the_numbers_own(text, style, expected):
    assert extract_answer(text, style) == expected


@pytest.mark.parametrize(
    "text, style, expected",
    [
        ("so it comes to 2·5", "last_number", "5"),  # a dot between digits is no decimal point
        ("The answer is 2·5.", "answer_is", "2"),
        ("so it comes to 2·10", "last_number", "10"),  # a dot before 10 with no power is no scale
        ("so it comes to 3·4^2", "last_number", "4^2"),  # only a power of ten scales
        ("so it comes to 2.5·10", "last_number", "10"),
    ],
)
def test_a_dot_is_a_multiplication_sign_only_before_a_power_of_ten(text, style, expected):
    assert extract_answer(text, style) == expected


@pytest.mark.parametrize("written", ["2·5", "2·10", "3·4^2", "2.5·10", "2.5·10^3.5", "·10^3"])
def test_a_dot_without_a_number_and_a_power_of_ten_is_no_number(written):
    assert not is_number(written)
    assert value(written) is None


def test_a_middle_dot_scales_on_both_sides_of_a_comparison():
    assert math_equal("2.5·10^3", "2500") is True
    assert math_equal("2500", "2.5·10^3") is True
    assert math_equal("2.5·10^3", "2.5 \\times 10^{3}") is True
    assert math_equal("2.5·10^3", "25") is False
    assert math_equal("2·5", "2.5") is False


def test_a_wrong_number_in_any_form_is_still_wrong():
    assert math_equal(extract_answer("The answer is 10^+4.", "answer_is") or "", "1000") is False
    assert math_equal(extract_answer("The answer is 2.5×10^+2.", "answer_is") or "", "2500") is False
    assert math_equal(extract_answer("The answer is +\\$6.", "answer_is") or "", "5") is False


def test_every_format_reads_numbers_by_the_grammar():
    from streamrl.rewards import extract
    from streamrl.rewards.number_grammar import NUMBER

    assert extract._NUMBER.pattern == NUMBER
    assert NUMBER in extract._ANSWER_IS.pattern and NUMBER in extract._GSM8K.pattern
