"""Math answer equivalence with math-verify (LaTeX, fractions, intervals, sets)."""

from __future__ import annotations

import threading


def math_equal(predicted: str, reference: str) -> bool:
    """True when math-verify finds the two answers equivalent ('0.5' vs '\\frac{1}{2}', sets in any order).

    math-verify bounds parsing and comparison with SIGALRM, which only works in the main thread; in a
    scoring thread (the RewardService's thread pool) it would fail every comparison, so there the
    timeouts are off and the service's own per-call timeout is the bound.
    """
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
