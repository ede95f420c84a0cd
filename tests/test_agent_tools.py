"""The example tool-calling agent (envs/agents.py:calculator) through the colocated agent runner: the
policy calls the tool, reads its result as observation tokens and answers; reward and tokens exact."""

import dataclasses
import json
import re
import threading
import time
from types import SimpleNamespace

import pytest
from scripted_chat import ScriptedEngine

from streamrl.envs.agents import one_call, run_calculate
from streamrl.rollout.agent import AGENTS_PER_ROW, rollout_agent_episodes
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


_WINDOW = {"inside": 0, "peak": 0}
_WINDOW_LOCK = threading.Lock()


def counting_agent(client, messages):
    """envs/agents.py's one_call, counting the agents inside at once."""
    with _WINDOW_LOCK:
        _WINDOW["inside"] += 1
        _WINDOW["peak"] = max(_WINDOW["peak"], _WINDOW["inside"])
    try:
        return one_call(client, messages)
    finally:
        with _WINDOW_LOCK:
            _WINDOW["inside"] -= 1


def test_at_most_two_agents_per_engine_row_run_at_once_and_every_episode_returns_in_order(tiny):
    """40 episodes, rollout.max_batch 8: the first 16 agents start and their calls wait (a gate) while
    the rest do not start; once the gate opens each ending agent starts the next, and all 40 episodes
    come back in job order. With env.agent_timeout_s 5 and the gate held 5.5 s, an agent's own time
    counts from its start, not from the first agent's: none of the later ones is ended as overdue (5 s,
    not less: on a loaded machine a later agent's thread can take over 2 s to reach its first call)."""
    _, tok = tiny
    assert AGENTS_PER_ROW == 2
    task = make_task("agent:test_agent_tools:counting_agent", {"base": "rg:chain_sum"}, "", "", "answer_is")
    problem = next(task.train_stream(0, set()))
    gate = threading.Event()
    engine = ScriptedEngine(tok, lambda prompt: f"The answer is {problem.answer}." if gate.wait(60) else "")
    jobs = [(problem, f"g{j}", j % 2) for j in range(40)]
    settings = dataclasses.replace(SETTINGS, agent_timeout_s=5.0)
    _WINDOW.update(inside=0, peak=0)
    out: list = []

    def run() -> None:
        out.extend(rollout_agent_episodes(engine, tok, task, settings, jobs))

    runner = threading.Thread(target=run)
    runner.start()
    for _ in range(600):  # until the first agents are all waiting in their calls
        if _WINDOW["inside"] >= 16:
            break
        time.sleep(0.05)
    time.sleep(5.5)  # room for an agent beyond the window to start, were it allowed to
    waiting = _WINDOW["inside"]
    gate.set()
    runner.join(120)
    assert waiting == 16 and _WINDOW["peak"] == 16
    assert [ep.trajectories[0].sample_id for ep in out] == [f"g{j}-{j % 2}" for j in range(40)]
    assert [(ep.reward, ep.error) for ep in out] == [(1.0, "")] * 40
