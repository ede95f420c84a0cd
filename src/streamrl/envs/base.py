"""The Environment protocol, the EnvTask base class and the registry of environments by name.

An episode: `env.reset(problem)`, then for every model turn `env.step(text) -> EnvStep`. The episode
machine (envs/episode.py) turns observations into tokens; environments only see and return text.
A new Environment is made per episode (`EnvTask.new_env()`), so environments may keep state.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from streamrl.data.task import Task
from streamrl.types import Problem

if TYPE_CHECKING:
    from streamrl.config import EnvConfig


@dataclass
class EnvStep:
    """What the environment answers to one model turn.

    observation: text shown to the model as the next turn (ignored when done); reward: this step's
    reward (the episode's reward is the sum over steps); info: on the final step the keys `correct`
    (bool), `formatted` (bool) and `extracted` (str | None) feed the metrics like a single-turn score.
    """

    observation: str
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


class Environment(Protocol):
    def reset(self, problem: Problem) -> None:
        """Start an episode on `problem` (the prompt itself is rendered by the caller)."""
        ...

    def step(self, text: str) -> EnvStep:
        """React to one model turn (decoded text, special tokens removed)."""
        ...


class ProblemEnv:
    """One problem per episode: `reset` stores it; `current()` returns it or names the missing reset."""

    problem: Problem | None = None

    def reset(self, problem: Problem) -> None:
        self.problem = problem

    def current(self) -> Problem:
        if self.problem is None:
            raise RuntimeError(f"{type(self).__name__}.step before reset(problem)")
        return self.problem


class EnvTask(Task):
    """A Task whose samples are multi-turn episodes: problems as usual plus a fresh env per episode."""

    env_cfg: EnvConfig

    def new_env(self) -> Environment:
        raise NotImplementedError


# name (without the "env:" prefix) -> builder(args, system_prompt, instruction, extract, env_cfg,
# sandbox_executor, sandbox_min_isolation)
ENVIRONMENTS: dict[str, Callable[..., EnvTask]] = {}
_MODULES = ("streamrl.envs.python_tool", "streamrl.envs.search")  # imported on demand: they register


def register(name: str) -> Callable[[Callable[..., EnvTask]], Callable[..., EnvTask]]:
    def deco(builder: Callable[..., EnvTask]) -> Callable[..., EnvTask]:
        ENVIRONMENTS[name] = builder
        return builder

    return deco


def make_env_task(
    name: str,
    args: dict[str, Any],
    system_prompt: str,
    instruction: str,
    extract: str,
    env_cfg: EnvConfig,
    sandbox_executor: str = "local",
    sandbox_min_isolation: str = "auto",
) -> EnvTask:
    """The EnvTask registered as `name` ('search' for task=env:search); an environment whose tool runs
    model code runs it in the code sandbox (reward.sandbox_executor, reward.sandbox_min_isolation)."""
    for mod in _MODULES:
        importlib.import_module(mod)
    if name not in ENVIRONMENTS:
        raise ValueError(
            f"unknown environment 'env:{name}'; choose from: "
            + ", ".join(f"env:{n}" for n in sorted(ENVIRONMENTS))
        )
    sandbox = {"sandbox_executor": sandbox_executor, "sandbox_min_isolation": sandbox_min_isolation}
    return ENVIRONMENTS[name](
        args=args,
        system_prompt=system_prompt,
        instruction=instruction,
        extract=extract,
        env_cfg=env_cfg,
        **sandbox,
    )


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and the tail (where tracebacks end) of a long observation."""
    if len(text) <= max_chars:
        return text
    half = max_chars // 2
    return f"{text[:half]}\n...[{len(text) - 2 * half} characters cut]...\n{text[len(text) - half :]}"
