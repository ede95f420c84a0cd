"""Rollout worker start-up: a spawned process against one forked from the preloaded fork server.

    python benchmarks/worker_start.py [--model tiny-random|smollm2-135m-instruct] [--repeats 3]

Times `LocalRollouts.start` until `wait_ready` (the worker has imported its code, loaded the model and
polls its requests: what a run waits for before its first step, and after a worker dies):
  spawn       each worker a fresh interpreter (the start method before placement/forkserver.py)
  fork, cold  the first worker of a process: the fork server is started with it, so it pays the
              server's imports (`python -m streamrl.cli train` starts the server before it loads its own
              model, so there they run beside the trainer's model load)
  fork, warm  every later start: a worker restart, or the next job in the same process
Arms alternate within each repeat (spawn, cold, warm), one worker at a time, nothing else running;
prints each start's seconds and the medians, warm against spawn.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import statistics
import time
from multiprocessing import forkserver
from typing import Any

import torch

from streamrl.config import load_config
from streamrl.models.startup import start_model
from streamrl.placement import backend as backend_mod
from streamrl.rollout.worker import run_worker


def _time_start(cfg: Any, state: dict[str, torch.Tensor], spawn: bool) -> float:
    if spawn:
        original = backend_mod.worker_context
        backend_mod.worker_context = lambda: mp.get_context("spawn")
    try:
        b = backend_mod.LocalRollouts(cfg, run_worker)
    finally:
        if spawn:
            backend_mod.worker_context = original
    t0 = time.perf_counter()
    b.start(state, 0)
    if not b.wait_ready(600):
        raise RuntimeError("the worker did not start within 600 s")
    took = time.perf_counter() - t0
    b.stop()
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="tiny-random")
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    cfg = load_config(None, [f"model={a.model}", "runtime.rollout_workers=1", "runtime.elastic_cores=fixed"])
    state = start_model(cfg.model, cfg.seed, cfg.device).model.state_dict()
    times: dict[str, list[float]] = {"spawn": [], "fork, cold": [], "fork, warm": []}
    for r in range(a.repeats):
        times["spawn"].append(_time_start(cfg, state, spawn=True))
        forkserver._forkserver._stop()  # the next start pays the server's imports
        times["fork, cold"].append(_time_start(cfg, state, spawn=False))
        times["fork, warm"].append(_time_start(cfg, state, spawn=False))
        print(f"repeat {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"\nmodel {a.model}, one worker, {a.repeats} repeats: median seconds from start to ready")
    for k, v in med.items():
        print(f"  {k:<11} {v:6.2f} s  ({med['spawn'] / v:.1f}x faster than spawn)")


if __name__ == "__main__":
    main()
