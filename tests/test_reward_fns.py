"""Reward functions of the user's own (reward.fn / reward.fns) in TRL's convention: exact weighted sums,
None as "not applicable", each function's value logged on its own, malformed results and exceptions
costing one sample's reward, and every bad setting refused in one line before anything is written."""

from __future__ import annotations

import json
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tiny_args import TINY

from streamrl.cli import main
from streamrl.config import ConfigError, load_config
from streamrl.rollout.score import Scoring
from streamrl.types import Problem, Trajectory

USER_FILE = textwrap.dedent(
    """
    CALLS = []

    def brevity(prompts, completions, completion_ids, answer, **columns):
        CALLS.append((prompts, completions, completion_ids, answer, columns))
        return [1.0 / (1 + len(ids)) for ids in completion_ids]

    def mentions_answer(prompts, completions, answer, **columns):
        return [None if a == "skip" else float(a in c) for c, a in zip(completions, answer)]

    def broken(prompts, completions, **columns):
        return [0.5, 0.5]  # two values for one completion

    def raises(prompts, completions, **columns):
        raise RuntimeError("boom")

    LOOPS = []

    async def async_brevity(prompts, completions, completion_ids, **columns):
        import asyncio

        LOOPS.append(asyncio.get_running_loop())  # a client made on the first call is bound to it
        return [1.0 / (1 + len(ids)) for ids in completion_ids]

    CANCELLED = []

    async def async_hangs(prompts, completions, **columns):
        import asyncio

        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            CANCELLED.append(completions[0])
            raise

    def no_kwargs(prompts, completions, completion_ids):
        return [1.0]

    def needs_solution(completions, solution, **kwargs):  # open-r1's accuracy reward: a `solution` column
        return [float(s in c) for c, s in zip(completions, solution)]

    def answer_is_72(prompts, completions, answer, **columns):
        return [float(a == "72") for a in answer]

    def text_score(prompts, completions, **columns):
        return ["8"]  # a judge's raw text: not a reward

    def keyed_score(prompts, completions, **columns):
        return {0.7: completions[0]}  # a mapping iterates as its keys

    def hangs(prompts, completions, **columns):
        import time

        time.sleep(30)
        return [1.0]

    def exits(prompts, completions, **columns):
        import os

        os._exit(3)  # the worker process dies mid-score
    """
)


def _problem(answer: str = "7", **columns: object) -> Problem:
    meta = {
        "kind": "math",
        "question": "What is 3+4?",
        "columns": {"prompt": "What is 3+4?", "answer": answer, **columns},
    }
    return Problem("p1", [{"role": "user", "content": "What is 3+4?"}], answer, meta)


def _traj(text: str, ids: list[int]) -> Trajectory:
    return Trajectory(
        problem_id="p1",
        group_id="g",
        sample_id="g-0",
        prompt_ids=[1],
        completion_ids=ids,
        behaviour_logprobs=[0.0] * len(ids),
        versions=[0] * len(ids),
        finish_reason="stop",
        text=text,
    )


@pytest.fixture
def user_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    (tmp_path / "my_rewards.py").write_text(USER_FILE)
    monkeypatch.chdir(tmp_path)
    yield tmp_path / "my_rewards.py"
    sys.modules.pop("my_rewards", None)  # another test's my_rewards.py is another module


def _scored(overrides: list[str], problem: Problem, traj: Trajectory) -> Trajectory:
    from streamrl.data.sources import task_from_rows

    cfg = load_config(None, ["reward.extract=last_number", "reward.service=inline", *overrides])
    task = task_from_rows([{"prompt": "What is 3+4?", "answer": "7"}], extract="last_number")
    scoring = Scoring(cfg, task)
    scoring.score([(problem, traj)])
    scoring.close()
    return traj


def test_weighted_functions_and_the_task_reward_sum_exactly(user_file: Path) -> None:
    fns = (
        "reward.fns=[{fn: my_rewards.py:brevity, weight: 0.5}, {fn: my_rewards:mentions_answer, weight: 2},"
        " {fn: task, weight: 0.25}]"
    )
    t = _scored([fns], _problem(source="unit"), _traj("so 7", [5, 6, 7]))
    # brevity 1/4 * 0.5 + mentions 1.0 * 2 + task (correct 1 + format_weight 0.1 * formatted 1) * 0.25
    assert t.reward == pytest.approx(0.125 + 2.0 + 1.1 * 0.25, abs=1e-12)
    assert t.reward_info["reward/brevity"] == 0.25
    assert t.reward_info["reward/mentions_answer"] == 1.0
    assert t.reward_info["reward/task"] == pytest.approx(1.1)
    assert t.correct is True  # accuracy is still the task's verdict
    import my_rewards

    [(prompts, completions, ids, answer, columns)] = my_rewards.CALLS
    assert (prompts, completions, ids, answer) == (["What is 3+4?"], ["so 7"], [[5, 6, 7]], ["7"])
    assert columns == {"source": ["unit"]}  # the row's own columns ("prompt" passes as prompts)


