"""Fit the simulator's costs and workload from a run directory (config.yaml + metrics.jsonl).

Costs are expressed per unit of compute: on CPU one core, with k threads running k ** alpha times
faster: alpha = thread_scaling for training, decode_alpha = decode_thread_scaling for generation (both 1
by default; benchmarks/thread_scaling.py measures them: decoding is memory-bound and scales less, so a
decode cost fitted at 2 threads and used at 1 needs its own exponent).

- train_token_s = sum(train_time) * k_train ** alpha / sum(tokens_trained)   (prompt + response tokens)
- k ** alpha is a phase's speed-up over one thread. With elastic cores (lend) a phase computes part of
  its time on threads another phase lent it, so the fit averages: a fraction f of its time on base + lent
  threads, the rest on its base, speed-up (1 - f) base ** alpha + f (base + lent) ** alpha, with f from
  the thread-seconds the run logged (cores_*_thread_s / cores_*_held_s), or for runs from before those
  metrics estimated as the trainer's share of the engine's idle time and the engine's share of the
  trainer's wait. Fitting on base alone would count the speed of borrowed threads twice: once in the
  fitted cost, again when the simulator lends.
- weight_sync_s = mean(weight_sync_time) (async runs; 0 for colocated, where the engine shares the module)
- decode (with decode_alpha in place of alpha): colocated rows log generate_time per step. A row
  generated n = (B + dropped) groups in r = 1 + ceil(dropped / B) rounds; each round takes S decode
  steps (max_new_tokens if any sample was truncated, else 3 x the mean length), so with
  prefill_token_s = decode_token_s (assumed: on CPU a prompt token costs about what one row of a
  decode step costs)

      generate_time * k ** alpha = a * r * S + c * (generated tokens + prompt tokens)

  (prompt tokens: G per group, or 1 with shared_prefill, as streamrl's engine computes them: it
  prefills a group's G identical prompts once; with G the fitted c absorbs the prefill cost; with the
  engine's prefix cache on, each counts prompt - P tokens and the prefix's P tokens once per step)
  solved for (a, c) >= 0 by least squares over the rows. Async rows log no generate time: the engine's
  busy time (1 - engine_idle_share) * elapsed covers every token it generated, so a = 0 and
  c = busy * k ** alpha / (generated + prompt tokens), generated tokens scaled up by the groups it
  also generated but did not train (zero-variance filtered, carried over).
- startup_s (async): the measured first trainer wait minus the simulated one with startup 0
  (process spawn and model load of the rollout worker).
- filter_rate: zero-variance groups filtered / (filtered + trained).
- cached_prefix P: the leading tokens every training prompt shared (prompt_shared_tokens, logged per
  step) when the run's default engine kept them in its prefix cache (rollout.prefix_cache) and they
  reach MIN_PREFIX; 0 for runs logged before that metric.
- row_share: the KV-cache rows per sequence the run's decode steps forwarded (engine_row_share: samples
  with identical tokens so far share a row); generated tokens enter both decode fits weighted by it,
  so c is the cost of one cache row, and the simulator charges c x row_share per running sequence.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from streamrl.config_parse import read_yaml
from streamrl.engine.base import MIN_PREFIX
from streamrl.observe.run_data import read_metrics
from streamrl.sim.lengths import StepStats
from streamrl.sim.model import simulate
from streamrl.sim.params import Costs, Setup, Workload

PREFILL = 1.0  # prefill_token_s / decode_token_s (assumed; see the module docstring)


@dataclass
class Run:
    path: Path
    config: dict[str, Any]
    rows: list[dict[str, Any]]
    cores: int

    @property
    def colocated(self) -> bool:
        return self.config.get("runtime", {}).get("mode") == "colocated"

    @property
    def B(self) -> int:
        return int(self.config["rollout"]["prompts_per_step"])

    @property
    def G(self) -> int:
        return int(self.config["rollout"]["samples_per_prompt"])

    @property
    def lends(self) -> bool:
        """Elastic cores with the lend policy (alternate is not modelled, runs from before the key ran
        on a fixed split)."""
        rt = self.config.get("runtime", {})
        return not self.colocated and rt.get("elastic_cores", "fixed") in ("lend", True)

    @property
    def workers(self) -> int:
        """Rollout workers (1 for colocated: the one engine)."""
        return 1 if self.colocated else int(self.config.get("runtime", {}).get("rollout_workers", 1))

    @property
    def elapsed(self) -> float:
        """The loop's seconds, from its final samples/s."""
        return self.B * self.G * len(self.rows) / self.rows[-1]["samples_per_s"]

    def threads(self) -> tuple[int, int]:
        """(trainer threads, engine threads per worker), as loop/job.py splits the cores."""
        rt, tr = self.config.get("runtime", {}), self.config.get("train", {})
        if self.colocated:
            return int(tr.get("threads") or self.cores), int(tr.get("threads") or self.cores)
        rollout = self.workers * int(rt.get("rollout_threads", 1))
        return int(tr.get("threads") or max(1, self.cores - rollout)), int(rt.get("rollout_threads", 1))


