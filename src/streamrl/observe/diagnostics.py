"""Training diagnostics: named rules with thresholds, pure functions over the metrics stream.

A rule looks at the records so far (oldest first) and returns a one-line message when it fires at the
latest record, else None. `diagnose` replays a whole stream (for the report); `DiagnosticsMonitor`
follows a live run and reports each rule once, at the step where it starts firing (for the console).
The monitor keeps its records in a `History` (observe/history.py), whose series grow with each record,
so a step costs the same at step 10 and at step 10000 (a rule given a plain list recomputes them).
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from streamrl.observe.history import History, Record, median_before_last
from streamrl.observe.history import number as _num
from streamrl.observe.history import series as _series
from streamrl.observe.metrics import NON_FINITE_KEY, nan_or_inf_keys
from streamrl.types import BUDGET_REASON


@dataclass(frozen=True)
class Rule:
    """A named check. `check(history, threshold)` -> message or None; `threshold` is documented per rule."""

    name: str
    description: str
    threshold: float
    check: Callable[[Sequence[Record], float], str | None]

    def __call__(self, history: Sequence[Record]) -> str | None:
        return self.check(history, self.threshold) if history else None


def non_finite_keys(record: Record) -> list[str]:
    """The record's metrics that are NaN or infinite, sorted: numbers in memory, or named under
    NON_FINITE_KEY once metrics.jsonl wrote them as null (observe/metrics.py)."""
    found = set(nan_or_inf_keys(record))
    named = record.get(NON_FINITE_KEY)
    if isinstance(named, list):
        found.update(str(k) for k in named)
    return sorted(found)


def _non_finite(history: Sequence[Record], limit: float) -> str | None:
    bad = non_finite_keys(history[-1])
    if len(bad) <= limit:
        return None
    shown = ", ".join(bad[:8]) + (f" and {len(bad) - 8} more" if len(bad) > 8 else "")
    return (
        f"{len(bad)} metric(s) are NaN or infinite ({shown}): the run diverged; start a new run from a "
        "model saved before it (model=RUN/checkpoints/step-N or RUN/state/step-N/model) with a lower "
        "train.lr, or look for a reward or loss term that overflows"
    )


def _reward_rose(history: Sequence[Record], k: int = 3) -> bool:
    """The mean reward of the last k steps is above that of the first k (by 0.05, or 5% of its size)."""
    rewards = _series(history, "reward_mean")
    if len(rewards) < 2:
        return False
    first, last = statistics.fmean(rewards[:k]), statistics.fmean(rewards[-k:])
    return last > first + 0.05 * max(1.0, abs(first))


def _entropy_collapse(history: Sequence[Record], frac: float) -> str | None:
    # A policy that learns a short answer becomes nearly deterministic: low entropy with a rising reward
    # is convergence. Collapse is the entropy falling while the reward does not rise.
    ent = _series(history, "entropy")
    if len(ent) < 2 or _num(history[-1], "entropy") is None or ent[0] <= 0:
        return None
    if ent[-1] < frac * ent[0] and not _reward_rose(history):
        return (
            f"entropy {ent[-1]:.3g} fell below {frac:g} x its first value {ent[0]:.3g} while the reward did "
            "not rise: policy collapsing (raise the temperature, lower the lr, or add loss.entropy_coef)"
        )
    return None


def _entropy_explosion(history: Sequence[Record], factor: float) -> str | None:
    ent = _series(history, "entropy")
    if len(ent) < 2 or _num(history[-1], "entropy") is None or ent[0] <= 0:
        return None
    if ent[-1] > factor * ent[0]:
        return f"entropy {ent[-1]:.3g} rose above {factor:g} x its first value {ent[0]:.3g}: policy diverging"
    return None


def _reward_stuck(history: Sequence[Record], steps: float) -> str | None:
    n = int(steps)
    recent = history[-n:]
    if len(recent) < n:
        return None
    if all((_num(r, "zero_adv_group_frac") or 0.0) >= 1.0 for r in recent):
        reward = _num(recent[-1], "reward_mean")
        said = f", reward {reward:.3g}" if reward is not None else ""
        return (
            f"every group had equal rewards (zero advantage) for {n} steps{said}: "
            "nothing to learn from; the task is too hard or too easy"
        )
    return None


def _ratio_explosion(history: Sequence[Record], limit: float) -> str | None:
    # Only the upper tail and the mean: a tiny per-token min ratio over thousands of tokens is ordinary
    # (one unlikely token), while a huge max or a drifting mean means the update left the trust region.
    hi, mean = _num(history[-1], "ratio_max"), _num(history[-1], "ratio_mean")
    if hi is not None and hi > limit:
        return f"importance ratio max {hi:.3g} > {limit:g}: policy and sampler disagree (staleness, lr)"
    if mean is not None and not 0.5 <= mean <= 2.0:
        return f"importance ratio mean {mean:.3g} is outside [0.5, 2]: the policy moved far in one step"
    return None


def _kl_spike(history: Sequence[Record], factor: float) -> str | None:
    floor = 0.01  # KL below this is noise, whatever the ratio to the median
    for key in ("kl_ref", "approx_kl"):
        now = _num(history[-1], key)
        if now is None or now < floor:
            continue
        med, count = median_before_last(history, key)
        if med is None or count < 3:
            continue
        if now > factor * max(med, floor / factor):
            return f"{key} {now:.3g} jumped above {factor:g} x its median so far {med:.3g}"
    return None


def _truncation(history: Sequence[Record], limit: float) -> str | None:
    rate = _num(history[-1], "truncation_rate")
    if rate is not None and rate > limit:
        return f"{rate:.0%} of responses hit max_new_tokens (> {limit:.0%}): raise the limit or shape length"
    return None


MIN_STEPS_FOR_SHARES = 3  # the first batch always waits for rollouts: judge shares only after a few steps


def _share_costing_cores(history: Sequence[Record], key: str, limit: float) -> float | None:
    """history[-1][key], a share of time one phase waited, when it is above `limit` after the first
    steps and the waiting cost cores. With elastic cores (cores_total is logged then) a waiting phase's
    threads compute for the other one, so its wait costs no core and there is nothing to act on."""
    share = _num(history[-1], key)
    lending = _num(history[-1], "cores_total") is not None
    if len(history) >= MIN_STEPS_FOR_SHARES and share is not None and share > limit and not lending:
        return share
    return None


def _trainer_starved(history: Sequence[Record], limit: float) -> str | None:
    share = _share_costing_cores(history, "trainer_wait_share", limit)
    if share is None:
        return None
    return (
        f"the trainer waited for rollouts {share:.0%} of the time (> {limit:.0%}) with its cores idle: "
        "set runtime.elastic_cores=lend, or add rollout capacity (runtime.rollout_workers, threads)"
    )


def _engine_idle(history: Sequence[Record], limit: float) -> str | None:
    share = _share_costing_cores(history, "engine_idle_share", limit)
    if share is None:
        return None
    return (
        f"rollout engines idled {share:.0%} of the time (> {limit:.0%}): the trainer or the staleness "
        "bound is the bottleneck (raise max_staleness or trainer threads)"
    )


def _top_reasons(reasons: dict[str, Any]) -> str:
    """{"KeyError": 4, "TimeoutError": 30} -> "TimeoutError x30, KeyError x4" (the three most frequent)."""
    return ", ".join(f"{k} x{v}" for k, v in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0]))[:3])


def _episode_errors(history: Sequence[Record], limit: float) -> str | None:
    last = history[-1]
    n, errors = _num(last, "episodes"), _num(last, "episode_errors")
    if not n or errors is None or errors / n <= limit:
        return None
    reasons = last.get("episode_error_reasons") or {}
    top = _top_reasons(reasons)
    return (
        f"{errors:.0f} of {n:.0f} agent episodes ({errors / n:.1%}) ended in an error (> {limit:.0%}): "
        f"{top}; each costs its episode's reward: the first message of each kind was printed, and each "
        "step's are in metrics.jsonl episode_error_examples"
    )


def _reward_errors(history: Sequence[Record], limit: float) -> str | None:
    """Scores that failed (reward 0), but those the step budget cut off (their own rule)."""
    last = history[-1]
    n, errors = _num(last, "rewards_scored"), _num(last, "reward_errors")
    if not n or errors is None:
        return None
    reasons = {k: v for k, v in (last.get("reward_error_reasons") or {}).items() if k != BUDGET_REASON}
    failed = sum(reasons.values())
    if failed / n <= limit:
        return None
    top = _top_reasons(reasons)
    return (
        f"{failed} of {n:.0f} rewards ({failed / n:.1%}) failed and count as 0 (> {limit:.0%}): {top}; the "
        "first message of each kind was printed, and each step's are in metrics.jsonl "
        "reward_error_examples: fix the reward function or scorer, or raise reward.timeout_s"
    )


def _scoring_budget(history: Sequence[Record], limit: float) -> str | None:
    n = _num(history[-1], "reward_step_budget_expired")
    if n is not None and n > limit:
        return (
            f"{n:.0f} score(s) were still outstanding when reward.step_budget_s ran out and count as "
            "reward 0: the scorer (an LLM judge, the sandbox, your reward functions) is slow or hanging"
        )
    return None


def _correction_masks(history: Sequence[Record], limit: float) -> str | None:
    share = _num(history[-1], "rc_token_masked_frac")
    if share is not None and share > limit:
        return (
            f"loss.rollout_correction masked {share:.0%} of the step's tokens (> {limit:.0%}): training sees "
            "few of them; loosen its thresholds (loss.rc_geo_tol, rc_lower, rc_upper) to the engine/trainer "
            "gap (rc_ratio_mean, rc_ratio_max) or choose another correction"
        )
    return None


RULES: tuple[Rule, ...] = (
    Rule(
        "non_finite", "number of the step's metrics that are NaN or infinite above threshold", 0, _non_finite
    ),
    Rule(
        "entropy_collapse",
        "entropy below threshold x its first value while the reward does not rise",
        0.1,
        _entropy_collapse,
    ),
    Rule("entropy_explosion", "entropy above threshold x its first value", 2.0, _entropy_explosion),
    Rule("reward_stuck", "all groups zero-advantage for threshold steps in a row", 3, _reward_stuck),
    Rule(
        "ratio_explosion",
        "importance ratio max above threshold, or ratio mean outside [0.5, 2]",
        10.0,
        _ratio_explosion,
    ),
    Rule("kl_spike", "kl_ref or approx_kl above threshold x its running median", 5.0, _kl_spike),
    Rule("truncation_high", "truncation rate above threshold", 0.5, _truncation),
    Rule(
        "trainer_starved",
        "trainer_wait_share above threshold while its cores are not lent to generation",
        0.5,
        _trainer_starved,
    ),
    Rule(
        "engine_idle",
        "engine_idle_share above threshold while the engines' cores are not lent to training",
        0.5,
        _engine_idle,
    ),
    Rule(
        "rollout_correction_masks",
        "share of tokens the rollout correction masked in a step above threshold",
        0.5,
        _correction_masks,
    ),
    Rule(
        "episode_errors",
        "share of the step's agent episodes that ended in an error above threshold",
        0.01,
        _episode_errors,
    ),
    Rule(
        "reward_errors",
        "share of the step's scores that failed (an error or reward.timeout_s) above threshold",
        0.01,
        _reward_errors,
    ),
    Rule(
        "scoring_budget",
        "scores cut off by reward.step_budget_s in a step above threshold",
        0,
        _scoring_budget,
    ),
)


@dataclass
class Finding:
    """A rule that fired somewhere in a stream: the steps it fired at and its first and last message."""

    rule: str
    description: str
    steps: list[int]
    first_message: str
    last_message: str


def diagnose(records: Sequence[Record], rules: Sequence[Rule] = RULES) -> list[Finding]:
    """Replay `records` through every rule; one Finding per rule that fired at least once."""
    monitor = DiagnosticsMonitor(rules)
    for record in records:
        monitor.update(record)
    return monitor.findings()


class DiagnosticsMonitor:
    """Live diagnostics: `update(record)` returns the warnings of rules firing for the first time, and
    `findings()` every rule that fired so far with its steps (what the report shows, kept as the run goes
    rather than replayed over the whole stream at each report). `history`: the records of a resumed
    run's earlier steps (their findings count: a rule that fired before the resume does not warn again,
    and a rule comparing with the first steps compares with the run's own)."""

    def __init__(
        self,
        rules: Sequence[Rule] = RULES,
        emit: Callable[[str], None] | None = None,
        history: Sequence[Record] = (),
    ) -> None:
        self.rules = rules
        self.emit = emit
        self.history = History()
        self.found: dict[str, Finding] = {}
        for record in history:
            self._judge(record)

    def update(self, record: Record) -> list[str]:
        out = self._judge(record)
        if self.emit is not None:
            for line in out:
                self.emit(line)
        return out

    def _judge(self, record: Record) -> list[str]:
        """Run every rule at `record`; the warning lines of rules firing for the first time."""
        self.history.append({k: v for k, v in record.items() if not k.startswith("_")})
        step = int(record.get("step", len(self.history)))
        out = []
        for rule in self.rules:
            msg = rule(self.history)
            if msg is None:
                continue
            if (f := self.found.get(rule.name)) is not None:
                f.steps.append(step)
                f.last_message = msg
                continue
            self.found[rule.name] = Finding(rule.name, rule.description, [step], msg, msg)
            out.append(f"warning [{rule.name}] step {record.get('step')}: {msg}")
        return out

    def findings(self) -> list[Finding]:
        return [self.found[r.name] for r in self.rules if r.name in self.found]
