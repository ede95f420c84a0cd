"""Your reward functions on the threads that call them: a function calling math-verify with its default
timeouts (open-r1's accuracy reward) scores under the default reward.service=thread, on an async
function's event-loop thread too, and passes the start-up call made on such a thread; a function that
needs the main thread for a signal of its own is refused there in one line that names
reward.service=process."""

from __future__ import annotations

import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest
from user_rewards import _problem, _traj  # tests/ is on sys.path

from streamrl.config import load_config
from streamrl.rewards.fn_probe import choose_formats
from streamrl.rewards.user_fns import configured_fns, load_fns
from streamrl.rollout.score import Scoring
from streamrl.types import Trajectory

# open-r1's accuracy reward (src/open_r1/rewards.py), and the same check written on text, and async
OPEN_R1 = textwrap.dedent(
    """
    from latex2sympy2_extended import NormalizationConfig
    from math_verify import LatexExtractionConfig, parse, verify


    def accuracy_reward(completions, solution, **kwargs):
        contents = [completion[0]["content"] for completion in completions]
        rewards = []
        for content, sol in zip(contents, solution):
            gold_parsed = parse(sol, extraction_mode="first_match")
            if len(gold_parsed) != 0:
                answer_parsed = parse(
                    content,
                    extraction_config=[
                        LatexExtractionConfig(
                            normalization_config=NormalizationConfig(
                                nits=False, malformed_operators=False, basic_latex=True, equations=True,
                                boxed="all", units=True,
                            ),
                            boxed_match_priority=0,
                            try_extract_without_anchor=False,
                        )
                    ],
                    extraction_mode="first_match",
                )
                try:
                    reward = float(verify(gold_parsed, answer_parsed))
                except Exception:
                    reward = None
            else:
                reward = None
            rewards.append(reward)
        return rewards


    def same_answer(completions, solution, **kwargs):
        return [float(verify(parse(s), parse(c))) for c, s in zip(completions, solution)]


    async def async_same_answer(completions, solution, **kwargs):
        return same_answer(completions, solution)


    def alarm(completions, **kwargs):  # a timeout of its own, by SIGALRM
        import signal

        signal.signal(signal.SIGALRM, signal.getsignal(signal.SIGALRM))
        return [1.0]
    """
)


@pytest.fixture()
def openr1(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """openr1_rewards.py in the working directory, imported as reward.fn=openr1_rewards:NAME is."""
    (tmp_path / "openr1_rewards.py").write_text(OPEN_R1)
    monkeypatch.chdir(tmp_path)
    yield tmp_path
    sys.modules.pop("openr1_rewards", None)


def _score(overrides: list[str], text: str) -> Trajectory:
    """One response to 3+4 (reference \\frac{14}{2} in the row's `solution`) through the default service."""
    from streamrl.data.sources import task_from_rows

    cfg = load_config(None, ["reward.extract=last_number", *overrides])
    assert cfg.reward.service == "thread"  # the default
    scoring = Scoring(cfg, task_from_rows([{"prompt": "What is 3+4?", "answer": "7"}], extract="last_number"))
    t = _traj(text, [5])
    try:
        scoring.score([(_problem("7", solution="$\\frac{14}{2}$"), t)])
    finally:
        scoring.close()
    return t


@pytest.mark.parametrize(
    ("fn", "completions"),
    [("accuracy_reward", "chat"), ("same_answer", "text"), ("async_same_answer", "text")],
    ids=["open-r1", "text", "async"],
)
@pytest.mark.parametrize(("text", "value"), [("So $\\boxed{7}$", 1.0), ("So $\\boxed{8}$", 0.0)])
def test_math_verify_with_its_default_timeouts_scores_on_the_services_threads(
    openr1: Path, fn: str, completions: str, text: str, value: float
) -> None:
    t = _score([f"reward.fn=openr1_rewards:{fn}", f"reward.completions={completions}"], text)
    assert (t.reward, t.reward_info["reward_error"], t.reward_info[f"reward/{fn}"]) == (value, None, value)


def test_the_start_up_call_on_a_scoring_thread_accepts_open_r1s_reward(
    openr1: Path, capsys: pytest.CaptureFixture
) -> None:
    cfg = load_config(None, ["reward.fn=openr1_rewards:accuracy_reward"])
    fns = configured_fns(cfg.reward.fn, cfg.reward.fns, cfg.reward.completions)
    choose_formats(cfg.reward, load_fns(fns), fns, _problem("7", solution="$7$"))
    assert capsys.readouterr().err == (
        "streamrl: reward function openr1_rewards:accuracy_reward takes completions as chat messages "
        "(reward.completions=auto)\n"
    )
    assert cfg.reward.completions == "chat"


def test_a_function_that_needs_the_main_thread_is_refused_under_threads_and_taken_by_processes(
    openr1: Path,
) -> None:
    error = "ValueError: signal only works in main thread of the main interpreter"
    cfg = load_config(None, ["reward.fn=openr1_rewards:alarm"])
    fns = configured_fns(cfg.reward.fn, cfg.reward.fns, cfg.reward.completions)
    with pytest.raises(ValueError) as e:
        choose_formats(cfg.reward, load_fns(fns), fns, _problem())
    assert str(e.value) == (
        "config key 'reward.fn': openr1_rewards:alarm fails on the first training problem (id p1) with "
        f"completions as text ({error}) and with completions as chat messages ({error}): it needs the main "
        "thread (signals): set reward.service=process, whose workers call it there"
    )
    cfg = load_config(None, ["reward.fn=openr1_rewards:alarm", "reward.service=process"])
    choose_formats(cfg.reward, load_fns(fns), fns, _problem())  # called on this (the main) thread
    assert cfg.reward.completions == "text"
