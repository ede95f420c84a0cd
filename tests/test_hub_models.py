"""Hugging Face Hub model ids resolve through huggingface_hub: from the local cache without network
(HF_HUB_OFFLINE=1 and a cache built here from the tiny model), and an id that is not cached fails in
one line before anything is written. Runs in subprocesses: huggingface_hub reads its environment once."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from tiny_args import TINY

from streamrl.models import resolve_model_dir
from streamrl.models.hub import split_id

COMMIT = "0123456789abcdef0123456789abcdef01234567"


def _hub_cache(root: Path, repo: str) -> Path:
    """The hub cache layout huggingface_hub writes: models--ORG--NAME/{refs/main, snapshots/COMMIT/}."""
    entry = root / ("models--" + repo.replace("/", "--"))
    snap = entry / "snapshots" / COMMIT
    shutil.copytree(resolve_model_dir("tiny-random", seed=0), snap)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(COMMIT)
    return snap


def _cli(args: list[str], hub: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(hub), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "streamrl.cli", "train", *args], env=env, capture_output=True, text=True
    )


def test_a_hub_id_trains_from_the_offline_cache(tmp_path: Path) -> None:
    snap = _hub_cache(tmp_path / "hub", "testorg/tiny-chat")
    run = tmp_path / "run"
    model = f"model=testorg/tiny-chat@{COMMIT}"
    args = [*TINY, model, "max_steps=2", "checkpoint.save=true", f"run_dir={run}"]
    res = _cli([*args, "train.lora_rank=2"], tmp_path / "hub")
    assert res.returncode == 0, res.stderr[-3000:]
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [1, 2]
    env = json.loads((run / "environment.json").read_text())
    assert "testorg/tiny-chat" in json.dumps(env)
    # the trained model is the cached snapshot's architecture
    keys = ("model_type", "vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
    saved, cached = (json.loads((d / "config.json").read_text()) for d in (run / "checkpoint", snap))
    assert [saved[k] for k in keys] == [cached[k] for k in keys]
    # the card and the adapter name the base by its Hub id, not the snapshot directory of this machine
    assert "base_model: testorg/tiny-chat\n" in (run / "checkpoint" / "README.md").read_text()
    adapter = json.loads((run / "checkpoint" / "adapter" / "adapter_config.json").read_text())
    assert (adapter["base_model_name_or_path"], adapter["revision"]) == ("testorg/tiny-chat", COMMIT)


def test_a_revision_resolves_to_its_snapshot(tmp_path: Path) -> None:
    snap = _hub_cache(tmp_path / "hub", "testorg/tiny-chat")
    code = (
        "from streamrl.models import resolve_model_dir; "
        f"print(resolve_model_dir('testorg/tiny-chat@{COMMIT}')); "
        "print(resolve_model_dir('testorg/tiny-chat'))"
    )
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(snap), str(snap)]


def test_an_id_missing_offline_fails_in_one_line_and_writes_nothing(tmp_path: Path) -> None:
    _hub_cache(tmp_path / "hub", "testorg/tiny-chat")
    run = tmp_path / "run"
    res = _cli([*TINY, "model=testorg/not-cached", f"run_dir={run}"], tmp_path / "hub")
    assert res.returncode == 2
    assert res.stderr == (
        f"streamrl: error: model 'testorg/not-cached' is not in the local Hugging Face cache "
        f"({tmp_path / 'hub'}) and HF_HUB_OFFLINE=1 forbids downloading it: download it where the Hub is "
        "reachable (`hf download testorg/not-cached`, then copy the cache or the folder here) or pass a "
        "local directory: model=/path/to/model (a folder with config.json)\n"
    )
    assert not run.exists()


def test_a_path_that_is_not_a_model_is_refused_before_the_hub(tmp_path: Path) -> None:
    run = tmp_path / "run"
    res = _cli([*TINY, f"model={tmp_path}", f"run_dir={run}"], tmp_path / "hub")
    assert res.returncode == 2 and res.stderr.count("\n") == 1
    assert f"model '{tmp_path}': not a model directory (no config.json there)" in res.stderr
    assert not run.exists()


def test_hub_ids_are_told_from_paths() -> None:
    assert split_id("Qwen/Qwen2.5-0.5B-Instruct") == ("Qwen/Qwen2.5-0.5B-Instruct", None)
    assert split_id("gpt2") == ("gpt2", None)
    assert split_id("org/name@v1.0") == ("org/name", "v1.0")
    assert split_id("a/b/c") is None and split_id("../x") is None and split_id("org/na me") is None


def test_a_snapshot_this_project_downloaded_is_used_offline(tmp_path: Path) -> None:
    """A download of the config, tokenizer and weights files also caches the repository's whole file list
    (trees/COMMIT.json): the cache check must ask for those files only, or the README and the other
    files never fetched make the snapshot look incomplete and an offline run refuses it."""
    snap = _hub_cache(tmp_path / "hub", "testorg/tiny-chat")
    files = [p.name for p in snap.iterdir()] + ["README.md", ".gitattributes", "model.bin", "onnx/model.onnx"]
    code = (
        "import sys; from huggingface_hub._tree_cache import TreeCacheEntry, write_tree_cache; "
        f"write_tree_cache(sys.argv[1], '{COMMIT}', "
        f"{{f: TreeCacheEntry(size=1, blob_id='0' * 40) for f in {files!r}}}); "
        "from streamrl.models import resolve_model_dir; print(resolve_model_dir('testorg/tiny-chat'))"
    )
    entry = tmp_path / "hub" / "models--testorg--tiny-chat"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "hub")}
    res = subprocess.run([sys.executable, "-c", code, str(entry)], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stderr[-2000:]
    assert (entry / "trees" / f"{COMMIT}.json").is_file()
    assert res.stdout.strip().splitlines()[-1] == str(snap)


def test_a_cached_snapshot_missing_a_shard_its_index_names_is_not_taken_as_complete(tmp_path: Path) -> None:
    """A cache with the index of two shards and only the first (transformers fetched part of it, or a
    download was cut short): offline it is refused in one line instead of failing at load."""
    snap = _hub_cache(tmp_path / "hub", "testorg/tiny-chat")
    (snap / "model.safetensors").rename(snap / "model-00001-of-00002.safetensors")
    weight_map = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (snap / "model.safetensors.index.json").write_text(json.dumps({"weight_map": weight_map}))
    run = tmp_path / "run"
    res = _cli([*TINY, "model=testorg/tiny-chat", f"run_dir={run}"], tmp_path / "hub")
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr[-2000:]
    assert "model 'testorg/tiny-chat' is not in the local Hugging Face cache" in res.stderr
    assert not run.exists()


def test_a_cut_short_file_in_the_hub_cache_is_refused_with_the_command_that_downloads_it_again(
    tmp_path: Path,
) -> None:
    """The set of weights is whole but a file of it is cut short (a disk that filled, a copied cache):
    its header is checked as a local directory's, and the way out is a forced download of that file
    (a deleted snapshot alone would link the same cut-short blob again)."""
    snap = _hub_cache(tmp_path / "hub", "testorg/tiny-chat")
    weights = snap / "model.safetensors"
    full = weights.stat().st_size
    weights.write_bytes(weights.read_bytes()[: full // 2])
    run = tmp_path / "run"
    res = _cli([*TINY, "model=testorg/tiny-chat", f"run_dir={run}"], tmp_path / "hub")
    assert res.returncode == 2
    assert res.stderr == (
        f"streamrl: error: model=testorg/tiny-chat: {weights} is not a whole safetensors file (it holds "
        f"{full // 2} bytes where its header describes {full}): download it again: `hf download "
        f"testorg/tiny-chat model.safetensors --revision {COMMIT} --force-download`\n"
    )
    assert not run.exists()


def test_a_whole_set_of_weights_in_either_format_makes_a_snapshot_complete(tmp_path: Path) -> None:
    """A repository with both formats sharded: the safetensors shards complete, the .bin index's shards
    never downloaded (only the safetensors set is fetched): complete. Missing a shard of it: not."""
    from streamrl.models.weight_files import is_complete

    (tmp_path / "config.json").write_text("{}")
    st = {"a": "model-00001-of-00002.safetensors", "b": "model-00002-of-00002.safetensors"}
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": st}))
    (tmp_path / "pytorch_model.bin.index.json").write_text(json.dumps({"weight_map": {"a": "p-1.bin"}}))
    (tmp_path / st["a"]).write_bytes(b"x")
    assert not is_complete(tmp_path)  # one safetensors shard of two, no .bin shard
    (tmp_path / st["b"]).write_bytes(b"x")
    assert is_complete(tmp_path)
    (tmp_path / st["a"]).unlink()
    (tmp_path / "model.safetensors").write_bytes(b"x")  # the single file transformers loads first
    assert is_complete(tmp_path)
