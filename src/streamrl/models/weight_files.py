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


MAX_HEADER = 100_000_000  # bytes: the safetensors library refuses a longer header


def safetensors_problem(file: Path) -> str:
    """Why `file` is not a whole safetensors file, '' when it is. Only its header is read (an 8-byte
    little-endian length, then that much JSON), and the tensor data it describes must fill the rest of
    the file exactly, as safetensors requires: no tensor is read."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if length < 0 or 8 + length > size:
                return f"its header runs past the end of the file's {size} bytes"
            if length > MAX_HEADER:  # safetensors' own limit: a corrupt length is not read into memory
                return f"its header claims {length} bytes, past safetensors' limit of {MAX_HEADER}"
            header = json.loads(f.read(length))
    except OSError as e:
        return f"it cannot be read: {e.strerror}"
    except ValueError:  # not JSON, not UTF-8
        return "its header is not JSON"
    try:
        tensors = [t for key, t in header.items() if key != "__metadata__"]
        end = max((int(t["data_offsets"][1]) for t in tensors), default=0)
    except (AttributeError, TypeError, KeyError, IndexError, ValueError):
        return "its header does not describe tensors"
    if 8 + length + end != size:
        return f"it holds {size} bytes where its header describes {8 + length + end}"
    return ""


def weights_problem(path: Path) -> str:
    """What keeps transformers from loading the weights of directory `path` ('' when nothing), naming
    the file and the way out: no weight set (weight_set), a shard index that does not read or names
    shards that are not there, a safetensors file cut short (safetensors_problem)."""
    files = weight_set(path)
    if not files:
        index = next((path / index for _, index in FORMATS if (path / index).is_file()), None)
        if index is not None:
            return f"{index} is not a shard index (JSON with a weight_map): copy it again from the base model"
        return (
            f"no weights in {path} (model.safetensors, model.safetensors.index.json with its shards, or "
            "pytorch_model.bin): copy them from the base model"
        )
    missing = [f for f in files if not (path / f).is_file()]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return (
            f"{path} lacks {len(missing)} of the {len(files)} shards its index names ({missing[0]}{more}): "
            "copy them from the base model"
        )
    for f in files:
        reason = safetensors_problem(path / f) if f.endswith(".safetensors") else ""
        if reason:
            return f"{path / f} is not a whole safetensors file ({reason}): copy it again from the base model"
    return ""
