"""The file of reward functions of the user's own that the reward.fn tests load (my_rewards.py), and the
problem, trajectory and inline scoring they go through (tests/ is on sys.path)."""

from __future__ import annotations

import textwrap

from streamrl.config import load_config
from streamrl.rollout.score import Scoring
from streamrl.types import Problem, Trajectory

USER_FILE = textwrap.dedent(
    """
    CALLS = []

    def brevity(prompts, completions, completion_ids, answer, **columns):
        CALLS.append((prompts, completions, completion_ids, answer, columns))
        return [1.0 / (1 + len(ids)) for ids in completion_ids]

    def mentions_answer(prompts, completions, answer, **columns):
        return [None if a == "skip" else float(a in c) for c, a in zip(completions, answer)]

    def broken(prompts, completions, **columns):
        return [0.5, 0.5]  # two values for one completion

    def raises(prompts, completions, **columns):
        raise RuntimeError("boom")

    def raises_long(prompts, completions, **columns):
        raise RuntimeError("y" * 2000)

    LOOPS = []

    async def async_brevity(prompts, completions, completion_ids, **columns):
        import asyncio

        LOOPS.append(asyncio.get_running_loop())  # a client made on the first call is bound to it
        return [1.0 / (1 + len(ids)) for ids in completion_ids]

    CANCELLED = []

    async def async_hangs(prompts, completions, **columns):
        import asyncio

        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            CANCELLED.append(completions[0])
            raise

    def no_kwargs(prompts, completions, completion_ids):
        return [1.0]

    def needs_solution(completions, solution, **kwargs):  # open-r1's accuracy reward: a `solution` column
        return [float(s in c) for c, s in zip(completions, solution)]

    def style_match(prompts, completions, style, **columns):
        return [float(s in c) for c, s in zip(completions, style)]

    def answer_is_72(prompts, completions, answer, **columns):
        return [float(a == "72") for a in answer]

    def text_score(prompts, completions, **columns):
        return ["8"]  # a judge's raw text: not a reward

    def keyed_score(prompts, completions, **columns):
        return {0.7: completions[0]}  # a mapping iterates as its keys

    def nan_score(prompts, completions, **columns):
        return [float("nan")]

    def hangs(prompts, completions, **columns):
        import time

        time.sleep(30)
        return [1.0]

    def exits(prompts, completions, **columns):
        import os

        os._exit(3)  # the worker process dies mid-score
    """
)


def _problem(answer: str = "7", **columns: object) -> Problem:
    meta = {
        "kind": "math",
        "question": "What is 3+4?",
        "columns": {"prompt": "What is 3+4?", "answer": answer, **columns},
    }
    return Problem("p1", [{"role": "user", "content": "What is 3+4?"}], answer, meta)


def _traj(text: str, ids: list[int]) -> Trajectory:
    return Trajectory(
        problem_id="p1",
        group_id="g",
        sample_id="g-0",
        prompt_ids=[1],
        completion_ids=ids,
        behaviour_logprobs=[0.0] * len(ids),
        versions=[0] * len(ids),
        finish_reason="stop",
        text=text,
    )


def _scored(overrides: list[str], problem: Problem, traj: Trajectory) -> Trajectory:
    from streamrl.data.sources import task_from_rows

    cfg = load_config(None, ["reward.extract=last_number", "reward.service=inline", *overrides])
    task = task_from_rows([{"prompt": "What is 3+4?", "answer": "7"}], extract="last_number")
    scoring = Scoring(cfg, task)
    scoring.score([(problem, traj)])
    scoring.close()
    return traj
