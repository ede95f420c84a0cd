"""env:python_tool (ReTool-style): the model may run Python before giving its final answer.

Protocol, per model turn:
- a final answer in the task's format (outside code blocks) ends the episode; reward = 1[correct]
  by the task's scorer (reasoning-gym's score_answer on the extracted answer);
- else ```python ...``` blocks are run (all blocks of the turn, in order, as one fresh program: no state
  is kept between turns) and the output, truncated, is the observation;
- else (neither) the episode ends unanswered: reward 0, formatted False.
Problems are reasoning-gym arithmetic (task_config.args.dataset, default basic_arithmetic).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from streamrl.config import EnvConfig, TaskConfig
from streamrl.data.prompts import SHOT_TEMPLATES
from streamrl.data.reasoning_gym import ReasoningGymTask
from streamrl.data.task import SMALL_MODEL_ARGS
from streamrl.envs.base import EnvStep, EnvTask, ProblemEnv, register, truncate_middle
from streamrl.envs.executor import RunCode, SandboxRunner
from streamrl.types import Problem

DEFAULT_DATASET = "basic_arithmetic"
_CODE = re.compile(r"```(?:python|py)[ \t]*\n(.*?)```", re.DOTALL)


def _written(extract: str, answer: str = "<number>") -> str:
    """An answer as the few-shot examples write it for reward.extract (data/prompts.py SHOT_TEMPLATES)."""
    return SHOT_TEMPLATES[extract].format(answer=answer)


# the system prompt's request for the final answer, by reward.extract
_FORMATS = {
    "answer_is": f"write '{_written('answer_is')}'",
    "boxed": f"write the final answer in {_written('boxed', answer='')}",
    "last_number": "end your reply with the final number",
    "gsm8k": f"end your reply with '{_written('gsm8k')}'",
}


def tool_system_prompt(extract: str) -> str:
    how = _FORMATS.get(extract, _FORMATS["answer_is"])
    return (
        "You solve problems and may run Python. To run code, write one block\n```python\nprint(2 + 3)\n```\n"
        "and end your turn; the output comes back in the next message. Every block runs as a fresh "
        f"program, so print what you need. When you know the result, {how}."
    )


def make_runner(
    env_cfg: EnvConfig, sandbox_executor: str = "local", sandbox_min_isolation: str = "auto"
) -> RunCode:
    """The default executor: the code tasks' sandbox (reward.sandbox_executor, checked against
    reward.sandbox_min_isolation); pass run_code= to the task to use another."""
    return SandboxRunner(env_cfg.code_timeout, sandbox_executor, min_isolation=sandbox_min_isolation)


class PythonToolEnv(ProblemEnv):
    def __init__(self, task: PythonToolTask, run_code: RunCode, max_chars: int) -> None:
        self.task, self.run_code, self.max_chars = task, run_code, max_chars

    def step(self, text: str) -> EnvStep:
        problem = self.current()
        blocks = _CODE.findall(text)
        score = self.task.score(problem, _CODE.sub("", text))
        if score.formatted or not blocks:
            info = {"correct": score.correct, "formatted": score.formatted, "extracted": score.extracted}
            return EnvStep("", float(score.correct), True, info)
        output, status = self.run_code("\n".join(blocks))
        output = output.strip() or "(no output: print the values you need)"
        obs = f"Output ({status}):\n{truncate_middle(output, self.max_chars)}"
        return EnvStep(obs, 0.0, False, {"tool_status": status})


class PythonToolTask(EnvTask):
    """Reasoning-gym problems, answered with the help of a Python tool."""

    def __init__(
        self,
        args: dict[str, Any],
        system_prompt: str,
        instruction: str,
        extract: str,
        env_cfg: EnvConfig,
        run_code: RunCode | None = None,
        sandbox_executor: str = "local",
        sandbox_min_isolation: str = "auto",
    ) -> None:
        if system_prompt in ("", TaskConfig().system_prompt):  # the single-turn default knows no tool
            system_prompt = tool_system_prompt(extract)
        super().__init__(system_prompt, instruction, extract)
        gen_args = dict(args)
        dataset = str(gen_args.pop("dataset", DEFAULT_DATASET))
        self.inner = ReasoningGymTask(
            dataset,
            gen_args or SMALL_MODEL_ARGS.get(dataset, {}),
            system_prompt=system_prompt,
            instruction=instruction,
            extract=extract,
        )
        self.name = "env:python_tool"
        self.env_cfg = env_cfg
        self.run_code = run_code or make_runner(env_cfg, sandbox_executor, sandbox_min_isolation)

    def heldout(self, n: int) -> list[Problem]:
        return self.inner.heldout(n)

    def set_few_shot(self, shots: list[tuple[str, str]]) -> None:
        """The inner task renders the training problems, so it shows the examples."""
        super().set_few_shot(shots)
        self.inner.set_few_shot(shots)

    def render(self, problem: Problem) -> list[dict[str, str]]:
        return self.inner.render(problem)

    def heldout_from_training(self) -> bool:
        return self.inner.heldout_from_training()

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        return self.inner.train_stream(seed, exclude)

    def is_correct(self, extracted: str, problem: Problem) -> bool:
        return self.inner.is_correct(extracted, problem)

    def new_env(self) -> PythonToolEnv:
        return PythonToolEnv(self, self.run_code, self.env_cfg.max_observation_chars)


@register("python_tool")
def build(**kw: Any) -> PythonToolTask:
    return PythonToolTask(**kw)