NEEDED = ("tokens_generated", "tokens_trained", "train_time", "response_length", "samples_per_s")


def load_run(path: str | Path, cores: int | None = None) -> Run:
    p = Path(path)
    cfg_path, met_path = p / "config.yaml", p / "metrics.jsonl"
    for f in (cfg_path, met_path):
        if not f.is_file():
            raise FileNotFoundError(f"{f} not found: a run directory needs config.yaml and metrics.jsonl")
    config = read_yaml(cfg_path, "run config") or {}
    rows = read_metrics(met_path)  # a torn last line (a run killed mid-write) is skipped
    if not rows:
        raise ValueError(f"{met_path} has no steps to fit")
    for r in rows:  # read_metrics drops null values: a NaN or infinite one is missing too
        if missing := [k for k in NEEDED if k not in r]:
            raise ValueError(
                f"{met_path}: step {r.get('step', '?')} has no {', '.join(missing)} (not logged, or NaN or "
                "infinite): the fit needs it at every step; fit a copy of the run whose metrics.jsonl stops "
                "before that step"
            )
    return Run(p, config, rows, cores or os.cpu_count() or 1)


def _filtered(run: Run) -> int:
    if run.colocated:
        return sum(int(r.get("groups_dropped_zero_variance", 0)) for r in run.rows)
    return int(run.rows[-1].get("filtered_zero_variance", 0))


def _prompt_len(run: Run) -> float:
    per = [(r["tokens_trained"] - r["tokens_generated"]) / (run.B * run.G) for r in run.rows]
    return max(1.0, sum(per) / len(per))


def cached_prefix(run: Run) -> int:
    """The prompt prefix the run's engine prefilled once per policy version (see the module docstring)."""
    shared = int(run.rows[-1].get("prompt_shared_tokens", 0))
    on = run.config["rollout"].get("prefix_cache", False) and run.config.get("engine", "hf") == "hf"
    if not on or shared < MIN_PREFIX:
        return 0
    return min(shared, round(_prompt_len(run)) - 1)


def row_share(run: Run) -> float:
    """KV-cache rows per sequence in the run's decode steps (engine_row_share, logged per step; 1.0 for
    runs logged before it or by an engine that does not share rows)."""
    return min(1.0, max(1e-3, float(run.rows[-1].get("engine_row_share", 1.0))))


def borrowed_shares(run: Run) -> tuple[float, float]:
    """(trainer, engine): the fraction of its computing time each phase ran on borrowed threads as well
    as its own (0, 0 without lending; see the module docstring)."""
    if not run.lends:
        return 0.0, 0.0
    tt, et = run.threads()
    last = run.rows[-1]
    if last.get("cores_trainer_held_s") and last.get("cores_worker_held_s"):
        mt = last["cores_trainer_thread_s"] / last["cores_trainer_held_s"]
        me = last["cores_worker_thread_s"] / last["cores_worker_held_s"]
        f_t, f_e = (mt - tt) / (et * run.workers), (me - et) / tt
    else:
        train_s = sum(r["train_time"] for r in run.rows)
        wait_s = sum(r.get("trainer_wait_time", 0.0) for r in run.rows)
        f_t = last.get("engine_idle_share", 0.0) * run.elapsed / train_s if train_s else 0.0
        busy = engine_busy(run)
        f_e = wait_s / busy if busy else 0.0
    return min(1.0, max(0.0, f_t)), min(1.0, max(0.0, f_e))


def speedups(run: Run, alpha: float = 1.0, decode_alpha: float | None = None) -> tuple[float, float]:
    """(trainer, engine): each phase's speed over one thread, averaged over the threads it ran on."""
    tt, et = run.threads()
    d_alpha = alpha if decode_alpha is None else decode_alpha
    f_t, f_e = borrowed_shares(run)
    top_t, top_e = tt + et * run.workers, et + tt
    return (
        (1 - f_t) * tt**alpha + f_t * top_t**alpha,
        (1 - f_e) * et**d_alpha + f_e * top_e**d_alpha,
    )


