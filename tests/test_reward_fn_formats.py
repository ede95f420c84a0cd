"""The form your reward functions get `completions` and `prompts` in (reward.completions): TRL's own
conversational rewards (trl.rewards accuracy_reward, think_format_reward) score through the scoring
path with chat messages, auto picks each function's format with one call on the first training problem
(printed, and recorded in the config), and a function that fails in every format it may take is
refused in one line before any model loads and before anything is written."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest
from tiny_args import TINY
from user_rewards import _problem, _scored, _traj  # tests/ is on sys.path

from streamrl.cli import main
from streamrl.config import ConfigError, load_config
from streamrl.rewards.fn_probe import choose_formats
from streamrl.rewards.user_fns import configured_fns, load_fns

FORMAT_FILE = textwrap.dedent(
    """
    CALLS = []

    def records(prompts, completions, **columns):
        CALLS.append((prompts, completions))
        return [1.0]

    def chat_length(completions, **columns):  # reads a conversational completion, as TRL's own do
        return [float(len(c[0]["content"])) for c in completions]
    """
)


@pytest.fixture()
def fmt_file(user_file: Path) -> Path:
    """fmt_rewards.py beside my_rewards.py in the working directory."""
    path = user_file.parent / "fmt_rewards.py"
    path.write_text(FORMAT_FILE)
    return path


def _solution(solution: str) -> object:
    return _problem("7", solution=solution)  # a row with TRL's `solution` column


@pytest.mark.parametrize("service", ["inline", "thread"])
@pytest.mark.parametrize(
    ("fn", "text", "reward"),
    [
        ("accuracy_reward", r"So \boxed{\frac{1}{2}}", 1.0),
        ("accuracy_reward", r"So \boxed{\frac{1}{3}}", 0.0),
        ("think_format_reward", "<think>\nhalf\n</think>\nSo 0.5", 1.0),
        ("think_format_reward", "half. So 0.5", 0.0),
    ],
    ids=["accuracy-right", "accuracy-wrong", "think-format-followed", "think-format-missing"],
)
def test_trls_own_rewards_score_with_chat_completions(
    user_file: Path, service: str, fn: str, text: str, reward: float
) -> None:
    args = [f"reward.fn=trl.rewards:{fn}", "reward.completions=chat", f"reward.service={service}"]
    t = _scored(args, _solution(r"\frac{1}{2}"), _traj(text, [5, 6]))
    assert (t.reward, t.reward_info["reward_error"], t.reward_info[f"reward/{fn}"]) == (reward, None, reward)


def test_auto_chooses_chat_for_trls_rewards_and_the_scoring_path_uses_it(
    user_file: Path, capsys: pytest.CaptureFixture
) -> None:
    """The start-up call picks chat for TRL's functions and text for a text one; the choice is
    recorded in the config, so scoring (any process built from it) calls each function that way."""
    fns = (
        "reward.fns=[{fn: trl.rewards:accuracy_reward}, {fn: trl.rewards:think_format_reward, weight: 0.5},"
        " {fn: my_rewards.py:brevity, weight: 2}]"
    )
    cfg = load_config(None, [fns])
    problem = _solution(r"\frac{1}{2}")
    fs = configured_fns(cfg.reward.fn, cfg.reward.fns, cfg.reward.completions)
    choose_formats(cfg.reward, load_fns(fs), fs, problem)
    assert capsys.readouterr().err == (
        "streamrl: reward function trl.rewards:accuracy_reward takes completions as chat messages "
        "(reward.completions=auto)\n"
        "streamrl: reward function trl.rewards:think_format_reward takes completions as chat messages "
        "(reward.completions=auto)\n"
        "streamrl: reward function my_rewards.py:brevity takes completions as text "
        "(reward.completions=auto)\n"
    )
    assert [e["completions"] for e in cfg.reward.fns] == ["chat", "chat", "text"]
    again = load_config(None, [f"reward.fns={json.dumps(list(cfg.reward.fns))}"])  # as config.yaml reads back
    t = _scored(
        [f"reward.fns={json.dumps(list(again.reward.fns))}"],
        problem,
        _traj(r"<think>a</think>\boxed{0.5}", [5]),
    )
    # accuracy 1 + think format 0.5 * 1 + brevity 2 * 1 / 2
    assert (t.reward, t.reward_info["reward_error"]) == (2.5, None)


def test_chat_passes_the_prompts_messages_and_the_response_as_one_assistant_message(fmt_file: Path) -> None:
    problem = _problem()
    problem.messages = [
        {"role": "system", "content": "You are a calculator."},
        {"role": "user", "content": "What is 3+4?\nEnd with the answer."},
    ]
    _scored(["reward.fn=fmt_rewards.py:records", "reward.completions=chat"], problem, _traj("so 7", [5]))
    _scored(["reward.fn=fmt_rewards.py:records", "reward.completions=text"], problem, _traj("so 8", [5]))
    from streamrl.user_code import load_object

    calls = load_object("fmt_rewards.py:records", "reward.fn").__globals__["CALLS"]
    assert calls == [
        ([problem.messages], [[{"role": "assistant", "content": "so 7"}]]),
        (["What is 3+4?"], ["so 8"]),  # text: the question as the row asked it
    ]


def test_auto_records_the_format_of_a_single_function(fmt_file: Path, capsys: pytest.CaptureFixture) -> None:
    cfg = load_config(None, ["reward.fn=fmt_rewards.py:chat_length"])
    fs = configured_fns(cfg.reward.fn, cfg.reward.fns, cfg.reward.completions)
    choose_formats(cfg.reward, load_fns(fs), fs, _problem())
    assert cfg.reward.completions == "chat"
    assert capsys.readouterr().err == (
        "streamrl: reward function fmt_rewards.py:chat_length takes completions as chat messages "
        "(reward.completions=auto)\n"
    )
    t = _scored(
        ["reward.fn=fmt_rewards.py:chat_length", "reward.completions=chat"], _problem(), _traj("so 7", [5])
    )
    assert t.reward == 4.0  # len("so 7")


TEXT_ERROR = "TypeError: string indices must be integers, not 'str'"


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["reward.fn=my_rewards.py:raises"],
            "config key 'reward.fn': my_rewards.py:raises fails on the first training problem (id p1) with "
            "completions as text (RuntimeError: boom) and with completions as chat messages (RuntimeError: "
            "boom): fix it so that it returns a float or None per completion in one of them",
        ),
        (
            ["reward.fn=my_rewards.py:broken"],
            "config key 'reward.fn': my_rewards.py:broken fails on the first training problem (id p1) with "
            "completions as text (TypeError: the function returned list [0.5, 0.5]; expected a list with "
            "one float (or None) per completion) and with completions as chat messages (TypeError: the "
            "function returned list [0.5, 0.5]; expected a list with one float (or None) per completion): "
            "fix it so that it returns a float or None per completion in one of them",
        ),
        (
            ["reward.fn=trl.rewards:accuracy_reward", "reward.completions=text"],
            "config key 'reward.fn': trl.rewards:accuracy_reward fails on the first training problem "
            f"(id p1) with completions as text ({TEXT_ERROR}), as reward.completions=text passes them: fix "
            "it, or set reward.completions=auto (text, else chat messages) or reward.completions=chat",
        ),
        (
            ["reward.fns=[{fn: task}, {fn: fmt_rewards.py:chat_length, completions: text}]"],
            "config key 'reward.fns[1]': fmt_rewards.py:chat_length fails on the first training problem "
            f"(id p1) with completions as text ({TEXT_ERROR}), as reward.fns[1].completions=text passes "
            "them: fix it, or set reward.fns[1].completions=auto (text, else chat messages) or "
            "reward.fns[1].completions=chat",
        ),
        (
            ["reward.fns=[{fn: my_rewards.py:raises}]"],
            "config key 'reward.fns[0]': my_rewards.py:raises fails on the first training problem (id p1) "
            "with completions as text (RuntimeError: boom) and with completions as chat messages "
            "(RuntimeError: boom): fix it so that it returns a float or None per completion in one of them",
        ),
        (
            ["reward.fns=[{fn: fmt_rewards.py:chat_length, completions: text}]"],
            "config key 'reward.fns[0]': fmt_rewards.py:chat_length fails on the first training problem "
            f"(id p1) with completions as text ({TEXT_ERROR}), as reward.fns[0].completions=text passes "
            "them: fix it, or set reward.fns[0].completions=auto (text, else chat messages) or "
            "reward.fns[0].completions=chat",
        ),
        (
            ["reward.fn=my_rewards.py:hangs", "reward.timeout_s=0.5"],
            "config key 'reward.fn': my_rewards.py:hangs fails on the first training problem (id p1) with "
            "completions as text (TimeoutError: no result within reward.timeout_s=0.5 s): make it return "
            "sooner, or raise reward.timeout_s",
        ),
    ],
    ids=[
        "raises",
        "malformed",
        "trl-as-text",
        "chat-function-as-text",
        "the-only-entry-of-fns",
        "the-only-entry-of-fns-as-text",
        "hangs",
    ],
)
def test_a_function_that_fails_in_its_formats_is_refused_in_one_line(
    fmt_file: Path, args: list[str], message: str
) -> None:
    cfg = load_config(None, args)
    fs = configured_fns(cfg.reward.fn, cfg.reward.fns, cfg.reward.completions)
    with pytest.raises(ValueError) as e:
        choose_formats(cfg.reward, load_fns(fs), fs, _solution(r"\frac{1}{2}"))
    assert str(e.value) == message


def _rows(where: Path) -> list[str]:
    """A data task of one training row (id q1) with TRL's `solution` column, held-out rows apart."""
    rows, held = where / "rows.jsonl", where / "held.jsonl"
    rows.write_text(json.dumps({"id": "q1", "prompt": "What is 3+4?", "answer": "7", "solution": "7"}) + "\n")
    held.write_text(json.dumps({"id": "h1", "prompt": "What is 1+1?", "answer": "2", "solution": "2"}) + "\n")
    columns = "task_config.columns={prompt: prompt, answer: answer, id: id}"
    return [f"task=data:{rows}", f"task_config.eval_data={held}", "eval.size=1", columns]


