"""Reward functions of the user's own (reward.fn / reward.fns) before they score: every bad setting, a
function that does not import and one whose parameters no call fits refused in one line before anything
is written, and a slow import in a reward process made before the worker says ready, not charged to
the first score's timeout."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_args import TINY
from user_rewards import _problem, _traj  # tests/ is on sys.path

from streamrl.cli import main
from streamrl.config import ConfigError, load_config
from streamrl.rollout.score import Scoring


@pytest.mark.parametrize(
    ("override", "message"),
    [
        (
            ["reward.fn=my_rewards:brevity", "reward.fns=[{fn: task}]"],
            "config keys 'reward.fn' and 'reward.fns' exclude each other: list every function in reward.fns",
        ),
        (
            ["reward.fns=[{weight: 2}]"],
            "config key 'reward.fns[0]' must be a mapping with fn (e.g. {fn: my_rewards.py:brevity, "
            "weight: 0.5}), got {'weight': 2}",
        ),
        (
            ["reward.fns=[{fn: task, wieght: 2}]"],
            "config key 'reward.fns[0]': unknown field(s) wieght; valid: fn, weight, name, completions",
        ),
        (
            ["reward.fns=[{fn: task, weight: heavy}]"],
            "config key 'reward.fns[0].weight' must be a finite number, got 'heavy'",
        ),
        (
            ["reward.fns=[{fn: task, weight: .inf}]"],
            "config key 'reward.fns[0].weight' must be a finite number, got inf",
        ),
        (
            ["reward.fn=my_rewards.brevity"],
            "config key 'reward.fn' must be package.module:function or path/to/file.py:function, "
            "got 'my_rewards.brevity'",
        ),
        (
            ["reward.fns=[{fn: a.py:f}, {fn: b.py:f}]"],
            "config key 'reward.fns': two functions are named f: give one a name (name: ...)",
        ),
    ],
)
def test_bad_settings_are_one_line(override: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, override)
    assert str(e.value) == message


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("missing.py:f", "config key 'reward.fn': file 'missing.py' (from 'missing.py:f') not found"),
        ("my_rewards.py:nope", "config key 'reward.fn': 'my_rewards.py' has no attribute 'nope'"),
    ],
)
def test_a_function_that_does_not_import_fails_before_anything_is_written(
    user_file: Path, spec: str, message: str, capsys: pytest.CaptureFixture
) -> None:
    run = user_file.parent / "run"
    assert main(["train", *TINY, f"reward.fn={spec}", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"streamrl: error: {message}") and err.count("\n") == 1
    assert not run.exists()


def test_a_function_without_kwargs_is_refused_before_anything_is_written(
    user_file: Path, capsys: pytest.CaptureFixture
) -> None:
    run = user_file.parent / "run"
    assert main(["train", *TINY, "reward.fn=my_rewards.py:no_kwargs", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "streamrl: error: config key 'reward.fn': my_rewards.py:no_kwargs takes no **kwargs; it is called "
        "as fn(prompts=..., completions=..., completion_ids=..., **columns), as in TRL: add **kwargs to its "
        "parameters\n"
    )
    assert not run.exists()


def test_a_function_that_needs_a_column_the_rows_lack_is_refused_before_anything_is_written(
    user_file: Path, capsys: pytest.CaptureFixture
) -> None:
    run = user_file.parent / "run"
    assert main(["train", *TINY, "reward.fn=my_rewards.py:needs_solution", f"run_dir={run}"]) == 2
    assert capsys.readouterr().err == (
        "streamrl: error: config key 'reward.fn': my_rewards.py:needs_solution needs 'solution', which no "
        "call passes (it is called with answer, completion_ids, completions, prompts): use one of those "
        "names or give 'solution' a default\n"
    )
    assert not run.exists()
    rows = user_file.parent / "rows.jsonl"  # rows with that column: the same function is accepted
    rows.write_text(json.dumps({"prompt": "What is 3+4?", "answer": "7", "solution": "7"}) + "\n")
    from streamrl.rewards.user_fns import check_arguments, configured_fns, load_fns, reward_columns
    from streamrl.tasks import make_task

    fns = configured_fns("my_rewards.py:needs_solution", [])
    problem = next(make_task(f"data:{rows}", {}, "", "", "answer_is").train_stream(0, set()))
    check_arguments(load_fns(fns), fns, reward_columns(problem))
    # a mixture: every source's rows are checked, not only those the first problem came from
    many = user_file.parent / "many.jsonl"
    rows_with_solution = [{"prompt": f"{i}+1?", "answer": str(i + 1), "solution": "s"} for i in range(12)]
    many.write_text("".join(json.dumps(r) + "\n" for r in rows_with_solution))
    mix = f"task_config.sources=[{{task: data:{many}, weight: 1000}}, {{task: rg:chain_sum, weight: 1}}]"
    args = [*TINY, "task=mix", mix, "reward.fn=my_rewards.py:needs_solution"]
    assert main(["train", *args, f"run_dir={run}"]) == 2
    assert "needs_solution needs 'solution', which no call passes" in capsys.readouterr().err
    assert not run.exists()


def test_a_slow_import_in_a_reward_process_is_not_charged_to_the_first_scores_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """reward.service=process: a worker imports your module before it says ready (bounded by the
    service's start-up limit), so a module that takes longer to import than reward.timeout_s (a model it
    loads) still scores; before, every first score timed out, its worker was replaced, and so on."""
    (tmp_path / "slow_rewards.py").write_text(
        "import time\ntime.sleep(3)  # loads a classifier\n\n"
        "def length(prompts, completions, **columns):\n    return [float(len(completions[0]))]\n"
    )
    (tmp_path / "rows.jsonl").write_text('{"prompt": "What is 3+4?", "answer": "7"}\n')
    monkeypatch.chdir(tmp_path)
    cfg = load_config(
        None,
        ["task=data:rows.jsonl", "reward.extract=last_number", "reward.service=process", "reward.timeout_s=1"]
        + ["reward.workers=1", "reward.fn=slow_rewards.py:length"],
    )
    scoring = Scoring(cfg)
    try:
        t = _traj("so 7", [5])
        scoring.score([(_problem(), t)])
    finally:
        scoring.close()
    assert t.reward_info["reward_error"] is None and t.reward == 4.0  # len("so 7")


def test_a_functions_name_follows_one_rule_wherever_it_is_read() -> None:
    """The name a reward.fns entry is scored and logged under (configured_fns), the one auto's format is
    recorded under (record_formats), the one two entries may not share (the config check) and the one
    streamrl.train gives a function are one rule (config_rewards.reward_fn_name), written once."""
    import re

    import streamrl
    from streamrl.api import _reward_settings
    from streamrl.rewards.fn_formats import record_formats
    from streamrl.rewards.user_fns import configured_fns

    cfg = load_config(
        None, ["reward.fns=[{fn: my_rewards.py:brevity}, {fn: pkg.mod:length, name: size}, {fn: task}]"]
    )
    rc = cfg.reward
    assert [f.name for f in configured_fns(rc.fn, rc.fns, rc.completions)] == ["brevity", "size", "task"]
    assert [f.name for f in configured_fns("pkg.mod:length", ())] == ["length"]
    record_formats(rc, {"brevity": "chat", "size": "text"})
    assert [e.get("completions") for e in rc.fns] == ["chat", "text", None]
    with pytest.raises(ConfigError, match="two functions are named size"):
        load_config(None, ["reward.fns=[{fn: a.py:size}, {fn: pkg.mod:length, name: size}]"])
    entries = _reward_settings(["a.py:f", "pkg.b:f", "c.py:g"])["reward.fns"]
    assert [e.get("name") for e in entries] == ["a.f", "pkg.b.f", None]
    rule = re.compile(r"""rpartition\(["']:["']\)\[2\]""")
    # user_code.py's own use is the attribute of any spec, in a hint of its import error
    files = [p for p in Path(streamrl.__file__).parent.rglob("*.py") if p.name != "user_code.py"]
    assert [p.name for p in files if rule.search(p.read_text())] == ["config_rewards.py"]


@pytest.mark.parametrize(
    ("fns", "message"),
    [
        (
            [{"fn": "missing.py:f"}],
            "config key 'reward.fns[0]': file 'missing.py' (from 'missing.py:f') not found",
        ),
        (
            [{"fn": "task"}, {"fn": "my_rewards.py:no_kwargs"}],
            "config key 'reward.fns[1]': my_rewards.py:no_kwargs takes no **kwargs",
        ),
        (
            [{"fn": "my_rewards.py:needs_solution"}],
            "config key 'reward.fns[0]': my_rewards.py:needs_solution needs 'solution', which no call passes",
        ),
    ],
    ids=["does-not-import", "no-kwargs", "needs-a-column"],
)
def test_a_refused_entry_of_reward_fns_is_named_by_its_own_key(
    user_file: Path, fns: list[dict], message: str
) -> None:
    """An entry of reward.fns is refused as reward.fns[i], the key the user wrote (one entry too: it
    was never reward.fn)."""
    from streamrl.rewards.user_fns import check_arguments, configured_fns, load_fns, reward_columns

    configured = configured_fns("", fns)
    with pytest.raises(ValueError) as e:
        check_arguments(load_fns(configured), configured, reward_columns(_problem()))
    assert str(e.value).startswith(message)
