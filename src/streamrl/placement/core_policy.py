"""Whether lending cores pays, from the phases' speeds measured in the run itself.

Two phases share two cores. Per trained sample generation takes g1 seconds on one core and g2 on
both, training t1 and t2. Over time fractions x (one core each, both phases at once), y (both cores
generate) and z (both cores train), x + y + z = 1, ideal sharing reaches the largest rate r with

    x / g1 + y / g2 >= r    and    x / t1 + z / t2 >= r        (`bound`)

Alternating phases on every core (colocated, or `runtime.elastic_cores=alternate`) is the point
x = 0: r = 1 / (g2 + t2). Lending (`lend`) approaches the bound, so it pays where the bound is well
above that point: where a phase gains little from a second core. Where both phases run about twice
as fast on two cores, running them side by side gains nothing and loses what they cost each other.

`lend_gain` measures this while a run lends: each process's boundaries (a decode step, a trainer
layer) are timed at the threads they ran on. Boundaries on a phase's own core run beside the other
phase, so their time includes what the phases cost each other (memory bandwidth, caches); those on
both cores run while the other phase waits. A phase's speed-up is its mean own-core boundary over
its mean both-core one, and its one-core seconds are its own-core seconds plus its both-core seconds
scaled up by that speed-up. The trained samples are common to both phases and cancel in the ratio.
"""

from __future__ import annotations

from dataclasses import dataclass

LEND_MIN_GAIN = 1.1  # lending keeps the cores only if its bound is this far above alternating:
# measured lending runs reach 86-97% of the bound (docs/benchmarks.md, elastic cores)


def bound(g1: float, g2: float, t1: float, t2: float) -> float:
    """Samples/s of ideal sharing of two cores (see the module docstring): the bottleneck phase gets
    both cores for the share of time the other can spare."""
    best = max(1 / (g2 + t2), min(1 / g1, 1 / t1))  # alternating; the fixed split
    for slow, slow2, fast in ((g1, g2, t1), (t1, t2, g1)):  # double the slower phase part of the time
        # x/fast = x/slow + (1 - x)/slow2  ->  x = (1/slow2) / (1/fast - 1/slow + 1/slow2)
        x = min(1.0, (1 / slow2) / (1 / fast - 1 / slow + 1 / slow2))
        best = max(best, min(x / fast, x / slow + (1 - x) / slow2))
    return best


@dataclass(frozen=True)
class PhaseTimes:
    """One phase's timed boundaries while lending: seconds and count on its own threads and on every
    core."""

    own_s: float
    own_n: int
    all_s: float
    all_n: int

    def speedup(self) -> float:
        """How much faster a boundary runs on every core than on the phase's own."""
        return (self.own_s / self.own_n) / (self.all_s / self.all_n)

    def own_seconds(self) -> float:
        """The phase's seconds as if every boundary had run on its own threads."""
        return self.own_s + self.all_s * self.speedup()


def lend_gain(gen: PhaseTimes, train: PhaseTimes) -> float:
    """The bound of lending over alternating (>= 1), from generation's and training's timed
    boundaries; each needs boundaries on both thread counts."""
    sg, st = gen.speedup(), train.speedup()
    g1, t1 = gen.own_seconds(), train.own_seconds()
    g2, t2 = g1 / sg, t1 / st
    return bound(g1, g2, t1, t2) * (g2 + t2)
