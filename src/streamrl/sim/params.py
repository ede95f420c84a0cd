"""What the pipeline simulator takes and returns: costs, workload, setup, result (sim/model.py runs it).

Costs are seconds on one unit of compute (one device, or one core in shared-core mode); see model.py for
how each enters the engine and trainer timelines.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Protocol

MODES = ("sync", "async", "partial")
WEIGHT_UPDATES = ("inflight", "interrupt")


class LengthModel(Protocol):
    def sample(self, version: int, rng: random.Random) -> int:
        """Response length (tokens) of a sample admitted under policy `version`."""
        ...


@dataclass(frozen=True)
class Costs:
    decode_step_s: float = 0.0  # a: fixed cost of one decode step (weights read once per step)
    decode_token_s: float = 0.01  # c: cost per running sequence per decode step
    prefill_token_s: float = 0.0  # p: per prompt token on joining, per cached token on recompute
    train_token_s: float = 0.01  # per trained token (prompt + response) on one rank
    train_step_s: float = 0.0  # fixed optimizer / bookkeeping cost per trainer step
    allreduce_s: float = 0.0  # gradient allreduce bandwidth term, scaled by 2 (R - 1) / R
    weight_sync_s: float = 0.0  # wall seconds to publish weights after a step
    startup_s: float = 0.0  # engines start generating at this time (process spawn, model load)


@dataclass(frozen=True)
class Workload:
    lengths: LengthModel
    batch_groups: int = 8  # B: groups per trainer step
    group_size: int = 8  # G: samples per prompt
    prompt_len: int = 50
    max_batch: int = 128  # sequences one engine decodes at once
    filter_rate: float = 0.0
    shared_prefill: bool = False  # a group's G samples share one prompt prefill
    # the leading prompt tokens every prompt shares (chat template, instruction), prefilled once per
    # engine and weights version instead of once per prompt: the engine's prefix cache (0: none)
    cached_prefix: int = 0
    # KV-cache rows per running sequence in a decode step: the engine forwards samples whose tokens so far
    # are identical (a confident policy's repeated answers) on one row (1.0: every sequence its own)
    row_share: float = 1.0


@dataclass(frozen=True)
class Setup:
    mode: str = "async"
    eta: int = 1
    overprovision: float = 2.0  # partial: groups in flight per round, in units of B
    weight_update: str = "inflight"
    engines: int = 1
    ranks: int = 1
    steps: int = 10
    shared_cores: int = 0  # 0: engines and ranks on their own devices; > 0: they share these cores
    engine_threads: int = 1
    trainer_threads: int = 1
    thread_scaling: float = 1.0  # alpha: k trainer threads run k ** alpha times faster than one
    decode_thread_scaling: float | None = None  # the engines' alpha (None: thread_scaling)
    contention: float = 0.0  # shared cores: each extra active component slows all by this fraction
    elastic: bool = False  # shared cores: a waiting trainer's threads decode, idle engines' threads train
    chunk: int = 1
    seed: int = 0


@dataclass
class SimResult:
    time: float
    samples: int
    samples_per_s: float
    trained_tokens_per_s: float
    gen_tokens_per_s: float  # tokens generated per second of wall time with any engine decoding
    trainer_idle: float
    engine_idle: float
    staleness_hist: dict[int, int]
    groups_admitted: int
    groups_trained: int
    filtered_stale: int
    filtered_other: int
    groups_in_flight: int  # admitted, not trained, not filtered at the end (carried over)
    first_batch_s: float  # when the trainer started its first step
    trace: list[tuple[float, str]] = field(default_factory=list)

    @property
    def staleness_mean(self) -> float:
        n = sum(self.staleness_hist.values())
        return sum(k * v for k, v in self.staleness_hist.items()) / n if n else 0.0

    @property
    def staleness_max(self) -> int:
        return max(self.staleness_hist, default=0)


def validate(work: Workload, setup: Setup) -> None:
    """Raise ValueError with one clear line on an impossible setting."""
    checks = [
        (setup.mode in MODES, f"mode must be one of {', '.join(MODES)}, got '{setup.mode}'"),
        (
            setup.weight_update in WEIGHT_UPDATES,
            f"weight_update must be inflight|interrupt, got '{setup.weight_update}'",
        ),
        (setup.eta >= 0, f"eta must be >= 0, got {setup.eta}"),
        (setup.overprovision >= 1.0, f"overprovision must be >= 1, got {setup.overprovision}"),
        (setup.engines >= 1 and setup.ranks >= 1, "engines and ranks must be >= 1"),
        (setup.steps >= 1, f"steps must be >= 1, got {setup.steps}"),
        (setup.chunk >= 1, f"chunk must be >= 1, got {setup.chunk}"),
        (setup.shared_cores >= 0, "shared_cores must be >= 0"),
        (min(setup.engine_threads, setup.trainer_threads) >= 1, "engine/trainer threads must be >= 1"),
        (work.batch_groups >= 1 and work.group_size >= 1, "batch_groups and group_size must be >= 1"),
        (work.max_batch >= 1, f"max_batch must be >= 1, got {work.max_batch}"),
        (0.0 <= work.filter_rate < 1.0, f"filter_rate must be in [0, 1), got {work.filter_rate}"),
        (
            work.cached_prefix == 0 or 0 < work.cached_prefix < work.prompt_len,
            f"cached_prefix must be 0 or below prompt_len ({work.prompt_len}): every prompt forwards at "
            f"least one token of its own, got {work.cached_prefix}",
        ),
        (
            0.0 < work.row_share <= 1.0,
            f"row_share must be in (0, 1] (cache rows per running sequence), got {work.row_share}",
        ),
    ]
    for ok, msg in checks:
        if not ok:
            raise ValueError(msg)
