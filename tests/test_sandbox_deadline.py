"""A code score the reward service gives up on runs no further tests: in thread mode the scoring thread
cannot be killed, so it would otherwise run every remaining test in the sandbox for nobody, beside the
fresh thread that took its place. The test under way keeps its wall limit: the service's timeout, not
a run cut short at the same moment, says that the score timed out."""

from __future__ import annotations

import threading
from typing import Any

from streamrl.rewards.code import score_program
from streamrl.rewards.sandbox import ExecResult, Limits
from streamrl.rewards.service import RewardService

TESTS = [{"input": f"{i}\n", "output": f"{i}\n"} for i in range(10)]


class Gated:
    """An executor whose runs wait until the test opens the gate; it records every run's limits and
    echoes stdin (so each test passes)."""

    name = "gated"

    def __init__(self) -> None:
        self.runs: list[Limits] = []
        self.started, self.gate = threading.Event(), threading.Event()

    def run(self, program: str, stdin: str = "", limits: Limits | None = None) -> ExecResult:
        self.runs.append(limits or Limits())
        self.started.set()
        self.gate.wait(60)
        return ExecResult(stdin, "", 0, "ok", 0.0, self.name)


def _scorer(ex: Gated, finished: threading.Event) -> Any:
    def score(program: str) -> tuple[float, dict[str, Any]]:
        try:
            return score_program(program, TESTS, executor=ex, limits=Limits(wall_s=30.0))
        finally:
            finished.set()

    return score


def test_a_timed_out_code_score_runs_no_further_tests() -> None:
    ex, finished = Gated(), threading.Event()
    with RewardService(_scorer(ex, finished), workers=1, timeout_s=1.0, mode="thread", cache_size=0) as svc:
        out = svc.submit("print(input())").result(timeout=60)
        assert out.error == "timeout"
        ex.gate.set()  # the abandoned thread's test run returns now
        assert finished.wait(60), "the abandoned score never returned"
    assert len(ex.runs) == 1
    assert ex.runs[0].wall_s == 30.0  # as configured: the score's outcome is the service's timeout


def test_a_code_score_the_service_closes_on_runs_no_further_tests() -> None:
    ex, finished = Gated(), threading.Event()
    svc = RewardService(_scorer(ex, finished), workers=1, timeout_s=600.0, mode="thread", cache_size=0)
    fut = svc.submit("print(input())")
    assert ex.started.wait(60)
    svc.close(wait=False)  # as Scoring.close() does
    assert fut.result(timeout=60).error == "ServiceClosed"
    ex.gate.set()
    assert finished.wait(60), "the abandoned score never returned"
    assert len(ex.runs) == 1
    assert ex.runs[0].wall_s == 30.0  # far from its deadline: as configured


def test_outside_a_service_every_test_runs_with_its_limits() -> None:
    ex = Gated()
    ex.gate.set()
    reward, info = score_program("print(input())", TESTS, executor=ex, limits=Limits(wall_s=30.0))
    assert (reward, info["passed"]) == (1.0, len(TESTS))
    assert [r.wall_s for r in ex.runs] == [30.0] * len(TESTS)
