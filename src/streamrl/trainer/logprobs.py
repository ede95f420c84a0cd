"""Log-probs of the sampled completion tokens under a model, at the sampling temperature."""

from __future__ import annotations

from typing import Any

import torch

from streamrl.trainer.batching import MicroBatch
from streamrl.trainer.fused_logprobs import token_logprobs_entropy
from streamrl.trainer.shared_prompt import shared_forward


def completion_forward(
    model: Any,
    mb: MicroBatch,
    temperature: float = 1.0,
    return_entropy: bool = False,
    entropy_grad: bool = False,
    return_hidden: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """One forward -> (logprobs [B, C], entropy [B, C] or None, hidden [B, C, H] or None).

    hidden[:, j] is the last layer's hidden state at position P - 1 + j: the state before completion
    token j is generated (what a value head reads). Only the C + 1 last positions go through the LM head.
    """
    B, C = mb.completion_ids.shape
    dev = next(model.parameters()).device
    if mb.prefix_ids is not None:  # shared prompt: one prefix forward per distinct prompt
        return shared_forward(model, mb, temperature, return_entropy, entropy_grad, return_hidden)
    index = mb.packed_index.to(dev) if mb.packed_index is not None else None
    out = model(
        input_ids=mb.input_ids.to(dev),
        # packed: None, so transformers derives the block-diagonal mask from the position_ids restarts
        attention_mask=mb.attention_mask.to(dev) if mb.attention_mask is not None else None,
        position_ids=mb.position_ids.to(dev),
        use_cache=False,
        logits_to_keep=index.flatten() if index is not None else C + 1,
        output_hidden_states=return_hidden,
    )
    if index is not None:
        logits = out.logits.view(B, C, -1)  # the LM head ran on the B*C predicting positions only
    else:
        logits = out.logits[:, :-1, :]  # position P-1+j predicts completion token j
    return _finish(logits, mb, temperature, return_entropy, entropy_grad, out, return_hidden, index)


def _finish(
    logits: torch.Tensor,
    mb: MicroBatch,
    temperature: float,
    return_entropy: bool,
    entropy_grad: bool,
    out: Any,
    return_hidden: bool,
    index: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """logits [B, C, V] (position j predicts completion token j) -> (logprobs, entropy, hidden)."""
    C = mb.completion_ids.shape[1]
    tokens = mb.completion_ids.to(logits.device)
    lp, entropy = token_logprobs_entropy(logits, tokens, temperature, return_entropy, entropy_grad)
    hidden = None
    if return_hidden:
        last = out.hidden_states[-1]
        hidden = last[0, index] if index is not None else last[:, -(C + 1) : -1, :]
    return lp, entropy, hidden


def completion_logprobs(
    model: Any,
    mb: MicroBatch,
    temperature: float = 1.0,
    return_entropy: bool = False,
    entropy_grad: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """-> (logprobs [B, C], entropy [B, C] or None). Only the C + 1 last positions go through the LM head.
    The entropy carries a gradient only with entropy_grad (an entropy bonus needs it)."""
    lp, entropy, _ = completion_forward(model, mb, temperature, return_entropy, entropy_grad)
    return lp, entropy
