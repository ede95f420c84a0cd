"""What a model directory must hold before transformers reads it, checked from its files alone (no weights
read, nothing run): config.json naming an architecture transformers has built in as a causal LM (custom
code, `auto_map`, would make transformers ask whether to run it), and the files a tokenizer is built from.
Each refusal is one line naming the model as given (`model=...`) and the way out."""

from __future__ import annotations

import json
from pathlib import Path

# the files transformers builds a tokenizer from (tokenization_utils_tokenizers.py): a tokenizers
# serialization, Mistral's tekken.json, BPE vocab.json (merges.txt beside it, or generated), WordPiece
# vocab.txt; besides these any sentencepiece or tiktoken *.model and *.tiktoken file
TOKENIZER_FILES = ("tokenizer.json", "tekken.json", "vocab.json", "vocab.txt")
TOKENIZER_SUFFIXES = (".model", ".tiktoken")


def causal_lm_types() -> set[str]:
    """The model_type values AutoModelForCausalLM loads with transformers' own code."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return set(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def has_tokenizer_files(path: Path) -> bool:
    return any((path / f).is_file() for f in TOKENIZER_FILES) or any(
        p.suffix in TOKENIZER_SUFFIXES and p.is_file() for p in path.iterdir()
    )


def check_model_files(path: Path, name: str) -> None:
    """ValueError (one line) when the model in directory `path`, given as `name`, cannot be loaded with
    transformers' built-in code and tokenizer files. A config.json that is not JSON is left to
    transformers, whose error names the file."""
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, ValueError):
        config = {}
    config = config if isinstance(config, dict) else {}
    model_type = config.get("model_type")
    built_in = isinstance(model_type, str) and model_type in causal_lm_types()
    if config.get("auto_map") and not built_in:  # a built-in model_type loads without the custom code
        raise ValueError(
            f"model={name}: its config.json names custom code (auto_map); streamrl loads only "
            "architectures transformers has built in"
        )
    if isinstance(model_type, str) and not built_in:
        import transformers

        raise ValueError(
            f"model={name}: its config.json has model_type '{model_type}', which transformers "
            f"{transformers.__version__} does not load as a causal language model (AutoModelForCausalLM)"
        )
    if not has_tokenizer_files(path):
        raise ValueError(
            f"model={name}: no tokenizer files (tokenizer.json, tokenizer.model, vocab.json + merges.txt, "
            "tekken.json) next to its config.json: copy them from the base model"
        )
