"""Attention for training on CPU: SDPA's fused kernel where it is fast, plain matmuls where it is not.

PyTorch's CPU flash-attention backward runs one small oneDNN GEMM per (row, head, block), each
creating its own primitive: on the trainer's shapes (64 rows x 9 heads, ~20 queries over ~70 keys, bf16)
forward + backward costs 78 ms per layer against 28 ms for matmul -> softmax -> matmul under autograd
(benchmarks/attention.py). Its forward alone is the fastest, so only grad-enabled multi-token calls
(the trainer's) take the matmul path; decoding and no-grad passes keep SDPA. On a GPU SDPA's kernels are
the right choice everywhere: `streamrl` attention is selected on CPU only (models/resolve.py).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import repeat_kv, sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "streamrl"


def matmul_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
) -> torch.Tensor:
    """query [B, H, Q, D], key / value [B, H, K, D] (heads already repeated), mask [B or 1, 1 or H, Q, K]
    bool (True = attend) or None (causal, the Q queries being the last Q of the K positions)
    -> [B, H, Q, D]. Softmax in fp32, like transformers' eager attention."""
    q_len, k_len = query.shape[-2], key.shape[-2]
    if mask is None:
        mask = torch.ones(q_len, k_len, dtype=torch.bool, device=query.device).tril(k_len - q_len)
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling
    # the dtype's lowest value, not -inf: a fully masked row (a left-pad query, never read) stays finite
    # instead of NaN, which would reach the gradients through softmax's backward
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    if dropout > 0.0:
        probs = torch.nn.functional.dropout(probs, p=dropout, training=True)
    return torch.matmul(probs, value)


def streamrl_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers attention-function signature; returns ([B, Q, H, D], None) like SDPA's."""
    exotic = any(kwargs.get(k) is not None for k in ("softcap", "position_bias", "s_aux", "sinks"))
    if not torch.is_grad_enabled() or query.shape[2] == 1 or exotic or kwargs.get("is_causal") is False:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    groups = getattr(module, "num_key_value_groups", 1)
    key, value = repeat_kv(key, groups), repeat_kv(value, groups)
    if attention_mask is not None and attention_mask.dtype != torch.bool:
        attention_mask = attention_mask == 0  # an additive float mask: 0 = attend
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    out = matmul_attention(query, key, value, attention_mask, scale, dropout)
    return out.transpose(1, 2).contiguous(), None


def register() -> str:
    """Make `attn_implementation="streamrl"` known to transformers (idempotent); returns the name."""
    AttentionInterface.register(NAME, streamrl_attention)
    AttentionMaskInterface.register(NAME, sdpa_mask)
    return NAME
