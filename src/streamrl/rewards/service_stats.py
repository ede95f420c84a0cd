"""The RewardService's counters: outcomes, cache hits, failures by reason, latencies, restarts.

Not thread-safe on its own: the service calls it under its lock.
"""

from __future__ import annotations

import math
from collections import Counter, deque

from streamrl.types import TIMEOUT_REASONS


class ServiceStats:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.count = self.cache_hits = self.restarts = 0
        self.errors: Counter[str] = Counter()
        self.latencies: deque[float] = deque(maxlen=100_000)

    def record(self, cached: bool, latency_s: float, error: str | None) -> bool:
        """Count one outcome; -> True when it is the first failure of its kind (worth a warning)."""
        self.count += 1
        if cached:
            self.cache_hits += 1
        else:
            self.latencies.append(latency_s)
        if error is None:
            return False
        self.errors[error] += 1
        return self.errors[error] == 1

    def snapshot(self, cache_size: int, queued: int) -> dict[str, float]:
        """Flat keys for a per-step record. count covers every outcome (cached and failed ones too);
        timeouts are counted apart from errors (errors/<reason> per reason); latencies cover scored,
        non-cached requests."""
        lat = sorted(self.latencies)
        n = len(lat)

        def pct(q: float) -> float:
            return lat[max(0, math.ceil(q * n) - 1)] if n else 0.0

        m = {
            "reward/count": float(self.count),
            "reward/cache_hits": float(self.cache_hits),
            "reward/cache_hit_rate": self.cache_hits / self.count if self.count else 0.0,
            "reward/cache_size": float(cache_size),
            "reward/timeouts": float(sum(self.errors[k] for k in TIMEOUT_REASONS)),
            "reward/errors": float(sum(v for k, v in self.errors.items() if k not in TIMEOUT_REASONS)),
            "reward/worker_restarts": float(self.restarts),
            "reward/queued": float(queued),
            "reward/latency_mean_s": sum(lat) / n if n else 0.0,
            "reward/latency_p50_s": pct(0.5),
            "reward/latency_p95_s": pct(0.95),
            "reward/latency_max_s": lat[-1] if n else 0.0,
        }
        m.update(
            {
                f"reward/errors/{k}": float(v)
                for k, v in sorted(self.errors.items())
                if k not in TIMEOUT_REASONS
            }
        )
        return m
