"""How each phase speeds up with torch threads: the simulator's decode and train thread-scaling exponents.

    python benchmarks/thread_scaling.py [--model smollm2|tiny] [--threads 1,2] [--batch 64] [--new-tokens 48]
                                        [--prompt-len 100] [--steps 2] [--out alphas.json]

decode: streamrl's engine as the rollout worker drives it (HFEngine through ContinuousDecoder, weights in
        rollout.precision: bf16 where the CPU multiplies it natively, else fp32),
        `batch` chat prompts x `new-tokens` tokens each (EOS ignored), tokens/s incl. prefill.
engine step costs (the simulator's decode_step_s a, decode_token_s c, prefill_token_s p): the median decode
        step at 1 row and at `batch` rows (8 distinct random prompts of `prompt-len` tokens x batch / 8) gives
        step(b) = a + c b; the first step's extra time over a decode step is the prefill of the distinct
        prompts (a group's samples share one prefill), p = that / (distinct prompt tokens).
train:  Trainer.step on a synthetic batch of the default job's shape (benchmarks/logprob_kernel.py), median
        of `steps` after one warm-up, trained tokens/s.
alpha = log(rate at k threads / rate at 1 thread) / log(k) for the largest k: k threads run k ** alpha times
faster than one (1 = linear; memory-bound decoding is well below). `streamrl simulate` takes them as
decode_thread_scaling / thread_scaling; benchmarks/simulate_validation.py reads the JSON (`--measured FILE`).
Not a test: figures, not assertions.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from engines import bench_streamrl  # noqa: E402
from logprob_kernel import MODELS, synthetic_batch  # noqa: E402


def alpha(rates: dict[int, float]) -> float:
    """Exponent between 1 thread and the most threads measured."""
    k = max(rates)
    return math.log(rates[k] / rates[1]) / math.log(k) if k > 1 else 1.0


def engine_costs(model, tokenizer, batch: int, prompt_len: int, new: int) -> dict[str, float]:
    """One-process step timings of streamrl's engine -> a, c, p in seconds at the current threads."""
    import random

    from streamrl.engine.base import GenRequest
    from streamrl.engine.continuous import ContinuousDecoder
    from streamrl.engine.hf import HFEngine

    rng = random.Random(0)
    vocab = model.config.vocab_size
    distinct = [[rng.randrange(vocab) for _ in range(prompt_len)] for _ in range(8)]
    engine = HFEngine(model, tokenizer, max_batch=batch, seed=0)
    engine.stop_ids = set()  # every request decodes exactly `new` tokens

    def step_times(prompts: list[list[int]]) -> list[float]:
        decoder = ContinuousDecoder(engine)
        decoder.add([GenRequest(p, new, 1.0) for p in prompts])
        times = []
        while not decoder.idle:
            t0 = time.perf_counter()
            decoder.step()
            times.append(time.perf_counter() - t0)
        return times

    step_times(distinct[:1])  # warm-up
    one = step_times(distinct[:1])
    big = step_times([p for p in distinct for _ in range(max(1, batch // len(distinct)))])
    rows = max(1, batch // len(distinct)) * len(distinct)
    d1, db = statistics.median(one[1:]), statistics.median(big[1:])
    c = max(0.0, (db - d1) / (rows - 1))
    return {
        "decode_step_s": max(0.0, d1 - c),
        "decode_token_s": c,
        "prefill_token_s": max(0.0, big[0] - db) / (len(distinct) * prompt_len),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    p.add_argument("--threads", default="1,2")
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--prompt-len", type=int, default=100)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--out", default="")
    a = p.parse_args()
    if a.batch < 8 or a.batch % 8 or a.new_tokens < 2:
        p.error("--batch must be a multiple of 8 (8 distinct prompts) and --new-tokens at least 2")
    threads = sorted({int(t) for t in a.threads.split(",")} | {1})
    from streamrl.config import load_config
    from streamrl.models import load_model, load_tokenizer, resolve_model_dir
    from streamrl.models.precision import cast_params, precision_dtype
    from streamrl.trainer.trainer import Trainer

    cfg = load_config(None, [f"model={MODELS[a.model]}", "eval.size=0"])
    model_dir = resolve_model_dir(cfg.model, cfg.seed)
    tokenizer = load_tokenizer(model_dir)
    engine_dtype = precision_dtype(cfg.rollout.precision, cfg.device)
    engine_model = cast_params(load_model(model_dir, cfg.device), engine_dtype)
    decode: dict[int, float] = {}
    steps: dict[int, dict[str, float]] = {}
    for k in threads:
        torch.set_num_threads(k)
        decode[k] = bench_streamrl(engine_model, tokenizer, a.batch, a.new_tokens)
        steps[k] = engine_costs(engine_model, tokenizer, a.batch, a.prompt_len, a.new_tokens)
        st = steps[k]
        print(
            f"decode {k} thread(s): {decode[k]:.1f} tok/s; step = {st['decode_step_s'] * 1e3:.1f} ms + "
            f"{st['decode_token_s'] * 1e3:.2f} ms x rows; prefill {st['prefill_token_s'] * 1e3:.3f} ms/token",
            flush=True,
        )
    del engine_model
    model = load_model(model_dir, cfg.device)
    trainer = Trainer.from_config(model, cfg, pad_id=int(tokenizer.pad_token_id))
    batch = synthetic_batch(model.config.vocab_size, a.prompt_len, cfg.rollout.max_new_tokens, cfg.seed)
    ntok = sum(len(t.prompt_ids) + len(t.completion_ids) for t in batch.trajectories)
    train: dict[int, float] = {}
    for k in threads:
        torch.set_num_threads(k)
        times = []
        for i in range(a.steps + 1):
            t0 = time.perf_counter()
            trainer.step(batch)
            if i:
                times.append(time.perf_counter() - t0)
        train[k] = ntok / statistics.median(times)
        print(f"train {k} thread(s): {train[k]:.1f} tok/s", flush=True)
    out = {
        "model": cfg.model,
        "decode_tokens_per_s": decode,
        "train_tokens_per_s": train,
        "decode_thread_scaling": alpha(decode),
        "thread_scaling": alpha(train),
        "engine_costs": steps,  # seconds at each thread count
    }
    k = max(threads)
    print(f"\n| phase | 1 thread | {k} threads | speed-up | alpha |\n|---|---|---|---|---|")
    for name, rates, key in (("decode", decode, "decode_thread_scaling"), ("train", train, "thread_scaling")):
        speedup = rates[k] / rates[1]
        print(f"| {name} | {rates[1]:.1f} tok/s | {rates[k]:.1f} tok/s | {speedup:.2f}x | {out[key]:.2f} |")
    if a.out:
        Path(a.out).write_text(json.dumps(out, indent=1))
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
