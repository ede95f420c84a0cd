"""A base model (no chat template): refused in one line before any weights load, or trained with a
template of your own (task_config.chat_template), which the exported checkpoint's tokenizer carries."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from tiny_args import TINY

import streamrl
from streamrl.cli import main
from streamrl.config import parse_override
from streamrl.models import load_tokenizer

DOCS = Path(__file__).resolve().parent.parent / "docs" / "data.md"


def _documented_template() -> str:
    """The example template of docs/data.md's 'Base models' section, as a user would copy it."""
    section = DOCS.read_text().split("## Base models", 1)[1]
    return re.search(r"```jinja\n(.*?)```", section, re.S).group(1)


@pytest.fixture(scope="module")
def base_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-random's weights and tokenizer with its chat template removed, as a base model ships."""
    from streamrl.models.tiny import build

    d = build(tmp_path_factory.mktemp("base") / "model")
    (d / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((d / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (d / "tokenizer_config.json").write_text(json.dumps(config))
    from transformers import AutoTokenizer

    assert not AutoTokenizer.from_pretrained(d).chat_template
    return d


def test_a_base_model_is_refused_in_one_line_before_anything_is_written(base_model, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", *TINY, f"model={base_model}", "max_steps=1", f"run_dir={run}"]) == 2
    assert capsys.readouterr().err == (
        f"streamrl: error: model={base_model} has no chat template (a base model): give it one with "
        "task_config.chat_template=FILE.jinja (docs/data.md#base-models), or use an instruct model\n"
    )
    assert not run.exists()


def test_a_template_file_that_is_not_there_is_named(base_model):
    with pytest.raises(ValueError) as e:
        load_tokenizer(base_model, "nope/plain.jinja")
    assert (
        str(e.value)
        == "config key 'task_config.chat_template': no file 'nope/plain.jinja' (a Jinja chat template)"
    )


def test_the_documented_template_renders_exactly(base_model, tmp_path):
    f = tmp_path / "plain.jinja"
    f.write_text(_documented_template())
    tok = load_tokenizer(base_model, str(f))
    chat = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "What is 2+3?"}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        "Be exact.\n\nQuestion: What is 2+3?\nAnswer:"
    )
    done = [*chat, {"role": "assistant", "content": "5"}]
    assert tok.apply_chat_template(done, tokenize=False) == (
        f"Be exact.\n\nQuestion: What is 2+3?\nAnswer: 5{tok.eos_token}\n"
    )


def test_a_base_model_trains_with_a_template_of_its_own_and_exports_it(base_model, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Path("plain.jinja").write_text(_documented_template())
    settings = dict(parse_override(o) for o in TINY if not o.startswith("model=")) | {
        "max_steps": 1,
        "checkpoint.save": True,
    }
    rows = [{"prompt": f"What is {a} + 1?", "answer": str(a + 1)} for a in range(12)]
    run = streamrl.train(
        model=str(base_model),
        train_data=rows,
        run_dir=str(tmp_path / "run"),
        **settings,
        **{"task_config.chat_template": "plain.jinja"},
    )
    assert run.steps == 1
    recorded = yaml.safe_load((run.run_dir / "config.yaml").read_text())["task_config"]["chat_template"]
    assert recorded == str(tmp_path / "plain.jinja")  # absolute: workers and resume read the same file
    exported = load_tokenizer(run.checkpoint)  # the model's own template now: no setting needed
    assert exported.chat_template == _documented_template()
