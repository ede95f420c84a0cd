"""Hugging Face Hub model ids (`model=Qwen/Qwen2.5-0.5B-Instruct`, `model=org/name@revision`) -> a local
snapshot directory, through huggingface_hub.

The local cache comes first: a snapshot that is already there (config.json and weights) is used without
touching the network, so rollout workers and resumed runs never download. Otherwise, unless offline
mode is on (HF_HUB_OFFLINE=1), the config, tokenizer and weight files are downloaded into the cache
(HF_HOME / HF_HUB_CACHE): safetensors when the repository has them, else PyTorch .bin files. Every
failure is one line naming the id, what went wrong and the way out (a local directory works everywhere).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

# the files a causal LM needs: config, generation config, tokenizer (json, sentencepiece, BPE merges)
NEEDED = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
WEIGHTS = ("*.safetensors", "*.bin")
_REPO_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")


def split_id(name: str) -> tuple[str, str | None] | None:
    """'org/name[@revision]' -> (repo id, revision); None when `name` cannot be a Hub model id."""
    repo, _, revision = name.partition("@")
    if not _REPO_ID.match(repo) or ".." in repo or repo.startswith(("-", ".")) or len(repo) > 96:
        return None
    return repo, revision or None


def _has_weights(path: Path) -> bool:
    """config.json and one whole set of weights: a file no shard index names (model.safetensors), or
    every shard of one index (a cache that transformers filled part of, or a download cut short, has
    an index and only some of its shards; a repository with both formats has two indexes)."""
    files = [f for w in WEIGHTS for f in path.glob(w)]
    if not (path / "config.json").is_file() or not files:
        return False
    named: set[str] = set()
    for index in path.glob("*.index.json"):
        try:
            shards = set(json.loads(index.read_text()).get("weight_map", {}).values())
        except (OSError, ValueError, AttributeError):
            continue
        if shards and all((path / shard).is_file() for shard in shards):
            return True
        named |= shards
    return any(f.name not in named for f in files)


def _local_hint(name: str) -> str:
    return (
        f"download it where the Hub is reachable (`hf download {name.split('@')[0]}`, then copy the cache "
        "or the folder here) or pass a local directory: model=/path/to/model (a folder with config.json)"
    )


def hub_snapshot(name: str) -> Path:
    """The local snapshot directory of Hub model `name` (downloaded first if needed and allowed)."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    parsed = split_id(name)
    if parsed is None:
        raise ValueError(f"model '{name}': not a local directory and not a Hugging Face Hub id (org/name)")
    repo, revision = parsed
    for weights in WEIGHTS:  # the files a download below fetched: the rest of the repo is not needed
        try:
            patterns = [*NEEDED, weights]
            cached = Path(
                snapshot_download(repo, revision=revision, local_files_only=True, allow_patterns=patterns)
            )
            if _has_weights(cached):
                return cached
        except (LocalEntryNotFoundError, FileNotFoundError):  # IncompleteSnapshotError among them
            pass
    if constants.HF_HUB_OFFLINE:
        raise ValueError(
            f"model '{name}' is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and "
            f"HF_HUB_OFFLINE=1 forbids downloading it: {_local_hint(name)}"
        )
    try:  # safetensors weights; PyTorch .bin files only for a repository without them
        path = Path(snapshot_download(repo, revision=revision, allow_patterns=[*NEEDED, WEIGHTS[0]]))
        if not _has_weights(path):
            path = Path(snapshot_download(repo, revision=revision, allow_patterns=[*NEEDED, WEIGHTS[1]]))
    except GatedRepoError:
        raise ValueError(
            f"model '{name}' is gated on the Hugging Face Hub: accept its terms on its page and log in "
            "(`hf auth login` or HF_TOKEN)"
        ) from None
    except RepositoryNotFoundError:
        raise ValueError(
            f"model '{name}': no such model on the Hugging Face Hub (private? log in with `hf auth login` "
            "or HF_TOKEN)"
        ) from None
    except RevisionNotFoundError:
        raise ValueError(f"model '{name}': the Hub repository {repo} has no revision '{revision}'") from None
    except Exception as e:  # DNS, connection, proxy, timeout: the Hub is unreachable
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise ValueError(
            f"model '{name}' is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and the Hub "
            f"could not be reached ({reason[:160]}): {_local_hint(name)}"
        ) from None
    if not _has_weights(path):
        raise ValueError(
            f"model '{name}': the Hub repository has no config.json with safetensors or .bin weights "
            "(GGUF-only and remote-code models are not supported; pass a converted local directory)"
        )
    return path
