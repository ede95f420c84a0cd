"""Accuracy intervals: Wilson for one proportion, Tango's paired score interval for a difference over
problems, Student's t interval for a difference over replicate runs."""

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
    """Mean of d_i = after_i - before_i over the same problems and its 95% interval.

    -> (mean, low, high). Pairing removes the between-problem variance, so the interval is the
    right one for "did training help on these problems" (McNemar's setting). It is Tango's asymptotic
    score interval for paired proportions (Tango 1998; recommended by Fagerland, Lydersen and Laake
    2014): the differences delta whose score statistic, with the discordant cells' probabilities
    re-estimated under delta (`_lost_share`), stays within z. It keeps a width at the extremes: no
    problem changing gives +-z^2 / (n + z^2) (n = 200: +-0.0188), every problem flipped up
    ([F, F, F] -> [T, T, T]) gives ((3 - z^2) / (3 + z^2), 1) = (-0.123, 1).
    """
    if len(before) != len(after):
        raise ValueError(f"paired interval needs equal lengths, got {len(before)} and {len(after)}")
    n = len(before)
    if n == 0:
        return (0.0, 0.0, 0.0)
    lost = sum(1 for b, a in zip(before, after) if b and not a)
    gained = sum(1 for b, a in zip(before, after) if a and not b)
    mean = (gained - lost) / n

    def score(delta: float) -> float:
        """(mean - delta) / its standard error under delta; 0 where that error is 0 and mean = delta."""
        var = (2 * _lost_share(lost, gained, n, delta) + delta - delta * delta) / n
        gap = mean - delta
        if var <= 0:
            return 0.0 if abs(gap) < 1e-12 else math.copysign(math.inf, gap)
        return gap / math.sqrt(var)

    def bound(lo: float, hi: float, target: float) -> float:
        """The delta in [lo, hi] where the score, falling in delta, crosses target (bisection)."""
        for _ in range(100):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if score(mid) > target else (lo, mid)
        return (lo + hi) / 2

    low = -1.0 if score(-1.0) <= z else bound(-1.0, mean, z)
    high = 1.0 if score(1.0) >= -z else bound(mean, 1.0, -z)
    return (mean, low, high)


def _lost_share(lost: int, gained: int, n: int, delta: float) -> float:
    """The maximum-likelihood probability of a lost problem (right before, wrong after) given that the
    gained one's is that plus delta: the root of 2n x^2 - w x - lost delta (1 - delta) = 0 with
    w = lost + gained - delta (2n + lost - gained), the one in [max(0, -delta), (1 - delta) / 2]."""
    w = lost + gained - delta * (2 * n + lost - gained)
    return (w + math.sqrt(max(0.0, w * w + 8 * n * lost * delta * (1 - delta)))) / (4 * n)


def t_quantile(p: float, df: int) -> float:
    """Student's t quantile (0.5 <= p < 1, df >= 1): bisection on the CDF, whose density is integrated by
    Simpson's rule (t_quantile(0.975, 2) = 4.3027, to 1e-6)."""
    if not 0.5 <= p < 1 or df < 1:
        raise ValueError(f"t_quantile needs 0.5 <= p < 1 and df >= 1, got p={p}, df={df}")
    log_c = math.lgamma((df + 1) / 2) - math.lgamma(df / 2) - 0.5 * math.log(df * math.pi)

    def cdf(t: float, steps: int = 4000) -> float:
        h = t / steps
        f = [math.exp(log_c - (df + 1) / 2 * math.log1p((i * h) ** 2 / df)) for i in range(steps + 1)]
        simpson = f[0] + f[-1] + 4 * sum(f[1:-1:2]) + 2 * sum(f[2:-1:2])
        return 0.5 + simpson * h / 3

    lo, hi = 0.0, 1.0
    while cdf(hi) < p:
        lo, hi = hi, 2 * hi
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if cdf(mid) < p else (lo, mid)
    return (lo + hi) / 2


def replicate_difference_interval(
    before: list[list[bool]], after: list[list[bool]], level: float = 0.95
) -> tuple[float, float, float]:
    """Replicate runs (seeds) of two arms, each evaluated on the same problems: per run r the mean
    paired difference d_r = mean(after_r - before_r); -> (mean of the d_r, and Student's t interval over
    the runs). It holds the run-to-run spread of training (seed, timing, the policy's path) that the
    problem-paired interval leaves out, so it is the one for "does the arm change what training reaches"
    (a single run: no interval, (d, -inf, inf))."""
    if len(before) != len(after) or not before:
        raise ValueError(
            f"replicate interval needs the same runs in both arms, got {len(before)} and {len(after)}"
        )
    d = [paired_difference_interval(b, a)[0] for b, a in zip(before, after)]
    n = len(d)
    mean = sum(d) / n
    if n == 1:
        return (mean, -math.inf, math.inf)
    sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
    half = t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n)
    return (mean, mean - half, mean + half)
