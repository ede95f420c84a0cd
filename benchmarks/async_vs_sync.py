"""Synchronous vs asynchronous RL on the same model, task, hyper-parameters and wall-clock budget.

    python benchmarks/async_vs_sync.py [budget_s=240] [etas=0,1,2,4] [static=1] [alternate=1] [key=value ...]

Runs, one after another (never two at once on 2 cores):
  sync       colocated, eta = 0: generate then train, each with every core (the fastest synchronous setup)
  async-N    rollout worker + trainer processes, eta = N for N in etas, the default elastic cores
             (runtime.elastic_cores=lend: a waiting phase lends its cores, placement/cores.py)
  static-N   the same with runtime.elastic_cores=fixed (the split alone), for the smallest eta in etas;
             static=0 leaves it out
  alt-N      the same with runtime.elastic_cores=alternate (the phases take every core in turn), for
             the smallest eta; alternate=0 leaves it out
each trained for `budget_s` seconds of wall clock, then evaluated greedily on the same held-out set.
Every run is `run_train` in a fresh Python process, as `streamrl train` runs: none inherits the memory an
earlier run faulted in (a trainer's first step maps GBs of fresh pages) or what it imported.
Prints samples/s, trained tokens/s, the share of time the trainer waited for data and the rollout
engine idled, and held-out accuracy; the speed-up is samples/s over `sync`.

The bound: the samples/s that ideal core sharing reaches given each phase's speed at one and at two
threads, measured in this invocation: per trained sample, t2 and g2 are the sync run's training and
generation seconds (both cores each), t1 and g1 the static run's trainer seconds and rollout worker busy
seconds (one core each; generation includes the groups dynamic sampling drops). Over time fractions x
(one core each), y (both cores generate), z (both train) with x + y + z = 1, the bound maximises r with
x/g1 + y/g2 >= r and x/t1 + z/t2 >= r; colocated is the point y/g2 = z/t2 = r, a fixed split x = 1.
Each run's samples/s is printed as a share of it.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

from run_state import drop_resume_state

from streamrl.config import Config, load_config
from streamrl.loop.job import run_train


def _config(name: str, overrides: list[str], root: Path) -> Config:
    run = [f"run_dir={root / name}", "eval.before=false", "checkpoint.save=false"]
    return load_config(None, [*overrides, *run])


def _train(name: str, root: Path, overrides: list[str]) -> None:
    """The body of one run's process: train, then write its summary beside its run dir."""
    summary = run_train(_config(name, overrides, root))
    (root / f"{name}.summary.json").write_text(json.dumps(summary, default=str))


