"""Run the model over a grid of modes / engines / ranks / eta and print a table (or JSON).

Speed-up is samples/s over the synchronous baseline of the same hardware. With `colocated_sync`
(default) the rounds modes (sync, partial) get every resource in each phase, as colocated systems
do: on shared cores each phase runs with all the cores; on devices every one of the E + R devices
generates, then every one trains (E + R engines, E + R ranks). Otherwise they use the split as given.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, replace
from typing import Any

from streamrl.sim.lengths import LogNormal
from streamrl.sim.model import simulate
from streamrl.sim.params import Costs, Setup, SimResult, Workload


@dataclass(frozen=True)
class Row:
    mode: str
    engines: int
    ranks: int
    eta: int | None
    result: SimResult
    speedup: float


def resources(setup: Setup, colocated_sync: bool = True) -> Setup:
    """The setup a mode actually runs with (see the module docstring)."""
    if setup.mode == "async" or not colocated_sync:
        return setup
    if setup.shared_cores:
        c = setup.shared_cores
        return replace(setup, engines=1, engine_threads=c, trainer_threads=c)
    n = setup.engines + setup.ranks
    return replace(setup, engines=n, ranks=n)


def grid(
    costs: Costs,
    work: Workload,
    base: Setup,
    modes: list[str],
    etas: list[int],
    engines: list[int],
    ranks: list[int],
    colocated_sync: bool = True,
) -> list[Row]:
    rows: list[Row] = []
    for e in engines:
        for r in ranks:
            hw = replace(base, engines=e, ranks=r)
            sync = simulate(costs, work, resources(replace(hw, mode="sync"), colocated_sync))
            for mode in modes:
                for eta in etas if mode == "async" else [None]:
                    s = replace(hw, mode=mode, eta=eta if eta is not None else base.eta)
                    res = sync if mode == "sync" else simulate(costs, work, resources(s, colocated_sync))
                    rows.append(Row(mode, e, r, eta, res, res.samples_per_s / max(sync.samples_per_s, 1e-12)))
    return rows


def table(rows: list[Row]) -> str:
    head = (
        f"{'mode':<8} {'engines':>7} {'ranks':>5} {'eta':>3} {'samples/s':>10} {'speedup':>7} "
        f"{'train tok/s':>11} {'gen tok/s':>10} {'trainer idle':>12} {'engine idle':>11} "
        f"{'stale mean':>10} {'stale max':>9}"
    )
    out = [head]
    for w in rows:
        r = w.result
        out.append(
            f"{w.mode:<8} {w.engines:>7} {w.ranks:>5} {'-' if w.eta is None else w.eta:>3} "
            f"{r.samples_per_s:>10.4g} {w.speedup:>6.2f}x {r.trained_tokens_per_s:>11.4g} "
            f"{r.gen_tokens_per_s:>10.4g} {r.trainer_idle:>12.1%} {r.engine_idle:>11.1%} "
            f"{r.staleness_mean:>10.2f} {r.staleness_max:>9d}"
        )
    return "\n".join(out)


def to_json(rows: list[Row], extra: dict[str, Any] | None = None) -> str:
    items = []
    for w in rows:
        d = asdict(w.result)
        d.pop("trace")
        d.update(
            mode=w.mode,
            engines=w.engines,
            ranks=w.ranks,
            eta=w.eta,
            speedup=w.speedup,
            staleness_mean=w.result.staleness_mean,
            staleness_max=w.result.staleness_max,
        )
        items.append(d)
    return json.dumps({**(extra or {}), "rows": items}, indent=2)


# ---- the papers' settings ---------------------------------------------------------------------
# Illustrative GPU-like costs (a 7B-class model on one accelerator per engine / rank), not measured:
# decode step 20 ms + 0.2 ms per running sequence, prefill 20 us per token, training 0.25 ms per
# token per rank, a 2 s allreduce term, 3 s to publish weights. Lengths in `chunk`-token steps.
GPU_COSTS = Costs(
    decode_step_s=0.02,
    decode_token_s=2e-4,
    prefill_token_s=2e-5,
    train_token_s=2.5e-4,
    train_step_s=1.0,
    allreduce_s=2.0,
    weight_sync_s=3.0,
)


def scenario(name: str) -> tuple[str, Costs, Workload, Setup, dict[str, list[Any]]]:
    """(description, costs, workload, base setup, grid) of a named scenario: areal | april."""
    long_tail = LogNormal(median=1500, sigma=1.0, max_len=16384)
    if name == "areal":
        work = Workload(long_tail, batch_groups=32, group_size=16, prompt_len=300, max_batch=128)
        base = Setup(steps=12, chunk=32, eta=4, weight_update="interrupt")
        desc = (
            "AReaL-like: 16 devices; async splits them 12 engines + 4 trainer ranks, sync (colocated) "
            "uses all 16 to generate then all 16 to train; 32 prompts x 16 samples per step; "
            "lengths log-normal (median 1500, sigma 1, cap 16384, mean "
            f"{long_tail.mean():.0f}); illustrative GPU costs"
        )
        return (
            desc,
            GPU_COSTS,
            work,
            base,
            {"modes": ["sync", "async", "partial"], "etas": [1, 2, 4, 8], "engines": [12], "ranks": [4]},
        )
    if name == "april":
        work = Workload(long_tail, batch_groups=32, group_size=8, prompt_len=300, max_batch=128)
        base = Setup(steps=12, chunk=32, overprovision=2.0, weight_update="interrupt")
        desc = (
            "APRIL-like: 8 devices, 4 engines + 4 trainer ranks, generating then training in rounds "
            "(a synchronous framework); partial over-provisions 2x the batch, trains the first 32 groups "
            "to finish and carries the rest; "
            f"lengths log-normal (median 1500, sigma 1, cap 16384, mean {long_tail.mean():.0f})"
        )
        return (
            desc,
            GPU_COSTS,
            work,
            base,
            {"modes": ["sync", "partial"], "etas": [1], "engines": [4], "ranks": [4]},
        )
    raise ValueError(f"unknown scenario '{name}': choose areal or april")
