"""`task=agent:MODULE:FUNCTION`: train an agent written against the `openai` client, unchanged.

The agent is a plain function `agent(client: openai.OpenAI, messages: list[dict]) -> str`: it gets a
client whose base URL is streamrl's chat proxy (envs/proxy.py) and the problem's opening chat, makes as
many chat calls as it likes (tools, retries, self-checks), and returns its final answer text. Problems
and scoring come from a base task, `task_config.args.base` (default rg:chain_sum; the other args go
to it). Every call the agent makes is recorded with token ids, log-probs and versions and assembled
into trajectories (envs/agent_trajectory.py); reward = the base task's score of the returned text.

    # my_agents.py
    def two_tries(client, messages):
        first = client.chat.completions.create(model="policy", messages=messages).choices[0].message
        if "answer is" in (first.content or ""):
            return first.content
        messages = messages + [{"role": "assistant", "content": first.content},
                               {"role": "user", "content": "Finish with 'The answer is <number>.'"}]
        return client.chat.completions.create(model="policy", messages=messages).choices[0].message.content

    streamrl train task=agent:my_agents:two_tries        # async or colocated, like any task

my_agents.py is found in the working directory (as `python -m` would); `agent:path/to/file.py:fn` names
a file instead (user_code.py). Agents may use function calling (`tools=[...]`, see
envs/agents.py:calculator and docs/rewards.md).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from streamrl.data.task import Score, Task, default_task_args
from streamrl.types import Problem
from streamrl.user_code import load_object

AgentFn = Callable[[Any, list[dict[str, str]]], str]


class AgentTask(Task):
    """Problems and scores of a base task; samples are agent episodes over the chat proxy."""

    def __init__(self, spec: str, args: dict[str, Any], base_factory: Callable[..., Task], **kw: Any) -> None:
        super().__init__(**kw)
        self.name = f"agent:{spec}"
        self.agent: AgentFn = load_object(spec, "task")  # module:function or path/to/file.py:function
        args = dict(args)
        base_spec = str(args.pop("base", "rg:chain_sum"))
        if base_spec.startswith(("agent:", "env:")):
            raise ValueError(f"task_config.args.base must be a single-turn task, got '{base_spec}'")
        self.base = base_factory(base_spec, args or default_task_args(base_spec), **kw)

    def heldout(self, n: int) -> list[Problem]:
        return self.base.heldout(n)

    def few_shot_sources(self) -> list[tuple[str, Task]]:
        """The base task's: it renders the training problems, so it shows the examples."""
        return self.base.few_shot_sources()

    def set_few_shot(self, shots: list[tuple[str, str]]) -> None:
        super().set_few_shot(shots)
        self.base.set_few_shot(shots)

    def render(self, problem: Problem) -> list[dict[str, str]]:
        return self.base.render(problem)

    def heldout_from_training(self) -> bool:
        return self.base.heldout_from_training()

    def held_split(self) -> set[str]:
        return self.base.held_split()

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        return self.base.train_stream(seed, exclude)

    def is_correct(self, extracted: str, problem: Problem) -> bool:
        return self.base.is_correct(extracted, problem)

    def score(self, problem: Problem, text: str) -> Score:
        return self.base.score(problem, text)

    def same_answer(self, a: str, b: str, problem: Problem) -> bool:
        return self.base.same_answer(a, b, problem)
