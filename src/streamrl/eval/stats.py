"""Accuracy intervals: Wilson for one proportion, paired normal interval for a difference."""

from __future__ import annotations

import math

Z95 = 1.959963984540054


def wilson_interval(correct: int, n: int, z: float = Z95) -> tuple[float, float]:
    """95% Wilson score interval of correct / n (well-behaved at 0 and n)."""
    if n == 0:
        return (0.0, 1.0)
    p = correct / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def paired_difference_interval(
    before: list[bool], after: list[bool], z: float = Z95
) -> tuple[float, float, float]:
    """Mean of d_i = after_i - before_i over the same problems and its 95% normal interval.

    -> (mean, low, high). Pairing removes the between-problem variance, so the interval is the
    right one for "did training help on these problems" (McNemar's setting).
    """
    if len(before) != len(after):
        raise ValueError(f"paired interval needs equal lengths, got {len(before)} and {len(after)}")
    n = len(before)
    if n == 0:
        return (0.0, 0.0, 0.0)
    d = [float(a) - float(b) for a, b in zip(after, before)]
    mean = sum(d) / n
    var = sum((x - mean) ** 2 for x in d) / (n - 1) if n > 1 else 0.0
    half = z * math.sqrt(var / n)
    return (mean, mean - half, mean + half)
