"""Speculative rollouts on a multi-epoch job: the same job with and without them, over several seeds.

    python benchmarks/spec_rollouts.py [--model smollm2|tiny-random] [--problems 512] [--epochs 3]
                                       [--seeds 3] [--eval-size 200] [--drafts 16] [--lenience 0]
                                       [--max-time 0] [--set KEY=VALUE ...] [--out results.json]

A finite training set of --problems rg:chain_sum problems (the default task's generator), written to a
JSONL file, and --eval-size held-out problems in another; every run trains --epochs epochs over the set
(max_steps = epochs x problems / prompts_per_step, DAPO dynamic sampling off so that each step draws
exactly prompts_per_step problems) or for --max-time seconds, whichever ends first: the same budget for
both arms. Arm `plain` runs the default job as it is; arm `spec` adds rollout.spec_drafts=--drafts (and
rollout.spec_lenience=--lenience; 16 = two rounds of a group of 8). Each run is `streamrl train` in a
fresh subprocess, one after the other (never two at once on a small machine), the arms alternating seed
by seed (plain 0, spec 0, plain 1, ...) so that a drift of the machine's speed reaches both alike over
the seeds, though not within a pair.

Printed per arm, pooled over the seeds, from the second epoch on (the steps after the first
problems / prompts_per_step, when every prompt has drafts):

    rollout tok/s  tokens generated / seconds the engine spent generating (async: every token the
                   workers generated, groups dynamic sampling drops included, over their busy time;
                   colocated: the trained samples' tokens over generate_time)
    samples/s      samples trained / wall seconds over those steps
    engine cores   the threads the workers held, on average over the seconds they held any (async with
                   runtime.elastic_cores=lend, where a waiting trainer lends its core, so the arm whose
                   trainer waits more generates on more cores; `fixed` holds the split: not recorded)
    acceptance     draft tokens accepted / draft tokens verified (spec only), accepted tokens per draft
    held-out       final greedy accuracy over all seeds' held-out answers, with its 95% Wilson interval

then spec / plain of rollout tok/s, samples/s and the trainer's seconds per step per seed (with
runtime.elastic_cores=fixed the trainer does the same work on the same core in both arms, so the last
says how much slower or faster the machine ran the speculative run, and the rollout ratio times it is
printed as drift-adjusted; lending cores makes the trainer's speed depend on the arm beside it:
benchmarks/spec_replay.py measures the engines with the drift cancelled instead of corrected), and
the difference spec - plain of held-out correctness twice: paired over problems (same problems, same
seeds; its 95% interval counts the problems' spread only) and over seeds (Student's t over the seeds'
paired differences; its interval also holds the run-to-run spread of training, so it is the one that
says whether speculation changes what training reaches). The defaults (SmolLM2, 512 problems, 3
epochs: 192 steps per run, 6 runs) take several hours on a 2-core CPU; --problems 128 --epochs 2 is a
quicker look.
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

from streamrl.eval.stats import paired_difference_interval, replicate_difference_interval, wilson_interval

MODELS = {"smollm2": "smollm2-135m-instruct", "tiny-random": "tiny-random"}
TASK = "rg:chain_sum"


def write_problems(root: Path, n_train: int, n_eval: int) -> tuple[Path, Path]:
    """The finite training set and the held-out set as JSONL rows {prompt, answer}, no question in both."""
    from streamrl.data.task import default_task_args
    from streamrl.tasks import make_task

    task = make_task(TASK, default_task_args(TASK), "", "", "answer_is")
    held = task.heldout(n_eval)
    seen = {p.meta["question"] for p in held}
    train = []
    for p in task.train_stream(0, seen):
        if p.meta["question"] not in seen:
            seen.add(p.meta["question"])
            train.append(p)
        if len(train) == n_train:
            break
    paths = root / "train.jsonl", root / "heldout.jsonl"
    for path, problems in zip(paths, (train, held)):
        rows = [{"prompt": p.meta["question"], "answer": p.answer} for p in problems]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def run_one(
    arm: str,
    seed: int,
    args: argparse.Namespace,
    data: tuple[Path, Path],
    root: Path,
    keep_state: bool = False,
) -> dict[str, Any]:
    """One training run in a subprocess -> its step records and final held-out correctness; its resume
    state is removed unless keep_state."""
    run_dir = root / f"{arm}-seed{seed}"
    spec = (
        [f"rollout.spec_drafts={args.drafts}", f"rollout.spec_lenience={args.lenience}"]
        if arm == "spec"
        else []
    )
    overrides = [
        f"model={MODELS[args.model]}",
        f"task=data:{data[0]}",
        f"task_config.eval_data={data[1]}",
        f"eval.size={args.eval_size}",
        f"seed={seed}",
        f"max_steps={args.steps}",
        f"max_time={args.max_time}",
        "rollout.dynamic_sampling=false",
        "eval.before=false",
        "checkpoint.save=false",
        f"run_dir={run_dir}",
        *spec,
        *args.set,
    ]
    cmd = [sys.executable, "-m", "streamrl.cli", "train", *overrides]
    print(f"--- {arm} seed {seed}: {' '.join(overrides)}", flush=True)
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stderr[-2000:], file=sys.stderr)
        return {"arm": arm, "seed": seed, "failed": proc.returncode, "rows": [], "correct": []}
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = json.loads((run_dir / "eval.json").read_text())
    if not keep_state:
        drop_resume_state(run_dir)
    return {
        "arm": arm,
        "seed": seed,
        "rows": rows,
        "correct": [bool(c) for c in evals.get("per_problem_correct", {}).get("final", [])],
    }


def window(run: dict[str, Any], first_epoch_steps: int, per_step: int) -> dict[str, float]:
    """Totals over the steps after the first epoch: tokens, generating and wall seconds, the workers'
    thread-seconds and seconds holding threads (lending cores; 0 when not recorded), steps, draft tokens
    verified and accepted, samples with a draft (per_step: samples trained per step)."""
    rows = run["rows"]
    before = [r for r in rows if r["step"] <= first_epoch_steps]
    after = [r for r in rows if r["step"] > first_epoch_steps]
    if not before or not after:
        return {}
    if all("generate_time" in r for r in after):  # colocated
        gen_s = sum(r["generate_time"] for r in after)
    else:  # async: the workers' cumulative busy seconds
        gen_s = after[-1]["engine_busy_time"] - before[-1]["engine_busy_time"]
    if "engine_tokens" in after[-1]:  # async: every token generated, dynamic sampling's dropped groups too
        tokens = after[-1]["engine_tokens"] - before[-1]["engine_tokens"]
    else:  # colocated: the trained samples' tokens
        tokens = sum(r["tokens_generated"] for r in after)
    return {
        "tokens": tokens,
        "generate_s": gen_s,
        "wall_s": after[-1]["time"] - before[-1]["time"],
        "engine_thread_s": after[-1].get("cores_worker_thread_s", 0.0)
        - before[-1].get("cores_worker_thread_s", 0.0),
        "engine_held_s": after[-1].get("cores_worker_held_s", 0.0)
        - before[-1].get("cores_worker_held_s", 0.0),
        "steps": len(after),
        "train_s": sum(r.get("train_time", 0.0) for r in after),
        "verified": sum(r.get("spec_verified_tokens", 0) for r in after),
        "accepted": sum(r.get("spec_acceptance_rate", 0.0) * r.get("spec_verified_tokens", 0) for r in after),
        "drafted": sum(r.get("spec_draft_share", 0.0) for r in after) * per_step,
    }


def summarise(arm: str, runs: list[dict[str, Any]], args: argparse.Namespace) -> dict[str, Any]:
    first = args.problems // args.prompts
    wins = [w for run in runs if (w := window(run, first, args.prompts * args.samples))]
    total = {
        k: sum(w[k] for w in wins)
        for k in (
            "tokens",
            "generate_s",
            "wall_s",
            "engine_thread_s",
            "engine_held_s",
            "steps",
            "train_s",
            "verified",
            "accepted",
            "drafted",
        )
    }
    correct = [c for run in runs for c in run["correct"]]
    lo, hi = wilson_interval(sum(correct), len(correct))
    return {
        "arm": arm,
        "runs": len(runs),
        "failed": [run["seed"] for run in runs if run.get("failed")],
        "rollout_tokens_per_s": total["tokens"] / total["generate_s"]
        if total["generate_s"]
        else float("nan"),
        "samples_per_s": total["steps"] * args.prompts * args.samples / total["wall_s"]
        if total["wall_s"]
        else float("nan"),
        "engine_cores": total["engine_thread_s"] / total["engine_held_s"]
        if total["engine_held_s"]
        else float("nan"),
        "trainer_s_per_step": total["train_s"] / total["steps"] if total["steps"] else float("nan"),
        "acceptance_rate": total["accepted"] / total["verified"] if total["verified"] else float("nan"),
        "accepted_per_draft": total["accepted"] / total["drafted"] if total["drafted"] else float("nan"),
        "heldout_accuracy": sum(correct) / len(correct) if correct else float("nan"),
        "heldout_ci95": [lo, hi],
        "per_seed_accuracy": [sum(r["correct"]) / len(r["correct"]) if r["correct"] else None for r in runs],
        "correct": correct,
        "windows": wins,  # each seed's totals (`window`), so that invocations can be pooled later
    }


def per_seed_ratios(
    plain: list[dict[str, Any]], spec: list[dict[str, Any]], args: argparse.Namespace
) -> list[tuple[int, float, float, float]]:
    """(seed, spec / plain rollout tok/s, spec / plain samples/s, spec / plain trainer seconds per step)
    for each seed both arms completed. The trainer does the same work in both arms (the same model and
    batch; the prompts dominate its tokens), so the last is the machine's speed between the two runs."""
    out = []
    for p_run, s_run in zip(plain, spec):
        p, s = (summarise(r["arm"], [r], args) for r in (p_run, s_run))
        if p["rollout_tokens_per_s"] > 0 and p["samples_per_s"] > 0:
            tok = s["rollout_tokens_per_s"] / p["rollout_tokens_per_s"]
            trained = p["trainer_s_per_step"] > 0 and s["trainer_s_per_step"] > 0  # no train_time: unknown
            trainer = s["trainer_s_per_step"] / p["trainer_s_per_step"] if trained else math.nan
            out.append((p_run["seed"], tok, s["samples_per_s"] / p["samples_per_s"], trainer))
    return out