def test_a_trl_reward_trains_in_the_format_auto_chose(user_file: Path, capsys: pytest.CaptureFixture) -> None:
    run = user_file.parent / "run"
    args = [*TINY, *_rows(user_file.parent), "reward.fn=trl.rewards:think_format_reward", "max_steps=1"]
    assert (
        main(
            [
                "train",
                *args,
                "runtime.mode=colocated",
                "max_staleness=0",
                "eval.after=false",
                f"run_dir={run}",
            ]
        )
        == 0
    )
    assert (
        "streamrl: reward function trl.rewards:think_format_reward takes completions as chat messages "
        "(reward.completions=auto)\n"
    ) in capsys.readouterr().err
    assert load_config(run / "config.yaml").reward.completions == "chat"
    [row] = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert (row["rewards_scored"], row["reward_errors"], row["reward/think_format_reward"]) == (8, 0, 0.0)


def test_a_failing_function_stops_training_before_the_model_loads_and_anything_is_written(
    user_file: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_model(*args: object) -> None:
        raise AssertionError("the model was resolved before the reward functions were checked")

    monkeypatch.setattr("streamrl.preflight.resolve_model_dir", no_model)
    run = user_file.parent / "run"
    data = _rows(user_file.parent)
    args = [
        *TINY,
        *data,
        "reward.fn=trl.rewards:accuracy_reward",
        "reward.completions=text",
        f"run_dir={run}",
    ]
    assert main(["train", *args]) == 2
    assert capsys.readouterr().err == (
        "streamrl: error: config key 'reward.fn': trl.rewards:accuracy_reward fails on the first training "
        f"problem (id q1) with completions as text ({TEXT_ERROR}), as reward.completions=text passes them: "
        "fix it, or set reward.completions=auto (text, else chat messages) or reward.completions=chat\n"
    )
    assert not run.exists()


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            ["reward.completions=chat"],
            "config key 'reward.completions' is chat, but no reward function of your own is set (reward.fn, "
            "or reward.fns beyond fn: task): drop it, or set reward.fn",
        ),
        (
            ["reward.fns=[{fn: task, completions: chat}]"],
            "config key 'reward.fns[0].completions': fn: task is the task's own reward, which is not called "
            "with completions: drop completions from that entry",
        ),
        (
            ["reward.fns=[{fn: a.py:f, completions: messages}]"],
            "config key 'reward.fns[0].completions' must be one of auto, text, chat, got 'messages'",
        ),
        (
            ["reward.fn=a.py:f", "reward.completions=messages"],
            "config key 'reward.completions' expects one of 'auto', 'text', 'chat', got 'messages'",
        ),
    ],
    ids=["without-functions", "on-the-task-entry", "unknown-in-an-entry", "unknown"],
)
def test_bad_format_settings_are_one_line(override: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, override)
    assert str(e.value) == message


def test_the_format_names_are_written_once() -> None:
    """reward.completions, a reward.fns entry's completions and the scoring path read one list of
    formats (config_rewards.py): a format added there is accepted, documented and known everywhere."""
    import re
    from typing import get_args, get_type_hints

    import streamrl
    from streamrl.config import RewardConfig
    from streamrl.config_rewards import FN_FORMATS
    from streamrl.rewards import fn_formats

    assert FN_FORMATS == ("auto", "text", "chat")
    assert get_args(get_type_hints(RewardConfig)["completions"]) == FN_FORMATS
    assert (fn_formats.AUTO, fn_formats.TEXT, fn_formats.CHAT) == FN_FORMATS
    assert not hasattr(fn_formats, "FORMATS")
    src = Path(streamrl.__file__).parent
    spelled = [
        p for p in sorted(src.rglob("*.py")) if re.search(r'"auto",\s*"text",\s*"chat"', p.read_text())
    ]
    assert spelled == [src / "config_rewards.py"]
