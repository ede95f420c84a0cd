"""Model start-up, the same for the trainer, the rollout workers, the trainer's follower ranks and eval:
name -> config and tokenizer files (checked) -> tokenizer -> weights (a Hub model's downloaded only now)
-> fp32 model -> (engines) their compute dtype."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.models.precision import cast_params
from streamrl.models.resolve import load_model, load_tokenizer, resolve_model_dir, resolve_model_files


@dataclass
class StartedModel:
    model_dir: Path
    tokenizer: Any
    model: Any
    resolve_seconds: float  # finding or converting the weights (a first SmolLM2 run converts the GGUF)


def start_model(
    name: str,
    seed: int = 0,
    device: str = "cpu",
    dtype: Any = None,
    chat_template: str = "",
    tokenizer: Any = None,
) -> StartedModel:
    """dtype None keeps the fp32 master weights (the trainer); an engine passes its compute dtype
    (parameters cast; buffers such as RoPE's inv_freq stay fp32, as transformers and vLLM load them).
    chat_template: task_config.chat_template (models/resolve.py load_tokenizer); tokenizer: the one
    load_tokenizer gave for this model and template already (checked before the weights), not loaded again."""
    t0 = time.perf_counter()
    files = resolve_model_files(name, seed)
    resolved = time.perf_counter() - t0
    if tokenizer is None:  # a model without a template: refused before its weights
        tokenizer = load_tokenizer(files, chat_template, name)
    t0 = time.perf_counter()
    model_dir = resolve_model_dir(name, seed)
    resolved += time.perf_counter() - t0
    model = load_model(model_dir, device)
    if dtype is not None:
        model = cast_params(model, dtype)
    return StartedModel(model_dir, tokenizer, model, resolved)