def job_parser(doc: str | None, problems: int, epochs: int, eval_size: int) -> argparse.ArgumentParser:
    """The options of the multi-epoch job the speculative-rollout benchmarks train (this one and
    spec_replay.py), with their defaults for `problems`, `epochs` and `eval_size`."""
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    ap.add_argument("--problems", type=int, default=problems, help="the finite training set")
    ap.add_argument("--epochs", type=int, default=epochs, help="epochs over it per training run")
    ap.add_argument("--seeds", type=int, default=3, help="seeds 0..N-1")
    ap.add_argument(
        "--eval-size", type=int, default=eval_size, help="held-out problems, the same for every run"
    )
    ap.add_argument("--drafts", type=int, default=16, help="rollout.spec_drafts of the speculative runs")
    ap.add_argument(
        "--set", action="append", default=[], metavar="KEY=VALUE", help="change the job (every run)"
    )
    ap.add_argument("--out", default="", help="results JSON (default: in the runs' temporary directory)")
    return ap


def job_setup(args: argparse.Namespace, prefix: str) -> tuple[Path, tuple[Path, Path]]:
    """The job's batch (args.prompts, args.samples), steps per run (args.steps) and core policy
    (args.elastic_cores) from its config; a temporary directory whose name starts with `prefix` and
    the problem files written in it -> (directory, files)."""
    from streamrl.config import load_config

    cfg = load_config(None, [f"model={MODELS[args.model]}", *args.set])  # the job's B and G
    args.prompts, args.samples = cfg.rollout.prompts_per_step, cfg.rollout.samples_per_prompt
    args.steps = args.epochs * args.problems // args.prompts
    args.elastic_cores = cfg.runtime.elastic_cores
    root = Path(tempfile.mkdtemp(prefix=prefix))
    return root, write_problems(root, args.problems, args.eval_size)


