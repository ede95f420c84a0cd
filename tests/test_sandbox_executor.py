"""reward.sandbox_executor: the code tasks run model code in an Executor of your own (a container
sandbox on a cluster), named as a factory; bad values are refused in one line before any work."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamrl.config import ConfigError, load_config
from streamrl.tasks import task_from_config

FAKE = """\
from streamrl.rewards.sandbox import ExecResult

class Echo:
    name = "echo"
    def run(self, program, stdin="", limits=None):
        # prints its input back: passes exactly the tests whose output equals their input
        return ExecResult(stdin, "", 0, "ok", 0.0, "echo")

def factory():
    return Echo()
"""
RESPONSE = "```python\nprint('nothing')\n```"  # fails every test in a real sandbox
RUN_THEIRS = (
    "(code, code:FILE, data:/hf: rows with tests, env:python_tool, and mix and agent: tasks over them run "
    "theirs in it): set reward.sandbox_executor=local"
)


@pytest.fixture
def factory(tmp_path: Path) -> str:
    (tmp_path / "my_sandbox.py").write_text(FAKE)
    return f"{tmp_path / 'my_sandbox.py'}:factory"


def test_the_code_task_scores_in_your_executor(factory: str) -> None:
    task = task_from_config(load_config(None, ["task=code", f"reward.sandbox_executor={factory}"]))
    assert type(task.executor).__name__ == "Echo"
    problem = task.heldout(1)[0]
    s = task.score(problem, RESPONSE)
    tests = problem.meta["tests"]
    echoed = sum(t["output"].strip() == t["input"].strip() for t in tests)
    assert s.value == pytest.approx(echoed / len(tests))  # the echo, not the built-in sandbox


def test_data_rows_with_tests_score_in_your_executor(factory: str, tmp_path: Path) -> None:
    rows = [
        {
            "prompt": f"echo line {i}",
            "tests": [{"input": "a\n", "output": "a\n"}, {"input": "b\n", "output": "c\n"}],
        }
        for i in range(4)
    ]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    keys = [f"task=data:{data}", "task_config.columns={prompt: prompt, tests: tests}", "eval.size=1"]
    cfg = load_config(None, [*keys, f"reward.sandbox_executor={factory}"])
    task = task_from_config(cfg)
    assert task.score(task.heldout(1)[0], RESPONSE).value == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (
            ["task=code", "reward.sandbox_executor=docker"],
            "config key 'reward.sandbox_executor' must be local or package.module:function or "
            "path/to/file.py:function, got 'docker'",
        ),
        (
            ["task=rg:chain_sum", "reward.sandbox_executor=my_sandbox:factory"],
            f"config key 'reward.sandbox_executor' does not apply to task=rg:chain_sum, which runs no model "
            f"code {RUN_THEIRS}",
        ),
        (
            ["task=env:search", "reward.sandbox_executor=my_sandbox:factory"],
            "config key 'reward.sandbox_executor' does not apply to task=env:search, whose environment runs "
            f"no model code {RUN_THEIRS}",
        ),
        (
            ["task=agent:my_agent:run", "reward.sandbox_executor=my_sandbox:factory"],
            "config key 'reward.sandbox_executor' does not apply to task=agent:my_agent:run, whose base task "
            f"rg:chain_sum runs no model code {RUN_THEIRS}",
        ),
        (
            [
                "task=agent:my_agent:run",
                "task_config.args={base: mix}",
                "task_config.sources=[{task: rg:chain_sum}]",
                "reward.sandbox_executor=my_sandbox:factory",
            ],
            "config key 'reward.sandbox_executor' does not apply to task=agent:my_agent:run, whose base task "
            f"mix runs no model code {RUN_THEIRS}",
        ),
        (
            [
                "task=mix",
                "task_config.sources=[{task: rg:chain_sum}, {task: rg:basic_arithmetic}]",
                "reward.sandbox_executor=my_sandbox:factory",
            ],
            "config key 'reward.sandbox_executor' does not apply to task=mix, whose sources are all rg: "
            f"tasks, which run no model code {RUN_THEIRS}",
        ),
        (
            ["task=code", "reward.sandbox_executor=my_sandbox:"],
            "config key 'reward.sandbox_executor' must be local or package.module:function or "
            "path/to/file.py:function, got 'my_sandbox:'",
        ),
    ],
)
def test_bad_executors_are_refused_in_one_line(keys: list[str], message: str) -> None:
    with pytest.raises(ConfigError) as e:
        load_config(None, keys)
    assert str(e.value) == message


def test_a_factory_that_does_not_exist_is_named_when_the_task_is_built(tmp_path: Path) -> None:
    cfg = load_config(None, ["task=code", f"reward.sandbox_executor={tmp_path / 'nope.py'}:factory"])
    with pytest.raises(ValueError, match=r"^config key 'reward.sandbox_executor'"):
        task_from_config(cfg)


def test_the_python_tool_runs_the_models_code_in_your_executor(factory: str) -> None:
    task = task_from_config(load_config(None, ["task=env:python_tool", f"reward.sandbox_executor={factory}"]))
    env = task.new_env()
    env.reset(task.heldout(1)[0])
    step = env.step("Let me check.\n```python\nprint(6 * 7)\n```")
    # the echo returns its stdin (empty), where the built-in sandbox would print 42
    assert (step.observation, step.done) == ("Output (ok):\n(no output: print the values you need)", False)


def test_the_python_tool_checks_the_built_in_sandbox_against_the_minimum_isolation() -> None:
    task = task_from_config(
        load_config(None, ["task=env:python_tool", "reward.sandbox_min_isolation=rlimits"])
    )
    assert type(task.run_code.executor).__name__ == "LocalSandbox"
    assert task.run_code.executor.min_isolation == "rlimits"


def test_two_code_rows_with_one_prompt_are_scored_each_against_its_own_tests(factory: str) -> None:
    """Streamed rows are not deduplicated: two rows with one prompt (and no id column) share a problem
    id and an empty answer, so the score cache tells them apart by their tests."""
    from dataclasses import replace

    from streamrl.rollout.score import Scoring
    from streamrl.types import Trajectory

    keys = ["task=code", f"reward.sandbox_executor={factory}", "reward.service=inline"]
    cfg = load_config(None, keys)
    task = task_from_config(cfg)
    problem = task.heldout(1)[0]
    echoed = [{"input": "a\n", "output": "a\n"}]  # the echo passes it
    other = replace(problem, meta={**problem.meta, "tests": [{"input": "a\n", "output": "b\n"}]})
    problem = replace(problem, meta={**problem.meta, "tests": echoed})
    scoring = Scoring(cfg, task)
    trajs = [Trajectory("p", "g", f"g-{k}", [1], [2], [-0.1], [0], "stop", text=RESPONSE) for k in range(2)]
    scoring.score([(problem, trajs[0]), (other, trajs[1])])
    scoring.close()
    assert problem.id == other.id and [t.correct for t in trajs] == [True, False]
