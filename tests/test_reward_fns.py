"""Reward functions of the user's own (reward.fn / reward.fns) in TRL's convention: exact weighted sums,
None as "not applicable", each function's value logged on its own, malformed results, exceptions, hangs
and dead workers costing one sample's reward (accuracy stays the task's verdict), async functions
awaited on one loop and cancelled at their timeout, and the answer a function is given."""

from __future__ import annotations

import json
import logging
import threading
from pathlib import Path

import pytest
from tiny_args import TINY
from user_rewards import _problem, _scored, _traj  # tests/ is on sys.path

from streamrl.cli import main
from streamrl.config import load_config
from streamrl.loop.step_metrics import step_record
from streamrl.rollout.score import Scoring
from streamrl.types import Group, Trajectory


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


def test_rows_of_one_prompt_are_scored_against_their_own_columns(user_file: Path) -> None:
    """Two streamed rows with one prompt and one answer share a problem id; a reward function reading
    another column (style) scores a response against each row's own, never the other row's cached
    score, while a repeat of a row's response still comes from the cache."""
    import itertools

    import datasets

    from streamrl.data.sources import task_from_rows

    rows = [{"prompt": "What is 3+4?", "answer": "7", "style": s} for s in ("formal", "casual")]
    task = task_from_rows(
        datasets.Dataset.from_list(rows).to_iterable_dataset(),
        eval_rows=[{"prompt": "What is 1+1?", "answer": "2"}],
        extract="last_number",
        shuffle_buffer=1,
    )
    problems = list(itertools.islice(task.train_stream(0, set()), 2))
    assert [p.meta["columns"]["style"] for p in problems] == ["formal", "casual"]
    assert problems[0].id == problems[1].id and problems[0].answer == problems[1].answer
    cfg = load_config(None, ["reward.extract=last_number", "reward.fn=my_rewards.py:style_match"])
    scoring = Scoring(cfg, task)
    trajs = [_traj("a formal 7", [5, 6]) for _ in range(3)]
    scoring.score([(problems[0], trajs[0]), (problems[1], trajs[1])])
    scoring.score([(problems[0], trajs[2])])
    scoring.close()
    assert [t.reward for t in trajs] == [1.0, 0.0, 1.0]
    assert [t.reward_info["reward_cached"] for t in trajs] == [False, False, True]


def test_a_row_whose_columns_are_no_json_is_scored(user_file: Path) -> None:
    # a row given from Python may hold a mapping whose keys do not sort: the cache key still has a digest
    t = _scored(["reward.fn=my_rewards.py:brevity"], _problem(extra={1: "a", "b": 2}), _traj("so 7", [5]))
    assert t.reward == 0.5 and t.reward_info["reward_error"] is None


def test_none_means_not_applicable(user_file: Path) -> None:
    t = _scored(["reward.fn=my_rewards:mentions_answer"], _problem("skip"), _traj("so 7", [5]))
    assert t.reward == 0.0 and t.reward_info["reward/mentions_answer"] is None


@pytest.mark.parametrize(
    ("fn", "reason", "message"),
    [
        (
            "broken",
            "TypeError",
            "the function returned list [0.5, 0.5]; expected a list with one float (or None) per completion",
        ),
        ("raises", "RuntimeError", "boom"),
        ("text_score", "TypeError", "the function returned '8' for a completion; expected a float or None"),
        (
            "keyed_score",
            "TypeError",
            "the function returned dict {0.7: 'so 7'}; expected a list with one "
            "float (or None) per completion",
        ),
        ("nan_score", "TypeError", "the function returned nan for a completion; expected a finite float"),
    ],
    ids=["malformed", "raises", "text", "mapping", "nan"],
)
def test_a_failing_function_costs_that_sample_only(
    user_file: Path, fn: str, reason: str, message: str
) -> None:
    """Its message names the function once, in the parentheses every reward error ends with."""
    t = _scored([f"reward.fn=my_rewards.py:{fn}"], _problem(), _traj("so 7", [5]))
    assert t.reward == 0.0 and t.correct is True  # the reward fails; the task's verdict stands
    assert t.reward_info["reward_error"] == reason
    assert t.reward_info["reward_error_detail"] == f"{reason}: {message} (reward function {fn}, problem p1)"


def test_a_long_message_is_cut_before_the_function_it_names(user_file: Path) -> None:
    """A 2000-character exception message: its text is cut, the step record keeps the function's name."""
    from streamrl.observe.error_examples import MESSAGE_CHARS

    t = _scored(["reward.fn=my_rewards.py:raises_long"], _problem(), _traj("so 7", [5]))
    where = " (reward function raises_long, problem p1)"
    kept = MESSAGE_CHARS - len(f"RuntimeError: ...{where}")
    message = f"RuntimeError: {'y' * kept}...{where}"
    assert len(message) == MESSAGE_CHARS and t.reward_info["reward_error_detail"] == message
    record = step_record(1, [Group(_problem(), [t])], {}, 0)
    assert record["reward_error_examples"] == {"RuntimeError": message}


