"""Resolve a model name to a local HF directory, and load model and tokenizer from it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamrl.models import smollm2, tiny
from streamrl.models.cache import models_dir
from streamrl.models.hub import hub_files, hub_weights, split_id
from streamrl.models.model_files import check_model_files, check_weight_files
from streamrl.models.quiet import no_progress_bars
from streamrl.models.weight_files import weight_set

KNOWN_MODELS = ("smollm2-135m-instruct", "tiny-random")


def _model_files(name: str, seed: int) -> tuple[Path, bool]:
    """(the directory with the model's config and tokenizer, checked; whether it is a Hub snapshot)."""
    local, hub = Path(name).expanduser(), False
    if name == "smollm2-135m-instruct":
        target = smollm2.converted_dir()
        path = target if (target / "config.json").exists() else smollm2.convert(target)
    elif name == "tiny-random":
        # v2: the chat template renders tools; a cached build with the older template is not reused
        target = models_dir() / f"tiny-random-v2-seed{seed}"
        path = target if (target / "config.json").exists() else tiny.build(target, seed=seed)
    elif (local / "adapter_config.json").is_file() and not (
        (local / "config.json").is_file() and weight_set(local)  # a whole model beside an adapter's config
    ):
        raise ValueError(_adapter_not_a_model(name, local))
    elif (local / "config.json").is_file():
        path = local
    elif (local / "checkpoint" / "config.json").is_file():  # a run's directory: its export is the model
        raise ValueError(
            f"model '{name}': a streamrl run directory; the model it exported is model={local / 'checkpoint'}"
        )
    elif local.exists() or name.startswith((".", "/", "~")) or split_id(name) is None:
        raise ValueError(
            f"model '{name}': not a model directory (no config.json there); use one of "
            f"{', '.join(KNOWN_MODELS)}, a local HF model directory or a Hugging Face Hub id (org/name)"
        )
    else:
        path, hub = hub_files(name), True
    check_model_files(path, name, weights=not hub)  # a Hub model's: once downloaded (resolve_model_dir)
    return path, hub


def _adapter_not_a_model(name: str, adapter: Path) -> str:
    """A PEFT adapter directory (a LoRA run's RUN/checkpoint/adapter) given as the model."""
    if (adapter.parent / "config.json").is_file():  # a checkpoint's adapter: its merged model beside it
        return (
            f"model '{name}': a PEFT adapter (adapter_config.json), not a model; the merged model it was "
            f"saved with is model={adapter.parent}"
        )
    return (
        f"model '{name}': a PEFT adapter (adapter_config.json), not a model: give its base model with the "
        "adapter merged in (PEFT's merge_and_unload, then save_pretrained)"
    )


def resolve_model_files(name: str, seed: int = 0) -> Path:
    """The directory holding the model's config.json and tokenizer, checked (models/model_files.py), with
    no weights read or downloaded: a Hub model's snapshot before its weights (models/hub.py)."""
    return _model_files(name, seed)[0]


def resolve_model_dir(name: str, seed: int = 0) -> Path:
    """'smollm2-135m-instruct' | 'tiny-random' | a local HF model directory | a Hugging Face Hub id
    ('org/name', 'org/name@revision': models/hub.py) -> directory path, with the weights."""
    path, hub = _model_files(name, seed)
    if hub:  # its weights: downloaded or found in the cache, then checked as a local directory's are
        path = hub_weights(name, path)
        check_weight_files(path, name)
    return path


def chat_template_file(chat_template: str) -> Path:
    """task_config.chat_template as an absolute path; ValueError (one line) when there is no such file."""
    path = Path(chat_template).expanduser()
    if not path.is_file():
        raise ValueError(
            f"config key 'task_config.chat_template': no file '{chat_template}' (a Jinja chat template)"
        )
    return path.resolve()


def load_tokenizer(model_dir: Path, chat_template: str = "", name: str = "") -> Any:
    """The model's tokenizer; `chat_template` (task_config.chat_template): a Jinja file that replaces
    the model's template. ValueError (one line, naming the model as `name` when given) for a missing
    file, or a model with no template. Custom code is never run (models/model_files.py refuses it)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=False)
    if chat_template:
        tok.chat_template = chat_template_file(chat_template).read_text()
    elif not tok.chat_template:
        raise ValueError(
            f"model={name or model_dir} has no chat template (a base model): give it one with "
            "task_config.chat_template=FILE.jinja (docs/data.md#base-models), or use an instruct model"
        )
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model_config(model_dir: Path) -> Any:
    """The model's transformers config alone (its context length, ...): no weights are read."""
    from transformers import AutoConfig

    return AutoConfig.from_pretrained(model_dir, trust_remote_code=False)


def load_model(model_dir: Path, device: str = "cpu") -> Any:
    """Load fp32 weights (mixed precision is the trainer's autocast choice, not the storage dtype)."""
    import torch
    from transformers import AutoModelForCausalLM

    from streamrl.models.attention import register
    from streamrl.models.fused_llama import install

    # CPU: the trainer's backward avoids the CPU flash-attention kernel (models/attention.py)
    cpu = str(device).startswith("cpu")
    attn = register() if cpu else "sdpa"
    with no_progress_bars():
        model = AutoModelForCausalLM.from_pretrained(
            model_dir, dtype=torch.float32, attn_implementation=attn, trust_remote_code=False
        )
    if cpu:  # the trainer's fused layers on compute weights (models/fused_llama.py); GPU: transformers'
        install(model)
    return model.to(device)
