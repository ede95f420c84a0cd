"""`streamrl eval` of a trained run's export takes from the run's config.yaml what is evaluated and how it
is prompted and scored (eval_settings.py); a key given on the command line or in a config file wins."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from streamrl.cli import main
from streamrl.config import Config, config_yaml, load_config
from streamrl.eval_settings import eval_config

PROMPT = "Solve it. End with '#### <number>'."
RUN_SETTINGS = [
    "model=tiny-random",
    "task=hf:openai/gsm8k:main",
    "task_config.columns={prompt: question, answer: answer}",
    "task_config.eval_split=test",
    f"task_config.system_prompt={PROMPT!r}",
    "task_config.instruction=Think step by step.",
    "reward.extract=gsm8k",
    "reward.code_partial_credit=false",
    "reward.format_weight=0.5",
    "eval.size=50",
    "eval.max_new_tokens=256",
    "eval.n=4",
    "env.max_turns=2",
    "seed=7",
    "rollout.max_new_tokens=200",
]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    """A trained run's directory as the job leaves it: config.yaml, metrics.jsonl, its exports."""
    run = tmp_path / "runs" / "x"
    for export in ("checkpoint", "checkpoints/step-2"):
        (run / export).mkdir(parents=True)
    cfg = load_config(None, [*RUN_SETTINGS, f"run_dir={run}"])
    (run / "config.yaml").write_text(config_yaml(cfg))
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    return run


def _taken(cfg: Config) -> dict[str, Any]:
    return {
        "task": cfg.task,
        "columns": cfg.task_config.columns,
        "eval_split": cfg.task_config.eval_split,
        "system_prompt": cfg.task_config.system_prompt,
        "instruction": cfg.task_config.instruction,
        "extract": cfg.reward.extract,
        "code_partial_credit": cfg.reward.code_partial_credit,
        "size": cfg.eval.size,
        "max_new_tokens": cfg.eval.max_new_tokens,
        "max_turns": cfg.env.max_turns,
    }


RUNS = {
    "task": "hf:openai/gsm8k:main",
    "columns": {"prompt": "question", "answer": "answer"},
    "eval_split": "test",
    "system_prompt": PROMPT,
    "instruction": "Think step by step.",
    "extract": "gsm8k",
    "code_partial_credit": False,
    "size": 50,
    "max_new_tokens": 256,
    "max_turns": 2,
}


@pytest.mark.parametrize("export", ["checkpoint", "checkpoints/step-2"])
def test_a_runs_export_is_evaluated_with_the_runs_task_prompt_and_scoring(run, export):
    cfg, line = eval_config(None, [f"model={run / export}"])
    assert _taken(cfg) == RUNS
    assert line == f"taking the task settings of {run} (config.yaml); a key given here overrides them"
    # not the run's model, run_dir or seed, nor what only training reads
    assert (cfg.model, cfg.run_dir, cfg.seed) == (str(run / export), "", 0)
    assert (cfg.reward.format_weight, cfg.eval.n) == (0.1, 0)


@pytest.mark.parametrize(
    ("given", "expected"), [([], 200), (["rollout.max_new_tokens=64"], 64), (["eval.max_new_tokens=9"], 9)]
)
def test_eval_max_new_tokens_0_follows_the_runs_rollout_length(run, given, expected):
    # 0: "as long as a training reply", the run's rollout.max_new_tokens=200 (not the default 48)
    cfg, _ = eval_config(None, [f"model={run / 'checkpoint'}", "eval.max_new_tokens=0", *given])
    assert cfg.eval.max_new_tokens == expected


def test_a_key_given_on_the_command_line_or_in_a_config_file_wins(run, tmp_path):
    given = ["task_config.system_prompt=Be brief.", "reward.extract=boxed", "eval.size=5"]
    file = tmp_path / "eval.yaml"
    file.write_text("eval: {max_new_tokens: 16}\nenv: {max_turns: 3}\n")
    cfg, _ = eval_config(str(file), [f"model={run / 'checkpoint'}", *given])
    mine = {"system_prompt": "Be brief.", "extract": "boxed", "size": 5, "max_new_tokens": 16, "max_turns": 3}
    assert _taken(cfg) == {**RUNS, **mine}


def test_another_task_takes_the_runs_prompt_and_scoring_but_not_its_data_keys(run):
    cfg, line = eval_config(None, [f"model={run / 'checkpoint'}", "task=rg:chain_sum"])
    assert (cfg.task, cfg.task_config.columns, cfg.task_config.eval_split) == ("rg:chain_sum", {}, "")
    assert (cfg.task_config.system_prompt, cfg.reward.extract, cfg.eval.size) == (PROMPT, "gsm8k", 50)
    assert line == (
        f"taking the prompt and scoring settings of {run} (config.yaml), not its data keys: "
        "task=rg:chain_sum is not its task, hf:openai/gsm8k:main; a key given here overrides them"
    )


@pytest.mark.parametrize(
    "model", ["Qwen/Qwen2.5-0.5B-Instruct", "tiny-random", "{tmp}/plain", "{tmp}/lone/checkpoint"]
)
def test_a_model_that_is_not_a_runs_export_is_evaluated_as_given(tmp_path, model):
    (tmp_path / "plain").mkdir()  # a model directory of its own
    (tmp_path / "lone" / "checkpoint").mkdir(parents=True)  # a config.yaml without metrics.jsonl: no run
    (tmp_path / "lone" / "config.yaml").write_text("task: hf:openai/gsm8k:main\n")
    given = [f"model={model.format(tmp=tmp_path)}", "eval.size=3"]
    cfg, line = eval_config(None, given)
    assert line is None and cfg == load_config(None, given)


