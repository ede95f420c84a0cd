"""The CPU trainer's Llama path: fused layers (models/fused_layers.py) on compute weights.

`install` (models/resolve.py, CPU only) swaps the classes of a Llama model's RMSNorm, MLP and attention
modules and of its LM head for the subclasses here. They run transformers' own forward unless the
trainer is inside `compute_weights(model, dtype)` (models/compute_weights.py: the GEMM weights cast
once per optimizer step, q | k | v and gate | up concatenated, so each layer runs two input GEMMs
instead of five). Then RMSNorm returns the compute dtype directly (the projections would cast its fp32
output anyway: five casts per layer and their backwards), RoPE keeps the queries' dtype, and the MLP
runs silu(gate) * up on the fused projection's output. The forward computes the same values as
transformers' under autocast (tests/test_fused_layers.py).

Outside the context (decoding, no-grad passes, LoRA, data parallel, GPU) nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.llama import modeling_llama as llama

from streamrl.models.cache_kwarg import cache_kwarg_of
from streamrl.models.compute_weights import Fused, master_linear
from streamrl.models.fused_layers import rms_norm, rope, swiglu


class FusedRMSNorm(llama.LlamaRMSNorm, Fused):
    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self._cw is None:
            return super().forward(hidden_states)
        return rms_norm(hidden_states, self.weight, self.variance_epsilon, self._dtype)


class FusedLlamaMLP(llama.LlamaMLP, Fused):
    def _groups(self) -> dict[str, list[torch.Tensor]]:
        return {"gate_up": [self.gate_proj.weight, self.up_proj.weight], "down": [self.down_proj.weight]}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cw = self._cw
        if cw is None:
            return super().forward(x)
        # transposed activations: gate and up are contiguous row blocks of [2I, N] (same GEMM speed)
        lead = x.shape[:-1]
        gate_up = master_linear(x, cw["gate_up"], self.gate_proj.weight, self.up_proj.weight, y_t=True)
        y = master_linear(swiglu(gate_up), cw["down"], self.down_proj.weight, x_t=True)
        return y.view(*lead, -1)


class FusedLlamaAttention(llama.LlamaAttention, Fused):
    def _groups(self) -> dict[str, list[torch.Tensor]]:
        qkv = [self.q_proj.weight, self.k_proj.weight, self.v_proj.weight]
        return {"qkv": qkv, "o": [self.o_proj.weight]}

    @property
    def _split(self) -> list[int]:
        return [self.q_proj.weight.shape[0], self.k_proj.weight.shape[0], self.v_proj.weight.shape[0]]

    def forward(  # the signature of transformers' LlamaAttention.forward
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        past_key_values: Any = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        # the KV cache under either name: `cache` since transformers 5.24, `past_key_values` before
        cache = cache if cache is not None else past_key_values
        cw = self._cw
        if cw is None:
            kwargs[cache_kwarg_of(llama.LlamaAttention)] = cache
            return super().forward(hidden_states, position_embeddings, attention_mask, **kwargs)
        assert position_embeddings is not None
        B, T, _ = hidden_states.shape
        D = self.head_dim
        qkv = master_linear(
            hidden_states, cw["qkv"], self.q_proj.weight, self.k_proj.weight, self.v_proj.weight
        )
        q, k, v = (t.view(B, T, -1, D).transpose(1, 2) for t in qkv.split(self._split, -1))
        q, k = rope(q, k, *position_embeddings)
        if cache is not None:
            k, v = cache.update(k, v, self.layer_idx)
        attention: Callable[..., Any] = ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, llama.eager_attention_forward
        )
        out, weights = attention(
            self,
            q,
            k,
            v,
            attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout,
            scaling=self.scaling,
            **kwargs,
        )
        return master_linear(out.reshape(B, T, -1), cw["o"], self.o_proj.weight), weights


class FusedHead(torch.nn.Linear, Fused):
    """The LM head (no bias; its weight may be tied to the embedding)."""

    def _groups(self) -> dict[str, list[torch.Tensor]]:
        return {"w": [self.weight]}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cw = self._cw
        return super().forward(x) if cw is None else master_linear(x, cw["w"], self.weight)


SWAPS: dict[type, type] = {
    llama.LlamaRMSNorm: FusedRMSNorm,
    llama.LlamaMLP: FusedLlamaMLP,
    llama.LlamaAttention: FusedLlamaAttention,
}


def install(model: Any) -> bool:
    """Swap the fused classes into a transformers Llama model in place (other architectures, biased
    projections or an activation other than SiLU: untouched); -> whether it was swapped."""
    cfg = getattr(model, "config", None)
    if not isinstance(model, llama.LlamaPreTrainedModel) or cfg is None:
        return False
    if cfg.hidden_act != "silu" or getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return False
    for m in model.modules():
        if type(m) in SWAPS:
            m.__class__ = SWAPS[type(m)]
    head = model.get_output_embeddings()
    if type(head) is torch.nn.Linear and head.bias is None:
        head.__class__ = FusedHead
    return True
