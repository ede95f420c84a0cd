"""The example tool-calling agent (envs/agents.py:calculator) through the colocated agent runner: the
policy calls the tool, reads its result as observation tokens and answers; reward and tokens exact."""

import json
import re
from types import SimpleNamespace

import pytest
from scripted_chat import ScriptedEngine

from streamrl.envs.agents import run_calculate
from streamrl.rollout.agent import rollout_agent_episodes
from streamrl.rollout.trajectory import RolloutSettings
from streamrl.tasks import make_task

SETTINGS = RolloutSettings(
    samples=2,
    max_new_tokens=128,
    temperature=1.0,
    top_p=1.0,
    max_batch=8,
    greedy_baseline=False,
    mask_truncated=False,
    format_weight=0.0,
)


def _task():
    return make_task("agent:streamrl.envs.agents:calculator", {"base": "rg:chain_sum"}, "", "", "answer_is")


def test_the_calculator_agent_calls_its_tool_and_is_rewarded(tiny):
    _, tok = tiny
    task = _task()
    problem = next(task.train_stream(0, set()))
    expression = f"{problem.answer} - 1 + 1"

    def policy(prompt: str) -> str:
        result = re.search(r"<\|im_start\|>tool\n(.*?)<\|im_end\|>\n<\|im_start\|>assistant\n$", prompt)
        if result:  # the tool answered: state it
            return f"The answer is {result.group(1)}."
        call = {"name": "calculate", "arguments": {"expression": expression}}
        return f"<tool_call>\n{json.dumps(call)}\n</tool_call>"

    engine = ScriptedEngine(tok, policy, version=5)
    (ep0, ep1) = rollout_agent_episodes(engine, tok, task, SETTINGS, [(problem, "g0", 0), (problem, "g0", 1)])
    assert ep0.reward == ep1.reward == 1.0 and ep0.error == ""
    (traj,) = ep0.trajectories  # tool call, tool result, answer: one unbroken context
    assert traj.correct and traj.reward_info["calls"] == 2 and traj.sample_id == "g0-0"
    first_turn = tok(policy("") + "<|im_end|>", add_special_tokens=False).input_ids
    obs = tok(
        f"\n<|im_start|>tool\n{problem.answer}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    )
    answer = tok(f"The answer is {problem.answer}.<|im_end|>", add_special_tokens=False).input_ids
    assert traj.completion_ids == first_turn + obs.input_ids + answer
    assert traj.loss_mask == [1] * len(first_turn) + [0] * len(obs.input_ids) + [1] * len(answer)
    assert set(traj.versions) == {5}
    assert '"name": "calculate"' in tok.decode(traj.prompt_ids)  # the tool schema was in the prompt


@pytest.mark.parametrize(
    "name, arguments, result",
    [
        ("calculate", '{"expression": "(3 + 4) * 2"}', "14"),
        ("calculate", '{"expression": "7 / 2"}', "3.5"),
        ("calculate", '{"expression": "2 ** 100 ** 2"}', "error: ValueError: exponent too large"),
        (
            "calculate",
            '{"expression": "__import__(\'os\')"}',
            "error: ValueError: only numbers, + - * / // % ** and parentheses",
        ),
        ("calculate", "{}", "error: KeyError: 'expression'"),
        ("search", "{}", "error: unknown function 'search'; the only tool is calculate"),
    ],
)
def test_the_calculate_tool(name, arguments, result):
    assert run_calculate(SimpleNamespace(name=name, arguments=arguments)) == result
