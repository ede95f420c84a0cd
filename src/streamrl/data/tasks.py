"""Tasks: where problems come from and how an answer is scored.

- `rg:NAME` generates reasoning-gym problems (lazy, deterministic by index and seed) and scores with
  the dataset's own `score_answer`; a sample is correct only at full score (1.0), because reasoning-gym
  gives wrong answers small partial credit.
- `path/to/file.jsonl` reads rows `{"prompt": ..., "answer": ...}` and scores with math-verify.
- `code` / `code:path/to/file.jsonl`: programs run against stdin/stdout tests (data/code_task.py).

The held-out set is drawn first (fixed seed) and every training problem whose question text equals a
held-out one is skipped, so the model is never trained on an evaluation problem.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.data.prompts import build_messages
from streamrl.rewards.extract import extract_answer
from streamrl.rewards.math import math_equal
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


def default_task_args(spec: str) -> dict[str, Any]:
    """The args a task runs with when none are configured (a copy; empty for other tasks)."""
    if spec == "env:python_tool":  # its problems come from reasoning-gym too
        return {"dataset": "basic_arithmetic", **SMALL_MODEL_ARGS["basic_arithmetic"]}
    return dict(SMALL_MODEL_ARGS.get(spec[3:], {})) if spec.startswith("rg:") else {}


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

    def _problem(self, pid: str, question: str, answer: str, meta: dict[str, Any]) -> Problem:
        messages = build_messages(question, self.system_prompt, self.instruction)
        return Problem(id=pid, messages=messages, answer=answer, meta={"question": question, **meta})

    def heldout(self, n: int) -> list[Problem]:
        raise NotImplementedError

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        raise NotImplementedError

    def is_correct(self, extracted: str, problem: Problem) -> bool:
        raise NotImplementedError

    def score(self, problem: Problem, text: str) -> Score:
        extracted = extract_answer(text, self.extract)
        if extracted is None:
            return Score(False, False, None)
        return Score(self.is_correct(extracted, problem), True, extracted)


class ReasoningGymTask(Task):
    def __init__(self, dataset: str, args: dict[str, Any], **kw: Any) -> None:
        import reasoning_gym

        super().__init__(**kw)
        self.name = f"rg:{dataset}"
        self.dataset = dataset
        self.args = dict(args)
        names = sorted(reasoning_gym.factory.DATASETS)
        if dataset not in names:
            raise ValueError(f"unknown reasoning-gym task '{dataset}'; choose from: {', '.join(names)}")
        try:
            self._scorer = reasoning_gym.create_dataset(dataset, size=1, seed=0, **self.args)
        except (TypeError, AssertionError) as e:
            raise ValueError(f"bad task_config.args for rg:{dataset}: {e}") from e

    def _stream(self, seed: int, prefix: str) -> Iterator[Problem]:
        import reasoning_gym

        ds = reasoning_gym.create_dataset(self.dataset, size=2**62, seed=seed, **self.args)
        idx = 0
        while True:
            entry = ds[idx]
            yield self._problem(
                f"{prefix}{seed}-{idx}", entry["question"], str(entry["answer"]), {"entry": entry}
            )
            idx += 1

    def heldout(self, n: int) -> list[Problem]:
        out: list[Problem] = []
        if n == 0:
            return out
        seen: set[str] = set()
        misses = 0
        for p in self._stream(HELDOUT_SEED, "eval-"):
            q = p.meta["question"]
            if q in seen:
                misses += 1
                if misses > 50 * n + 1000:
                    raise ValueError(
                        f"task {self.name} has fewer than {n} distinct problems; lower eval.size "
                        "or widen task_config.args"
                    )
                continue
            seen.add(q)
            out.append(p)
            if len(out) == n:
                return out
        return out

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        return (p for p in self._stream(seed, "train-") if p.meta["question"] not in exclude)

    def is_correct(self, extracted: str, problem: Problem) -> bool:
        return self._scorer.score_answer(extracted, problem.meta["entry"]) == 1.0


class JsonlTask(Task):
    """Rows `{"prompt": str, "answer": str}`; held-out = a seeded split of distinct prompts."""

    def __init__(self, path: Path, **kw: Any) -> None:
        super().__init__(**kw)
        self.name = str(path)
        rows: dict[str, str] = {}
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
                prompt, answer = str(row["prompt"]), str(row["answer"])
            except (json.JSONDecodeError, KeyError, TypeError) as e:
                raise ValueError(
                    f"{path}:{lineno}: expected a JSON object with 'prompt' and 'answer' ({e})"
                ) from e
            rows.setdefault(prompt, answer)
        if not rows:
            raise ValueError(f"{path}: no usable rows (need JSON lines with 'prompt' and 'answer')")
        self.rows = sorted(rows.items(), key=lambda kv: hashlib.sha1(kv[0].encode()).hexdigest())

    def _make(self, i: int) -> Problem:
        q, a = self.rows[i]
        return self._problem(f"row-{hashlib.sha1(q.encode()).hexdigest()[:10]}", q, a, {})

    def heldout(self, n: int) -> list[Problem]:
        if n >= len(self.rows):
            raise ValueError(f"{self.name}: eval.size={n} leaves no training rows ({len(self.rows)} rows)")
        return [self._make(i) for i in range(n)]

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        order = [i for i, (q, _) in enumerate(self.rows) if q not in exclude]
        rng = random.Random(seed)
        while True:  # epochs over the training rows, reshuffled each time
            rng.shuffle(order)
            yield from (self._make(i) for i in order)

    def is_correct(self, extracted: str, problem: Problem) -> bool:
        return math_equal(extracted, problem.answer)


def make_task(
    spec: str,
    args: dict[str, Any],
    system_prompt: str,
    instruction: str,
    extract: str,
    *,
    code_partial_credit: bool = True,
    env: Any = None,
) -> Task:
    """`env`: the EnvConfig that multi-turn tasks (`env:NAME`) take their limits from."""
    kw = {"system_prompt": system_prompt, "instruction": instruction, "extract": extract}
    if spec.startswith("agent:"):
        from streamrl.envs.agent_task import AgentTask

        return AgentTask(spec[6:], args, make_task, **kw)
    if spec.startswith("env:"):
        from streamrl.config import EnvConfig
        from streamrl.envs.base import make_env_task  # late: envs build on this module

        return make_env_task(spec[4:], args, env_cfg=env if env is not None else EnvConfig(), **kw)
    if spec == "code" or spec.startswith("code:"):
        from streamrl.config import TaskConfig
        from streamrl.data.code_task import CODE_SYSTEM_PROMPT, CodeTask

        if system_prompt == TaskConfig.system_prompt:  # the calculator default makes no sense here
            kw["system_prompt"] = CODE_SYSTEM_PROMPT
        if spec == "code":
            return CodeTask(None, code_partial_credit, **kw)
        path = Path(spec[5:]).expanduser()
        if not path.is_file():
            raise ValueError(f"task file '{spec[5:]}' not found (task=code:<a .jsonl of {{prompt, tests}}>)")
        return CodeTask(path, code_partial_credit, **kw)
    if spec.startswith("rg:"):
        return ReasoningGymTask(spec[3:], args, **kw)
    path = Path(spec).expanduser()
    if spec.endswith(".jsonl"):
        if not path.is_file():
            raise ValueError(f"task file '{spec}' not found")
        return JsonlTask(path, **kw)
    raise ValueError(
        f"unknown task '{spec}': use 'rg:<reasoning-gym dataset>', a .jsonl file of {{prompt, answer}}, "
        "'code', 'code:<file.jsonl>', 'env:python_tool' or 'env:search'"
    )


def task_from_config(cfg: Any) -> Task:
    """The task a Config describes (task_config.args default to the small-model settings when empty)."""
    tc = cfg.task_config
    return make_task(
        cfg.task,
        tc.args or default_task_args(cfg.task),
        tc.system_prompt,
        tc.instruction,
        cfg.reward.extract,
        code_partial_credit=cfg.reward.code_partial_credit,
        env=cfg.env,
    )
