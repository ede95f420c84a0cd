"""`streamrl score code|math`: score one answer from the command line and print one JSON object.

    streamrl score code --program prog.py --tests tests.json [--all-or-nothing]
    streamrl score math --answer '\\frac{1}{2}' --reference 0.5

tests.json is a list of {"input": str, "output": str}. Bad input raises ValueError with one line that
names the flag; cli.main prints it as `streamrl: error: ...` and exits 2.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def add_parser(sub: Any) -> None:
    """Register `score` on the top-level subparsers of cli.main."""
    score = sub.add_parser("score", help="score one program or math answer; prints JSON")
    kinds = score.add_subparsers(dest="kind", required=True)
    code = kinds.add_parser("code", help="run a Python program against stdin/stdout tests in the sandbox")
    code.add_argument("--program", required=True, help="a Python file (or a response with a ```python block)")
    code.add_argument("--tests", required=True, help='a JSON file: [{"input": "...", "output": "..."}, ...]')
    code.add_argument("--all-or-nothing", action="store_true", help="reward 1 only if every test passes")
    code.add_argument(
        "--executor",
        default="local",
        help="sandbox executor: local (default), or your factory as module:function or file.py:function",
    )
    math = kinds.add_parser("math", help="compare a math answer with a reference using math-verify")
    math.add_argument("--answer", required=True)
    math.add_argument("--reference", required=True)


def _read(flag: str, path: str) -> str:
    p = Path(path).expanduser()
    if not p.is_file():
        raise ValueError(f"{flag}: file '{path}' not found")
    return p.read_text(encoding="utf-8")


def _score_code(ns: argparse.Namespace) -> dict[str, Any]:
    from streamrl.rewards.code import extract_program, score_program, validate_tests
    from streamrl.rewards.sandbox import get_executor

    program = _read("--program", ns.program)
    try:
        raw = json.loads(_read("--tests", ns.tests))
    except json.JSONDecodeError as e:
        raise ValueError(f"--tests: '{ns.tests}' is not valid JSON ({e})") from e
    tests = validate_tests(raw, f"--tests {ns.tests}")
    if "```" in program:  # a whole model response: score its last code block, as the task does
        program = extract_program(program) or ""
    reward, info = score_program(program, tests, not ns.all_or_nothing, get_executor(ns.executor))
    return {"kind": "code", "reward": reward, **info}


def _score_math(ns: argparse.Namespace) -> dict[str, Any]:
    from streamrl.rewards.math import math_equal

    correct = math_equal(ns.answer, ns.reference)
    return {
        "kind": "math",
        "reward": float(correct),
        "correct": correct,
        "answer": ns.answer,
        "reference": ns.reference,
    }


def run_score(ns: argparse.Namespace) -> int:
    result = _score_code(ns) if ns.kind == "code" else _score_math(ns)
    print(json.dumps(result))
    return 0
