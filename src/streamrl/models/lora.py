"""LoRA via PEFT: train low-rank adapters only; engines and checkpoints get merged plain weights.

`apply_lora` injects adapters into the model in place (the same module object, so a colocated engine
that shares it samples from the adapted policy). `merged_state` is the state dict a plain
transformers model of the same architecture loads: W + (alpha / r) * B @ A for every adapted linear,
other weights as they are, adapter tensors dropped. It is computed without touching the live weights
(no merge/unmerge round trip that could race with an engine reading them).
"""

from __future__ import annotations

from typing import Any

import torch

ADAPTER_FILE = "adapter_state.pt"


def apply_lora(model: Any, rank: int, alpha: float, targets: tuple[str, ...], dropout: float = 0.0) -> Any:
    """Inject LoRA adapters into `targets` (module name suffixes); freeze everything else. -> model."""
    from peft import LoraConfig, inject_adapter_in_model

    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    missing = [t for t in targets if t not in names]
    if missing:
        raise ValueError(
            f"config key 'train.lora_targets': no linear layer named {missing} in this model; "
            f"its linear layers are {sorted(names)}"
        )
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=dropout)
    inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def is_lora(model: Any) -> bool:
    return any("lora_" in n for n, _ in model.named_parameters())


@torch.no_grad()
def merged_state(model: Any) -> dict[str, torch.Tensor]:
    """Plain-model state dict with every adapter folded into its base weight (a new tensor)."""
    from peft.tuners.lora import LoraLayer

    deltas: dict[str, torch.Tensor] = {}
    for name, module in model.named_modules():
        if isinstance(module, LoraLayer):
            for adapter in module.active_adapters:
                d = module.get_delta_weight(adapter)
                deltas[f"{name}.weight"] = deltas.get(f"{name}.weight", 0) + d
    out: dict[str, torch.Tensor] = {}
    for key, value in model.state_dict().items():
        if ".lora_" in key:
            continue
        plain = key.replace(".base_layer.", ".")
        out[plain] = value + deltas[plain].to(value.dtype) if plain in deltas else value
    return out


def adapter_state(model: Any) -> dict[str, torch.Tensor]:
    """Only the adapter tensors (what a resume needs besides the frozen base)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items() if ".lora_" in k}