def fit_decode(
    run: Run, alpha: float = 1.0, shared_prefill: bool = False, speedup: float | None = None
) -> tuple[float, float, str]:
    """(decode_step_s, decode_token_s, how) in one-thread seconds; see the module docstring.
    speedup: the engine's speed over one thread in this run (default et ** alpha)."""
    tt, et = run.threads()
    k = et**alpha if speedup is None else speedup
    prompt, max_new = _prompt_len(run), int(run.config["rollout"]["max_new_tokens"])
    prefix = cached_prefix(run)
    own = (prompt - prefix) * _per_group(run, shared_prefill)  # prompt tokens a group forwards
    share = row_share(run)  # decoded tokens cost per cache row: shared rows count once
    if run.colocated and all("generate_time" in r for r in run.rows):
        xs: list[tuple[float, float, float]] = []
        for r in run.rows:
            dropped = int(r.get("groups_dropped_zero_variance", 0))
            n_groups = run.B + dropped
            rounds = 1 + math.ceil(dropped / run.B)
            s_len = max_new if r.get("truncation_rate", 0) > 0 else min(max_new, 3 * r["response_length"])
            tokens = share * r["tokens_generated"] * n_groups / run.B + PREFILL * (own * n_groups + prefix)
            xs.append((rounds * s_len, tokens, r["generate_time"] * k))
        a, c = _nonneg_lstsq(xs)
        return a, c, f"least squares over {len(xs)} colocated steps' generate_time"
    busy = engine_busy(run)
    trained = run.B * len(run.rows)
    carried = int(run.rows[-1].get("groups_carried_over", 0))
    scale = (trained + _filtered(run) + carried) / trained
    tokens = (share * sum(r["tokens_generated"] for r in run.rows) + PREFILL * own * trained) * scale
    tokens += PREFILL * prefix * len(run.rows)
    return 0.0, busy * k / tokens, "engine busy time / tokens (a = 0 assumed)"


def engine_busy(run: Run) -> float:
    """Measured wall seconds the engines spent generating: colocated, the sum of generate_time; async,
    (1 - engine idle share) x the loop's elapsed time."""
    if run.colocated and all("generate_time" in r for r in run.rows):
        return float(sum(r["generate_time"] for r in run.rows))
    return (1.0 - run.rows[-1].get("engine_idle_share", 0.0)) * run.elapsed


def _per_group(run: Run, shared_prefill: bool) -> int:
    """Prompts prefilled per group: 1 when its samples share one prefill, else G."""
    return 1 if shared_prefill else run.G


def _nonneg_lstsq(xs: list[tuple[float, float, float]]) -> tuple[float, float]:
    """min sum (a x + c y - z)^2 over a, c >= 0 (2 x 2 normal equations, then the boundaries)."""
    sxx = sum(x * x for x, _, _ in xs)
    syy = sum(y * y for _, y, _ in xs)
    sxy = sum(x * y for x, y, _ in xs)
    sxz = sum(x * z for x, _, z in xs)
    syz = sum(y * z for _, y, z in xs)
    det = sxx * syy - sxy * sxy
    if det > 1e-12 * sxx * syy:
        a, c = (sxz * syy - syz * sxy) / det, (syz * sxx - sxz * sxy) / det
        if a >= 0 and c >= 0:
            return a, c
    return 0.0, max(0.0, syz / syy) if syy else 0.0


def workload(run: Run, shared_prefill: bool = False) -> Workload:
    ro = run.config["rollout"]
    lengths = StepStats(
        tuple(float(r["response_length"]) for r in run.rows),
        tuple(float(r.get("truncation_rate", 0.0)) for r in run.rows),
        int(ro["max_new_tokens"]),
        # the spread, where logged (runs before response_length_std: an assumed exponential shape)
        tuple(float(r["response_length_std"]) for r in run.rows)
        if all("response_length_std" in r for r in run.rows)
        else None,
    )
    trained = run.B * len(run.rows)
    filtered = _filtered(run)
    return Workload(
        lengths,
        batch_groups=run.B,
        group_size=run.G,
        prompt_len=round(_prompt_len(run)),
        max_batch=int(ro.get("max_batch", 128)),
        filter_rate=min(0.95, filtered / (filtered + trained)),
        shared_prefill=shared_prefill,
        cached_prefix=cached_prefix(run),
        row_share=row_share(run),
    )


