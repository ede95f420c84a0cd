"""A chat template that refuses the prompt (Gemma-2's 'System role not supported', Mistral-v0.1's strict
role alternation) is one line naming the template's message and the fix, before any weights load and
before anything is written: `task_config.system_prompt=""` when the system turn is the configured one,
else a template of your own (`task_config.chat_template=FILE`)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from tiny_args import TINY
from train_cli import rows_file, train

from streamrl.cli import main
from streamrl.config import load_config
from streamrl.preflight import preflight

# tiny-random's ChatML, refusing a system turn as Gemma-2's template does
NO_SYSTEM = (
    "{%- if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{%- endif %}"
    "{%- for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}"
    "{%- endfor %}{%- if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{%- endif %}"
)
# ... and any chat of more than one turn
ONE_TURN = (
    "{%- if messages | length > 1 %}{{ raise_exception('Only one turn is supported') }}{%- endif %}"
    + NO_SYSTEM
)
ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]


@pytest.fixture(scope="module")
def no_system_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tiny-random with a chat template that refuses system turns."""
    from streamrl.models import resolve_model_dir

    d = tmp_path_factory.mktemp("gemma-like") / "model"
    shutil.copytree(resolve_model_dir("tiny-random", seed=0), d)
    (d / "chat_template.jinja").write_text(NO_SYSTEM)
    return d


def _first_id(overrides: list[str]) -> str:
    """The id of the training problem preflight renders first."""
    import itertools

    from streamrl.tasks import prepare_split, task_from_config

    cfg = load_config(None, overrides)
    task = task_from_config(cfg)
    exclude = prepare_split(task, cfg)[1]
    return next(itertools.islice(task.train_stream(cfg.seed, exclude), 1)).id


@pytest.mark.parametrize("task", ["data", "rg:chain_sum"])
def test_a_template_that_refuses_the_system_turn_is_one_line_naming_the_fix(
    no_system_model: Path,
    tmp_path: Path,
    weight_loads: list[int],
    capsys: pytest.CaptureFixture,
    task: str,
) -> None:
    spec = f"task=data:{rows_file(tmp_path, ROWS)}" if task == "data" else f"task={task}"
    pid = _first_id([*TINY, spec])
    run = tmp_path / "run"
    assert train([*TINY, f"model={no_system_model}", spec, f"run_dir={run}"]) == 2
    assert capsys.readouterr().err == (
        f"streamrl: error: model={no_system_model}: its chat template refused the prompt of problem "
        f'{pid} (System role not supported): drop the system turn with task_config.system_prompt="", '
        "or give a template that takes one: task_config.chat_template=FILE\n"
    )
    assert not run.exists() and weight_loads == []


def test_the_fix_it_names_passes(no_system_model: Path, tmp_path: Path) -> None:
    cfg = load_config(None, [*TINY, f"model={no_system_model}", f"task=data:{rows_file(tmp_path, ROWS)}"])
    cfg.task_config.system_prompt = ""
    assert preflight(cfg).task is not None


def test_a_template_that_refuses_a_chat_without_a_system_turn_names_a_template_of_your_own(
    tmp_path: Path, no_system_model: Path, weight_loads: list[int], capsys: pytest.CaptureFixture
) -> None:
    template = tmp_path / "one_turn.jinja"
    template.write_text(ONE_TURN)
    args = [
        *TINY,
        f"task=data:{rows_file(tmp_path, ROWS)}",
        "task_config.system_prompt=",
        "task_config.few_shot_n=1",
    ]
    pid = _first_id(args)
    run = tmp_path / "run"
    given = [f"model={no_system_model}", f"task_config.chat_template={template}", f"run_dir={run}"]
    assert train([*args, *given]) == 2
    assert capsys.readouterr().err == (
        f"streamrl: error: the chat template {template} (task_config.chat_template) refused the prompt of "
        f"problem {pid} (Only one turn is supported): give a template that renders it: "
        "task_config.chat_template=FILE\n"
    )
    assert not run.exists() and weight_loads == []


def test_a_rows_own_system_turn_is_named_as_the_rows(
    tmp_path: Path, no_system_model: Path, weight_loads: list[int], capsys: pytest.CaptureFixture
) -> None:
    chats = [
        {"messages": [{"role": "system", "content": "Be exact."}, {"role": "user", "content": r["prompt"]}]}
        | {"answer": r["answer"]}
        for r in ROWS
    ]
    args = [*TINY, f"task=data:{rows_file(tmp_path, chats)}", "task_config.columns={messages: messages}"]
    pid = _first_id(args)
    run = tmp_path / "run"
    assert train([*args, f"model={no_system_model}", f"run_dir={run}"]) == 2
    assert capsys.readouterr().err == (
        f"streamrl: error: model={no_system_model}: its chat template refused the prompt of problem "
        f"{pid} (System role not supported): its row brings a system turn of its own: give a template "
        "that takes one: task_config.chat_template=FILE\n"
    )
    assert not run.exists() and weight_loads == []


def test_streamrl_eval_names_the_fix_before_the_weights_load(
    tmp_path: Path, no_system_model: Path, weight_loads: list[int], capsys: pytest.CaptureFixture
) -> None:
    args = ["eval", f"model={no_system_model}", "size=2", f"run_dir={tmp_path / 'ev'}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"streamrl: error: model={no_system_model}: its chat template refused the prompt of problem "
    ) and err.endswith(
        '(System role not supported): drop the system turn with task_config.system_prompt="", or give a '
        "template that takes one: task_config.chat_template=FILE\n"
    ), err
    assert err.count("\n") == 1 and weight_loads == [] and not (tmp_path / "ev").exists()


def test_a_template_that_does_not_parse_is_a_syntax_error_not_a_refusal(
    tmp_path: Path, no_system_model: Path, weight_loads: list[int], capsys: pytest.CaptureFixture
) -> None:
    template = tmp_path / "bad.jinja"
    template.write_text("{% for m in messages %}{{ m.content }\n")
    run = tmp_path / "run"
    rows = f"task=data:{rows_file(tmp_path, ROWS)}"
    assert train([*TINY, rows, f"task_config.chat_template={template}", f"run_dir={run}"]) == 2
    assert capsys.readouterr().err == (
        f"streamrl: error: {template} line 1: template syntax error (unexpected '}}'): fix the template\n"
    )
    (no_system_model.parent / "broken").mkdir()
    broken = shutil.copytree(no_system_model, no_system_model.parent / "broken" / "model")
    (broken / "chat_template.jinja").write_text("{{ messages }}\n{{ m.content }\n")
    assert train([*TINY, rows, f"model={broken}", f"run_dir={run}"]) == 2
    assert capsys.readouterr().err == (
        f"streamrl: error: model={broken}: its chat template line 2: template syntax error (unexpected "
        "'}'): give a template that parses: task_config.chat_template=FILE\n"
    )
    assert not run.exists() and weight_loads == []
