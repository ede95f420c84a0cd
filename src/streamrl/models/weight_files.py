"""The weight files of a model directory: the set transformers loads, and what a download fetches.

transformers (from_pretrained on a directory) loads the first of: model.safetensors; every shard that
model.safetensors.index.json names; pytorch_model.bin; every shard that pytorch_model.bin.index.json
names. A directory is complete when it holds config.json and every file of that set. Other weight files
a repository may ship next to them (a Mistral-format consolidated.safetensors, training_args.bin, a shard
no index names) are never part of the set: not downloaded, and not taken as a complete set.
"""

from __future__ import annotations

import json
from pathlib import Path

# (single file, shard index) per format, in transformers' order of preference
SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
PYTORCH = ("pytorch_model.bin", "pytorch_model.bin.index.json")
FORMATS = (SAFETENSORS, PYTORCH)


def index_shards(index: Path) -> list[str]:
    """The shard files an index's weight_map names, each once, sorted; [] when it cannot be read."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
        return sorted({str(shard) for shard in weight_map.values()})
    except (OSError, ValueError, AttributeError):
        return []


def weight_set(path: Path) -> list[str]:
    """The files transformers loads from directory `path` (relative names); [] when it finds none."""
    for single, index in FORMATS:
        if (path / single).is_file():
            return [single]
        if (path / index).is_file():
            return index_shards(path / index)
    return []


def is_complete(path: Path) -> bool:
    """config.json and every file of the weight set transformers loads from `path`."""
    files = weight_set(path)
    return (path / "config.json").is_file() and bool(files) and all((path / f).is_file() for f in files)


def download_sets(path: Path) -> list[list[str]]:
    """What to fetch into `path` (a snapshot holding the config and any shard index), one list per format
    in transformers' order: the shards its index names, else its single file; a format whose index
    cannot be read gives []."""
    return [index_shards(path / index) if (path / index).is_file() else [single] for single, index in FORMATS]