def test_one_text_in_two_tokenizations_is_scored_for_each(user_file: Path) -> None:
    """Identical responses are scored once, but a reward function reads the token ids too: the same
    text ending with another stop token is another response."""
    from streamrl.data.sources import task_from_rows

    cfg = load_config(
        None, ["reward.extract=last_number", "reward.service=inline", "reward.fn=my_rewards.py:brevity"]
    )
    scoring = Scoring(cfg, task_from_rows([{"prompt": "What is 3+4?", "answer": "7"}], extract="last_number"))
    short, long = _traj("so 7", [5, 6, 7]), _traj("so 7", [5, 6, 7, 8])
    scoring.score([(_problem(), short), (_problem(), long), (_problem(), _traj("so 7", [5, 6, 7]))])
    scoring.close()
    assert (short.reward, long.reward) == (0.25, 0.2)  # 1 / (1 + tokens)
    import my_rewards

    assert len(my_rewards.CALLS) == 2  # the third, a repeat of the first, came from the cache


def test_none_means_not_applicable(user_file: Path) -> None:
    t = _scored(["reward.fn=my_rewards:mentions_answer"], _problem("skip"), _traj("so 7", [5]))
    assert t.reward == 0.0 and t.reward_info["reward/mentions_answer"] is None


@pytest.mark.parametrize(
    ("fn", "reason"),
    [
        ("broken", "TypeError"),
        ("raises", "RuntimeError"),
        ("text_score", "TypeError"),
        ("keyed_score", "TypeError"),
    ],
    ids=["malformed", "raises", "text", "mapping"],
)
def test_a_failing_function_costs_that_sample_only(user_file: Path, fn: str, reason: str) -> None:
    t = _scored([f"reward.fn=my_rewards.py:{fn}"], _problem(), _traj("so 7", [5]))
    assert t.reward == 0.0 and t.correct is True  # the reward fails; the task's verdict stands
    assert t.reward_info["reward_error"] == reason


@pytest.mark.parametrize("service", ["inline", "thread", "process"])
@pytest.mark.parametrize(("text", "correct"), [("so 7", True), ("so 8", False)])
def test_accuracy_is_the_tasks_verdict_when_only_your_function_fails(
    user_file: Path, service: str, text: str, correct: bool
) -> None:
    fns = "reward.fns=[{fn: task}, {fn: my_rewards.py:raises}]"
    rows = user_file.parent / "rows.jsonl"  # a process worker builds the task from the config
    rows.write_text(json.dumps({"prompt": "What is 3+4?", "answer": "7"}) + "\n")
    t = _scored([fns, f"reward.service={service}", f"task=data:{rows}"], _problem(), _traj(text, [5]))
    assert (t.reward, t.correct, t.reward_info["reward_error"]) == (0.0, correct, "RuntimeError")
    assert t.reward_info["reward_latency_s"] > 0


@pytest.mark.parametrize(
    ("service", "fn", "reason"),
    [("thread", "hangs", "timeout"), ("process", "hangs", "timeout"), ("process", "exits", "WorkerDied")],
)
@pytest.mark.parametrize(("text", "correct"), [("so 7", True), ("so 8", False)])
def test_accuracy_is_the_tasks_verdict_when_your_function_hangs_or_kills_its_worker(
    user_file: Path, service: str, fn: str, reason: str, text: str, correct: bool
) -> None:
    rows = user_file.parent / "rows.jsonl"  # a process worker builds the task from the config
    rows.write_text(json.dumps({"prompt": "What is 3+4?", "answer": "7"}) + "\n")
    timeout = 1 if fn == "hangs" else 60  # a worker that dies must not be overtaken by the deadline
    overrides = [f"reward.fn=my_rewards.py:{fn}", f"reward.timeout_s={timeout}", f"reward.service={service}"]
    t = _scored([*overrides, f"task=data:{rows}"], _problem(), _traj(text, [5]))
    assert (t.reward, t.correct, t.reward_info["reward_error"]) == (0.0, correct, reason)


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
            "config key 'reward.fns[0]': unknown field(s) wieght; valid: fn, weight, name",
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