def test_the_eval_command_says_whose_settings_it_took(run, monkeypatch, capsys):
    import streamrl.eval_cli

    seen: list[Config] = []
    monkeypatch.setattr(streamrl.eval_cli, "run_eval", seen.append)
    assert main(["eval", f"model={run / 'checkpoint'}", "size=7"]) == 0
    assert _taken(seen[0]) == {**RUNS, "size": 7}  # the eval command's short keys win too
    assert capsys.readouterr().err == (
        f"taking the task settings of {run} (config.yaml); a key given here overrides them\n"
    )


def test_a_setting_of_the_run_refused_with_a_key_given_says_where_it_came_from(run, capsys):
    # the run's data is read whole, not streamed: a shuffle buffer given for it has nothing to shuffle
    assert main(["eval", f"model={run / 'checkpoint'}", "task_config.shuffle_buffer=5"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamrl: error: config key 'task_config.shuffle_buffer'"), err
    assert err.endswith(f" (with the task settings of {run}, from its config.yaml)\n"), err


def test_the_python_api_takes_the_runs_settings_as_the_eval_command_does(run, monkeypatch, capsys, tmp_path):
    import streamrl
    import streamrl.eval_cli

    seen: list[Config] = []
    monkeypatch.setattr(streamrl.eval_cli, "run_eval", lambda cfg: seen.append(cfg) or {})
    line = f"taking the task settings of {run} (config.yaml); a key given here overrides them\n"
    streamrl.evaluate(run / "checkpoint", **{"eval.size": 7})
    assert _taken(seen[-1]) == {**RUNS, "size": 7}  # a keyword given wins
    assert capsys.readouterr().err == line
    streamrl.evaluate(config={"model": str(run / "checkpoint"), "eval": {"max_new_tokens": 0}})
    assert _taken(seen[-1]) == {**RUNS, "max_new_tokens": 200}  # the run's rollout.max_new_tokens
    assert capsys.readouterr().err == line
    file = tmp_path / "eval.yaml"
    file.write_text(f"model: {run / 'checkpoint'}\nreward: {{extract: boxed}}\n")
    streamrl.evaluate(config=file, task="rg:chain_sum")
    assert (seen[-1].task, seen[-1].reward.extract, seen[-1].task_config.system_prompt) == (
        "rg:chain_sum",
        "boxed",
        PROMPT,
    )
    assert "not its data keys: task=rg:chain_sum is not its task" in capsys.readouterr().err
    # rows given from code are evaluated whole: the run's eval.size is not the caller's
    rows = [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in range(60)]
    streamrl.evaluate(run / "checkpoint", eval_data=rows)
    assert (seen[-1].eval.size, seen[-1].task_config.system_prompt) == (60, PROMPT)
    assert "taking the prompt and scoring settings of" in capsys.readouterr().err
    # a Config made before sets every key: nothing is taken, nothing said
    streamrl.evaluate(run / "checkpoint", config=load_config(None, ["eval.size=3"]))
    assert (seen[-1].task_config.system_prompt, seen[-1].eval.size) == (Config().task_config.system_prompt, 3)
    assert capsys.readouterr().err == ""


def test_a_run_saved_with_keys_its_data_sources_never_read_is_evaluated_without_them(tmp_path, capsys):
    """As its resume does (test_data_keys.py): a data task's args and unstreamed shuffle buffer, and a
    mixture's data source's, saved before they were refused, are dropped with one line; given here, they
    are refused."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(f'{{"prompt": "Q{i}?", "answer": "{i}"}}\n' for i in range(8)))
    single = Config(task=f"data:{rows}")
    single.task_config.args, single.task_config.shuffle_buffer = {"revision": "v2"}, 5
    mix = Config(task="mix")
    mix.task_config.sources = ({"task": f"data:{rows}", "args": {"revision": "v2"}},)
    for name, saved in (("single", single), ("mix", mix)):
        (tmp_path / name / "checkpoint").mkdir(parents=True)
        (tmp_path / name / "config.yaml").write_text(config_yaml(saved))
        (tmp_path / name / "metrics.jsonl").write_text('{"step": 1}\n')
    cfg, _ = eval_config(None, [f"model={tmp_path / 'single' / 'checkpoint'}"])
    assert (cfg.task_config.args, cfg.task_config.shuffle_buffer) == ({}, Config().task_config.shuffle_buffer)
    cfg, _ = eval_config(None, [f"model={tmp_path / 'mix' / 'checkpoint'}"])
    assert cfg.task_config.sources == ({"task": f"data:{rows}"},)
    assert capsys.readouterr().err == (
        "streamrl: note: eval: the trained run's config.yaml sets task_config.args, "
        "task_config.shuffle_buffer, which the run's data sources never read: dropped (a new run refuses "
        "them)\n"
        "streamrl: note: eval: the trained run's config.yaml sets task_config.sources[0].args, which the "
        "run's data sources never read: dropped (a new run refuses them)\n"
    )
    with pytest.raises(ValueError, match=r"^config key 'task_config.args' is not read by a data source"):
        eval_config(None, [f"model={tmp_path / 'single' / 'checkpoint'}", "task_config.args={revision: v2}"])
