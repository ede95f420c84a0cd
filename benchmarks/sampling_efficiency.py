"""Uniform vs difficulty-aware prompt sampling for the same number of rollouts.

    python benchmarks/sampling_efficiency.py [--model smollm2-135m-instruct] [--steps 20]
        [--samplers uniform,mopps] [key=value ...]

Runs the default job (SmolLM2, the default task) once per sampler, one after another, with DAPO
dynamic sampling off so that every run generates exactly steps x prompts_per_step groups (the same
rollout budget; with it on, the filter would hide the zero-advantage groups this measures). Prints,
per sampler:

    zero_adv_share = (groups whose G rewards are all equal) / (groups generated)
    informative    = steps x B x (1 - zero_adv_share): groups that gave a gradient
    heldout_acc    = greedy accuracy on the held-out set after training (eval.json), with the base

A lower zero_adv_share means fewer wasted rollouts; MoPPS aims for it by picking prompts whose
sampled success rate is near 0.5. Any key=value is passed to every run (e.g. eval.size=100).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from run_state import drop_resume_state

from streamrl.config import load_config
from streamrl.loop.job import run_train


def one_run(sampler: str, args: argparse.Namespace, extra: list[str], root: Path) -> dict[str, Any]:
    run_dir = root / sampler
    cfg = load_config(
        None,
        [
            f"model={args.model}",
            f"max_steps={args.steps}",
            "rollout.dynamic_sampling=false",
            "checkpoint.save=false",
            *extra,
            f"rollout.sampler={sampler}",
            f"run_dir={run_dir}",
        ],
    )
    run_train(cfg)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    evals = json.loads((run_dir / "eval.json").read_text())
    drop_resume_state(run_dir)
    groups = len(rows) * cfg.rollout.prompts_per_step  # dynamic sampling is off: B groups per step
    zero = sum(r["zero_adv_group_frac"] * cfg.rollout.prompts_per_step for r in rows)
    return {
        "sampler": sampler,
        "steps": len(rows),
        "groups": groups,
        "zero_adv_share": zero / max(groups, 1),
        "informative": groups - round(zero),
        "train_accuracy": sum(r["accuracy"] for r in rows) / max(len(rows), 1),
        "base_acc": (evals.get("base") or {}).get("accuracy", float("nan")),
        "heldout_acc": (evals.get("final") or {}).get("accuracy", float("nan")),
        "run_dir": str(run_dir),
    }


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--samplers", default="uniform,mopps")
    p.add_argument("--root", default="", help="directory for the runs (default: a new temp dir)")
    args, extra = p.parse_known_args(argv)
    bad = [x for x in extra if "=" not in x]
    if bad:
        p.error(f"unrecognised arguments {bad}: pass config overrides as key=value")
    root = Path(args.root) if args.root else Path(tempfile.mkdtemp(prefix="sampling-efficiency-"))
    results = [one_run(s, args, extra, root) for s in args.samplers.split(",")]
    print(f"\nsampling efficiency: model {args.model}, {args.steps} steps per run, runs in {root}")
    head = ("sampler", "groups", "zero-adv", "informative", "train acc", "base", "held-out")
    print("".join(f"{h:<14}" if i == 0 else f"{h:>12}" for i, h in enumerate(head)))
    for r in results:
        print(
            f"{r['sampler']:<14}{r['groups']:>12}{r['zero_adv_share']:>12.3f}{r['informative']:>12}"
            f"{r['train_accuracy']:>12.3f}{r['base_acc']:>12.3f}{r['heldout_acc']:>12.3f}"
        )
    (root / "sampling_efficiency.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main(sys.argv[1:])
