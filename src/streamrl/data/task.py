"""The Task contract: a held-out list, an endless training stream and a scorer (Task, Score), and
the generator settings tasks run with when none are configured. Every task type builds on this module;
the factory that picks one by name is streamrl/tasks.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from streamrl.data.columns import row_key
from streamrl.data.prompts import build_messages
from streamrl.rewards.extract import ends_with_answer, extract_answer
from streamrl.types import Problem

HELDOUT_SEED = 1_000_003

# Generator settings used when task_config.args is empty: sized for ~100M-parameter models, where
# reasoning-gym's defaults (up to 6 terms of 4 digits) leave every sample wrong and nothing to learn.
SMALL_MODEL_ARGS: dict[str, dict[str, Any]] = {
    "chain_sum": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 2},
    "basic_arithmetic": {
        "min_terms": 2,
        "max_terms": 2,
        "min_digits": 1,
        "max_digits": 1,
        "allow_parentheses": False,
        "allow_negation": False,
        "operators": ["+", "-", "*"],
    },
    "products": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1},
}

# hex digits of sha1 in a row's default id (row-..., code-...): 64 bits, so among ten million distinct
# prompts two share an id with a chance of about 3 in a million (with 40 bits, more often than not)
ID_HEX = 16


def default_task_args(spec: str) -> dict[str, Any]:
    """The args a task runs with when none are configured (a copy; empty for other tasks)."""
    if spec == "env:python_tool":  # its problems come from reasoning-gym too
        return {"dataset": "basic_arithmetic", **SMALL_MODEL_ARGS["basic_arithmetic"]}
    return dict(SMALL_MODEL_ARGS.get(spec[3:], {})) if spec.startswith("rg:") else {}


def prompt_key(problem: Problem) -> str:
    """The identity that held-out and few-shot exclusion compare: the question text, or a chat row's
    every turn (data/columns.py row_key). A chat of one user turn asks what a plain row with that
    question asks: its key is the question, so holding either out keeps the other (in any source of a
    mixture) out of training."""
    chat = problem.meta.get("chat")
    if chat and len(chat) == 1 and chat[0]["role"] == "user":
        return problem.meta["question"]
    return row_key(problem.meta["question"], chat)


@dataclass
class Score:
    correct: bool
    formatted: bool
    extracted: str | None
    value: float | None = None  # the task's own reward in [0, 1] (partial credit); None: float(correct)


class Task:
    """Base class: a held-out list, an endless training stream and a scorer."""

    name: str

    def __init__(self, system_prompt: str, instruction: str, extract: str) -> None:
        self.system_prompt = system_prompt
        self.instruction = instruction
        self.extract = extract
        self.few_shot: list[tuple[str, str]] = []  # (question, assistant response) shown before each

    def _problem(self, pid: str, question: str, answer: str, meta: dict[str, Any]) -> Problem:
        problem = Problem(id=pid, messages=[], answer=answer, meta={"question": question, **meta})
        problem.messages = self.render(problem)
        return problem

    def render(self, problem: Problem) -> list[dict[str, str]]:
        """The problem's chat with the current system prompt, few-shot turns and instruction."""
        return build_messages(
            problem.meta["question"],
            self.system_prompt,
            self.instruction,
            self.few_shot,
            problem.meta.get("chat"),
        )

    def set_few_shot(self, shots: list[tuple[str, str]]) -> None:
        self.few_shot = list(shots)

    def few_shot_sources(self) -> list[tuple[str, Task]]:
        """(where, task): the tasks that each draw few-shot examples from their own training problems
        and show them (tasks.py prepare_split); `where` names one in errors ("": the task itself)."""
        return [("", self)]

    def heldout(self, n: int) -> list[Problem]:
        raise NotImplementedError

    def heldout_from_training(self) -> bool:
        """Are the held-out problems the first of the training problems (so an evaluation with a larger
        eval.size than a run's takes problems it trained on)? False when they come from a split of
        their own."""
        return True

    def held_split(self) -> set[str]:
        """The prompts (prompt_key) of every row of a held-out split of the task's own, not only of the
        held-out problems an eval.size takes: its training stream never yields them, nor does a
        mixture's other sources' (so an evaluation of a larger eval.size takes none it trained on).
        Empty when the held-out problems are training rows."""
        return set()

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        raise NotImplementedError

    def is_correct(self, extracted: str, problem: Problem) -> bool:
        raise NotImplementedError

    def same_answer(self, a: str, b: str, problem: Problem) -> bool:
        """Do two extracted answers to `problem` vote together in maj@k? Default: equal text."""
        return a.strip() == b.strip()

    def score(self, problem: Problem, text: str) -> Score:
        extracted = extract_answer(text, self.extract)
        if extracted is None:
            return Score(False, False, None)
        return Score(self.is_correct(extracted, problem), ends_with_answer(text, self.extract), extracted)
