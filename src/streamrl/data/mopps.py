"""MoPPS (model-predictive prompt selection), `rollout.sampler=mopps`.

Each prompt i has a Beta(a_i, b_i) posterior of its success rate, from a Beta(1, 1) prior, updated by a
group of n samples with s successes as
    a_i <- lam * a_i + s,    b_i <- lam * b_i + (n - s)        (lam = 1: no forgetting)
A pool of K candidates is kept filled from the stream. Each draw samples theta_i ~ Beta(a_i, b_i) for
every candidate and returns  argmin_i |theta_i - target|  (Thompson sampling toward target = 0.5, where
the group-relative advantage has the most signal). The chosen prompt stays in the pool, so it can be
revisited with what was learned; it retires after `max_draws` draws, and a candidate whose posterior
mean has left [target - band, target + band] is replaced by a fresh one. Posteriors of retired prompts
are remembered (up to MEMORY), so a finite dataset's prompts start the next epoch with them.

Resume: the state holds the pool's positions in the base stream (its problems are re-drawn from the
deterministic stream), the posteriors and the RNG; a mark copies neither the posteriors, which
`state_at_mark()` rebuilds (data/bounded_memory.py), nor more than the pool.
"""

from __future__ import annotations

import random
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from streamrl.data.bounded_memory import BoundedMemory
from streamrl.data.sampler_base import MEMORY, Sampler, successes
from streamrl.types import Group, Problem


def _rng_state(state: tuple[Any, ...]) -> list[Any]:
    """A random.Random's getstate() as JSON."""
    v, internal, gauss = state
    return [v, list(internal), gauss]


def _set_rng(rng: random.Random, s: list[Any]) -> None:
    rng.setstate((s[0], tuple(s[1]), s[2]))


@dataclass
class _Candidate:
    problem: Problem
    position: int  # index in the base stream
    draws: int = 0


class MoPPSSampler(Sampler):
    def __init__(
        self,
        base: Iterator[Problem],
        pool: int = 64,
        target: float = 0.5,
        seed: int = 0,
        max_draws: int = 8,
        band: float = 0.3,
        lam: float = 1.0,
    ) -> None:
        super().__init__(base)
        self.K, self.target, self.max_draws, self.band, self.lam = pool, target, max_draws, band, lam
        self.pool: OrderedDict[str, _Candidate] = OrderedDict()
        self.post: BoundedMemory[list[float]] = BoundedMemory(MEMORY)  # id -> [a, b]
        self.rng = random.Random(seed)
        self.draws = self.retired = self.evicted = 0

    def _ab(self, pid: str) -> list[float]:
        return self.post.get(pid, [1.0, 1.0])

    def _mean(self, pid: str) -> float:
        a, b = self._ab(pid)
        return a / (a + b)

    def _fill(self) -> None:
        """Pull candidates until the pool holds K, or until a pull finds one the pool holds: the stream
        came round (a dataset smaller than the pool never fills it, and every draw would pull K)."""
        for _ in range(self.K):
            if len(self.pool) >= self.K:
                return
            pos = self.base_drawn
            p = self._pull()
            if p.id in self.pool:
                return
            self.pool[p.id] = _Candidate(p, pos)

    def __next__(self) -> Problem:
        with self.lock:
            self._fill()
            ids = list(self.pool)
            theta = [self.rng.betavariate(*self._ab(i)) for i in ids]
            best = min(range(len(ids)), key=lambda j: abs(theta[j] - self.target))
            cand = self.pool[ids[best]]
            cand.draws += 1
            self.draws += 1
            if cand.draws >= self.max_draws:
                del self.pool[ids[best]]
                self.retired += 1
            return cand.problem

    def observe(self, group: Group) -> None:
        s, n = successes(group)
        pid = group.problem.id
        with self.lock:
            a, b = self._ab(pid)
            self.post.put(pid, [self.lam * a + s, self.lam * b + (n - s)])
            if pid in self.pool and abs(self._mean(pid) - self.target) > self.band:
                del self.pool[pid]  # saturated (too easy or too hard): make room for a fresh prompt
                self.evicted += 1

    def metrics(self) -> dict[str, float]:
        with self.lock:
            means = [self._mean(i) for i in self.pool]
            return {
                "sampler_pool_size": float(len(self.pool)),
                "sampler_pool_success_mean": sum(means) / max(len(means), 1),
                "sampler_evicted": float(self.evicted),
                "sampler_retired": float(self.retired),
            }

    def state_dict(self) -> dict[str, Any]:
        with self.lock:
            return self._state(self._small(), self.post.items())

    def _small(self) -> dict[str, Any]:
        """The state but its posteriors, with the RNG's own tuple: what a mark copies."""
        pool = [[c.position, c.draws] for c in self.pool.values()]
        counts = [self.draws, self.retired, self.evicted]
        return {**self._position(), "pool": pool, "post": [], "rng": self.rng.getstate(), "counts": counts}

    @staticmethod
    def _state(small: dict[str, Any], post: Iterable[tuple[str, list[float]]]) -> dict[str, Any]:
        return {**small, "post": [[k, v[0], v[1]] for k, v in post], "rng": _rng_state(small["rng"])}

    def mark(self) -> None:
        with self.lock:
            self._marked = self._small()
            self.post.mark()  # the posteriors as of now are rebuilt by state_at_mark, not copied

    def state_at_mark(self) -> dict[str, Any]:
        with self.lock:
            return self._state(self._marked or self._small(), self.post.items_at_mark())

    def load_state_dict(self, d: dict[str, Any]) -> None:
        wanted = {int(pos): int(draws) for pos, draws in d["pool"]}
        for pos in range(int(d["base_drawn"])):
            p = self._pull()
            if pos in wanted:
                self.pool[p.id] = _Candidate(p, pos, wanted[pos])
        self._check_position(d)
        self.post = BoundedMemory(MEMORY, ((k, [float(a), float(b)]) for k, a, b in d["post"]))
        _set_rng(self.rng, d["rng"])
        self.draws, self.retired, self.evicted = d["counts"]
        self._marked = None
