"""Shared fixtures: an isolated model cache and the tiny random model."""

from __future__ import annotations

import os

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Real SmolLM2 conversions are reused from the user cache; everything else is per test session.
    if "STREAMRL_CACHE" not in os.environ:
        os.environ["STREAMRL_CACHE"] = str(tmp_path_factory.mktemp("streamrl-cache"))


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer) of tiny-random, seed 0."""
    from streamrl.models import load_model, load_tokenizer, resolve_model_dir

    d = resolve_model_dir("tiny-random", seed=0)
    return load_model(d), load_tokenizer(d)
