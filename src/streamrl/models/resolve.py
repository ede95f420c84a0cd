"""Resolve a model name to a local HF directory, and load model and tokenizer from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamrl.models import smollm2, tiny
from streamrl.models.cache import cache_dir

KNOWN_MODELS = ("smollm2-135m-instruct", "tiny-random")


def resolve_model_dir(name: str, seed: int = 0) -> Path:
    """'smollm2-135m-instruct' | 'tiny-random' | a local HF model directory -> directory path."""
    if name == "smollm2-135m-instruct":
        target = cache_dir() / "models" / "smollm2-135m-instruct"
        return target if (target / "config.json").exists() else smollm2.convert(target)
    if name == "tiny-random":
        target = cache_dir() / "models" / f"tiny-random-seed{seed}"
        return target if (target / "config.json").exists() else tiny.build(target, seed=seed)
    path = Path(name).expanduser()
    if (path / "config.json").is_file():
        return path
    raise ValueError(
        f"unknown model '{name}': use one of {', '.join(KNOWN_MODELS)} or a local HF model directory "
        "(a folder with config.json)"
    )


def load_tokenizer(model_dir: Path) -> Any:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(model_dir: Path, device: str = "cpu") -> Any:
    """Load fp32 weights (mixed precision is the trainer's autocast choice, not the storage dtype)."""
    import torch
    from transformers import AutoModelForCausalLM

    from streamrl.models.attention import register

    # CPU: the trainer's backward avoids the CPU flash-attention kernel (models/attention.py)
    attn = register() if str(device).startswith("cpu") else "sdpa"
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation=attn)
    return model.to(device)
