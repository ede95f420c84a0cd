"""`task=mix`: several sources drawn with weights, each scored by its own task.

    task_config.sources = [
        {task: rg:chain_sum, weight: 2},
        {task: "hf:openai/gsm8k:main", weight: 1, columns: {prompt: question}},
    ]

Per source the keys are `task` (any task spec except mix and env:), `weight` (> 0, default 1), `args`
(generator args; reasoning-gym defaults when empty; none for hf: and data: sources), and for hf: and
data: sources the task_config keys `columns`, `split`, `eval_split`, `eval_data`, `streaming` and
`shuffle_buffer` (data/sources.py; shuffle_buffer only with streaming).

Training: each problem comes from source i with probability p_i = w_i / sum_j w_j (a seeded draw), so
the empirical shares converge to p_i. Held-out: n is split by the same weights with largest remainders,
n_i = floor(n p_i) plus one for the largest fractional parts. A prompt held out by any source is never
trained on by any source: neither a held-out problem nor any row of a source's held-out split of its own.

Few-shot examples: each source draws task_config.few_shot_n of its own (tasks.py prepare_split), so its
prompts show its own format and answers; given task_config.few_shot examples are shown by every source.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from streamrl.config_validate import DATA_KEYS, check_source_weight
from streamrl.data.task import Score, Task, default_task_args
from streamrl.types import Problem

SOURCE_KEYS = ("task", "weight", "args", *DATA_KEYS)
SOURCE_SEED_STEP = 7919  # source i draws from its stream seeded seed + SOURCE_SEED_STEP * i


def split_by_weight(n: int, weights: list[float]) -> list[int]:
    """Largest-remainder apportionment of n by weights (sums to n exactly)."""
    total = sum(weights)
    exact = [n * w / total for w in weights]
    counts = [math.floor(x) for x in exact]
    by_remainder = sorted(range(len(weights)), key=lambda i: (counts[i] - exact[i], i))
    for i in by_remainder[: n - sum(counts)]:
        counts[i] += 1
    return counts


class MixtureTask(Task):
    def __init__(
        self,
        sources: Any,
        make_task: Callable[..., Task],
        code_partial_credit: bool = True,
        sandbox_min_isolation: str = "auto",
        sandbox_executor: str = "local",
        env: Any = None,
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        if not isinstance(sources, (list, tuple)) or not sources:
            raise ValueError(
                "task=mix needs task_config.sources=[{task: rg:chain_sum, weight: 2}, {task: data:x.jsonl}]"
            )
        self.tasks: list[Task] = []
        self.weights: list[float] = []
        for i, src in enumerate(sources):
            where = f"task_config.sources[{i}]"
            if not isinstance(src, dict) or not isinstance(src.get("task"), str):
                raise ValueError(f"{where} must be a mapping with a 'task' spec, got {src!r}")
            unknown = set(src) - set(SOURCE_KEYS)
            if unknown:
                raise ValueError(
                    f"{where}: unknown key(s) {sorted(unknown)}; valid: {', '.join(SOURCE_KEYS)}"
                )
            spec = src["task"]
            if spec.startswith("agent:"):  # its episodes would be single-turn samples of its base task
                raise ValueError(
                    f"{where}: '{spec}' cannot be mixed: an agent over a mixture is task={spec} with "
                    "task_config.args.base=mix and these sources"
                )
            if spec == "mix" or spec.startswith("env:"):
                raise ValueError(
                    f"{where}: '{spec}' cannot be mixed (use rg:, hf:, data:, .jsonl or code sources)"
                )
            weight = src.get("weight", 1.0)
            check_source_weight(weight, where)
            try:
                task = make_task(
                    spec,
                    src.get("args") or default_task_args(spec),
                    kw["system_prompt"],
                    kw["instruction"],
                    kw["extract"],
                    code_partial_credit=code_partial_credit,
                    sandbox_min_isolation=sandbox_min_isolation,
                    sandbox_executor=sandbox_executor,
                    env=env,
                    **{k: src[k] for k in DATA_KEYS if k in src},
                )
            except ValueError as e:
                raise ValueError(f"{where}: {e}") from e
            self.tasks.append(task)
            self.weights.append(float(weight))
        self.name = "mix(" + ", ".join(f"{t.name}:{w:g}" for t, w in zip(self.tasks, self.weights)) + ")"

    def set_few_shot(self, shots: list[tuple[str, str]]) -> None:
        """The same examples for every source (given ones); drawn ones are each source's own."""
        super().set_few_shot(shots)
        for t in self.tasks:
            t.set_few_shot(shots)

    def few_shot_sources(self) -> list[tuple[str, Task]]:
        """Each source: its prompts show examples of its own format and answers, not another's."""
        return [(f"task_config.sources[{i}]", t) for i, t in enumerate(self.tasks)]

    def render(self, problem: Problem) -> list[dict[str, str]]:
        return self.tasks[problem.meta["source"]].render(problem)

    @staticmethod
    def _tag(problem: Problem, i: int) -> Problem:
        return replace(problem, id=f"m{i}-{problem.id}", meta={**problem.meta, "source": i})

    def heldout_from_training(self) -> bool:
        return any(t.heldout_from_training() for t in self.tasks)

    def held_split(self) -> set[str]:
        return set().union(*(t.held_split() for t in self.tasks))

    def heldout(self, n: int) -> list[Problem]:
        out: list[Problem] = []
        for i, (task, k) in enumerate(zip(self.tasks, split_by_weight(n, self.weights))):
            out += [self._tag(p, i) for p in task.heldout(k)]
        return out

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        exclude = exclude | self.held_split()  # each source's held-out split, kept from every source
        streams = [t.train_stream(seed + SOURCE_SEED_STEP * i, exclude) for i, t in enumerate(self.tasks)]
        rng = random.Random(seed)
        indices = range(len(streams))
        while True:
            i = rng.choices(indices, weights=self.weights)[0]
            yield self._tag(self._next(streams[i], i), i)

    @staticmethod
    def _next(stream: Iterator[Problem], i: int) -> Problem:
        """The next problem of source i; its error names the source."""
        try:
            return next(stream)
        except ValueError as e:
            raise ValueError(f"task_config.sources[{i}]: {e}") from None

    def score(self, problem: Problem, text: str) -> Score:
        return self.tasks[problem.meta["source"]].score(problem, text)

    def same_answer(self, a: str, b: str, problem: Problem) -> bool:
        return self.tasks[problem.meta["source"]].same_answer(a, b, problem)
