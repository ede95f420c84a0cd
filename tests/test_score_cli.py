"""`streamrl score`: one JSON object on stdout and exit 0; bad input is one error line and exit 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from streamrl.cli import main

TESTS = [
    {"input": "1 2\n", "output": "3\n"},
    {"input": "5 5\n", "output": "10\n"},
    {"input": "0 0\n", "output": "0"},
]


@pytest.fixture
def files(tmp_path: Path) -> tuple[Path, Path]:
    prog = tmp_path / "prog.py"
    prog.write_text("a, b = map(int, input().split())\nprint(a + b if a != 5 else -1)\n")
    tests = tmp_path / "tests.json"
    tests.write_text(json.dumps(TESTS))
    return prog, tests


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    code = main(argv)
    out, err = capsys.readouterr()
    return code, out, err


def test_score_code_partial(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    prog, tests = files
    code, out, err = _run(["score", "code", "--program", str(prog), "--tests", str(tests)], capsys)
    assert (code, err) == (0, "")
    assert len(out.strip().splitlines()) == 1
    res = json.loads(out)
    assert res["kind"] == "code" and round(res["reward"], 4) == 0.6667
    assert (res["passed"], res["total"], res["tests"]) == (2, 3, ["pass", "wrong_answer", "pass"])
    assert res["reason"] == "test 1: wrong answer: expected '10', got '-1'"


def test_score_code_all_or_nothing_and_response_file(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    prog, tests = files
    code, out, _ = _run(
        ["score", "code", "--program", str(prog), "--tests", str(tests), "--all-or-nothing"], capsys
    )
    assert code == 0 and json.loads(out)["reward"] == 0.0
    resp = tmp_path / "response.md"
    resp.write_text("Here:\n```python\na, b = map(int, input().split())\nprint(a + b)\n```\nDone.")
    code, out, _ = _run(["score", "code", "--program", str(resp), "--tests", str(tests)], capsys)
    assert code == 0 and json.loads(out)["reward"] == 1.0


def test_score_math(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["score", "math", "--answer", "\\frac{1}{2}", "--reference", "0.5"], capsys)
    assert code == 0 and json.loads(out) == {
        "kind": "math",
        "reward": 1.0,
        "correct": True,
        "answer": "\\frac{1}{2}",
        "reference": "0.5",
    }
    code, out, _ = _run(["score", "math", "--answer", "0.49", "--reference", "0.5"], capsys)
    assert code == 0 and json.loads(out)["reward"] == 0.0


@pytest.mark.parametrize(
    "tests_text, msg",
    [
        (None, "--tests: file '{tests}' not found"),
        ("{oops", "--tests: '{tests}' is not valid JSON"),
        ('{"input": "1", "output": "1"}', "--tests {tests}: tests must be a non-empty list"),
        ('[{"input": "1"}]', "--tests {tests}: test 0 must be an object with string 'input' and 'output'"),
    ],
)
def test_bad_tests_file(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], tests_text: str | None, msg: str
) -> None:
    prog, tests = files
    if tests_text is None:
        tests.unlink()
    else:
        tests.write_text(tests_text)
    code, out, err = _run(["score", "code", "--program", str(prog), "--tests", str(tests)], capsys)
    assert code == 2 and out == ""
    assert err.startswith("streamrl: error: " + msg.format(tests=tests)) and err.count("\n") == 1


def test_missing_program(files: tuple[Path, Path], capsys: pytest.CaptureFixture[str]) -> None:
    _, tests = files
    code, out, err = _run(["score", "code", "--program", "nope.py", "--tests", str(tests)], capsys)
    assert (code, out, err) == (2, "", "streamrl: error: --program: file 'nope.py' not found\n")


def test_score_code_with_an_executor_of_your_own(
    files: tuple[Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """--executor file.py:factory: the CLI imports the factory (a registration in your code never runs
    here). This one answers every program with the second test's expected output."""
    prog, tests = files
    mine = tmp_path / "my_sandbox.py"
    mine.write_text(
        "from streamrl.rewards.sandbox import ExecResult\n"
        "class Fixed:\n"
        "    name = 'fixed'\n"
        "    def run(self, program, stdin='', limits=None):\n"
        "        return ExecResult('10\\n', '', 0, 'ok', 0.0, 'none')\n"
        "def factory():\n"
        "    return Fixed()\n"
    )
    argv = ["score", "code", "--program", str(prog), "--tests", str(tests), "--executor"]
    code, out, err = _run([*argv, f"{mine}:factory"], capsys)
    assert (code, err) == (0, "") and json.loads(out)["tests"] == ["wrong_answer", "pass", "wrong_answer"]
    code, out, err = _run([*argv, "mine"], capsys)
    assert code == 2 and out == "" and "--executor: unknown sandbox executor 'mine'" in err
