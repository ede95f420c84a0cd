"""Trainer.step with the fused Llama path (models/fused_llama.py) vs transformers' modules, same run.

    python benchmarks/trainer_kernels.py [--model smollm2|tiny] [--threads 1] [--steps 5] [--prompt-len 100]
                                         [--size 2048] [--profile] [--allocator both|glibc|kept]

One synthetic batch of the default job's shape (benchmarks/logprob_kernel.py: 8 prompts x 8 samples,
random prompt tokens, completion lengths uniform in 8..max_new_tokens), the default train config
(precision auto: bf16 where the CPU multiplies it natively, else fp32; shared prompts). Two phases, the
first with glibc's default malloc settings, the second after trainer/allocator.py's keep_freed_memory (it
cannot be undone, hence the order; --allocator glibc or kept runs one phase alone, so that invocations
alternating the two compare the allocators free of the drift a fixed order adds). In each, every round
measures the GEMM peak in the trainer's precision at --threads (benchmarks/mfu.py) and one step of each
variant, alternating, after a warm-up round:
    transformers  the model's own modules (under autocast in bf16; the trainer's compute weights off)
    fused         fused RMSNorm / SwiGLU / RoPE on compute weights cast once per optimizer step
Prints per phase and variant the median step time, user and system CPU time, minor page faults, and
the model FLOPs utilisation counted as benchmarks/mfu.py's "computed": 6 N x forward tokens (shared
prompts: the prefixes once + the completion rows, with their padding) per second of the median step
over the median peak. --profile: one more step of each variant under the torch profiler: its time in
GEMMs (mm, bmm, addmm) and outside them, and the ops that take most of the latter.
Not a test: figures, not assertions (tests/test_fused_layers.py checks values and gradients).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import time

import torch
from logprob_kernel import MODELS, default_model, synthetic_batch
from mfu import gemm_peak, param_count

Row = tuple[float, float, float, int, int]


def timed_step(trainer, batch) -> Row:
    """-> (wall s, user CPU s, system CPU s, minor page faults, forward tokens) of one Trainer.step."""
    r0, t0 = resource.getrusage(resource.RUSAGE_SELF), time.perf_counter()
    out = trainer.step(batch)
    wall, r1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_SELF)
    user, system = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
    return wall, user, system, r1.ru_minflt - r0.ru_minflt, int(out["padded_tokens"])


def run_phase(
    trainer, batch, variants: dict, steps: int, size: int, threads: int, dtype: torch.dtype
) -> tuple[dict, float]:
    """Interleaved steps of each variant after a warm-up round -> ({variant: rows}, median peak)."""
    rows: dict[str, list[Row]] = {name: [] for name in variants}
    peaks: list[float] = []
    for i in range(steps + 1):  # round 0 warms up (allocator, thread pool)
        peak = gemm_peak(size, 3, dtype, threads)
        for name, compute in variants.items():
            trainer.compute_dtype = compute
            row = timed_step(trainer, batch)
            if i:
                rows[name].append(row)
        if i:
            peaks.append(peak)
    return rows, statistics.median(peaks)


def report(rows: dict[str, list[Row]], peak: float, n_params: int) -> None:
    med: dict[str, float] = {}
    for name, rs in rows.items():
        wall, user, system, faults = (statistics.median(r[k] for r in rs) for k in range(4))
        flops = 6 * n_params * rs[0][4]
        med[name] = wall
        print(
            f"  {name:<12} {wall:7.3f} s/step  CPU user {user:7.3f} s  system {system:6.3f} s  "
            f"{faults:8.0f} page faults  computed {flops / wall / 1e9:6.1f} GFLOP/s = "
            f"{flops / wall / peak:.1%} of the peak"
        )
    print(f"  transformers / fused = {med['transformers'] / med['fused']:.2f}x")


GEMMS = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")


def profile_step(trainer, batch, top: int) -> None:
    """One step under the torch profiler: self CPU time in GEMMs and outside, the largest others."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.step(batch)
    ops = [(e.key, e.self_cpu_time_total / 1e6) for e in prof.key_averages()]
    gemm = sum(t for k, t in ops if k in GEMMS)
    other = sorted(((k, t) for k, t in ops if k not in GEMMS), key=lambda kt: -kt[1])
    rest = sum(t for _, t in other)
    print(f"    GEMMs {gemm:6.2f} s, outside GEMMs {rest:6.2f} s:")
    print("      " + ", ".join(f"{k.removeprefix('aten::')} {t:.2f}" for k, t in other[:top]))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    p.add_argument("--threads", type=int, default=1, help="torch threads (the async trainer's share here)")
    p.add_argument("--steps", type=int, default=5, help="measured steps per variant")
    p.add_argument("--prompt-len", type=int, default=100)
    p.add_argument("--size", type=int, default=2048, help="square GEMM size of the peak")
    p.add_argument("--profile", action="store_true", help="also profile one step of each variant")
    p.add_argument("--allocator", choices=("both", "glibc", "kept"), default="both", help="phases to run")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    from streamrl.models import load_tokenizer
    from streamrl.models.precision import dtype_name, precision_dtype, resolve_precision
    from streamrl.trainer import trainer as trainer_module
    from streamrl.trainer.trainer import Trainer

    cfg, model_dir, model = default_model(a.model)
    n_params = param_count(cfg.model)
    pad_id = int(load_tokenizer(model_dir).pad_token_id)
    keep = trainer_module.keep_freed_memory
    trainer_module.keep_freed_memory = lambda: False  # phase 1: glibc's defaults
    trainer = Trainer.from_config(model, cfg, pad_id=pad_id)
    trainer_module.keep_freed_memory = keep
    fused = trainer.compute_dtype
    if fused is None:
        raise SystemExit(f"{cfg.model}: the fused path is not installed for this model/config")
    batch = synthetic_batch(model.config.vocab_size, a.prompt_len, cfg.rollout.max_new_tokens, cfg.seed)
    real = sum(len(t.prompt_ids) + len(t.completion_ids) for t in batch.trajectories)
    print(
        f"{cfg.model} N={n_params / 1e6:.1f}M, {len(batch.trajectories)} samples, {real} tokens, "
        f"precision {resolve_precision(cfg.train.precision, cfg.device)}, {a.threads} thread(s), "
        f"{a.steps} steps per variant and phase"
    )
    variants = {"transformers": None, "fused": fused}
    dtype = precision_dtype(cfg.train.precision, cfg.device)
    phases = {"glibc": "glibc's default malloc", "kept": "freed memory kept (trainer/allocator.py)"}
    for phase in (phases[k] for k in phases if a.allocator in (k, "both")):
        if phase.startswith("freed"):
            keep()
        rows, peak = run_phase(trainer, batch, variants, a.steps, a.size, a.threads, dtype)
        print(
            f"{phase}; {dtype_name(dtype)} GEMM peak at {a.threads} thread(s) ({a.size}^2, median): "
            f"{peak / 1e9:.1f} GFLOP/s"
        )
        report(rows, peak, n_params)
    if a.profile:
        for name, compute in variants.items():
            trainer.compute_dtype = compute
            print(f"  profile of one step, {name}:")
            profile_step(trainer, batch, top=8)
    trainer.compute_dtype = fused


if __name__ == "__main__":
    main()