def _one(name: str, overrides: list[str], root: Path) -> dict:
    run_dir = root / name
    cfg = _config(name, overrides, root)
    subprocess.run([sys.executable, __file__, "--one", name, str(root), *overrides], check=True)
    summary = json.loads((root / f"{name}.summary.json").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    drop_resume_state(run_dir)
    last = rows[-1] if rows else {}
    trained_tokens = sum(r["tokens_trained"] for r in rows)
    samples = len(rows) * cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    return {
        "name": name,
        "steps": len(rows),
        "samples_per_s": last.get("samples_per_s", 0.0),
        "train_tokens_per_s": trained_tokens / max(summary["timings"]["train"], 1e-9),
        "trainer_wait": sum(r.get("trainer_wait_time", 0.0) for r in rows)
        / max(summary["timings"]["train"], 1e-9),
        "engine_idle": last.get("engine_idle_share", 0.0),
        "staleness_max": max((r["staleness_max"] for r in rows), default=0),
        "accuracy": (summary["eval"].get("final") or {}).get("accuracy", float("nan")),
        "n": (summary["eval"].get("final") or {}).get("n", 0),
        # seconds per trained sample of each phase (for the bound)
        "train_s": sum(r["train_time"] for r in rows) / max(samples, 1),
        "gen_s": (
            sum(r.get("generate_time", 0.0) for r in rows)
            if "generate_time" in last
            else last.get("engine_busy_time", 0.0)
        )
        / max(samples, 1),
        "cores_peak_held": last.get("cores_peak_held"),
        "cores_borrows": last.get("cores_borrows"),
    }


def bound(g1: float, g2: float, t1: float, t2: float) -> float:
    """Samples/s of ideal sharing of two cores (see the module docstring): the bottleneck phase gets
    both cores for the share of time the other can spare."""
    best = max(1 / (g2 + t2), min(1 / g1, 1 / t1))  # colocated; the fixed split
    for slow, slow2, fast in ((g1, g2, t1), (t1, t2, g1)):  # double the slower phase part of the time
        # x/fast = x/slow + (1 - x)/slow2  ->  x = (1/slow2) / (1/fast - 1/slow + 1/slow2)
        x = min(1.0, (1 / slow2) / (1 / fast - 1 / slow + 1 / slow2))
        best = max(best, min(x / fast, x / slow + (1 - x) / slow2))
    return best


def main(argv: list[str]) -> None:
    budget, etas, static, alternate, rest = 240.0, [0, 1, 2, 4], True, True, []
    for a in argv:
        if a.startswith("budget_s="):
            budget = float(a.split("=", 1)[1])
        elif a.startswith("etas="):
            etas = [int(x) for x in a.split("=", 1)[1].split(",")]
        elif a.startswith("static="):
            static = a.split("=", 1)[1] not in ("0", "false")
        elif a.startswith("alternate="):
            alternate = a.split("=", 1)[1] not in ("0", "false")
        else:
            rest.append(a)
    common = [f"max_time={budget}", "max_steps=100000", *rest]
    root = Path(tempfile.mkdtemp(prefix="async-vs-sync-"))
    results = [_one("sync", [*common, "runtime.mode=colocated", "max_staleness=0"], root)]
    if static:
        eta = min(etas)
        results.append(
            _one(
                f"static-{eta}",
                [*common, "runtime.mode=async", f"max_staleness={eta}", "runtime.elastic_cores=fixed"],
                root,
            )
        )
    if alternate:
        eta = min(etas)
        overrides = [*common, "runtime.mode=async", f"max_staleness={eta}", "runtime.elastic_cores=alternate"]
        results.append(_one(f"alt-{eta}", overrides, root))
    for eta in etas:
        results.append(_one(f"async-{eta}", [*common, "runtime.mode=async", f"max_staleness={eta}"], root))
    base = results[0]["samples_per_s"] or 1e-9
    ideal = None
    if static:
        st, sy = results[1], results[0]
        ideal = bound(st["gen_s"], sy["gen_s"], st["train_s"], sy["train_s"])
        print(
            f"\nper trained sample: generate {st['gen_s']:.3f} s at 1 core, {sy['gen_s']:.3f} s at 2; "
            f"train {st['train_s']:.3f} s at 1 core, {sy['train_s']:.3f} s at 2 "
            f"-> bound {ideal:.2f} samples/s"
        )
    print(f"\nbudget {budget:.0f} s of training per run; held-out accuracy after the budget (greedy)")
    print(
        f"{'run':>9} {'steps':>5} {'samples/s':>9} {'speed-up':>8} {'of bound':>8} {'train tok/s':>11} "
        f"{'trainer wait':>12} {'engine idle':>11} {'max stale':>9} {'peak thr':>8} {'accuracy':>9}"
    )
    for r in results:
        share = f"{100 * r['samples_per_s'] / ideal:>7.0f}%" if ideal else f"{'-':>8}"
        peak = r["cores_peak_held"] if r["cores_peak_held"] is not None else "-"
        print(
            f"{r['name']:>9} {r['steps']:>5} {r['samples_per_s']:>9.2f} {r['samples_per_s'] / base:>7.2f}x "
            f"{share} {r['train_tokens_per_s']:>11.0f} {100 * r['trainer_wait']:>11.0f}% "
            f"{100 * r['engine_idle']:>10.0f}% {r['staleness_max']:>9} {peak:>8} {100 * r['accuracy']:>8.1f}%"
        )
    (root / "results.json").write_text(json.dumps({"bound": ideal, "runs": results}, indent=2))
    print(f"results: {root / 'results.json'}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--one"]:
        _train(sys.argv[2], Path(sys.argv[3]), sys.argv[4:])
    else:
        main(sys.argv[1:])