def main(argv: list[str] | None = None) -> None:
    ap = job_parser(__doc__, problems=512, epochs=3, eval_size=200)
    ap.add_argument("--lenience", type=float, default=0.0, help="rollout.spec_lenience of the spec arm")
    ap.add_argument("--max-time", type=float, default=0.0, help="training seconds per run (0: no limit)")
    args = ap.parse_args(argv)
    root, data = job_setup(args, "spec-rollouts-")
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "spec": []}
    for seed in range(args.seeds):
        for arm in runs:
            runs[arm].append(run_one(arm, seed, args, data, root))
    results = [summarise(arm, arm_runs, args) for arm, arm_runs in runs.items()]
    plain, spec = results
    ratios = per_seed_ratios(runs["plain"], runs["spec"], args)
    diff = across = None
    if plain["correct"] and len(plain["correct"]) == len(spec["correct"]):
        diff = paired_difference_interval(plain["correct"], spec["correct"])
        seeds = [(p["correct"], s["correct"]) for p, s in zip(runs["plain"], runs["spec"])]
        if all(p and len(p) == len(s) for p, s in seeds):
            across = replicate_difference_interval([p for p, _ in seeds], [s for _, s in seeds])
    print(
        f"\n{args.model}: {args.problems} problems x {args.epochs} epochs ({args.steps} steps, max_time "
        f"{args.max_time:g} s) per run, {args.seeds} seeds, spec_drafts={args.drafts} "
        f"lenience={args.lenience:g}; from the second epoch on (steps > {args.problems // args.prompts}):"
    )
    print(
        f"{'arm':>6} {'rollout tok/s':>14} {'samples/s':>10} {'engine cores':>12} {'acceptance':>10} "
        f"{'acc/draft':>9}  "
        "held-out (95% CI)"
    )
    for s in results:
        lo, hi = s["heldout_ci95"]
        print(
            f"{s['arm']:>6} {s['rollout_tokens_per_s']:>14.1f} {s['samples_per_s']:>10.3f} "
            f"{s['engine_cores']:>12.2f} "
            f"{s['acceptance_rate']:>10.3f} {s['accepted_per_draft']:>9.2f}  "
            f"{100 * s['heldout_accuracy']:.1f}% ({100 * lo:.1f}-{100 * hi:.1f})"
            + (f"  failed seeds {s['failed']}" if s["failed"] else "")
        )
    # lending cores makes the trainer's speed depend on the arm beside it: no measure of the machine then
    fixed = args.elastic_cores == "fixed"
    for seed, tok, smp, trainer in ratios:
        adjusted = f"{tok * trainer:.2f}x" if fixed else "only with runtime.elastic_cores=fixed"
        print(
            f"seed {seed}: spec / plain rollout tok/s {tok:.2f}x, samples/s {smp:.2f}x, trainer seconds "
            f"per step {trainer:.2f}x (rollout tok/s times it, drift-adjusted: {adjusted})"
        )
    if diff is not None:
        print(
            f"held-out spec - plain (paired over problems): {100 * diff[0]:+.1f} pts "
            f"(95% CI {100 * diff[1]:+.1f} to {100 * diff[2]:+.1f})"
        )
    if across is not None:
        print(
            f"held-out spec - plain (over seeds, Student's t): {100 * across[0]:+.1f} pts "
            f"(95% CI {100 * across[1]:+.1f} to {100 * across[2]:+.1f})"
        )
    out = Path(args.out) if args.out else root / "spec_rollouts.json"
    out.write_text(
        json.dumps(
            {
                "args": vars(args),
                "results": results,
                "per_seed_ratios": ratios,
                "difference": diff,
                "difference_over_seeds": across,
            },
            indent=2,
        )
    )
    print(f"runs and results in {root}")


if __name__ == "__main__":
    main()
