"""The LM head applied to a decoder's hidden states, as the model's own forward applies it.

Speculative rollouts (engine/speculative.py) and the trainer's shared-prompt forward
(trainer/shared_prompt.py) run the decoder and then the head only on the positions they need, so they
compute logits outside the model's forward: `head_logits` repeats what the forwards of the supported
families do after the head (Gemma's final soft-capping, Cohere's and Granite's logit scales), and
`check_head` refuses a model whose forward does something else.
"""

from __future__ import annotations

from typing import Any

import torch


def head_logits(model: Any, hidden: torch.Tensor) -> torch.Tensor:
    """hidden [..., H] (the decoder's output) -> logits [..., V] as the model's forward computes them:
    its LM head, then Gemma's final soft-capping, Cohere's logit scale or Granite's logit divisor where
    the config has one (`check_head` makes sure that is all the forward does)."""
    logits = model.get_output_embeddings()(hidden)
    config = getattr(model, "config", None)
    config = config.get_text_config() if hasattr(config, "get_text_config") else config  # multimodal
    cap = getattr(config, "final_logit_softcapping", None)
    if cap:
        logits = torch.tanh(logits / cap) * cap
    scale = getattr(config, "logit_scale", None)
    if isinstance(scale, (int, float)) and scale != 1:
        logits = logits * scale
    divisor = getattr(config, "logits_scaling", None)
    if isinstance(divisor, (int, float)) and divisor != 1:
        logits = logits / divisor
    return logits


@torch.no_grad()
def check_head(model: Any, device: Any, setting: str, user: str, fix: str) -> None:
    """Once per model: `head_logits` of the decoder's output must be the model's own logits (on three
    tokens, in eval mode), or `user` would compute another distribution than the model's forward.
    Raises ValueError naming the setting, the model and the fix otherwise."""
    if getattr(model, "_streamrl_head_checked", False):
        return
    training = model.training
    model.eval()
    try:
        ids = torch.arange(1, 4, device=device)[None]
        own = model(input_ids=ids, use_cache=False).logits[0, -1].float()
        hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0, -1]
        ours = head_logits(model, hidden).float()
    finally:
        model.train(training)
    if not float((own - ours).abs().max()) <= 1e-3 * float(own.abs().max()) + 1e-6:
        raise ValueError(
            f"{setting}: {type(model).__name__} computes its logits from the decoder's output in a way "
            f"{user} cannot reproduce; {fix}"
        )
    model._streamrl_head_checked = True
