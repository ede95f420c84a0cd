"""`streamrl simulate RUN_DIR | params.yaml | scenario=areal|april [key=value ...] [--json]`

RUN_DIR: costs and lengths fitted from its config.yaml + metrics.jsonl (see sim/fit.py), the run's
own mode first (colocated: sync; async: at its max_staleness, added to the etas).
params.yaml / key=value: any field of Costs (decode_step_s, decode_token_s,
prefill_token_s, train_token_s, train_step_s, allreduce_s, weight_sync_s, startup_s), Workload
(batch_groups, group_size, prompt_len, max_batch, filter_rate, shared_prefill, cached_prefix,
row_share, lengths=fixed:N|list:..|lognormal:..)
and Setup (steps, weight_update, overprovision, shared_cores, engine_threads, trainer_threads,
thread_scaling, decode_thread_scaling, contention, elastic, chunk, seed), plus the grid:
modes=sync,async,partial etas=0,1,2 engines=1,2 ranks=1 and colocated_sync=true|false.
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

from streamrl.config_parse import parse_override, read_yaml
from streamrl.sim import fit
from streamrl.sim.lengths import Fixed, parse_lengths
from streamrl.sim.params import Costs, Setup, Workload
from streamrl.sim.report import grid, scenario, table, to_json

GRID_KEYS = ("modes", "etas", "engines", "ranks")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("simulate", help="predict async / sync / partial-rollout throughput (a model)")
    p.add_argument("args", nargs="*", help="RUN_DIR | params.yaml | scenario=areal|april, then key=value")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")


def _list(value: Any, cast: type) -> list[Any]:
    items = value if isinstance(value, list) else str(value).split(",")
    return [cast(x) for x in items]


def _apply(obj: Any, params: dict[str, Any]) -> Any:
    """Replace the dataclass fields named in params (cast to the field's type); pop what was used."""
    changes: dict[str, Any] = {}
    for f in dataclasses.fields(obj):
        if f.name in params:
            raw = params.pop(f.name)
            cur = getattr(obj, f.name)
            if cur is None:  # the only optional fields are floats (decode_thread_scaling)
                changes[f.name] = float(raw)
            elif isinstance(cur, bool):
                changes[f.name] = str(raw).lower() in ("1", "true", "yes")
            else:
                changes[f.name] = str(raw) if isinstance(cur, str) else type(cur)(raw)
    return dataclasses.replace(obj, **changes)


def build(args: list[str]) -> tuple[str, Costs, Workload, Setup, dict[str, list[Any]], bool, list[str]]:
    """Parse the command line into (title, costs, workload, setup, grid, colocated_sync, notes)."""
    params: dict[str, Any] = {}
    source = None
    for i, item in enumerate(args):
        if i == 0 and "=" not in item:
            source = item
            continue
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ValueError(f"expected key=value, got '{item}'")
        params[key] = parse_override(item)[1]
    notes: list[str] = []
    g: dict[str, list[Any]] = {
        "modes": ["sync", "async", "partial"],
        "etas": [0, 1, 2, 4],
        "engines": [1],
        "ranks": [1],
    }
    if "scenario" in params:
        title, costs, work, setup, g = scenario(str(params.pop("scenario")))
    elif source and Path(source).is_dir():
        run = fit.load_run(source, int(params.pop("cores", 0)) or None)
        alpha = float(params.get("thread_scaling", 1.0))
        raw = params.get("decode_thread_scaling")
        decode_alpha = float(raw) if raw is not None else None
        shared = str(params.get("shared_prefill", False)).lower() in ("true", "1", "yes")
        costs, notes = fit.fit_costs(run, alpha, decode_alpha=decode_alpha, shared_prefill=shared)
        work, setup = fit.workload(run, shared), fit.setup(run, alpha, decode_alpha)
        g.update(engines=[setup.engines], ranks=[setup.ranks])
        # the run's own mode first (colocated: sync; async: at its max_staleness), then the others
        g["modes"] = [setup.mode, *(m for m in g["modes"] if m != setup.mode)]
        if setup.mode == "async":
            g["etas"] = [setup.eta, *(e for e in g["etas"] if e != setup.eta)]
        title = (
            f"fitted from {source} ({len(run.rows)} steps, measured {run.rows[-1]['samples_per_s']:.3f}"
            " samples/s)"
        )
    elif source:
        if not Path(source).is_file():
            raise FileNotFoundError(f"{source}: not a run directory or a params YAML file")
        loaded = read_yaml(source, "parameters file") or {}
        if not isinstance(loaded, dict):
            raise ValueError(f"{source}: expected a mapping of key: value")
        params = {**loaded, **params}
        title, costs, work, setup = f"parameters from {source}", Costs(), Workload(Fixed(32)), Setup()
    else:
        title, costs, work, setup = "parameters from the command line", Costs(), Workload(Fixed(32)), Setup()
    if "lengths" in params:
        work = dataclasses.replace(work, lengths=parse_lengths(str(params.pop("lengths"))))
    for key, cast in zip(GRID_KEYS, (str, int, int, int)):
        if key in params:
            g[key] = _list(params.pop(key), cast)
    colocated = str(params.pop("colocated_sync", True)).lower() in ("true", "1", "yes")
    costs, work, setup = _apply(costs, params), _apply(work, params), _apply(setup, params)
    if params:
        raise ValueError(f"unknown simulate key(s): {', '.join(sorted(params))}")
    return title, costs, work, setup, g, colocated, notes


def run_simulate(ns: argparse.Namespace) -> int:
    title, costs, work, setup, g, colocated, notes = build(ns.args)
    rows = grid(costs, work, setup, g["modes"], g["etas"], g["engines"], g["ranks"], colocated)
    if ns.json:
        print(to_json(rows, {"title": title, "costs": dataclasses.asdict(costs), "notes": notes}))
        return 0
    print(title)
    print("costs: " + ", ".join(f"{k}={v:.4g}" for k, v in dataclasses.asdict(costs).items()))
    for n in notes:
        print(f"note: {n}")
    print(table(rows))
    return 0
