"""Model FLOPs utilisation of the RL loop against this machine's measured GEMM peak.

    python benchmarks/mfu.py [RUN_DIR] [--steps 5] [--size 2048] [--repeats 5]

1. Peak: the best of `repeats` large square matmuls (size x size, fp32 and bf16) at 1 thread and at all
   cores: 2 * size^3 FLOPs per matmul.
2. The loop: the run directory's metrics.jsonl (or, without RUN_DIR, a fresh run of the default job for
   `--steps` steps with no evaluation). Useful model FLOPs, with N the model's parameter count:
     generate = 2N x (prompt + completion tokens of every sample)   (prefill + decode, no padding)
     train    = 6N x trained tokens (forward + backward), + 2N x trained tokens for a reference model
                forward when loss.kl_coef > 0, + 2N x trained tokens for a pi_prox pass when
                train.mini_batches > 1
   MFU(loop) = (generate + train) / wall time / peak(all cores, the run's precision);
   MFU(train) = train FLOPs / train_time / peak(trainer threads). Padding and recomputed-but-discarded
   work are NOT counted as useful: they are what the ratio exposes.
Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

import torch
import yaml


def gemm_peak(size: int, repeats: int, dtype: torch.dtype, threads: int) -> float:
    """Best FLOP/s of size x size matmuls at `threads` threads."""
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
        torch.mm(a, b)  # warm-up
        best = float("inf")
        for _ in range(repeats):
            t0 = time.perf_counter()
            torch.mm(a, b)
            best = min(best, time.perf_counter() - t0)
        return 2 * size**3 / best
    finally:
        torch.set_num_threads(old)


def param_count(model_name: str) -> int:
    from streamrl.models import load_model, resolve_model_dir

    model = load_model(resolve_model_dir(model_name, 0), "cpu")
    return sum(p.numel() for p in model.parameters())  # tied embeddings counted once (the lm_head matmul)


def run_default_job(steps: int) -> Path:
    from streamrl.config import load_config
    from streamrl.runtime.job import run_train

    run_dir = Path(tempfile.mkdtemp(prefix="mfu-"))
    keys = [f"max_steps={steps}", "eval.before=false", "eval.after=false", "train.save_checkpoint=false"]
    run_train(load_config(None, [*keys, f"run_dir={run_dir}"]))
    return run_dir


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir", nargs="?")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    peaks = {
        (name, t): gemm_peak(args.size, args.repeats, dt, t)
        for name, dt in (("fp32", torch.float32), ("bf16", torch.bfloat16))
        for t in sorted({1, cores})
    }
    print(f"GEMM peak ({args.size}^2, best of {args.repeats}):")
    for (name, t), v in peaks.items():
        print(f"  {name} {t} thread(s): {v / 1e9:7.1f} GFLOP/s")
    run_dir = Path(args.run_dir) if args.run_dir else run_default_job(args.steps)
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    n = param_count(cfg["model"])
    # steady state: the steps after the first, timed between consecutive step records (no set-up or eval)
    steady = rows[1:] if len(rows) > 1 else rows
    wall = rows[-1]["time"] - rows[0]["time"] if len(rows) > 1 else rows[0]["time"]
    trained = sum(r["tokens_trained"] for r in steady)
    padded = sum(r["padded_tokens"] for r in steady)
    train_time = sum(r["train_time"] for r in steady)
    extra = (cfg["loss"]["kl_coef"] > 0) + (cfg["train"]["mini_batches"] > 1)
    gen_flops = 2 * n * trained  # every trained sample was prefilled and decoded once
    train_flops = (6 + 2 * extra) * n * trained
    prec = cfg["train"]["precision"]
    mode = cfg["runtime"]["mode"]
    rollout = cfg["runtime"]["rollout_workers"] * cfg["runtime"]["rollout_threads"]
    t_threads = cfg["train"]["threads"] or (max(1, cores - rollout) if mode == "async" else cores)
    loop, train = (gen_flops + train_flops) / wall, train_flops / train_time
    print(f"run {run_dir}: {cfg['model']} N={n / 1e6:.1f}M, {len(steady)} steady steps, {mode}, {prec}")
    print(
        f"  trained tokens {trained}, padded to {padded} ({1 - trained / padded:.0%} padding), {wall:.0f} s"
    )
    print(
        f"  loop : {loop / 1e9:6.2f} GFLOP/s = {loop / peaks[(prec, cores)]:.1%} of the {prec} peak, "
        f"{cores} threads"
    )
    print(
        f"  train: {train / 1e9:6.2f} GFLOP/s = {train / peaks[(prec, t_threads)]:.1%} of the {prec} peak at "
        f"{t_threads} thread(s); the trainer was busy {train_time / wall:.0%} of the loop's wall time"
    )


if __name__ == "__main__":
    main()
