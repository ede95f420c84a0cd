"""Casting a model's weights to a compute dtype without touching its buffers."""

from __future__ import annotations

import torch


def cast_params(module: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """Cast the parameters of `module` to `dtype` in place; buffers keep their dtype.

    `module.to(torch.bfloat16)` would also round RoPE's `inv_freq` buffer to bf16 (8 bits of mantissa):
    with SmolLM2's rotary base the angle moves by up to 0.14 rad at position 100 and 1.4 rad at position
    1000, a long-context disagreement with the trainer's fp32 RoPE (on the ~100-token default job the
    engine/trainer log-prob gap was the same either way). transformers and vLLM keep it fp32 in bf16 too.
    Tied parameters stay tied (each Parameter is cast once)."""
    for p in module.parameters():
        if p.is_floating_point() and p.dtype != dtype:
            p.data = p.data.to(dtype)
    return module
