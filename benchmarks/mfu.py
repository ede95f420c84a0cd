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
   work are NOT counted as useful: they are what the ratio exposes. Printed three times: "2N+6N" counts
   2N per generated (i.e. completion) token and 6N per trained token (no prompt prefill);
   "credited" counts every sample's prompt (what the padded layout computes); "computed" counts what ran
   when prompts are shared (one prefill per group in the engine, the trainer's forward tokens incl.
   its padding).
3. The model's own forward GEMM shapes (q/o, k/v, MLP, LM head) at --gemm-tokens rows, 1 thread: how fast
   its matmuls run when nothing else does (a bound on what GEMM efficiency alone can explain).
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
from run_state import drop_resume_state

from streamrl.models.precision import resolve_precision


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


def model_gemms(
    model_name: str, dtype: torch.dtype, tokens: int, repeats: int
) -> list[tuple[str, float, float]]:
    """(name, FLOPs per token, FLOP/s at 1 thread) of the model's forward GEMMs at `tokens` rows: where the
    step's GEMM time could go if nothing else ran (the backward runs the same shapes transposed, twice)."""
    from transformers import AutoConfig

    from streamrl.models import resolve_model_dir

    c = AutoConfig.from_pretrained(resolve_model_dir(model_name, 0))
    h, inter, heads = c.hidden_size, c.intermediate_size, c.num_attention_heads
    kv = h // heads * getattr(c, "num_key_value_heads", heads)
    shapes = {  # (k, n, matmuls per layer); the LM head once
        "q/o proj": (h, h, 2),
        "k/v proj": (h, kv, 2),
        "mlp gate/up": (h, inter, 2),
        "mlp down": (inter, h, 1),
        "lm head": (h, c.vocab_size, 0),
    }
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    out = []
    try:
        for name, (k, n, per_layer) in shapes.items():
            a, b = torch.randn(tokens, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
            torch.mm(a, b)
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                torch.mm(a, b)
                best = min(best, time.perf_counter() - t0)
            count = per_layer * c.num_hidden_layers if per_layer else 1
            out.append((name, 2.0 * k * n * count, 2.0 * tokens * k * n / best))
    finally:
        torch.set_num_threads(old)
    return out


def param_count(model_name: str) -> int:
    from streamrl.models import load_model, resolve_model_dir

    model = load_model(resolve_model_dir(model_name, 0), "cpu")
    return sum(p.numel() for p in model.parameters())  # tied embeddings counted once (the lm_head matmul)


def run_default_job(steps: int) -> Path:
    from streamrl.config import load_config
    from streamrl.loop.job import run_train

    run_dir = Path(tempfile.mkdtemp(prefix="mfu-"))
    keys = [f"max_steps={steps}", "eval.before=false", "eval.after=false", "checkpoint.save=false"]
    run_train(load_config(None, [*keys, f"run_dir={run_dir}"]))
    drop_resume_state(run_dir)
    return run_dir


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("run_dir", nargs="?")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--size", type=int, default=2048)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--gemm-tokens", type=int, default=2048, help="rows of the model-shape GEMMs")
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
    # the precision the run trained in (environment.json records what `auto` chose on its machine)
    env_path = run_dir / "environment.json"
    env = json.loads(env_path.read_text()) if env_path.is_file() else {}
    device = cfg.get("device") or "cpu"
    prec = env.get("train_precision") or resolve_precision(cfg["train"]["precision"], device)
    dt = torch.bfloat16 if prec == "bf16" else torch.float32
    gemms = model_gemms(cfg["model"], dt, args.gemm_tokens, args.repeats)
    per_token = sum(f for _, f, _ in gemms)
    print(f"the model's forward GEMMs at {args.gemm_tokens} rows, 1 thread ({prec}):")
    for name, f, rate in gemms:
        print(f"  {name:<12} {f / per_token:5.1%} of the GEMM FLOPs  {rate / 1e9:7.1f} GFLOP/s")
    mixed = per_token / sum(f / rate for _, f, rate in gemms)
    square = peaks[(prec, 1)]
    print(f"  FLOP-weighted {mixed / 1e9:.1f} GFLOP/s = {mixed / square:.0%} of the square peak at 1 thread")
    # steady state: the steps after the first, timed between consecutive step records (no set-up or eval)
    steady = rows[1:] if len(rows) > 1 else rows
    wall = rows[-1]["time"] - rows[0]["time"] if len(rows) > 1 else rows[0]["time"]
    trained = sum(r["tokens_trained"] for r in steady)
    padded = sum(r["padded_tokens"] for r in steady)
    train_time = sum(r["train_time"] for r in steady)
    extra = (cfg["loss"]["kl_coef"] > 0) + (cfg["train"]["mini_batches"] > 1)
    generated = sum(r["tokens_generated"] for r in steady)
    group = cfg["rollout"]["samples_per_prompt"]
    # credited: every sample's prompt counted, as the padded layout computes it. computed: what ran when
    # prompts are shared (the engine prefills a group's prompt once; the trainer's shared-prompt layout
    # forwards U prefixes + rows x C: padded_tokens < trained), padding of the shared layout included
    shared = padded < trained
    counts = {
        "2N+6N": (2 * n * generated, (6 + 2 * extra) * n * trained),
        "credited": (2 * n * trained, (6 + 2 * extra) * n * trained),
        "computed": (
            2 * n * ((trained - generated) / group + generated),
            (6 + 2 * extra) * n * (padded if shared else trained),
        ),
    }
    mode = cfg["runtime"]["mode"]
    rollout = cfg["runtime"]["rollout_workers"] * cfg["runtime"]["rollout_threads"]
    t_threads = cfg["train"]["threads"] or (max(1, cores - rollout) if mode == "async" else cores)
    print(f"run {run_dir}: {cfg['model']} N={n / 1e6:.1f}M, {len(steady)} steady steps, {mode}, {prec}")
    print(
        f"  trained tokens {trained}, forward tokens {padded}"
        + (" (shared prompts)" if shared else f" ({1 - trained / padded:.0%} padding)")
        + f", {wall:.0f} s; the trainer was busy {train_time / wall:.0%} of the loop's wall time"
    )
    for how, (gen_flops, train_flops) in counts.items():
        loop, train = (gen_flops + train_flops) / wall, train_flops / train_time
        print(
            f"  {how:<8} loop {loop / 1e9:6.1f} GFLOP/s = {loop / peaks[(prec, cores)]:.1%} of the {prec} "
            f"peak ({cores} threads); train {train / 1e9:6.1f} GFLOP/s = "
            f"{train / peaks[(prec, t_threads)]:.1%} of the peak at {t_threads} thread(s)"
        )


if __name__ == "__main__":
    main()
