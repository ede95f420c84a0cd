"""Math answer equivalence with math-verify (LaTeX, fractions, intervals, sets)."""

from __future__ import annotations

import math
import re
import threading

from streamrl.rewards.numerals import ascii_numerals

_PLAIN_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")  # 1,234 groups digits; 2,3 and -2,1 are pairs


def _plain_number(s: str) -> float | None:
    """'1,000' / '1e3' / '.5' -> a float; anything else (LaTeX, fractions, sets, '2,3') -> None."""
    t = _THOUSANDS.sub("", s.strip().strip("$").strip())
    return float(t) if _PLAIN_NUMBER.fullmatch(t) else None


def math_equal(predicted: str, reference: str) -> bool:
    """True when math-verify finds the two answers equivalent ('0.5' vs '\\frac{1}{2}', sets in any order).

    math-verify bounds parsing and comparison with SIGALRM, which only works in the main thread; in a
    scoring thread (the RewardService's thread pool) it would fail every comparison, so there the
    timeouts are off and the service's own per-call timeout is the bound.

    Both answers are made ASCII first (rewards/numerals.py): digits of any script ('٣', full-width
    '３'), vulgar fractions ('½' = 0.5, '1½' = 1.5) and full-width punctuation compare as their values.
    """
    predicted, reference = ascii_numerals(predicted), ascii_numerals(reference)
    a, b = _plain_number(predicted), _plain_number(reference)
    if a is not None and b is not None:  # plain decimals; math-verify reads '1e3' as e * 3
        if math.isclose(a, b, rel_tol=1e-9, abs_tol=0.0):
            return True
        if "e" in (predicted + reference).lower():
            return False
    from math_verify import parse, verify

    main = threading.current_thread() is threading.main_thread()
    timeout = 5 if main else None

    def as_latex(s: str) -> str:
        s = s.strip()
        return s if s.startswith("$") else f"${s}$"

    try:
        gold = parse(as_latex(reference), parsing_timeout=timeout)  # type: ignore[arg-type]
        pred = parse(as_latex(predicted), parsing_timeout=timeout)  # type: ignore[arg-type]
        return bool(gold) and bool(pred) and bool(verify(gold, pred, timeout_seconds=timeout))
    except Exception:  # math-verify raises on some malformed LaTeX: a wrong answer, not a crash
        return False
