"""Math answer equivalence: exact for plain numbers, math-verify for the rest (LaTeX, roots, intervals,
sets)."""

from __future__ import annotations

import threading
from decimal import Decimal
from fractions import Fraction

from streamrl.rewards.number_grammar import canonical, is_number, value
from streamrl.rewards.numerals import ascii_numerals

# a decimal whose last digit is past 10^±1000 is not written out as an integer ratio or as digits
# (1e999999999 would take gigabytes): no fraction of integers in a response is that far from 1
_EXPONENT_LIMIT = 1000


def _terminates(f: Fraction) -> bool:
    """Whether f has a finite decimal expansion (its denominator's only prime factors are 2 and 5)."""
    q = f.denominator
    for p in (2, 5):
        while q % p == 0:
            q //= p
    return q == 1


def _exactly_equal(a: Decimal | Fraction, b: Decimal | Fraction) -> bool | None:
    """a == b exactly where both have a finite decimal expansion; None where one has none (1/3): no
    decimal equals it, and whether one stands for it is math-verify's rounding rule."""
    if isinstance(a, Decimal) and isinstance(b, Decimal):
        return a == b
    if isinstance(a, Fraction) and isinstance(b, Fraction):
        return a == b
    d, f = (a, b) if isinstance(a, Decimal) else (b, a)
    assert isinstance(d, Decimal) and isinstance(f, Fraction)
    if not _terminates(f):
        return None
    exponent = d.as_tuple().exponent
    if not isinstance(exponent, int) or abs(exponent) > _EXPONENT_LIMIT:
        return False
    return Fraction(d) == f


def math_equal(predicted: str, reference: str) -> bool:
    """True when the two answers are equivalent ('0.5' vs '\\frac{1}{2}', sets in any order).

    Plain numbers compare exactly: integers and decimals (thousands separators, 1e3, 2.5×10^3) and
    fractions of integers ('3/4', '\\frac{3}{4}') are equal only when their values are, however many
    digits they have ('1000000000' != '1000000001', '0.1' != '0.10000000001', '0.5' == '1/2').
    A value without a finite decimal expansion (1/3, \\sqrt{2}, \\pi) can only be approximated by a
    decimal: math-verify decides those, and it takes a decimal that agrees to 6 decimal places
    ('0.333333' == '1/3', '0.6667' != '2/3'). Everything else (LaTeX, roots, intervals, sets) goes to
    math-verify.

    math-verify bounds parsing and comparison with SIGALRM, which only works in the main thread; in a
    scoring thread (the RewardService's thread pool) it would fail every comparison, so there the
    timeouts are off and the service's own per-call timeout is the bound.

    Both answers are made ASCII first (rewards/numerals.py): digits of any script ('٣', full-width
    '３'), vulgar fractions ('½' = 0.5, '1½' = 1.5) and full-width punctuation compare as their values.
    """
    predicted, reference = ascii_numerals(predicted), ascii_numerals(reference)
    a, b = value(predicted), value(reference)
    if a is not None and b is not None:
        exact = _exactly_equal(a, b)
        if exact is not None:
            return exact
    from math_verify import parse, verify

    main = threading.current_thread() is threading.main_thread()
    timeout = 5 if main else None

    def as_latex(s: str, exact: Decimal | Fraction | None) -> str:
        if isinstance(exact, Decimal):  # math-verify reads '1e3' as e * 3 and '1,000' as a pair
            exponent = exact.as_tuple().exponent
            if isinstance(exponent, int) and abs(exponent) <= _EXPONENT_LIMIT:
                s = format(exact, "f")
        elif is_number(s):  # a number math-verify reads otherwise, or not at all: '10^+3', '\\$10^6'
            s = canonical(s)
        s = s.strip()
        return s if s.startswith("$") else f"${s}$"

    try:
        gold = parse(as_latex(reference, b), parsing_timeout=timeout)  # type: ignore[arg-type]
        pred = parse(as_latex(predicted, a), parsing_timeout=timeout)  # type: ignore[arg-type]
        return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=timeout))
    except Exception:  # math-verify raises on some malformed LaTeX: a wrong answer, not a crash
        return False
