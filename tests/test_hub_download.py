"""What a Hub model id downloads, and when: the config and tokenizer files first, every check that reads
them (lengths, LoRA targets, chat template, custom code, tokenizer files), and the weights only once they
pass: exactly the set transformers loads (the shards the index names), nothing when a check refuses.
huggingface_hub's snapshot_download is replaced by a stand-in serving a local folder as the repository,
which records each request in order."""

from __future__ import annotations

import json
import re
import shutil
import zipfile
from fnmatch import fnmatch
from pathlib import Path
from typing import Any

import pytest
from tiny_args import TINY

from streamrl.config import load_config
from streamrl.models import resolve_model_dir
from streamrl.models.hub import NEEDED

COMMIT = "0123456789abcdef0123456789abcdef01234567"
MODEL = "testorg/base-7b"
SHARDS = [f"model-0000{i}-of-00003.safetensors" for i in (1, 2, 3)]


class FakeHub:
    """snapshot_download over folder `repo`: a download copies the files its patterns match into the
    cache's snapshot folder (snapshots/COMMIT); a local_files_only call finds that folder if it exists."""

    def __init__(self, repo: Path, cache: Path, log: list[Any]) -> None:
        self.repo, self.snap, self.log = repo, cache / "snapshots" / COMMIT, log
        self.fetched: list[str] = []  # every file a download copied, in order

    def __call__(
        self,
        repo_id: str,
        *,
        revision: str | None = None,
        local_files_only: bool = False,
        allow_patterns=None,
    ) -> str:
        from huggingface_hub.errors import LocalEntryNotFoundError

        assert repo_id == MODEL and allow_patterns is not None
        self.log.append(("local" if local_files_only else "download", list(allow_patterns), revision))
        if local_files_only:
            if not self.snap.is_dir():
                raise LocalEntryNotFoundError("not cached")
            return str(self.snap)
        self.snap.mkdir(parents=True, exist_ok=True)
        for f in sorted(self.repo.rglob("*")):
            name = f.relative_to(self.repo).as_posix()
            if f.is_file() and any(fnmatch(name, p) for p in allow_patterns):
                if not (self.snap / name).is_file():
                    self.fetched.append(name)
                shutil.copy(f, self.snap / name)
        return str(self.snap)


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """The Hub repository's files: tiny-random's config, tokenizer, chat template and weights."""
    d = tmp_path / "repo"
    shutil.copytree(resolve_model_dir("tiny-random", seed=0), d)
    return d


