"""Rollout corrections for the engine/trainer gap on the default job, each over several seeds.

    python benchmarks/mismatch.py [--model smollm2|tiny-random] [--steps 10] [--max-time 0]
                                  [--seeds 3] [--eval-size 100] [--corrections none,token_tis,...]
                                  [--set KEY=VALUE ...] [--out results.json]

The job is streamrl's default (bf16 engine, trainer with fp32 master weights and bf16 autocast, decoupled
PPO, GRPO advantages, async with eta 1): the engine's log-probs differ from the trainer's even on the same
weights. One run per correction (loss.rollout_correction: none, token_tis, seq_mis, icepop, geo_mask with
their default thresholds) and seed, each stopped after --steps optimizer steps or --max-time seconds of
training (whichever first), then evaluated greedily on the same --eval-size held-out problems. Each run is
`streamrl train` in a fresh subprocess, one after the other (never two at once on a small machine).

The defaults (10 steps, 100 held-out problems, 3 seeds, 5 corrections) take about 45 minutes on a 2-core
CPU with SmolLM2-135M: ~14 s per step, ~25 s of evaluation and ~10 s of start-up per run.

Printed per correction: held-out accuracy pooled over the seeds with its 95% Wilson interval (and each
seed's), the engine/trainer ratio rho = pi_old / pi_behav (mean over steps of its per-step mean, and its
largest value), the shares of tokens and sequences the correction masked or truncated, and whether a run
collapsed: a non-finite loss, gradient norm or reward, the mean reward falling to 0 at the last step after
a positive one, or 0 held-out accuracy after training steps with correct samples.
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from run_state import drop_resume_state

from streamrl.eval.stats import wilson_interval

CORRECTIONS = ("none", "token_tis", "seq_mis", "icepop", "geo_mask")
MODELS = {"smollm2": "smollm2-135m-instruct", "tiny-random": "tiny-random"}


def run_one(correction: str, seed: int, args: argparse.Namespace, root: Path) -> dict[str, Any]:

    run_dir = root / f"{correction}-seed{seed}"
    overrides = [
        f"model={MODELS[args.model]}",
        f"loss.rollout_correction={correction}",
        f"seed={seed}",
        f"max_steps={args.steps}",
        f"max_time={args.max_time}",
        f"eval.size={args.eval_size}",
        "eval.before=false",
        "checkpoint.save=false",
        f"run_dir={run_dir}",
        *args.set,
    ]
    cmd = [sys.executable, "-m", "streamrl.cli", "train", *overrides]
    print(f"--- {correction} seed {seed}: {' '.join(overrides)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
        return {"correction": correction, "seed": seed, "failed": proc.returncode, "rows": []}
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    final = json.loads((run_dir / "eval.json").read_text()).get("final") or {}
    drop_resume_state(run_dir)
    return {
        "correction": correction,
        "seed": seed,
        "steps": len(rows),
        "correct": final.get("correct", 0),
        "n": final.get("n", 0),
        "accuracy": final.get("accuracy", float("nan")),
        "rows": rows,
    }


def collapsed(run: dict[str, Any]) -> str:
    """Why a run collapsed, or '' when it did not."""
    rows = run["rows"]
    if run.get("failed"):
        return f"exit {run['failed']}"
    for r in rows:
        for key in ("loss", "grad_norm", "reward_mean"):
            if not math.isfinite(r.get(key, 0.0)):
                return f"{key} not finite at step {r['step']}"
    rewards = [r["reward_mean"] for r in rows]
    if rewards and rewards[-1] == 0 and any(x > 0 for x in rewards[:-1]):
        return "reward fell to 0"
    if run["n"] and run["correct"] == 0 and any(r.get("accuracy", 0.0) > 0 for r in rows):
        return "held-out accuracy 0"
    if not math.isfinite(run["accuracy"]):
        return "accuracy not finite"
    return ""


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def summarise(correction: str, runs: list[dict[str, Any]]) -> dict[str, Any]:
    rows = [r for run in runs for r in run["rows"]]
    correct, n = sum(run["correct"] for run in runs), sum(run["n"] for run in runs)
    lo, hi = wilson_interval(correct, n)
    return {
        "correction": correction,
        "accuracy": correct / n if n else float("nan"),
        "ci95": [lo, hi],
        "per_seed": [run["accuracy"] for run in runs],
        "steps": [run.get("steps", 0) for run in runs],
        "ratio_mean": _mean([r["rc_ratio_mean"] for r in rows if "rc_ratio_mean" in r]),
        "ratio_max": max((r["rc_ratio_max"] for r in rows if "rc_ratio_max" in r), default=float("nan")),
        **{
            key: _mean([r[f"rc_{key}"] for r in rows if f"rc_{key}" in r])
            for key in ("token_masked_frac", "seq_masked_frac", "token_truncated_frac", "seq_truncated_frac")
        },
        "collapsed": [f"seed {run['seed']}: {why}" for run in runs if (why := collapsed(run))],
    }


def print_table(results: list[dict[str, Any]]) -> None:
    print(
        f"\n{'correction':>10} {'accuracy (95% CI)':>22} {'per seed':>20} {'rho mean':>8} {'rho max':>8} "
        f"{'tok mask':>8} {'seq mask':>8} {'tok trunc':>9} {'seq trunc':>9}  collapsed"
    )
    for s in results:
        acc = f"{100 * s['accuracy']:.1f}% ({100 * s['ci95'][0]:.1f}-{100 * s['ci95'][1]:.1f})"
        seeds = " ".join(f"{100 * a:.1f}" for a in s["per_seed"])
        print(
            f"{s['correction']:>10} {acc:>22} {seeds:>20} {s['ratio_mean']:>8.4f} {s['ratio_max']:>8.3f} "
            f"{100 * s['token_masked_frac']:>7.2f}% {100 * s['seq_masked_frac']:>7.2f}% "
            f"{100 * s['token_truncated_frac']:>8.2f}% {100 * s['seq_truncated_frac']:>8.2f}%  "
            f"{'; '.join(s['collapsed']) or 'no'}"
        )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps per run")
    ap.add_argument("--max-time", type=float, default=0.0, help="training seconds per run (0: no limit)")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1 per correction")
    ap.add_argument("--eval-size", type=int, default=100, help="held-out problems, the same for every run")
    ap.add_argument("--corrections", default=",".join(CORRECTIONS))
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="change the job")
    ap.add_argument("--out", default="", help="results JSON (default: in the runs' temporary directory)")
    args = ap.parse_args(argv)
    root = Path(tempfile.mkdtemp(prefix="mismatch-"))
    results = []
    for correction in args.corrections.split(","):
        runs = [run_one(correction, seed, args, root) for seed in range(args.seeds)]
        results.append(summarise(correction, runs))
    print(
        f"\n{args.model}, {args.steps} steps (max_time {args.max_time:g} s) per run, {args.seeds} seeds; "
        f"greedy accuracy on {args.eval_size} held-out problems, pooled; rho = pi_old / pi_behav"
    )
    print_table(results)
    out = Path(args.out) if args.out else root / "results.json"
    out.write_text(json.dumps(results, indent=2))
    print(f"results: {out} (runs in {root})")


if __name__ == "__main__":
    main()
