"""Attention on CPU: SDPA's fused kernel where it is fast, plain matmuls where it is not.

PyTorch's CPU flash-attention backward runs one small oneDNN GEMM per (row, head, block), each
creating its own primitive: on the trainer's shapes (64 rows x 9 heads, 48 queries over 147 keys, bf16,
one thread) forward + backward costs 151 ms per layer against 33 ms for grouped matmul -> softmax ->
matmul under autograd (benchmarks/attention.py; 67 vs 9 ms at 20 queries over 70 keys). Its forward is
slow on few queries too: a decode step (one query per row, 64 rows over 150 keys) costs 9-14 ms per
layer against about 1 ms in matmuls, two thirds of a SmolLM2 decode step (benchmarks/attention.py
--no-grad). So grad-enabled calls (the trainer's) and no-grad calls of at most SHORT_QUERIES queries
(decode steps, speculative verify chunks, no-grad log-probs of short completions) take the matmul
path; longer no-grad passes (prefills, long completions) keep SDPA, which is close in speed there and
never holds the [rows, heads, queries, keys] scores, except inside `training_kernels()`: the trainer's
no-grad passes whose log-probs the loss compares with the training forward's (pi_old, V_old, the
mini-batch's token selections) take the training forward's matmuls whatever their length, so that
unchanged weights give a ratio of exactly 1. On a GPU SDPA's
kernels are the right choice everywhere: `streamrl` attention is selected on CPU only (models/resolve.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar
from typing import Any

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

NAME = "streamrl"
SHORT_QUERIES = 16  # no-grad calls up to this many queries take matmuls (beyond, SDPA: close, less memory)
_TRAINING_KERNELS: ContextVar[bool] = ContextVar("streamrl_training_kernels", default=False)


@contextlib.contextmanager
def training_kernels() -> Iterator[None]:
    """Within (this thread): no-grad calls take the grad-enabled forward's matmul path at any length."""
    token = _TRAINING_KERNELS.set(True)
    try:
        yield
    finally:
        _TRAINING_KERNELS.reset(token)


def matmul_attention(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    mask: torch.Tensor | None,
    scaling: float,
    dropout: float = 0.0,
) -> torch.Tensor:
    """query [B, H, Q, D], key / value [B, Hkv, K, D] with H a multiple of Hkv (grouped-query attention:
    query head h reads kv head h // (H / Hkv), as transformers' repeat_kv lays them out), mask
    [B or 1, 1 or H, Q, K] bool (True = attend) or None (causal, the Q queries being the last Q of the K
    positions) -> [B, H, Q, D].

    The kv heads are never repeated: each kv head's g = H / Hkv query heads are stacked into one
    [g * Q, D] matrix, so the matmuls read K and V once (repeat_kv's copies and their backward reductions
    were ~1/3 of a SmolLM2 attention layer's fwd + bwd on the trainer's shapes: benchmarks/attention.py)."""
    B, H, Q, D = query.shape
    Hkv, K = key.shape[1], key.shape[2]
    if H % Hkv:
        raise ValueError(f"{H} query heads are not a multiple of {Hkv} key/value heads")
    g = H // Hkv
    if mask is None:
        mask = torch.ones(Q, K, dtype=torch.bool, device=query.device).tril(K - Q)
    mask = mask.view(*([1] * (4 - mask.dim())), *mask.shape)  # [b, h, q, k], q / k: Q / K or 1 (broadcast)
    if mask.shape[-1] not in (1, K):
        raise ValueError(f"attention mask covers {mask.shape[-1]} keys, the keys are {K}")
    per_head = mask.shape[1] == H and H > 1
    mask = mask.reshape(mask.shape[0], Hkv if per_head else 1, g if per_head else 1, *mask.shape[-2:])
    q = (query * scaling).reshape(B, Hkv, g * Q, D)
    if torch.is_grad_enabled():
        scores = torch.matmul(q, key.transpose(-1, -2))
    else:  # the same products, bit for bit; key as the left operand is not copied when it is a view of
        # a longer KV-cache buffer (engine/kv_cache.py), which q @ key^T copies: 2x faster when decoding
        scores = torch.matmul(key, q.transpose(-1, -2)).transpose(-1, -2)
    scores = scores.reshape(B, Hkv, g, Q, K)
    # the dtype's lowest value, not -inf: a fully masked row (a left-pad query, never read) stays finite
    # instead of NaN, which would reach the gradients through softmax's backward
    scores = scores.masked_fill(~mask, torch.finfo(scores.dtype).min)
    # in the scores' dtype: torch's CPU softmax accumulates bf16 in fp32 and rounds once (~1e-5 of the
    # probabilities differ by one bf16 ulp from an fp32 softmax + cast), without the two [B, H, Q, K]
    # casts and their backward (33 vs 49 ms per layer)
    probs = torch.softmax(scores, dim=-1).to(value.dtype)
    if dropout > 0.0:
        probs = torch.nn.functional.dropout(probs, p=dropout, training=True)
    return torch.matmul(probs.view(B, Hkv, g * Q, K), value).view(B, H, Q, D)


def rectangles(shapes: list[torch.Size]) -> list[tuple[int, int, slice]]:
    """(rows, columns, the slice of their tokens) of rectangles laid end to end as one sequence, row by
    row (a packed forward's layout, engine/packed.py)."""
    out, start = [], 0
    for r, c in shapes:
        out.append((r, c, slice(start, start + r * c)))
        start += r * c
    return out


def unpack_rows(x: torch.Tensor, rows: int, columns: int, part: slice) -> torch.Tensor:
    """x [H, T, D] of a packed sequence -> the rectangle at `part` as [rows, H, columns, D]."""
    return x[:, part].unflatten(1, (rows, columns)).transpose(0, 1)


class SegmentedMask:
    """The `attention_mask` of a packed forward (engine/packed.py): the queries are several rectangles'
    tokens laid end to end, shapes[i] = (rows, columns) of rectangle i, and masks[i] [rows, 1, columns,
    K_i] what each of its queries sees in its own KV cache (the key / value `attend` receives per
    rectangle)."""

    def __init__(self, shapes: list[torch.Size], masks: list[torch.Tensor]) -> None:
        self.shapes = shapes
        self.masks = masks

    def attend(
        self,
        module: torch.nn.Module,
        query: torch.Tensor,
        keys: list[torch.Tensor],
        values: list[torch.Tensor],
        scaling: float | None,
    ) -> tuple[torch.Tensor, None]:
        """query [1, H, T, D] (T = every rectangle's rows x columns) -> ([1, T, H, D], None)."""
        outs = []
        for (r, c, part), mask, k, v in zip(rectangles(self.shapes), self.masks, keys, values, strict=True):
            out, _ = streamrl_attention(
                module, unpack_rows(query[0], r, c, part), k, v, mask, scaling=scaling
            )
            outs.append(out.reshape(r * c, *out.shape[2:]))
        return torch.cat(outs)[None], None


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
    if isinstance(attention_mask, SegmentedMask):  # a packed forward: key / value are lists
        return attention_mask.attend(module, query, key, value, scaling)  # type: ignore[arg-type]
    exotic = any(kwargs.get(k) is not None for k in ("softcap", "position_bias", "s_aux", "sinks"))
    long_no_grad = (
        not torch.is_grad_enabled() and query.shape[2] > SHORT_QUERIES and not _TRAINING_KERNELS.get()
    )
    if long_no_grad or exotic or kwargs.get("is_causal") is False:
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
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