def test_each_function_is_logged_in_metrics(user_file: Path) -> None:
    run = user_file.parent / "run"
    fns = "reward.fns=[{fn: my_rewards.py:brevity}, {fn: task, weight: 0.5, name: verifier}]"
    args = [*TINY, fns, "runtime.mode=colocated", "max_staleness=0", "max_steps=2", f"run_dir={run}"]
    assert main(["train", *args]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    groups = [json.loads(x) for x in (run / "groups.jsonl").read_text().splitlines()]
    for row in rows:
        assert 0 < row["reward/brevity"] <= 1 / 2 and "reward/verifier" in row
        step = [r for g in groups if g["step"] == row["step"] for r in g["rewards"]]
        # every reward is brevity (in (0, 1/2]) + 0.5 * the verifier's (0, 0.05, 0.5 or 0.55)
        assert row["reward_mean"] == pytest.approx(sum(step) / len(step))
        assert row["reward_mean"] == pytest.approx(row["reward/brevity"] + 0.5 * row["reward/verifier"])


def test_an_async_function_is_awaited_on_one_loop_that_lives_on(user_file: Path) -> None:
    """As TRL runs them: every call on the same running loop, so what a function keeps between calls
    (an async HTTP client bound to its loop) still works on the next sample."""
    from streamrl.rewards.user_fns import call_fn
    from streamrl.user_code import load_object

    t = _scored(["reward.fn=my_rewards.py:async_brevity"], _problem(), _traj("so 7", [5, 6, 7]))
    assert t.reward_info["reward/async_brevity"] == 0.25 and t.reward == 0.25
    fn = load_object("my_rewards.py:async_brevity", "reward.fn")
    assert [call_fn(fn, "f", "q", "so 7", [5], {}) for _ in range(2)] == [0.5, 0.5]
    loops = fn.__globals__["LOOPS"][-2:]
    assert loops[0] is loops[1] and loops[0].is_running()


@pytest.mark.parametrize("service", ["inline", "thread"])
def test_an_async_function_past_the_timeout_is_cancelled_not_left_on_the_loop(
    user_file: Path, service
) -> None:
    import time

    fns = ["reward.fn=my_rewards.py:async_hangs", "reward.timeout_s=0.5", f"reward.service={service}"]
    box: list[Trajectory] = []  # a daemon thread: a wait without a limit fails the test, not hangs it
    th = threading.Thread(
        target=lambda: box.append(_scored(fns, _problem(), _traj("so 7", [5]))), daemon=True
    )
    th.start()
    th.join(60)
    assert box, "the score never returned"
    t = box[0]
    if service == "inline":  # the function's own timeout
        assert (t.reward, t.correct, t.reward_info["reward_error"]) == (0.0, True, "TimeoutError")
    else:  # whichever gives up first, the service or the function's own timeout: the verdict is kept
        error = t.reward_info["reward_error"]
        assert t.reward == 0.0 and error in ("timeout", "TimeoutError") and t.correct is True
    import my_rewards

    for _ in range(100):  # the abandoned thread wakes at its own timeout and cancels the coroutine
        if my_rewards.CANCELLED:
            break
        time.sleep(0.1)
    assert my_rewards.CANCELLED == ["so 7"]


def test_answer_is_the_parsed_reference_even_beside_a_raw_answer_column(user_file: Path) -> None:
    """A GSM8K row: its raw `answer` column holds the worked solution, the task's reference is 72."""
    problem = _problem("72")
    problem.meta["columns"]["answer"] = "48 + 24 = 72 clips.\n#### 72"
    t = _scored(["reward.fn=my_rewards.py:answer_is_72"], problem, _traj("so 72", [5]))
    assert t.reward_info["reward/answer_is_72"] == 1.0


def test_without_a_mapped_answer_a_rows_answer_column_reaches_the_function(user_file: Path) -> None:
    """task_config.columns.answer=null: no reference is parsed, and a row's own `answer` field stays."""
    problem = _problem("")
    problem.meta["columns"]["answer"] = "72"
    t = _scored(["reward.fn=my_rewards.py:answer_is_72"], problem, _traj("so 72", [5]))
    assert t.reward_info["reward/answer_is_72"] == 1.0


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
