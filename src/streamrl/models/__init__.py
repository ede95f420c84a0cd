"""Model resolution: names -> (model, tokenizer)."""

from streamrl.models.resolve import KNOWN_MODELS, load_model, load_tokenizer, resolve_model_dir

__all__ = ["KNOWN_MODELS", "load_model", "load_tokenizer", "resolve_model_dir"]
