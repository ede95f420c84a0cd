"""Synchronous vs asynchronous RL on the same model, task, hyper-parameters and wall-clock budget.

    python benchmarks/async_vs_sync.py [budget_s=240] [etas=0,1,2,4] [key=value ...]

Runs, one after another (never two at once on 2 cores):
  sync       colocated, eta = 0: generate then train, each with every core (the fastest synchronous setup)
  async-0    rollout worker + trainer processes, eta = 0 (exactly synchronous, cores split 1 + 1)
  async-N    the same with eta = N, for N in etas
each trained for `budget_s` seconds of wall clock, then evaluated greedily on the same held-out set.
Prints samples/s, trained tokens/s, the share of time the trainer waited for data and the rollout
engine idled, and held-out accuracy; the speed-up is samples/s over `sync`.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from streamrl.config import load_config
from streamrl.loop.job import run_train


def _one(name: str, overrides: list[str], root: Path) -> dict:
    run_dir = root / name
    cfg = load_config(None, [*overrides, f"run_dir={run_dir}", "eval.before=false", "checkpoint.save=false"])
    summary = run_train(cfg)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    last = rows[-1] if rows else {}
    trained_tokens = sum(r["tokens_trained"] for r in rows)
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
    }


def main(argv: list[str]) -> None:
    budget, etas, rest = 240.0, [0, 1, 2, 4], []
    for a in argv:
        if a.startswith("budget_s="):
            budget = float(a.split("=", 1)[1])
        elif a.startswith("etas="):
            etas = [int(x) for x in a.split("=", 1)[1].split(",")]
        else:
            rest.append(a)
    common = [f"max_time={budget}", "max_steps=100000", *rest]
    root = Path(tempfile.mkdtemp(prefix="async-vs-sync-"))
    results = [_one("sync", [*common, "runtime.mode=colocated", "max_staleness=0"], root)]
    for eta in etas:
        results.append(_one(f"async-{eta}", [*common, "runtime.mode=async", f"max_staleness={eta}"], root))
    base = results[0]["samples_per_s"] or 1e-9
    print(f"\nbudget {budget:.0f} s of training per run; held-out accuracy after the budget (greedy)")
    print(
        f"{'run':>8} {'steps':>5} {'samples/s':>9} {'speed-up':>8} {'train tok/s':>11} {'trainer wait':>12} "
        f"{'engine idle':>11} {'max stale':>9} {'accuracy':>9}"
    )
    for r in results:
        print(
            f"{r['name']:>8} {r['steps']:>5} {r['samples_per_s']:>9.2f} {r['samples_per_s'] / base:>7.2f}x "
            f"{r['train_tokens_per_s']:>11.0f} {100 * r['trainer_wait']:>11.0f}% "
            f"{100 * r['engine_idle']:>10.0f}% "
            f"{r['staleness_max']:>9} {100 * r['accuracy']:>8.1f}%"
        )
    (root / "results.json").write_text(json.dumps(results, indent=2))
    print(f"results: {root / 'results.json'}")


if __name__ == "__main__":
    main(sys.argv[1:])
