"""Code rewards: run a program on stdin/stdout test cases in a sandbox and count the passes.

Tests are `[{"input": str, "output": str}, ...]`. A test passes when the program exits cleanly and its
stdout equals the expected output after trailing whitespace is stripped from every line and from the
end. reward = passed / total (partial credit) or 1.0 only when all pass (all-or-nothing, which stops
at the first failure to save sandbox time). Scored by a RewardService, the tests stop where the score
runs out of time (workers.time_left): none runs after the service gave up on the score. A test under
way keeps its own wall limit, so the service's timeout, not a run cut short at the same moment, decides
that the score timed out.
"""

from __future__ import annotations

import logging
import re
from typing import Any

from streamrl.rewards.sandbox import Executor, Limits, get_executor
from streamrl.rewards.workers import time_left

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)
STDERR_TAIL = 300  # characters of stderr kept in a failure reason
log = logging.getLogger(__name__)


def extract_program(text: str) -> str | None:
    """The last fenced block tagged python/py/python3; without one, the last untagged block; None when
    there is neither.

    'so:\\n```python\\nprint(1)\\n```' -> 'print(1)\\n'. An untagged block after a python one is
    taken for the program's output ('For input 2 it prints:\\n```\\n4\\n```'), not the program; blocks
    tagged with another language are ignored.
    """
    blocks = _FENCE.findall(text)
    tagged = [body for lang, body in blocks if lang.lower() in ("python", "py", "python3")]
    bare = [body for lang, body in blocks if not lang]
    return (tagged or bare or [None])[-1]


def normalize_output(s: str) -> str:
    """'1  \\n2\\n\\n' -> '1\\n2': trailing whitespace off every line and off the end."""
    return "\n".join(line.rstrip() for line in s.rstrip().splitlines())


def validate_tests(tests: Any, where: str) -> list[dict[str, str]]:
    """Check `tests` is a non-empty list of {"input": str, "output": str}; errors name `where`."""
    if not isinstance(tests, list) or not tests:
        raise ValueError(f'{where}: tests must be a non-empty list of {{"input": str, "output": str}}')
    for i, t in enumerate(tests):
        if not (isinstance(t, dict) and isinstance(t.get("input"), str) and isinstance(t.get("output"), str)):
            got = repr(t)[:80]
            raise ValueError(f"{where}: test {i} must be an object with string 'input' and 'output': {got}")
    return [{"input": t["input"], "output": t["output"]} for t in tests]


def _tail(s: str) -> str:
    s = s.strip()
    return s if len(s) <= STDERR_TAIL else "..." + s[-STDERR_TAIL:]


_warned: list[str] = []  # the first sandbox setup failure of this process


def _warn_setup_failed(stderr: str) -> None:
    if not _warned:
        _warned.append(stderr)
        log.warning(
            "the code sandbox could not isolate a program, so its tests count as failed: %s", _tail(stderr)
        )


def _short(s: str, n: int = 60) -> str:
    return repr(s if len(s) <= n else s[:n] + "...")


def score_program(
    program: str,
    tests: list[dict[str, str]],
    partial_credit: bool = True,
    executor: Executor | None = None,
    limits: Limits | None = None,
) -> tuple[float, dict[str, Any]]:
    """-> (reward in [0, 1], info). info: passed, total, tests (per-test status: "pass",
    "wrong_answer" or the sandbox status such as "error"/"timeout"/"memory"), reason (the first
    failure, None when all pass), isolation. A sandbox that could not isolate the program (the host
    refused a namespace, a mount or a limit) fails the test too, with a warning logged once. Within a
    RewardService no test runs past the score's deadline (see the module docstring)."""
    ex = executor or get_executor("local")
    statuses: list[str] = []
    reason = None
    isolation = ""
    for i, t in enumerate(tests):
        left = time_left()
        if left <= 0:  # the service gave up on this score: the rest would run for nobody
            reason = reason or f"test {i}: not run: the score ran out of time"
            break
        r = ex.run(program, t["input"], limits)
        isolation = r.isolation
        if r.setup_failed:  # not the program's failure, yet its test fails: said once per process
            _warn_setup_failed(r.stderr)
        if r.status != "ok":
            status = r.status
            why = f"test {i}: {r.status}" + (f": {_tail(r.stderr)}" if r.stderr.strip() else "")
        elif normalize_output(r.stdout) != normalize_output(t["output"]):
            status = "wrong_answer"
            got, want = normalize_output(r.stdout), normalize_output(t["output"])
            why = f"test {i}: wrong answer: expected {_short(want)}, got {_short(got)}"
        else:
            status, why = "pass", None
        statuses.append(status)
        if why is not None:
            reason = reason or why
            if not partial_credit:
                break  # all-or-nothing: the reward is 0 whatever the other tests do
    passed = statuses.count("pass")
    total = len(tests)
    reward = passed / total if partial_credit else float(passed == total)
    info = {"passed": passed, "total": total, "tests": statuses, "reason": reason, "isolation": isolation}
    return reward, info


def score_response(
    text: str,
    tests: list[dict[str, str]],
    partial_credit: bool = True,
    executor: Executor | None = None,
    limits: Limits | None = None,
) -> tuple[float, dict[str, Any]]:
    """Score a model response: its program (extract_program) against `tests`; no block -> 0 and the
    reason "no code block"."""
    program = extract_program(text)
    if program is None:
        info = {"passed": 0, "total": len(tests), "tests": [], "reason": "no code block", "isolation": ""}
        return 0.0, info
    return score_program(program, tests, partial_credit, executor, limits)
