"""What a model directory must hold before transformers reads it, checked from its files alone (no weights
read, nothing run): a config.json that is JSON, naming an architecture transformers has built in as a
causal LM (custom code, `auto_map`, would make transformers ask whether to run it), the files a tokenizer
is built from, and a whole set of weights (models/weight_files.py: every shard there, each safetensors
header read). Each refusal is one line naming the model as given (`model=...`) and the way out."""

from __future__ import annotations

import json
from pathlib import Path

from streamrl.brief import brief_error
from streamrl.models.weight_files import weights_problem

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


def check_weight_files(path: Path, name: str) -> None:
    """ValueError (one line) when directory `path` lacks a whole set of weights for model `name`."""
    problem = weights_problem(path)
    if problem:
        raise ValueError(f"model={name}: {problem}")


def read_config(path: Path, name: str) -> dict:
    """The config.json of directory `path` (model `name`); ValueError (one line) when it is not a JSON
    object."""
    file = path / "config.json"
    try:
        config = json.loads(file.read_text())
    except OSError as e:
        raise ValueError(f"model={name}: {file} cannot be read ({e.strerror or e})") from None
    except ValueError as e:  # JSONDecodeError, or not UTF-8
        reason = brief_error(e, first_line=True)
        raise ValueError(
            f"model={name}: {file} is not valid JSON ({reason}): restore it from the base model"
        ) from None
    if not isinstance(config, dict):
        raise ValueError(f"model={name}: {file} is not a JSON object: restore it from the base model")
    return config


def check_model_files(path: Path, name: str, weights: bool = True) -> None:
    """ValueError (one line) when the model in directory `path`, given as `name`, cannot be loaded with
    transformers' built-in code and tokenizer files, or (`weights`) lacks a whole set of weights. A Hub
    snapshot is checked with weights=False, before its weights are downloaded (models/hub.py)."""
    config = read_config(path, name)
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
    if weights:
        check_weight_files(path, name)
