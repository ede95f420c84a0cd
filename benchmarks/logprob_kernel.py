"""The trainer's log-prob + entropy computation: chunked hand-written backward vs plain autograd, same run.

    python benchmarks/logprob_kernel.py [--model smollm2|tiny] [--rows 2000] [--threads 1] [--repeats 3]
                                        [--prompt-len 100] [--steps 3]

1. Kernel: logits [rows, V] (V = the model's vocabulary) in the trainer's precision (precision auto: bf16
   where the CPU multiplies it natively, else fp32) -> log-probs of sampled tokens and entropy,
   forward + backward of sum(logprob * advantage), best of `repeats`:
     autograd  the plain path (x.float(), log_softmax, gather, entropy under no_grad; autograd backward)
     chunked   streamrl.trainer.fused_logprobs.token_logprobs_entropy
2. Trainer step: Trainer.step on one synthetic batch of the default job's shape (8 prompts x 8 samples,
   random prompt tokens of --prompt-len, completion lengths uniform in 8..max_new_tokens), alternating
   the two implementations (patched into the trainer's modules), median of `steps` each.
Not a test: figures, not assertions (tests/test_fused_logprobs.py checks the values and gradients).
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

from streamrl.models.precision import dtype_name, precision_dtype, resolve_precision
from streamrl.trainer import fused_logprobs, logprobs, shared_prompt

MODELS = {"smollm2": "smollm2-135m-instruct", "tiny": "tiny-random"}
Impl = Callable[..., tuple[torch.Tensor, torch.Tensor | None]]


def autograd_reference(
    logits: torch.Tensor,
    tokens: torch.Tensor,
    temperature: float = 1.0,
    with_entropy: bool = True,
    entropy_grad: bool = True,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The plain autograd path the trainer used before fused_logprobs (same signature)."""
    x = logits.float()
    if temperature > 0 and temperature != 1.0:
        x = x / temperature
    logp = torch.log_softmax(x, dim=-1)
    lp = logp.gather(-1, tokens[..., None]).squeeze(-1)
    ent = None
    if with_entropy:
        with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
            ent = -(logp.exp() * logp).sum(-1)
    return lp, ent


def time_kernel(impl: Impl, x: torch.Tensor, tokens: torch.Tensor, adv: torch.Tensor, repeats: int) -> float:
    best = float("inf")
    for _ in range(repeats):
        leaf = x.detach().clone().requires_grad_(True)
        t0 = time.perf_counter()
        lp, ent = impl(leaf, tokens)
        assert ent is not None
        (lp * adv).sum().backward()
        best = min(best, time.perf_counter() - t0)
    return best


def default_model(key: str) -> tuple[Any, Any, Any]:
    """-> (the default job's config for MODELS[key], its model directory, its fp32 model)."""
    from streamrl.config import load_config
    from streamrl.models import load_model, resolve_model_dir

    cfg = load_config(None, [f"model={MODELS[key]}", "eval.size=0"])
    model_dir = resolve_model_dir(cfg.model, cfg.seed)
    return cfg, model_dir, load_model(model_dir, cfg.device)


def synthetic_batch(vocab: int, prompt_len: int, max_new: int, seed: int) -> Any:
    from streamrl.types import TrainBatch, Trajectory

    rng = random.Random(seed)
    trajs, adv = [], []
    for p in range(8):
        prompt = [rng.randrange(vocab) for _ in range(prompt_len)]
        for s in range(8):
            n = rng.randint(8, max_new)
            trajs.append(
                Trajectory(
                    f"p{p}",
                    f"g{p}",
                    f"s{p}-{s}",
                    prompt,
                    [rng.randrange(vocab) for _ in range(n)],
                    [-1.0] * n,
                    [0] * n,
                    "stop",
                )
            )
            adv.append(rng.choice([-1.0, 1.0]))
    return TrainBatch(trajs, adv)


def patch(impl: Impl) -> None:
    for module in (logprobs, shared_prompt):
        module.token_logprobs_entropy = impl  # type: ignore[attr-defined]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", choices=sorted(MODELS), default="smollm2")
    p.add_argument("--rows", type=int, default=2000)
    p.add_argument("--threads", type=int, default=1, help="torch threads (the async trainer's share here)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--prompt-len", type=int, default=100)
    p.add_argument("--steps", type=int, default=3)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    from streamrl.models import load_tokenizer
    from streamrl.trainer.trainer import Trainer

    cfg, model_dir, model = default_model(a.model)
    vocab = model.config.vocab_size
    impls: dict[str, Impl] = {
        "autograd": autograd_reference,
        "chunked": fused_logprobs.token_logprobs_entropy,
    }

    dtype = precision_dtype(cfg.train.precision, cfg.device)
    x = torch.randn(a.rows, vocab).mul_(3).to(dtype)
    tokens, adv = torch.randint(0, vocab, (a.rows,)), torch.randn(a.rows)
    name = dtype_name(dtype)
    print(f"kernel: {name} logits [{a.rows}, {vocab}], fwd + bwd, {a.threads} thread(s), best of {a.repeats}")
    kern = {name: time_kernel(f, x, tokens, adv, a.repeats) for name, f in impls.items()}
    for name, s in kern.items():
        print(f"  {name:<9} {s:7.3f} s")
    print(f"  autograd / chunked = {kern['autograd'] / kern['chunked']:.2f}x")

    trainer = Trainer.from_config(model, cfg, pad_id=int(load_tokenizer(model_dir).pad_token_id))
    batch = synthetic_batch(vocab, a.prompt_len, cfg.rollout.max_new_tokens, cfg.seed)
    ntok = sum(len(t.prompt_ids) + len(t.completion_ids) for t in batch.trajectories)
    print(
        f"trainer step: {len(batch.trajectories)} samples, {ntok} tokens, "
        f"precision {resolve_precision(cfg.train.precision, cfg.device)}"
    )
    times: dict[str, list[float]] = {name: [] for name in impls}
    for i in range(a.steps + 1):  # the first round warms up (allocator, thread pool)
        for name, f in impls.items():
            patch(f)
            t0 = time.perf_counter()
            trainer.step(batch)
            if i:
                times[name].append(time.perf_counter() - t0)
    patch(fused_logprobs.token_logprobs_entropy)
    med = {name: statistics.median(v) for name, v in times.items()}
    for name, s in med.items():
        print(f"  {name:<9} {s:7.3f} s/step  ({ntok / s:.0f} tok/s)")
    print(f"  autograd / chunked = {med['autograd'] / med['chunked']:.2f}x")


if __name__ == "__main__":
    main()
