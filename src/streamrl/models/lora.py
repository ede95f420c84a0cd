"""LoRA via PEFT: train low-rank adapters only; engines and checkpoints get merged plain weights.

`apply_lora` injects adapters into the model in place (the same module object, so a colocated engine
that shares it samples from the adapted policy). `save_adapter` writes them in PEFT's own format
(adapter_config.json + adapter_model.safetensors, what `PeftModel.from_pretrained(base, path)` loads),
`load_adapter` reads that format back (resume). `merged_state` is the state dict a plain
transformers model of the same architecture loads: W + (alpha / r) * B @ A for every adapted linear
(transposed for transformers' Conv1D, GPT-2's layers, whose weight is [in, out]: PEFT's delta does it),
other weights as they are, adapter tensors dropped. It is computed without touching the live weights
(no merge/unmerge round trip that could race with an engine reading them).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from streamrl.run_dirs import STATE_DIR, STATE_PREFIX

ADAPTER_DIR = "adapter"  # a checkpoint's PEFT adapter, in a subdirectory (see save_adapter)
# a PeftModel's state-dict prefix: PEFT (and transformers' own adapter saving) store keys under it
PEFT_PREFIX = "base_model.model."


def apply_lora(model: Any, rank: int, alpha: float, targets: tuple[str, ...], dropout: float = 0.0) -> Any:
    """Inject LoRA adapters into `targets` (module name suffixes); freeze everything else. -> model."""
    from peft import LoraConfig, inject_adapter_in_model
    from transformers.pytorch_utils import Conv1D

    check_targets(model, targets)
    conv = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, Conv1D)}
    config = LoraConfig(
        r=rank,
        lora_alpha=alpha,
        target_modules=list(targets),
        lora_dropout=dropout,
        fan_in_fan_out=set(targets) <= conv,  # Conv1D's weight is [in, out] (PEFT would warn and set it)
        task_type="CAUSAL_LM",
        base_model_name_or_path=getattr(model.config, "name_or_path", None) or None,
    )
    inject_adapter_in_model(config, model)
    for name, p in model.named_parameters():
        p.requires_grad_("lora_" in name)
    return model


def check_targets(model: Any, targets: tuple[str, ...], resumed: Path | None = None) -> None:
    """One line (ValueError) when a target names no linear layer of `model` (nn.Linear or transformers'
    Conv1D), or names its output embedding while the model ties it to the input embedding (its weights
    may be on the meta device: preflight checks the targets before any weights load,
    check_targets_on_meta). resumed: the run directory of a resume, whose targets are its saved ones."""
    names = {n.rsplit(".", 1)[-1] for n, m in model.named_modules() if isinstance(m, _linear_types())}
    missing = [t for t in targets if t not in names]
    if missing:
        raise ValueError(
            f"config key 'train.lora_targets': no linear layer named {missing} in this model; "
            f"its linear layers are {sorted(names)}"
        )
    _refuse_tied_head(model, targets, resumed)


def _linear_types() -> tuple[type, ...]:
    """The layers PEFT's LoRA adapts as linear: nn.Linear, and transformers' Conv1D (GPT-2's attention
    and MLP: a linear layer whose weight is stored transposed, [in, out]; PEFT sets fan_in_fan_out)."""
    from transformers.pytorch_utils import Conv1D

    return (torch.nn.Linear, Conv1D)


def _refuse_tied_head(model: Any, targets: tuple[str, ...], resumed: Path | None) -> None:
    """An adapter on a tied output embedding: the merged weights would give the LM head W + BA and the
    embedding W, one tensor in every engine and checkpoint, which keeps only one of them.

    A run that trained one (before this was refused) cannot resume: its saved adapters and optimizer
    state are those targets', which a resume keeps (config.RESUME_FIXED). What it trained is in its
    merged weights, which hold the LM head and the embedding apart (transformers loads them untied): a
    new run starts from them."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    embed = model.get_input_embeddings() if hasattr(model, "get_input_embeddings") else None
    if head is None or embed is None or head.weight is not embed.weight:
        return
    name = next(n for n, m in model.named_modules() if m is head).rsplit(".", 1)[-1]
    if name not in targets:
        return
    tied = "which this model ties to its input embedding (tie_word_embeddings): the merged weights cannot"
    if resumed is None:
        raise ValueError(
            f"config key 'train.lora_targets': {name!r} is the output embedding, {tied} hold both; leave it "
            "out of train.lora_targets, or train a model with untied embeddings"
        )
    merged = merged_weights(resumed)
    start = f"model={merged}" if merged else "its base model (the run saved no merged weights)"
    raise ValueError(
        f"resume: config key 'train.lora_targets' in {resumed}/config.yaml names {name!r}, the output "
        f"embedding, {tied} hold both, and a resumed run keeps its targets; start a new run from {start} "
        f"with {name!r} left out of train.lora_targets"
    )


def merged_weights(run_dir: Path) -> Path | None:
    """A run's newest plain model directory, its LoRA adapters merged in: its exported checkpoint/, else
    the model/ of its newest saved state (state/step-N/model, loop/state.py); None when it has neither."""
    if (run_dir / "checkpoint" / "config.json").is_file():
        return run_dir / "checkpoint"
    states = [p.parent for p in (run_dir / STATE_DIR).glob(f"{STATE_PREFIX}*/model/config.json")]
    steps = [p for p in states if p.parent.name.removeprefix(STATE_PREFIX).isdigit()]
    return max(steps, key=lambda p: int(p.parent.name.removeprefix(STATE_PREFIX)), default=None)


def check_targets_on_meta(model_config: Any, targets: tuple[str, ...], resumed: Path | None = None) -> None:
    """check_targets on the model's layers built on the meta device from its config: no weights read."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(model_config)
    check_targets(model, targets, resumed)


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


def save_adapter(model: Any, path: str | Path) -> None:
    """The adapters in PEFT's format in directory `path`, fp32 as trained (a few MB).

    `path` should not be the merged model's own directory: transformers' from_pretrained treats a
    directory holding adapter_config.json as an adapter and loads its base model instead."""
    from peft import get_peft_model_state_dict
    from safetensors.torch import save_file

    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    model.peft_config["default"].save_pretrained(str(out))
    state = {PEFT_PREFIX + k: v.detach().contiguous() for k, v in get_peft_model_state_dict(model).items()}
    save_file(state, str(out / "adapter_model.safetensors"), metadata={"format": "pt"})


def load_adapter(model: Any, path: str | Path) -> None:
    """Load adapters saved by `save_adapter` into a model with the same adapters injected."""
    from peft import set_peft_model_state_dict
    from safetensors.torch import load_file

    f = Path(path) / "adapter_model.safetensors"
    if not f.is_file():
        raise FileNotFoundError(f"{f} not found: a LoRA model's saved state keeps its adapters there")
    loaded = set_peft_model_state_dict(model, load_file(str(f)))
    missing = [k for k in loaded.missing_keys if ".lora_" in k]
    if loaded.unexpected_keys or missing:
        raise ValueError(
            f"{f}: adapter tensors do not match this model ({(loaded.unexpected_keys or missing)[:3]}); "
            "resume with the run's own train.lora_rank and train.lora_targets"
        )
