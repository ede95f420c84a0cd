"""Tasks: where problems come from and how an answer is scored.

- `rg:NAME` generates reasoning-gym problems (lazy, deterministic by index and seed) and scores with
  the dataset's own `score_answer`; a sample is correct only at full score (1.0), because reasoning-gym
  gives wrong answers small partial credit.
- `rg:composite` mixes reasoning-gym datasets: task_config.args.datasets=[{name, weight, config}, ...].
- `data:PATH`, `PATH.jsonl`, `PATH.parquet`: rows with a column mapping (data/sources.py).
- `mix`: weighted sources, task_config.sources=[{task, weight, ...}, ...] (data/mixture.py).
- `code` / `code:path/to/file.jsonl`: programs run against stdin/stdout tests (data/code_task.py).

The held-out set is drawn first (fixed seed) and every training problem whose question text equals a
held-out one is skipped, so the model is never trained on an evaluation problem.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.data.prompts import SHOT_TEMPLATES, build_messages, shot_response
from streamrl.rewards.extract import extract_answer
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
            self._scorer = self._create(1, 0)
        except (TypeError, AssertionError, KeyError, ValueError) as e:
            raise ValueError(f"bad task_config.args for rg:{dataset}: {e}") from e

    def _create(self, size: int, seed: int) -> Any:
        """The generator; composite's `datasets` list of dicts becomes reasoning-gym DatasetSpecs."""
        import reasoning_gym

        args = dict(self.args)
        if self.dataset == "composite":
            from reasoning_gym.composite import DatasetSpec

            specs = args.get("datasets")
            if not isinstance(specs, list) or not specs:
                raise ValueError("rg:composite needs task_config.args.datasets=[{name, weight, config}, ...]")
            args["datasets"] = [
                DatasetSpec(str(d["name"]), float(d.get("weight", 1.0)), dict(d.get("config") or {}))
                for d in specs
            ]
        return reasoning_gym.create_dataset(self.dataset, size=size, seed=seed, **args)

    def _stream(self, seed: int, prefix: str) -> Iterator[Problem]:
        ds = self._create(2**62, seed)
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


def make_task(
    spec: str,
    args: dict[str, Any],
    system_prompt: str,
    instruction: str,
    extract: str,
    *,
    code_partial_credit: bool = True,
    sandbox_min_isolation: str = "auto",
    env: Any = None,
    columns: dict[str, Any] | None = None,
    eval_data: str = "",
    sources: Any = (),
) -> Task:
    """`env`: the EnvConfig that multi-turn tasks (`env:NAME`) take their limits from; `columns`,
    `eval_data`: the data:PATH column mapping and held-out file; `sources`: the `mix` task's list;
    `sandbox_min_isolation`: tasks that run model code check their sandbox against it when built."""
    kw = {"system_prompt": system_prompt, "instruction": instruction, "extract": extract}
    if spec.startswith("agent:"):
        from streamrl.envs.agent_task import AgentTask

        return AgentTask(spec[6:], args, make_task, **kw)
    if spec == "mix":
        from streamrl.data.mixture import MixtureTask

        return MixtureTask(
            sources,
            code_partial_credit=code_partial_credit,
            sandbox_min_isolation=sandbox_min_isolation,
            env=env,
            **kw,
        )
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
            return CodeTask(None, code_partial_credit, min_isolation=sandbox_min_isolation, **kw)
        path = Path(spec[5:]).expanduser()
        if not path.is_file():
            raise ValueError(f"task file '{spec[5:]}' not found (task=code:<a .jsonl of {{prompt, tests}}>)")
        return CodeTask(path, code_partial_credit, min_isolation=sandbox_min_isolation, **kw)
    if spec.startswith("rg:"):
        return ReasoningGymTask(spec[3:], args, **kw)
    if spec.startswith("data:") or spec.endswith((".jsonl", ".parquet")):
        from streamrl.data.sources import DataTask

        path = Path(spec.removeprefix("data:")).expanduser()
        if not path.exists():
            raise ValueError(f"task file '{path}' not found")
        held = Path(eval_data).expanduser() if eval_data else None
        return DataTask(path, columns, held, code_partial_credit, sandbox_min_isolation, **kw)
    raise ValueError(
        f"unknown task '{spec}': use 'rg:<reasoning-gym dataset>', 'data:<.jsonl/.parquet/HF dir>', a .jsonl "
        "file of {prompt, answer}, 'mix', 'code', 'code:<file.jsonl>', 'env:python_tool' or 'env:search'"
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
        sandbox_min_isolation=cfg.reward.sandbox_min_isolation,
        env=cfg.env,
        columns=tc.columns,
        eval_data=tc.eval_data,
        sources=tc.sources,
    )


FEW_SHOT_SEED = 1_000_033


def prepare_split(task: Task, cfg: Any) -> tuple[list[Problem], set[str]]:
    """(held-out problems, prompts never to train on), with task_config.few_shot examples set on the task.

    Drawn few-shot examples (few_shot_n) are the first distinct training problems of a fixed seed;
    neither they nor the held-out problems are ever trained on.
    """
    tc = cfg.task_config
    shots = [
        shot_response(s, cfg.reward.extract, f"task_config.few_shot[{i}]") for i, s in enumerate(tc.few_shot)
    ]
    heldout = task.heldout(cfg.eval.size)
    exclude = {p.meta["question"] for p in heldout}
    if tc.few_shot_n:
        template = SHOT_TEMPLATES.get(cfg.reward.extract, "{answer}")
        seen: set[str] = set()
        for p in task.train_stream(FEW_SHOT_SEED, exclude):
            if p.meta["question"] not in seen:
                seen.add(p.meta["question"])
                shots.append((p.meta["question"], template.format(answer=p.answer)))
            if len(seen) == tc.few_shot_n:
                break
    if shots:
        task.set_few_shot(shots)
        for p in heldout:
            p.messages = task.render(p)
        exclude |= {q for q, _ in shots}
    return heldout, exclude
