"""A local model directory transformers cannot load with its own code and tokenizer files is refused in
one line naming model=DIR before anything loads or is written: custom code (config.json's auto_map on an
architecture transformers lacks), a model_type that is not a causal LM, no tokenizer files (an SFT output
saved without them). auto_map on an architecture transformers has built in loads as usual."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from tiny_args import TINY

from streamrl.cli import main
from streamrl.models import resolve_model_dir


def _tiny_copy(tmp_path: Path, change: Callable[[Path], None]) -> Path:
    d = tmp_path / "model"
    shutil.copytree(resolve_model_dir("tiny-random", seed=0), d)
    change(d)
    return d


def _config(**keys: object) -> Callable[[Path], None]:
    def change(d: Path) -> None:
        config = json.loads((d / "config.json").read_text())
        (d / "config.json").write_text(json.dumps(config | keys))

    return change


CUSTOM = {"AutoConfig": "modeling_mine.MineConfig", "AutoModelForCausalLM": "modeling_mine.MineForCausalLM"}
NO_TOKENIZER = "no tokenizer files (tokenizer.json, tokenizer.model, vocab.json + merges.txt, tekken.json) "


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (
            _config(model_type="mine", auto_map=CUSTOM),
            "its config.json names custom code (auto_map); streamrl loads only architectures transformers "
            "has built in",
        ),
        (
            _config(model_type="t5"),
            "its config.json has model_type 't5', which transformers {v} does not load as a causal "
            "language model (AutoModelForCausalLM)",
        ),
        (
            lambda d: (d / "tokenizer.json").unlink(),
            NO_TOKENIZER + "next to its config.json: copy them from the base model",
        ),
    ],
    ids=["custom-code", "not-a-causal-lm", "no-tokenizer-files"],
)
def test_a_directory_transformers_cannot_load_is_one_line_before_anything_is_written(
    tmp_path, capsys, change, message
):
    import transformers

    model = _tiny_copy(tmp_path, change)
    run = tmp_path / "run"
    assert main(["train", *TINY, f"model={model}", f"run_dir={run}"]) == 2
    expected = message.format(v=transformers.__version__)
    assert capsys.readouterr().err == f"streamrl: error: model={model}: {expected}\n"
    assert not run.exists()


def test_custom_code_on_a_built_in_architecture_loads_without_it(tmp_path):
    """Repositories keep auto_map after transformers took the architecture in (Phi-3, for one):
    transformers loads its own class, and so may streamrl."""
    from streamrl.models import load_model, load_tokenizer

    model = _tiny_copy(tmp_path, _config(auto_map=CUSTOM))
    assert resolve_model_dir(str(model)) == model
    assert load_tokenizer(model).chat_template and load_model(model) is not None


@pytest.mark.parametrize(
    "files",
    [
        ["tokenizer.json"],
        ["tokenizer.model"],
        ["vocab.json", "merges.txt"],
        ["tekken.json"],
        ["qwen.tiktoken"],
    ],
)
def test_each_kind_of_tokenizer_file_counts(tmp_path, files):
    from streamrl.models.model_files import has_tokenizer_files

    (tmp_path / "tokenizer_config.json").write_text("{}")
    assert not has_tokenizer_files(tmp_path)
    for f in files:
        (tmp_path / f).write_text("")
    assert has_tokenizer_files(tmp_path)


def test_transformers_is_never_asked_to_run_custom_code(tmp_path, monkeypatch):
    """Past the file checks (a directory changed after them), transformers refuses custom code itself
    instead of asking on the terminal whether to run it."""
    import builtins

    from streamrl.models.resolve import load_model_config

    asked: list[str] = []
    monkeypatch.setattr(builtins, "input", lambda prompt="": asked.append(prompt) or "n")
    model = _tiny_copy(tmp_path, _config(model_type="mine", auto_map=CUSTOM))
    with pytest.raises(ValueError, match="trust_remote_code"):
        load_model_config(model)
    assert asked == []