@pytest.fixture
def hub(repo: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FakeHub:
    import huggingface_hub
    from huggingface_hub import constants

    fake = FakeHub(repo, tmp_path / "hub" / "models--testorg--base-7b", [])
    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return fake


def _weights(files: list[str]) -> list[str]:
    return [f for f in files if f.endswith((".safetensors", ".bin"))]


def _preflight(tmp_path: Path, hub: FakeHub, monkeypatch: pytest.MonkeyPatch, *overrides: str) -> Any:
    """streamrl.preflight on MODEL, the checks that read the model's files logged between the requests."""
    import streamrl.preflight as preflight

    for name in ("prompt_limit", "load_tokenizer"):
        real = getattr(preflight, name)

        def logged(*args: Any, _real: Any = real, _name: str = name, **kwargs: Any) -> Any:
            out = _real(*args, **kwargs)
            hub.log.append(_name)
            return out

        monkeypatch.setattr(preflight, name, logged)
    cfg = load_config(None, [*TINY, f"model={MODEL}", f"run_dir={tmp_path / 'run'}", *overrides])
    return preflight.preflight(cfg)


def test_the_weights_are_requested_once_the_checks_have_passed(tmp_path, hub, monkeypatch):
    checked = _preflight(tmp_path, hub, monkeypatch)
    assert hub.log == [
        ("local", NEEDED, None),  # the cache first
        ("download", NEEDED, None),  # config, tokenizer, chat template: no weights
        "prompt_limit",
        "load_tokenizer",
        ("local", NEEDED, None),  # the weights: into the snapshot the checks read
        ("download", [*NEEDED, "model.safetensors"], COMMIT),
    ]
    assert _weights(hub.fetched) == ["model.safetensors"] and hub.fetched[-1] == "model.safetensors"
    assert checked.model_dir == hub.snap and (hub.snap / "model.safetensors").is_file()


def _without_template(repo: Path) -> None:
    (repo / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((repo / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (repo / "tokenizer_config.json").write_text(json.dumps(config))


def _refusing_system(repo: Path) -> None:
    (repo / "chat_template.jinja").write_text(
        "{%- for m in messages %}{%- if m['role'] == 'system' %}"
        "{{- raise_exception('System role not supported') }}{%- endif %}{{- m['content'] }}{%- endfor %}"
    )


def _custom_code(repo: Path) -> None:
    config = json.loads((repo / "config.json").read_text())
    config |= {"model_type": "base7b", "auto_map": {"AutoConfig": "m.C", "AutoModelForCausalLM": "m.M"}}
    (repo / "config.json").write_text(json.dumps(config))


@pytest.mark.parametrize(
    ("change", "overrides", "message"),
    [
        (
            _without_template,
            [],
            f"model={MODEL} has no chat template (a base model): give it one with "
            "task_config.chat_template=FILE.jinja (docs/data.md#base-models), or use an instruct model",
        ),
        (
            None,
            ["rollout.max_new_tokens=1024"],
            "rollout.max_new_tokens=1024 leaves no room for a prompt in the model's context of 1024 tokens: "
            "lower rollout.max_new_tokens",
        ),
        (
            None,
            ["train.lora_rank=2", "train.lora_targets=[q_projj]"],
            "config key 'train.lora_targets': no linear layer named ['q_projj'] in this model; its linear "
            "layers are ['down_proj', 'gate_proj', 'k_proj', 'lm_head', 'o_proj', 'q_proj', 'up_proj', "
            "'v_proj']",
        ),
        (
            _refusing_system,
            [],
            f"model={MODEL}: its chat template refused the prompt of problem PROBLEM (System role not "
            'supported): drop the system turn with task_config.system_prompt="", or give a template that '
            "takes one: task_config.chat_template=FILE",
        ),
        (
            _custom_code,
            [],
            f"model={MODEL}: its config.json names custom code (auto_map); streamrl loads only "
            "architectures transformers has built in",
        ),
        (
            lambda repo: (repo / "tokenizer.json").unlink(),
            [],
            f"model={MODEL}: no tokenizer files (tokenizer.json, tokenizer.model, vocab.json + merges.txt, "
            "tekken.json) next to its config.json: copy them from the base model",
        ),
    ],
    ids=[
        "no-chat-template",
        "no-room-for-a-prompt",
        "lora-targets",
        "system-turn-refused",
        "custom-code",
        "no-tokenizer",
    ],
)
def test_a_refusal_comes_before_any_weights_are_requested(
    tmp_path, repo, hub, monkeypatch, change, overrides, message
):
    if change is not None:
        change(repo)
    with pytest.raises(ValueError) as e:
        _preflight(tmp_path, hub, monkeypatch, *overrides)
    assert re.sub(r"problem \S+ \(", "problem PROBLEM (", str(e.value)) == message
    assert [x for x in hub.log if isinstance(x, tuple) and x[1] != NEEDED] == []
    assert _weights(hub.fetched) == [] and not (tmp_path / "run").exists()


def _index(shards: list[str]) -> str:
    return json.dumps({"metadata": {}, "weight_map": {f"layer.{i}": s for i, s in enumerate(shards)}})


def _stand_in(file: Path) -> None:
    """A weight file holding no tensor that its check passes: a safetensors file with an empty header,
    a PyTorch checkpoint's zip archive with its data.pkl."""
    if file.suffix == ".bin":
        with zipfile.ZipFile(file, "w") as z:
            z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    else:
        file.write_bytes((2).to_bytes(8, "little") + b"{}")


def _made_up(
    d: Path, files: list[str], index: list[str] | None = None, bin_index: list[str] | None = None
) -> Path:
    """A directory with config.json, `files` (stand-ins for weights) and the indexes given."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text("{}")
    for f in files:
        _stand_in(d / f)
    if index is not None:
        (d / "model.safetensors.index.json").write_text(_index(index))
    if bin_index is not None:
        (d / "pytorch_model.bin.index.json").write_text(_index(bin_index))
    return d


BIN_SHARDS = ["pytorch_model-00001-of-00002.bin", "pytorch_model-00002-of-00002.bin"]


@pytest.mark.parametrize(
    ("files", "index", "bin_index", "complete"),
    [
        (SHARDS, SHARDS, None, True),
        (["consolidated.safetensors", SHARDS[0]], SHARDS, None, False),  # the index names 3 shards
        (["consolidated.safetensors"], None, None, False),  # not a file transformers loads
        (["consolidated.safetensors", "model.safetensors"], None, None, True),
        ([SHARDS[0], SHARDS[1], "model-00003-of-00004.safetensors"], SHARDS, None, False),
        ([*BIN_SHARDS, "training_args.bin"], None, BIN_SHARDS, True),
        ([BIN_SHARDS[0], "training_args.bin"], None, BIN_SHARDS, False),
        (["pytorch_model.bin"], SHARDS, None, False),  # transformers reads the safetensors index first
    ],
    ids=[
        "index-and-its-shards",
        "consolidated-and-one-shard-of-three",
        "consolidated-alone",
        "single-file",
        "a-shard-of-another-set",
        "bin-index-and-its-shards",
        "bin-index-and-one-shard",
        "bin-file-behind-a-safetensors-index",
    ],
)
def test_a_set_of_weights_is_complete_only_as_transformers_loads_it(
    tmp_path, files, index, bin_index, complete
):
    from streamrl.models.weight_files import is_complete

    assert is_complete(_made_up(tmp_path / "m", files, index, bin_index)) is complete


def test_what_is_downloaded_is_the_index_shards_else_the_single_file(tmp_path):
    from streamrl.models.weight_files import download_sets

    assert download_sets(_made_up(tmp_path / "a", [], SHARDS)) == [SHARDS, ["pytorch_model.bin"]]
    assert download_sets(_made_up(tmp_path / "b", [])) == [["model.safetensors"], ["pytorch_model.bin"]]
    assert download_sets(_made_up(tmp_path / "c", [], None, BIN_SHARDS)) == [
        ["model.safetensors"],
        BIN_SHARDS,
    ]


def _hub_repo(
    repo: Path, files: list[str], index: list[str] | None = None, bin_index: list[str] | None = None
):
    """`repo` (tiny-random's config and tokenizer) with these weight files instead of its own."""
    (repo / "model.safetensors").unlink()
    _made_up(repo, files, index, bin_index)
    (repo / "config.json").write_text(json.dumps({"model_type": "llama"}))


@pytest.mark.parametrize(
    ("files", "index", "bin_index", "calls", "fetched"),
    [
        (["consolidated.safetensors", *SHARDS], SHARDS, None, [SHARDS], SHARDS),
        (
            ["consolidated.safetensors", "model.safetensors"],
            None,
            None,
            [["model.safetensors"]],
            ["model.safetensors"],
        ),
        (
            [*BIN_SHARDS, "training_args.bin"],
            None,
            BIN_SHARDS,
            [["model.safetensors"], BIN_SHARDS],
            BIN_SHARDS,
        ),
    ],
    ids=["mistral-style-shards-and-consolidated", "single-file-and-consolidated", "bin-shards-only"],
)
def test_a_hub_download_fetches_exactly_the_set_transformers_loads(
    repo, hub, files, index, bin_index, calls, fetched
):
    _hub_repo(repo, files, index, bin_index)
    assert resolve_model_dir(MODEL) == hub.snap
    weight_calls = [x[1][len(NEEDED) :] for x in hub.log if x[0] == "download" and x[1] != NEEDED]
    assert weight_calls == calls
    assert _weights(hub.fetched) == fetched


def test_an_incomplete_cache_is_completed_online_and_refused_offline(repo, hub, monkeypatch):
    from huggingface_hub import constants

    _hub_repo(repo, ["consolidated.safetensors", *SHARDS], SHARDS)
    hub(MODEL, allow_patterns=[*NEEDED, "consolidated.safetensors", SHARDS[0]])  # a cut-short download
    hub.log.clear()
    before = len(hub.fetched)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(
        ValueError, match=rf"^model '{MODEL}' is not in the local Hugging Face cache .*HF_HUB_OFF"
    ):
        resolve_model_dir(MODEL)
    assert [x[0] for x in hub.log] == ["local"]
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert resolve_model_dir(MODEL) == hub.snap
    assert hub.log[-1] == ("download", [*NEEDED, *SHARDS], COMMIT)
    assert hub.fetched[before:] == SHARDS[1:]


def test_a_cached_config_without_its_tokenizer_is_completed_before_the_checks(repo, hub):
    """A cache entry holding config.json alone (transformers' AutoConfig read it) is not taken for the
    model's files: the tokenizer check would refuse a repository that has them."""
    from streamrl.models.resolve import resolve_model_files

    hub(MODEL, allow_patterns=["config.json"])
    hub.log.clear()
    assert resolve_model_files(MODEL) == hub.snap
    assert hub.log == [("local", NEEDED, None), ("download", NEEDED, None)]
    assert (hub.snap / "tokenizer.json").is_file() and not (hub.snap / "model.safetensors").exists()
