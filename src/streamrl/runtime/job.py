"""The train job: set up, evaluate the base model, run the RL loop, evaluate again, save, summarise."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from streamrl.config import Config, dump_config
from streamrl.data.tasks import Task, default_task_args, make_task
from streamrl.engine.hf import HFEngine
from streamrl.eval.heldout import EvalResult, evaluate
from streamrl.eval.stats import paired_difference_interval
from streamrl.models import load_model, load_tokenizer, resolve_model_dir
from streamrl.observe.metrics import MetricsWriter
from streamrl.observe.progress import StepProgress
from streamrl.observe.summary import print_summary
from streamrl.runtime.rl_step import rl_step
from streamrl.trainer.trainer import Trainer
from streamrl.types import Problem


@dataclass
class Components:
    model: Any
    tokenizer: Any
    task: Task
    heldout: list[Problem]
    stream: Iterator[Problem]
    engine: HFEngine
    trainer: Trainer
    resolve_seconds: float


def build_components(cfg: Config) -> Components:
    """Model, tokenizer, task (held-out list + training stream), engine and trainer for `cfg`."""
    if not cfg.task_config.args:
        cfg.task_config.args = default_task_args(cfg.task)
    t0 = time.perf_counter()
    model_dir = resolve_model_dir(cfg.model, cfg.seed)
    resolve_seconds = time.perf_counter() - t0
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, cfg.device)
    tc = cfg.task_config
    task = make_task(cfg.task, tc.args, tc.system_prompt, tc.instruction, cfg.reward.extract)
    heldout = task.heldout(cfg.eval.size)
    stream = task.train_stream(cfg.seed, exclude={p.meta["question"] for p in heldout})
    engine = HFEngine(model, tokenizer, max_batch=cfg.rollout.max_batch, seed=cfg.seed, device=cfg.device)
    trainer = Trainer(model, cfg, pad_id=int(tokenizer.pad_token_id))
    return Components(model, tokenizer, task, heldout, stream, engine, trainer, resolve_seconds)


def _run_dir(cfg: Config) -> Path:
    path = Path(cfg.run_dir) if cfg.run_dir else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def _sigterm_as_interrupt() -> None:
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    signal.signal(signal.SIGTERM, handler)


def _eval_record(base: EvalResult | None, final: EvalResult | None) -> dict[str, Any]:
    out: dict[str, Any] = {
        "base": base.summary() if base else None,
        "final": final.summary() if final else None,
    }
    if base and final:
        mean, lo, hi = paired_difference_interval(base.correct, final.correct)
        out["difference"] = {"mean": mean, "ci95": [lo, hi]}
        out["samples"] = {"base": base.samples, "final": final.samples}
    return out


def run_train(cfg: Config, console: Console | None = None) -> dict[str, Any]:
    """Run the whole job; returns the summary dict (also written to the run directory)."""
    console = console or Console(stderr=True)
    t_start = time.perf_counter()
    threads = cfg.train.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    _seed_everything(cfg.seed)
    _sigterm_as_interrupt()
    if not cfg.task_config.args:
        cfg.task_config.args = default_task_args(cfg.task)  # recorded in config.yaml
    run_dir = _run_dir(cfg)
    dump_config(cfg, run_dir / "config.yaml")
    console.print(
        f"[bold]streamrl[/] run dir {run_dir} | model {cfg.model} | task {cfg.task} | threads {threads}"
    )

    t0 = time.perf_counter()
    parts = build_components(cfg)
    t_resolve = parts.resolve_seconds
    tokenizer, task, heldout, stream = parts.tokenizer, parts.task, parts.heldout, parts.stream
    engine, trainer = parts.engine, parts.trainer
    timings = {"resolve_model": t_resolve, "setup": time.perf_counter() - t0, "eval": 0.0, "train": 0.0}

    base = final = None
    if cfg.eval.before and heldout:
        console.print(f"evaluating the base model on {len(heldout)} held-out problems (greedy)...")
        base = evaluate(engine, tokenizer, task, heldout, cfg.eval.max_new_tokens)
        timings["eval"] += base.seconds
        console.print(f"base accuracy {base.accuracy:.3f} ({sum(base.correct)}/{len(base.correct)})")

    writer = MetricsWriter(run_dir)
    interrupted = False
    t_train = time.perf_counter()
    try:
        with StepProgress(cfg.max_steps, console) as progress:
            for step in range(1, cfg.max_steps + 1):
                problems = list(itertools.islice(stream, cfg.rollout.prompts_per_step))
                record = rl_step(step, problems, engine, trainer, tokenizer, task, cfg)
                record["time"] = time.perf_counter() - t_start
                writer.write(record)
                progress.update(record)
    except KeyboardInterrupt:
        interrupted = True
        console.print("[yellow]interrupted: saving what was trained so far[/]")
    finally:
        writer.close()
    timings["train"] = time.perf_counter() - t_train

    if cfg.eval.after and heldout and not interrupted:
        console.print("evaluating the trained model on the same held-out problems...")
        final = evaluate(engine, tokenizer, task, heldout, cfg.eval.max_new_tokens)
        timings["eval"] += final.seconds
    evals = _eval_record(base, final)
    (run_dir / "eval.json").write_text(json.dumps(evals, indent=2))

    ckpt = run_dir / "checkpoint"
    if cfg.train.save_checkpoint:
        trainer.save(str(ckpt), tokenizer)
    timings["total"] = time.perf_counter() - t_start
    summary = {
        "run_dir": str(run_dir),
        "steps": trainer.version,
        "interrupted": interrupted,
        "timings": timings,
        "eval": {k: v for k, v in evals.items() if k != "samples"},
        "checkpoint": str(ckpt) if cfg.train.save_checkpoint else None,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    print_summary(summary, console)
    return summary
