"""Attention forward + backward on the trainer's shapes, or forward alone on the engine's: SDPA vs matmul
attention, same run.

    python benchmarks/attention.py [--rows 64] [--queries 48] [--keys 147] [--threads 1] [--repeats 5]
                                   [--no-grad]

SmolLM2-135M's heads (9 query heads, 3 key/value heads, head dim 64), in the precision a run picks (bf16
where the CPU multiplies it natively, else fp32), a causal mask over a
left-padded prompt, fwd + bwd of one layer's attention, best of `repeats`:
  sdpa             torch's scaled_dot_product_attention on repeated kv heads (CPU flash backward)
  matmul+repeat    matmul_attention on kv heads repeated by transformers' repeat_kv (isolates the grouping;
                   streamrl's attention before commit 1ece85a was this path with an fp32 softmax: 73 ms
                   at the default shape)
  matmul grouped   streamrl.models.attention.matmul_attention: each kv head's query heads stacked
The default shape is the shared-prompt trainer's completion pass: 64 rows of 48 queries over a 99-token
prompt cache + 48 keys. `--no-grad`: the forward alone under no_grad, keys and values views of a KV-cache
buffer with spare columns (engine/kv_cache.py), e.g. a decode step: `--no-grad --queries 1 --keys 150`.
Not a test: figures (tests/test_attention.py checks values and gradients).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import repeat_kv

from streamrl.models.attention import matmul_attention
from streamrl.models.precision import dtype_name, precision_dtype

Attn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


def best_time(
    f: Attn, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad: torch.Tensor | None, n: int
) -> float:
    """grad None: the forward alone under no_grad; else forward + backward."""
    best = float("inf")
    for _ in range(n + 1):  # + 1 warm-up
        if grad is None:
            with torch.no_grad():
                t0 = time.perf_counter()
                f(q, k, v)
        else:
            leaves = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
            t0 = time.perf_counter()
            (f(*leaves).float() * grad).sum().backward()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rows", type=int, default=64)
    p.add_argument("--queries", type=int, default=48)
    p.add_argument("--keys", type=int, default=147)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--no-grad", action="store_true", help="forward only, on KV-cache views (the engine)")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    B, H, Hkv, Q, K, D = a.rows, 9, 3, a.queries, a.keys, 64
    g = H // Hkv
    dtype = precision_dtype("auto", "cpu")
    q = torch.randn(B, Q, H, D).transpose(1, 2).to(dtype)  # [B, H, Q, D] as a q_proj view
    spare = 256 if a.no_grad else 0  # the engine's cache: views of the first K of K + spare columns
    k, v = (torch.randn(B, Hkv, K + spare, D).to(dtype)[:, :, :K] for _ in range(2))
    mask = torch.ones(Q, K, dtype=torch.bool).tril(K - Q).expand(B, 1, Q, K).clone()
    mask[: B // 2, :, :, :5] = False  # half the rows left-padded by 5 keys
    grad = None if a.no_grad else torch.randn(B, H, Q, D)
    impls: dict[str, Attn] = {
        "sdpa": lambda q, k, v: F.scaled_dot_product_attention(
            q, repeat_kv(k, g), repeat_kv(v, g), attn_mask=mask, scale=D**-0.5
        ),
        "matmul+repeat": lambda q, k, v: matmul_attention(q, repeat_kv(k, g), repeat_kv(v, g), mask, D**-0.5),
        "matmul grouped": lambda q, k, v: matmul_attention(q, k, v, mask, D**-0.5),
    }
    what = "fwd (no grad)" if a.no_grad else "fwd + bwd"
    print(
        f"one layer {what}: [{B} rows, {H}/{Hkv} heads, {Q} queries, {K} keys, dim {D}], "
        f"{dtype_name(dtype)}, "
        f"{a.threads} thread(s)"
    )
    times = {name: best_time(f, q, k, v, grad, a.repeats) for name, f in impls.items()}
    base = times["matmul grouped"]
    for name, t in times.items():
        print(f"  {name:<15} {t * 1e3:7.1f} ms   {t / base:5.2f}x the grouped time")


if __name__ == "__main__":
    main()
