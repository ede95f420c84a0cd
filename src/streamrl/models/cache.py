"""Where streamrl keeps converted models: $STREAMRL_CACHE, else $XDG_CACHE_HOME/streamrl, else ~/.cache."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    root = os.environ.get("STREAMRL_CACHE")
    if root:
        return Path(root)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "streamrl"


def models_dir() -> Path:
    """Where the models streamrl builds itself live (tiny-random, smollm2-135m-instruct)."""
    return cache_dir() / "models"
