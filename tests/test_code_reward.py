"""Code reward: extraction, exact partial credit, failure reasons, the code task and its dataset."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pytest
from sandbox_levels import LEVELS, level_works

from streamrl.data.code_task import CodeTask, builtin_text
from streamrl.data.task import Score, Task
from streamrl.rewards import code as code_mod
from streamrl.rewards.code import (
    extract_program,
    normalize_output,
    score_program,
    score_response,
    validate_tests,
)
from streamrl.rewards.sandbox import ExecResult, Limits, LocalSandbox
from streamrl.rollout.score import outcome_reward
from streamrl.tasks import make_task

ADD = [
    {"input": "1 2\n", "output": "3\n"},
    {"input": "10 -4\n", "output": "6"},
    {"input": "0 0", "output": "0"},
]
# programs that end at once: limits no loaded machine reaches (wall_s counts the sandbox's start, which
# a machine running the whole suite on every core can stretch past a second or two)
ROOMY = Limits(cpu_s=5, wall_s=30)


def test_extract_program_takes_the_last_python_block_else_the_last_bare_one() -> None:
    # an untagged block after a python one is its output, not a program
    text = "first\n```python\nprint(1)\n```\nit prints\n```\n1\n```\n```bash\nls\n```\n"
    assert extract_program(text) == "print(1)\n"
    assert extract_program("```python\nprint(1)\n```\n```py\nprint(2)\n```") == "print(2)\n"
    assert extract_program("```\nprint(1)\n```\nthen\n```\nprint(2)\n```") == "print(2)\n"
    assert extract_program("```py\nx = 1\n```") == "x = 1\n"
    assert extract_program("no fences, print(1)") is None
    assert extract_program("```bash\nls\n```") is None


def test_a_sandbox_that_cannot_isolate_a_program_is_said_once(caplog) -> None:
    """The host refused the sandbox a namespace or a mount: the program never ran. Its tests fail (an
    evaluation or an agent's scoring goes on), and the first such failure of the process is logged."""

    class Refused:
        name = "refused"

        def run(self, program, stdin="", limits=None):
            err = "sandbox setup failed: unshare(CLONE_NEWUSER): No space left on device\n"
            return ExecResult("", err, 97, "error", 0.01, "ns-user")

    monkey = pytest.MonkeyPatch()
    monkey.setattr(code_mod, "_warned", [])
    try:
        with caplog.at_level(logging.WARNING, logger="streamrl.rewards.code"):
            for _ in range(2):
                assert score_program("print(3)", ADD, executor=Refused())[0] == 0.0
    finally:
        monkey.undo()
    [record] = [r for r in caplog.records if r.name == "streamrl.rewards.code"]
    assert "could not isolate a program" in record.getMessage() and "unshare" in record.getMessage()
    assert not ExecResult("", "sandbox setup failed: mine", 1, "error", 0.0).setup_failed  # the program's
    assert not ExecResult("", "Traceback ...", 97, "error", 0.0).setup_failed  # exit(97) of its own


def test_normalize_output() -> None:
    assert normalize_output("1  \n2\t\n\n\n") == "1\n2"
    assert normalize_output("1\n 2") != normalize_output("1\n2")  # leading space is significant


def test_correct_wrong_and_partial_credit() -> None:
    good = "a, b = map(int, input().split())\nprint(a + b)   \n"
    r, info = score_program(good, ADD, limits=ROOMY)
    assert (r, info["passed"], info["total"], info["reason"]) == (1.0, 3, 3, None)
    assert info["tests"] == ["pass", "pass", "pass"]

    # right except when the sum is 0: 2 of 3 tests pass
    partial = "a, b = map(int, input().split())\nprint(a + b if a + b else 'zero')\n"
    r, info = score_program(partial, ADD, limits=ROOMY)
    assert round(r, 4) == 0.6667 and info["passed"] == 2
    assert info["tests"] == ["pass", "pass", "wrong_answer"]
    assert info["reason"] == "test 2: wrong answer: expected '0', got 'zero'"

    r, info = score_program(partial, ADD, partial_credit=False, limits=ROOMY)
    assert r == 0.0 and info["passed"] == 2

    r, info = score_program("print(0)\n", ADD, partial_credit=False, limits=ROOMY)
    assert r == 0.0 and info["tests"] == ["wrong_answer"]  # all-or-nothing stops at the first failure


def test_crash_gives_stderr_reason() -> None:
    r, info = score_program("x = int(input())\n", ADD, limits=ROOMY)
    assert r == 0.0 and info["tests"] == ["error", "error", "error"]
    assert info["reason"].startswith('test 0: error: Traceback (most recent call last):\n  File "program.py"')
    assert info["reason"].endswith("ValueError: invalid literal for int() with base 10: '1 2'")


def test_timeout_is_a_failed_test() -> None:
    r, info = score_program("while True: pass\n", ADD[:1], limits=Limits(cpu_s=1, wall_s=1))
    assert r == 0.0 and info["tests"] == ["timeout"] and info["reason"] == "test 0: timeout"


@pytest.mark.parametrize("level", LEVELS)
def test_cpu_limit_is_a_timeout_at_every_isolation_level(level: str) -> None:
    if not level_works(level):
        pytest.skip(f"{level} cannot run on this machine")
    box = LocalSandbox(isolation=level, min_isolation="rlimits")
    r, info = score_program("while True: pass\n", ADD[:1], executor=box, limits=Limits(cpu_s=1, wall_s=60))
    assert (r, info["tests"], info["reason"]) == (0.0, ["timeout"], "test 0: timeout")


def test_score_response_without_block() -> None:
    r, info = score_response("print(3)", ADD)
    assert r == 0.0 and info["reason"] == "no code block"


@pytest.mark.parametrize(
    "tests, msg",
    [
        ([], "non-empty list"),
        ({"input": "1"}, "non-empty list"),
        ([{"input": "1"}], "test 0 must be an object with string 'input' and 'output'"),
        ([{"input": "1", "output": 3}], "test 0 must be an object"),
    ],
)
def test_validate_tests_errors(tests: object, msg: str) -> None:
    with pytest.raises(ValueError, match=msg):
        validate_tests(tests, "t.json")


def _code_task(**kw: object) -> Task:
    return make_task(
        "code", {}, "You are a calculator. Reply in the form 'The answer is <number>.'", "", "answer_is", **kw
    )  # type: ignore[arg-type]


def test_builtin_task_split_prompt_and_scores() -> None:
    task = _code_task()
    assert isinstance(task, CodeTask) and len(task.rows) == 64
    held = task.heldout(8)
    train = task.train_stream(0, exclude={p.meta["question"] for p in held})
    seen = {next(train).meta["question"] for _ in range(56)}
    assert len(seen) == 56 and not seen & {p.meta["question"] for p in held}
    assert "Python programmer" in held[0].messages[0]["content"]  # calculator default replaced

    p = next(p for p in held + [task._make(i) for i in range(64)] if "sum" in p.meta["question"])
    solution = f"```python\n{p.answer}```"
    assert task.score(p, solution) == Score(True, True, p.answer, value=1.0)
    assert task.score(p, "I cannot") == Score(False, False, None, value=0.0)
    reward, correct, _ = outcome_reward(task, p, "```python\nprint('?')\n```", format_weight=0.1)
    assert (reward, correct) == (0.1, False)


def test_outcome_reward_uses_partial_value(tmp_path: Path) -> None:
    f = tmp_path / "add.jsonl"
    f.write_text("\n".join(json.dumps({"prompt": q, "tests": ADD}) for q in ("add", "b")))
    resp = "```python\na, b = map(int, input().split())\nprint(a + b if a + b else 'zero')\n```"
    partial = make_task(f"code:{f}", {}, "", "", "answer_is")
    p = partial.heldout(1)[0]
    reward, correct, _ = outcome_reward(partial, p, resp, format_weight=0.1)
    assert round(reward, 4) == round(2 / 3 + 0.1, 4) and not correct
    strict = make_task(f"code:{f}", {}, "", "", "answer_is", code_partial_credit=False)
    assert outcome_reward(strict, p, resp, format_weight=0.0)[0] == 0.0


def test_code_held_out_rows_are_chosen_by_prompt_hash_not_by_file_order(tmp_path: Path) -> None:
    rows = [json.dumps({"prompt": f"problem {i}", "tests": ADD}) for i in range(6)]
    f, g = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    f.write_text("\n".join(rows))
    g.write_text("\n".join(reversed(rows)))  # a file sorted by, say, difficulty, the other way round
    task = make_task(f"code:{f}", {}, "", "", "answer_is")
    held = [p.meta["question"] for p in task.heldout(2)]
    assert held == [p.meta["question"] for p in make_task(f"code:{g}", {}, "", "", "answer_is").heldout(2)]
    assert len(task.heldout(5)) == 5  # one row is left to train on
    with pytest.raises(
        ValueError, match=rf"^code:{re.escape(str(f))}: eval.size=6 leaves no training rows \(6 rows\): lower"
    ):
        task.heldout(6)


def test_code_file_errors_name_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.jsonl"
    rows = [json.dumps({"prompt": "ok", "tests": ADD}), "", json.dumps({"prompt": "x", "tests": "1"})]
    f.write_text("\n".join(rows))
    with pytest.raises(ValueError, match=rf"code:{f}:3: tests must be a non-empty list"):
        make_task(f"code:{f}", {}, "", "", "answer_is")
    f.write_text("{not json\n")
    with pytest.raises(ValueError, match=rf"code:{f}:1: not valid JSON"):
        make_task(f"code:{f}", {}, "", "", "answer_is")
    with pytest.raises(ValueError, match="task file 'nope.jsonl' not found"):
        make_task("code:nope.jsonl", {}, "", "", "answer_is")


def test_every_builtin_reference_solution_passes_in_the_sandbox() -> None:
    from concurrent.futures import ThreadPoolExecutor

    rows = [json.loads(line) for line in builtin_text().splitlines()]
    assert len(rows) >= 60 and all(3 <= len(r["tests"]) <= 5 for r in rows)
    assert len({r["prompt"] for r in rows}) == len(rows)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda r: score_program(r["solution"], r["tests"], limits=ROOMY), rows))
    failed = [(r["id"], info["reason"]) for r, (v, info) in zip(rows, results) if v != 1.0]
    assert failed == []
