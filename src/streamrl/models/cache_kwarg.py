"""The name under which a transformers model takes and returns its KV cache.

transformers renamed `past_key_values` to `cache` in the models' forward arguments and outputs (5.24;
the old name is deprecated); vLLM's CPU build pins an older transformers, so both names stay in use.
The engine and the trainer hand a model its cache through `cache_kwargs(model, cache)` and read it back
with `returned_cache(out)`, whichever release is installed.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import torch


@functools.cache
def cache_kwarg_of(cls: type) -> str:
    """The keyword `cls.forward` takes its KV cache by: "cache" or "past_key_values"."""
    params = inspect.signature(cls.forward).parameters  # follows the deprecation wrapper's __wrapped__
    return "cache" if "cache" in params else "past_key_values"


def cache_kwargs(model: torch.nn.Module, cache: Any) -> dict[str, Any]:
    """{name: cache} to splat into `model(...)`, under the keyword `model.forward` takes."""
    return {cache_kwarg_of(type(model)): cache}


def returned_cache(out: Any) -> Any:
    """The KV cache a forward returned (`out.cache`, or `out.past_key_values` before the rename)."""
    cache = getattr(out, "cache", None)
    return cache if cache is not None else getattr(out, "past_key_values", None)