def setup(run: Run, alpha: float = 1.0, decode_alpha: float | None = None) -> Setup:
    tt, et = run.threads()
    rt = run.config.get("runtime", {})
    return Setup(
        mode="sync" if run.colocated else "async",
        eta=int(run.config.get("max_staleness", 0)),
        weight_update=str(rt.get("weight_update", "inflight")),
        engines=run.workers,
        steps=len(run.rows),
        shared_cores=run.cores,
        engine_threads=et,
        trainer_threads=tt,
        thread_scaling=alpha,
        decode_thread_scaling=decode_alpha,
        elastic=run.lends,
    )


@dataclass(frozen=True)
class EngineCosts:
    """Decode costs measured apart from any run (benchmarks/thread_scaling.py), in one-thread seconds:
    a decode step's fixed cost, its cost per running row, a prefill's cost per distinct prompt token."""

    decode_step_s: float
    decode_token_s: float
    prefill_token_s: float


def fit_costs(
    run: Run,
    alpha: float = 1.0,
    decode_from: Run | None = None,
    decode_alpha: float | None = None,
    shared_prefill: bool = False,
    engine: EngineCosts | None = None,
    scale_engine: bool = False,
) -> tuple[Costs, list[str]]:
    """Costs of `run`: decode costs fitted on the run, on `decode_from` (a cross-fit) or taken from
    measured `engine` costs (prefill then counted once per group). Returns notes too.
    alpha: the trainer's thread-scaling exponent; decode_alpha: the engines' (None: alpha).
    scale_engine (with `engine`): keep the measured costs' proportions (per step, per row, prefill) but
    scale them so the simulated engines are busy as long as the run's were: an idle-machine benchmark
    misses what a loaded one adds (memory-bandwidth contention with the trainer, worker overhead)."""
    if engine is not None:
        a, c, p = engine.decode_step_s, engine.decode_token_s, engine.prefill_token_s
        shared_prefill = True
        notes = ["decode: measured engine costs"]
    else:
        d_alpha = alpha if decode_alpha is None else decode_alpha
        src = decode_from or run
        a, c, how = fit_decode(src, d_alpha, shared_prefill, speedups(src, alpha, decode_alpha)[1])
        p = PREFILL * c
        notes = [f"decode: {how}" + (f" of {decode_from.path}" if decode_from else "")]
    k_train = speedups(run, alpha, decode_alpha)[0]
    train = sum(r["train_time"] for r in run.rows) * k_train / sum(r["tokens_trained"] for r in run.rows)
    syncs = [r["weight_sync_time"] for r in run.rows if "weight_sync_time" in r]
    costs = Costs(
        decode_step_s=a,
        decode_token_s=c,
        prefill_token_s=p,
        train_token_s=train,
        weight_sync_s=sum(syncs) / len(syncs) if syncs else 0.0,
    )
    if engine is not None and scale_engine:
        costs, factor = _scale_to_busy(
            costs, run, workload(run, shared_prefill), setup(run, alpha, decode_alpha)
        )
        notes[0] += f" x {factor:.2f} (scaled to the run's engine busy time)"
    if not run.colocated and "trainer_wait_time" in run.rows[0]:
        sim = simulate(
            costs, workload(run, shared_prefill), replace(setup(run, alpha, decode_alpha), steps=1)
        )
        first = sim.first_batch_s
        costs = replace(costs, startup_s=max(0.0, run.rows[0]["trainer_wait_time"] - first))
        notes.append(f"startup_s = measured first wait - simulated {first:.1f} s")
    return costs, notes


def _scale_to_busy(costs: Costs, run: Run, work: Workload, st: Setup, rounds: int = 4) -> tuple[Costs, float]:
    """Scale the decode costs until the simulated engine busy time matches the measured one (the
    schedule moves with the costs, so a few fixed-point rounds) -> (costs, total factor)."""
    target, total = engine_busy(run), 1.0
    for _ in range(rounds):
        r = simulate(costs, work, st)
        busy = (1.0 - r.engine_idle) * r.time * st.engines
        if busy <= 0:
            break
        f = target / busy
        total *= f
        costs = replace(
            costs,
            decode_step_s=costs.decode_step_s * f,
            decode_token_s=costs.decode_token_s * f,
            prefill_token_s=costs.prefill_token_s * f,
        )
    return costs, total


def measured(run: Run) -> dict[str, float]:
    last = run.rows[-1]
    return {
        "samples_per_s": float(last["samples_per_s"]),
        "trainer_idle": float(last.get("trainer_wait_share", 0.0)),
        "engine_idle": float(last.get("engine_idle_share", 0.0)),
        "staleness_mean": sum(r.get("staleness_mean", 0.0) for r in run.rows) / len(run.rows),
        "staleness_max": max(int(r.get("staleness_max", 0)) for r in run.rows),
    }
