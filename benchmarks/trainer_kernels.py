"""Trainer.step with the fused Llama path (models/fused_llama.py) vs transformers' modules, same run.

    python benchmarks/trainer_kernels.py [--model smollm2|tiny] [--threads 1] [--steps 5] [--prompt-len 100]
                                         [--size 2048]

One synthetic batch of the default job's shape (benchmarks/logprob_kernel.py: 8 prompts x 8 samples,
random prompt tokens, completion lengths uniform in 8..max_new_tokens), the default train config
(bf16, shared prompts). Each round measures the one-thread bf16 GEMM peak (benchmarks/mfu.py) and one
step of each variant, alternating, after a warm-up round:
    transformers  the model's own modules under autocast (the trainer's compute weights switched off)
    fused         fused RMSNorm / SwiGLU / RoPE on bf16 compute weights cast once per optimizer step
Prints per variant the median step time, CPU time (user + system), minor page faults, and the model
FLOPs utilisation counted as benchmarks/mfu.py's "computed": 6 N x forward tokens (shared prompts:
the prefixes once + the completion rows, with their padding) over the median peak.
Not a test: figures, not assertions (tests/test_fused_layers.py checks values and gradients).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
from logprob_kernel import MODELS, synthetic_batch
from mfu import gemm_peak, param_count


def timed_step(trainer, batch) -> tuple[float, float, int, int]:
    """-> (wall s, CPU s, minor page faults, forward tokens) of one Trainer.step."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out = trainer.step(batch)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    cpu = r1.ru_utime - r0.ru_utime + r1.ru_stime - r0.ru_stime
    return wall, cpu, r1.ru_minflt - r0.ru_minflt, int(out["padded_tokens"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the async trainer's share here)")
    p.add_argument("--steps", type=int, default=5, help="measured steps per variant")
    p.add_argument("--prompt-len", type=int, default=100)
    p.add_argument("--size", type=int, default=2048, help="square GEMM size of the peak")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    from streamrl.config import load_config
    from streamrl.models import load_model, load_tokenizer, resolve_model_dir
    from streamrl.trainer.trainer import Trainer

    cfg = load_config(None, [f"model={MODELS[a.model]}", "eval.size=0"])
    model_dir = resolve_model_dir(cfg.model, cfg.seed)
    model = load_model(model_dir, cfg.device)
    n_params = param_count(cfg.model)
    trainer = Trainer.from_config(model, cfg, pad_id=int(load_tokenizer(model_dir).pad_token_id))
    fused = trainer.compute_dtype
    if fused is None:
        raise SystemExit(f"{cfg.model}: the fused path is not installed for this model/config")
    batch = synthetic_batch(model.config.vocab_size, a.prompt_len, cfg.rollout.max_new_tokens, cfg.seed)
    real = sum(len(t.prompt_ids) + len(t.completion_ids) for t in batch.trajectories)
    print(
        f"{cfg.model} N={n_params / 1e6:.1f}M, {len(batch.trajectories)} samples, {real} tokens, "
        f"precision {cfg.train.precision}, {a.threads} thread(s), {a.steps} steps per variant"
    )
    variants = {"transformers": None, "fused": fused}
    rows: dict[str, list[tuple[float, float, int, int]]] = {name: [] for name in variants}
    peaks: list[float] = []
    for i in range(a.steps + 1):  # round 0 warms up (allocator, thread pool)
        peak = gemm_peak(a.size, 3, torch.bfloat16, a.threads)
        for name, dtype in variants.items():
            trainer.compute_dtype = dtype
            row = timed_step(trainer, batch)
            if i:
                rows[name].append(row)
        if i:
            peaks.append(peak)
    trainer.compute_dtype = fused
    peak = statistics.median(peaks)
    print(f"bf16 GEMM peak at {a.threads} thread(s) ({a.size}^2, median of rounds): {peak / 1e9:.1f} GFLOP/s")
    med: dict[str, float] = {}
    for name, rs in rows.items():
        wall = statistics.median(r[0] for r in rs)
        cpu = statistics.median(r[1] for r in rs)
        faults = statistics.median(r[2] for r in rs)
        flops = 6 * n_params * rs[0][3]
        med[name] = wall
        print(
            f"  {name:<12} {wall:7.3f} s/step  CPU {cpu:7.3f} s  {faults:8.0f} page faults  "
            f"computed {flops / wall / 1e9:6.1f} GFLOP/s = {flops / wall / peak:.1%} of the peak"
        )
    print(f"  transformers / fused = {med['transformers'] / med['fused']:.2f}x")


if __name__ == "__main__":
    main()
