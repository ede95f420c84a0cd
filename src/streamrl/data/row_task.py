"""What tasks over tabular rows share: a parsed row -> a Problem, and the scorer of its kind.

Math rows score with math-verify against the reference answer (any of a row's accepted answers,
data/answers.py); code rows run the response's program
against the row's tests in the sandbox (built, and checked against `sandbox_min_isolation`, when the
task is set up and some row is code).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from typing import Any

from streamrl.config_sections import TaskConfig
from streamrl.data.answers import answers_of
from streamrl.data.prompts import build_messages
from streamrl.data.task import ID_HEX, Score, Task
from streamrl.rewards.sandbox import Executor, make_executor
from streamrl.types import Problem

log = logging.getLogger("streamrl.data")
SHOWN_WARNINGS = 5  # per source: the first few bad rows by position, then a count


def report_skipped(name: str, skipped: list[str]) -> None:
    """One warning naming the first few skipped rows (`where: why`) and how many there were."""
    if skipped:
        shown = "; ".join(skipped[:SHOWN_WARNINGS])
        more = f" (and {len(skipped) - SHOWN_WARNINGS} more)" if len(skipped) > SHOWN_WARNINGS else ""
        log.warning("%s: skipped %d malformed row(s): %s%s", name, len(skipped), shown, more)


def no_usable_rows(name: str, skipped: list[str], column_names: Iterable[str] | None) -> ValueError:
    columns = f"its columns: {', '.join(column_names)}; " if column_names else ""
    first = f"; first problem: {skipped[0]}" if skipped else ""
    return ValueError(
        f"{name}: no usable rows ({columns}map columns with task_config.columns={{prompt: ..., answer: "
        f"...}}, a chat column with messages: ... instead of prompt; rows without reference answers: "
        f"answer: null, scored by your own reward.fn){first}"
    )


class RowTask(Task):
    """Problems from parsed rows ({question, messages, answer, id, kind, tests}; data/columns.py)."""

    def __init__(
        self,
        code_partial_credit: bool = True,
        sandbox_min_isolation: str = "auto",
        sandbox_executor: str = "local",
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.partial_credit = code_partial_credit
        self.min_isolation, self.sandbox_executor = sandbox_min_isolation, sandbox_executor
        self.executor: Executor | None = None  # code rows: set by use_sandbox_for

    def use_sandbox_for(self, rows: Iterable[dict[str, Any]]) -> None:
        """Build the sandbox now (so a refused isolation level fails at set-up) if any row is code."""
        if self.executor is None and any(r["kind"] == "code" for r in rows):
            self.executor = make_executor(self.sandbox_executor, self.min_isolation)

    def _make(self, row: dict[str, Any]) -> Problem:
        pid = row["id"] or f"row-{hashlib.sha1(row['key'].encode()).hexdigest()[:ID_HEX]}"
        meta: dict[str, Any] = {"kind": row["kind"]}
        if row["tests"]:
            meta["tests"] = row["tests"]
        if row.get("answers") is not None:
            meta["answers"] = row["answers"]
        if row["messages"]:
            meta["chat"] = row["messages"]
        if row.get("columns"):
            meta["columns"] = row["columns"]
        return self._problem(pid, row["question"], row["answer"], meta)

    def render(self, problem: Problem) -> list[dict[str, str]]:
        """A code row under the default (calculator) system prompt gets the code task's instead."""
        if problem.meta.get("kind") == "code" and self.system_prompt == TaskConfig.system_prompt:
            from streamrl.data.code_task import CODE_SYSTEM_PROMPT

            question, chat = problem.meta["question"], problem.meta.get("chat")
            return build_messages(question, CODE_SYSTEM_PROMPT, self.instruction, self.few_shot, chat)
        return super().render(problem)

    def is_correct(self, extracted: str, problem: Problem) -> bool:
        """Equal (math-verify) to any of the row's accepted answers."""
        from streamrl.rewards.math import math_equal

        return any(math_equal(extracted, a) for a in answers_of(problem))

    def same_answer(self, a: str, b: str, problem: Problem) -> bool:
        """Math rows: equivalent values ('0.5', '1/2') vote together, and so do two accepted answers of
        one row; code rows: the same program."""
        if problem.meta.get("kind") == "code":
            return super().same_answer(a, b, problem)
        from streamrl.rewards.math import math_equal

        if math_equal(a, b):
            return True
        return len(answers_of(problem)) > 1 and self.is_correct(a, problem) and self.is_correct(b, problem)

    def score(self, problem: Problem, text: str) -> Score:
        if problem.meta.get("kind") != "code":
            return super().score(problem, text)
        from streamrl.data.code_task import LIMITS
        from streamrl.rewards.code import extract_program, score_program

        if self.executor is None:  # a streamed source met its first code row after set-up
            self.executor = make_executor(self.sandbox_executor, self.min_isolation)
        program = extract_program(text)
        if program is None:
            return Score(False, False, None, value=0.0)
        value, info = score_program(
            program, problem.meta["tests"], self.partial_credit, self.executor, LIMITS
        )
        return Score(info["passed"] == info["total"], True, program, value=value)
