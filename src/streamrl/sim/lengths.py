"""Response-length models for the simulator: fixed, a list (cycled), log-normal, per-step run stats.

A spec string picks one on the command line:

    fixed:32                  every response is 32 tokens
    list:10,20,48             cycled in admission order
    lognormal:600,1.0,8192    median 600, sigma 1.0 (of log length), capped at 8192 (long tail)
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass


@dataclass(frozen=True)
class Fixed:
    length: int

    def sample(self, version: int, rng: random.Random) -> int:
        return self.length


@dataclass
class Cycle:
    lengths: tuple[int, ...]
    _i: int = 0

    def sample(self, version: int, rng: random.Random) -> int:
        n = self.lengths[self._i % len(self.lengths)]
        self._i += 1
        return n


@dataclass(frozen=True)
class LogNormal:
    median: float
    sigma: float
    max_len: int

    def sample(self, version: int, rng: random.Random) -> int:
        return max(1, min(self.max_len, round(rng.lognormvariate(math.log(self.median), self.sigma))))

    def mean(self) -> float:
        """Mean of the capped distribution (numerically; for reports)."""
        rng = random.Random(1)
        return sum(self.sample(0, rng) for _ in range(20000)) / 20000


@dataclass(frozen=True)
class StepStats:
    """Lengths matching a run's per-step `response_length` (mean m), `truncation_rate` (tr) and, when
    logged, `response_length_std` (s).

    A sample is truncated (max_len tokens L) with probability tr; otherwise its length has mean
    m' = (m - tr L) / (1 - tr) and, with s, the variance v' = (s^2 + m^2 - tr L^2) / (1 - tr) - m'^2
    that gives the mixture the logged mean and spread: gamma-distributed with those two moments (m' for
    every sample when v' is 0: a confident policy's answers of one length), clipped to [1, L - 1]. Runs
    logged without s get an exponential (v' = m'^2, an assumed shape). Samples admitted under version v
    use step v + 1's stats (the last step's beyond the run).
    """

    means: tuple[float, ...]
    truncation: tuple[float, ...]
    max_len: int
    stds: tuple[float, ...] | None = None

    def sample(self, version: int, rng: random.Random) -> int:
        i = min(version, len(self.means) - 1)
        m, tr, cap = self.means[i], self.truncation[i], self.max_len
        if rng.random() < tr:
            return cap
        body = max(1.0, (m - tr * cap) / max(1e-9, 1.0 - tr))
        if self.stds is None:
            x = rng.expovariate(1.0 / body)
        else:
            s = self.stds[i]
            var = max(0.0, (s * s + m * m - tr * cap * cap) / max(1e-9, 1.0 - tr) - body * body)
            x = rng.gammavariate(body * body / var, var / body) if var > 1e-9 else body
        return max(1, min(cap - 1, round(x)))


def parse_lengths(spec: str) -> Fixed | Cycle | LogNormal:
    """'fixed:N' | 'list:a,b,...' | 'lognormal:median,sigma,max'; ValueError with one line otherwise."""
    kind, _, rest = spec.partition(":")
    try:
        if kind == "fixed":
            n = int(rest)
            if n >= 1:
                return Fixed(n)
        elif kind == "list":
            items = tuple(int(x) for x in rest.split(","))
            if items and min(items) >= 1:
                return Cycle(items)
        elif kind == "lognormal":
            med, sig, cap = rest.split(",")
            if float(med) > 0 and float(sig) >= 0 and int(cap) >= 1:
                return LogNormal(float(med), float(sig), int(cap))
    except ValueError:
        pass
    raise ValueError(
        f"bad lengths spec '{spec}': use fixed:N, list:a,b,c or lognormal:median,sigma,max (positive)"
    )