@pytest.mark.parametrize(
    ("fn", "service", "failure"),
    [
        ("raises", "inline", "RuntimeError: boom"),
        ("hangs", "thread", "timeout: no result within 1s; worker replaced"),
    ],
)
def test_the_services_log_line_names_the_function_that_failed(
    user_file: Path, caplog: pytest.LogCaptureFixture, fn: str, service: str, failure: str
) -> None:
    """Not the scorer (`task`): a rollout worker's log then says which of your functions to look at."""
    caplog.set_level(logging.DEBUG, logger="streamrl.rewards.service")
    keys = [f"reward.fn=my_rewards.py:{fn}", f"reward.service={service}", "reward.timeout_s=1"]
    _scored(keys, _problem(), _traj("so 7", [5]))
    failed = [r.getMessage() for r in caplog.records if "-> 0.0" in r.getMessage()]
    assert failed == [f"reward function {fn} -> 0.0 ({failure})"]


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
    details = {  # a dead worker's pipe may close before its exit is seen, or after
        "timeout": ["no result within 1s; worker replaced"],
        "WorkerDied": ["worker process exited with code 3", "worker pipe closed (exit code 3)"],
    }[reason]
    named = [f"{reason}: {d} (reward function {fn}, problem p1)" for d in details]
    assert t.reward_info["reward_error_detail"] in named


@pytest.mark.parametrize(
    ("service", "fn", "reason"), [("thread", "hangs", "timeout"), ("process", "exits", "WorkerDied")]
)
def test_a_hang_or_a_dead_worker_names_the_function_then_running(
    user_file: Path, service: str, fn: str, reason: str
) -> None:
    """Each of your functions tells the service its name as it starts (keep_on_failure): a score the
    second one cuts short names the second, not the first that had finished (which one message per
    sample, sent before the first, would name)."""
    rows = user_file.parent / "rows.jsonl"
    rows.write_text(json.dumps({"prompt": "What is 3+4?", "answer": "7"}) + "\n")
    fns = f"reward.fns=[{{fn: my_rewards.py:brevity}}, {{fn: my_rewards.py:{fn}}}]"
    timeout = 1 if fn == "hangs" else 60
    overrides = [fns, f"reward.timeout_s={timeout}", f"reward.service={service}", f"task=data:{rows}"]
    t = _scored(overrides, _problem(), _traj("so 7", [5]))
    assert (t.reward, t.correct, t.reward_info["reward_error"]) == (0.0, True, reason)
    assert t.reward_info["reward_error_detail"].endswith(f" (reward function {fn}, problem p1)")


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
    assert [call_fn(fn, "q", "so 7", [5], {}) for _ in range(2)] == [0.5, 0.5]
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
        assert t.reward_info["reward_error_detail"] == (
            "TimeoutError: the function gave no result within 0.5 s (reward function async_hangs, problem p1)"
        )
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


def test_a_groups_rows_are_digested_once_for_its_cache_keys(
    user_file: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With your functions a response's cache key holds digests of its row (its tests, its columns):
    made once per problem, which its group's samples share, and the same keys as each response alone
    gets (a score cached before still hits)."""
    from streamrl.data.sources import task_from_rows
    from streamrl.rewards.user_fns import reward_columns
    from streamrl.rollout import score

    digest, digested = score._digest, []
    monkeypatch.setattr(score, "_digest", lambda value: digested.append(value) or digest(value))
    cfg = load_config(
        None, ["reward.extract=last_number", "reward.service=inline", "reward.fn=my_rewards.py:brevity"]
    )
    scoring = Scoring(cfg, task_from_rows([{"prompt": "What is 3+4?", "answer": "7"}], extract="last_number"))
    keys = []
    submit = scoring.service.submit
    monkeypatch.setattr(
        scoring.service,
        "submit",
        lambda *a, cache_key: keys.append(cache_key) or submit(*a, cache_key=cache_key),
    )
    formal, casual = _problem(style="formal"), _problem(style="casual")
    formal.meta["tests"] = [{"input": "", "output": "7"}]
    pairs = [(formal, _traj(f"so 7 {i}", [5, i])) for i in range(4)] + [(casual, _traj("so 7", [5]))] * 2
    scoring.score(pairs)
    scoring.close()
    assert len(digested) == 3  # the formal row's tests and columns, the casual row's columns
    tests = digest(formal.meta["tests"])
    assert keys == [
        *[("p1", (("7", tests), digest(reward_columns(formal))), f"so 7 {i}", (5, i)) for i in range(4)],
        *[("p1", ("7", digest(reward_columns(casual))), "so 7", (5,))] * 2,
    ]
