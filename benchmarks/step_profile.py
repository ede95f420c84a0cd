"""Time per RL step of the default job, split into generate / reward / train, with tokens/s per phase.

    python benchmarks/step_profile.py [key=value ...]      (default: 5 steps, 1 warm-up, no eval)

Prints one row per step and the mean over the measured steps. Not a test: figures, not assertions.
"""

from __future__ import annotations

import os
import statistics
import sys

import torch

from streamrl.config import load_config
from streamrl.loop.colocated import ColocatedRunner
from streamrl.loop.job import build_components
from streamrl.loop.signals import StopFlag
from streamrl.loop.state import RunState
from streamrl.loop.step import StepRecord
from streamrl.models.precision import resolve_precision


def main(argv: list[str]) -> None:
    cfg = load_config(None, ["max_steps=5", "eval.size=0", *argv])
    torch.set_num_threads(cfg.train.threads or os.cpu_count() or 1)
    torch.manual_seed(cfg.seed)
    cfg.max_steps += 1  # step 1 warms up allocators and caches; not counted
    parts = build_components(cfg)
    runner = ColocatedRunner(
        cfg, parts.trainer, parts.engine, parts.tokenizer, parts.task, parts.stream, RunState(), StopFlag()
    )
    print(
        f"model {cfg.model} | task {cfg.task} | {cfg.rollout.prompts_per_step} prompts x "
        f"{cfg.rollout.samples_per_prompt} samples | max_new_tokens {cfg.rollout.max_new_tokens} | "
        f"precision {resolve_precision(cfg.train.precision, cfg.device)} | threads {torch.get_num_threads()}"
    )
    header = (
        f"{'step':>4} {'total s':>8} {'gen s':>7} {'reward s':>8} {'train s':>8} {'gen tok/s':>9} "
        f"{'train tok/s':>11} {'gen tok':>7} {'train tok':>9} {'pad %':>6}"
    )
    print(header)
    rows = []

    def on_step(rec: StepRecord) -> None:
        r = rec.metrics
        r["total"] = r["step_time"]
        pad = r["padding_frac"]
        print(
            f"{rec.step:>4} {r['total']:>8.2f} {r['generate_time']:>7.2f} {r['reward_time']:>8.3f} "
            f"{r['train_time']:>8.2f} {r['generate_tokens_per_s']:>9.0f} {r['train_tokens_per_s']:>11.0f} "
            f"{r['tokens_generated']:>7} {r['tokens_trained']:>9} {100 * pad:>6.1f}"
            + ("  (warm-up)" if rec.step == 1 else "")
        )
        if rec.step > 1:
            rows.append(r)

    runner.run(on_step)
    mean = {
        k: statistics.fmean(r[k] for r in rows)
        for k in (
            "total",
            "generate_time",
            "reward_time",
            "train_time",
            "generate_tokens_per_s",
            "train_tokens_per_s",
        )
    }
    print(
        f"mean {mean['total']:>8.2f} {mean['generate_time']:>7.2f} {mean['reward_time']:>8.3f} "
        f"{mean['train_time']:>8.2f} {mean['generate_tokens_per_s']:>9.0f} "
        f"{mean['train_tokens_per_s']:>11.0f}"
    )
    share = {k: 100 * mean[k] / mean["total"] for k in ("generate_time", "reward_time", "train_time")}
    print(
        f"share of step time: generate {share['generate_time']:.0f}%, reward {share['reward_time']:.1f}%, "
        f"train {share['train_time']:.0f}%"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
