"""Hugging Face Hub model ids (`model=Qwen/Qwen2.5-0.5B-Instruct`, `model=org/name@revision`) -> a local
snapshot directory, through huggingface_hub, in two steps:

- `hub_files`: the config, tokenizer, chat template, generation config and shard indexes (small files),
  which every check before loading reads (models/model_files.py, preflight.py);
- `hub_weights`: the weight files transformers loads (models/weight_files.py), fetched into the same
  snapshot (the commit the checks read) only when those checks passed.

The local cache comes first: files already there are used without touching the network, so rollout
workers and resumed runs never download. Otherwise, unless offline mode is on (HF_HUB_OFFLINE=1), they
are downloaded into the cache (HF_HOME / HF_HUB_CACHE). Every failure is one line naming the id, what
went wrong and the way out (a local directory works everywhere).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from streamrl.brief import brief_error
from streamrl.models.model_files import has_tokenizer_files
from streamrl.models.weight_files import download_sets, is_complete

# the small files a causal LM needs besides its weights: config, generation config, shard indexes,
# tokenizer (json, sentencepiece, BPE merges, tiktoken), chat template
NEEDED = ["*.json", "*.model", "*.txt", "*.tiktoken", "*.jinja"]
_REPO_ID = re.compile(r"^(?:[\w.-]+/)?[\w.-]+$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def split_id(name: str) -> tuple[str, str | None] | None:
    """'org/name[@revision]' -> (repo id, revision); None when `name` cannot be a Hub model id."""
    repo, _, revision = name.partition("@")
    if not _REPO_ID.match(repo) or ".." in repo or repo.startswith(("-", ".")) or len(repo) > 96:
        return None
    return repo, revision or None


def _parse(name: str) -> tuple[str, str | None]:
    parsed = split_id(name)
    if parsed is None:
        raise ValueError(f"model '{name}': not a local directory and not a Hugging Face Hub id (org/name)")
    return parsed


def _local_hint(name: str) -> str:
    return (
        f"download it where the Hub is reachable (`hf download {name.split('@')[0]}`, then copy the cache "
        "or the folder here) or pass a local directory: model=/path/to/model (a folder with config.json)"
    )


def _offline(name: str) -> ValueError:
    from huggingface_hub import constants

    return ValueError(
        f"model '{name}' is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and "
        f"HF_HUB_OFFLINE=1 forbids downloading it: {_local_hint(name)}"
    )


@contextmanager
def _one_line_errors(name: str, repo: str, revision: str | None) -> Iterator[None]:
    """A download's failures as one line each."""
    from huggingface_hub import constants
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        yield
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
        reason = brief_error(e, 160, first_line=True)
        raise ValueError(
            f"model '{name}' is not in the local Hugging Face cache ({constants.HF_HUB_CACHE}) and the Hub "
            f"could not be reached ({reason}): {_local_hint(name)}"
        ) from None


def hub_files(name: str) -> Path:
    """The local snapshot directory of Hub model `name` with its NEEDED files (its weights may not be
    there yet): from the cache, else downloaded if allowed."""
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    repo, revision = _parse(name)
    patterns = NEEDED  # the files a download below fetched: the rest of the repo is not needed
    try:
        cached = Path(
            snapshot_download(repo, revision=revision, local_files_only=True, allow_patterns=patterns)
        )
        if (cached / "config.json").is_file() and has_tokenizer_files(cached):  # not a config read alone
            return cached
    except (LocalEntryNotFoundError, FileNotFoundError):  # IncompleteSnapshotError among them
        pass
    if constants.HF_HUB_OFFLINE:
        raise _offline(name)
    with _one_line_errors(name, repo, revision):
        path = Path(snapshot_download(repo, revision=revision, allow_patterns=NEEDED))
    if not (path / "config.json").is_file():
        raise ValueError(
            f"model '{name}': the Hub repository has no config.json (GGUF-only and Mistral-format "
            "repositories are not supported; pass a converted local directory)"
        )
    return path


def hub_weights(name: str, files: Path) -> Path:
    """`files` (hub_files(name)) with the weight set transformers loads: the shards its index names, else
    model.safetensors; the .bin files only for a repository without safetensors weights."""
    from huggingface_hub import constants, snapshot_download

    if is_complete(files):
        return files
    if constants.HF_HUB_OFFLINE:
        raise _offline(name)
    repo, revision = _parse(name)
    commit = files.name if _COMMIT.match(files.name) else revision  # the snapshot the checks read
    path = files
    for wanted in download_sets(files):
        if not wanted:
            continue
        # with NEEDED (cached already): a call that matches nothing fetches nothing and logs nothing
        with _one_line_errors(name, repo, revision):
            path = Path(snapshot_download(repo, revision=commit, allow_patterns=[*NEEDED, *wanted]))
        if is_complete(path):
            return path
    raise ValueError(
        f"model '{name}': the Hub repository has no weights transformers loads (model.safetensors, the "
        "shards of model.safetensors.index.json, or their pytorch_model.bin counterparts); GGUF-only and "
        "remote-code models are not supported: pass a converted local directory"
    )
