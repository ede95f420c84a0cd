"""Math answer equivalence with math-verify (LaTeX, fractions, intervals, sets)."""

from __future__ import annotations


def math_equal(predicted: str, reference: str) -> bool:
    from math_verify import parse, verify

    def as_latex(s: str) -> str:
        s = s.strip()
        return s if s.startswith("$") else f"${s}$"

    try:
        gold = parse(as_latex(reference))
        pred = parse(as_latex(predicted))
        return bool(gold) and bool(pred) and bool(verify(gold, pred))
    except Exception:  # math-verify raises on some malformed LaTeX: a wrong answer, not a crash
        return False
