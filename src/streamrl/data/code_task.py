"""The code task: write a Python program that passes stdin/stdout tests, run in the sandbox.

- `code` uses the built-in set (streamrl/data/code_problems.jsonl, made by
  scripts/make_code_problems.py: 64 simple problems with 4 tests each).
- `code:path/to/file.jsonl` reads rows `{"prompt": str, "tests": [{"input": str, "output": str}, ...]}`.

Score: formatted = the response has a fenced code block; correct = every test passes; value = the
fraction of tests passed (partial credit) or 1/0 (all-or-nothing), used as the reward by outcome_reward.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from streamrl.data.task import ID_HEX, Score, Task
from streamrl.rewards.code import extract_program, score_program, validate_tests
from streamrl.rewards.sandbox import Executor, Limits, make_executor
from streamrl.types import Problem

CODE_SYSTEM_PROMPT = (
    "You are a Python programmer. Write a complete program that reads from standard input and writes "
    "to standard output. Reply with the program in a single ```python code block."
)
LIMITS = Limits(cpu_s=2.0, wall_s=4.0, memory_mb=512)  # per test run; module default for now


def _load_rows(text: str, where: str) -> list[dict[str, Any]]:
    rows: dict[str, dict[str, Any]] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as e:
            raise ValueError(f"{where}:{lineno}: not valid JSON ({e})") from e
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise ValueError(f"{where}:{lineno}: expected a JSON object with a string 'prompt' and 'tests'")
        tests = validate_tests(row.get("tests"), f"{where}:{lineno}")
        rows.setdefault(
            row["prompt"], {"prompt": row["prompt"], "tests": tests, "solution": str(row.get("solution", ""))}
        )
    if not rows:
        raise ValueError(f"{where}: no usable rows (need JSON lines with 'prompt' and 'tests')")
    return sorted(rows.values(), key=lambda r: hashlib.sha1(r["prompt"].encode()).hexdigest())


def builtin_text() -> str:
    return resources.files("streamrl.data").joinpath("code_problems.jsonl").read_text(encoding="utf-8")


class CodeTask(Task):
    """Held-out = the first n rows in a fixed hash order; training = the rest, reshuffled per epoch.

    executor: None = `sandbox_executor`'s (reward.sandbox_executor: "local" is a LocalSandbox checked
    against `min_isolation`, "auto" / "namespaces" / "rlimits")."""

    def __init__(
        self,
        path: Path | None = None,
        partial_credit: bool = True,
        executor: Executor | None = None,
        limits: Limits = LIMITS,
        min_isolation: str = "auto",
        sandbox_executor: str = "local",
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.name = "code" if path is None else f"code:{path}"
        self.rows = _load_rows(builtin_text() if path is None else path.read_text(), self.name)
        self.partial_credit = partial_credit
        # built here so a sandbox below min_isolation fails when the task is set up, not at a rollout
        self.executor = executor or make_executor(sandbox_executor, min_isolation)
        self.limits = limits

    def _make(self, i: int) -> Problem:
        row = self.rows[i]
        pid = f"code-{hashlib.sha1(row['prompt'].encode()).hexdigest()[:ID_HEX]}"
        return self._problem(pid, row["prompt"], row["solution"], {"tests": row["tests"]})

    def heldout(self, n: int) -> list[Problem]:
        if n >= len(self.rows):
            raise ValueError(
                f"{self.name}: eval.size={n} leaves no training rows ({len(self.rows)} rows): lower eval.size"
            )
        return [self._make(i) for i in range(n)]

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        order = [i for i, r in enumerate(self.rows) if r["prompt"] not in exclude]
        if not order:
            raise ValueError(
                f"{self.name}: every row is held out or a few-shot example; lower eval.size or "
                "task_config.few_shot_n"
            )
        rng = random.Random(seed)
        while True:
            rng.shuffle(order)
            yield from (self._make(i) for i in order)

    def score(self, problem: Problem, text: str) -> Score:
        program = extract_program(text)
        if program is None:
            return Score(False, False, None, value=0.0)
        value, info = score_program(
            program, problem.meta["tests"], self.partial_credit, self.executor, self.limits
        )
        return Score(info["passed"] == info["total"], True, program, value=value)
