"""A rollout worker waits briefly after a decode step for the scores of the groups that step finished,
so a group reaches the trainer before the next step rather than after it; the wait is bounded by an
allowance that decoding earns (rollout/score.py: ScoreWait)."""

from __future__ import annotations

import queue
import threading
import time
from concurrent.futures import Future
from typing import Any

from scripted_worker import StillWeights, one_group_in_a_thread
from tiny_args import TINY

from streamrl.config import load_config, to_dict
from streamrl.engine.base import GenResult
from streamrl.rollout import score as score_mod
from streamrl.rollout import worker as worker_mod
from streamrl.rollout.score import ScoreWait
from streamrl.rollout.worker import STOP, GroupRequest, _loop
from streamrl.tasks import task_from_config

# -------------------------------------------------------------------------------- the allowance


def test_decoding_earns_a_share_of_its_time_up_to_the_cap():
    w = ScoreWait(share=0.1, cap_s=0.05)
    assert w.allowance == 0.05  # the first wait may take the whole cap
    w.allowance = 0.0
    w.earn(0.2)
    assert abs(w.allowance - 0.02) < 1e-12  # 10% of 200 ms
    w.earn(0.2)
    assert abs(w.allowance - 0.04) < 1e-12
    w.earn(1.0)
    assert w.allowance == 0.05  # held at the cap


def test_done_scores_and_a_spent_allowance_cost_nothing():
    w = ScoreWait(share=0.1, cap_s=0.05)
    done: Future = Future()
    done.set_result(None)
    assert w.wait([done]) == 0.0
    assert w.allowance == 0.05  # nothing pending: no wait, nothing deducted
    w.allowance = 0.0
    never: Future = Future()
    assert w.wait([never]) == 0.0  # returns at once: a slow scorer gets no more than decoding earned
    assert w.allowance == 0.0 and not never.done()


def test_a_wait_ends_when_the_scores_arrive_and_is_deducted():
    w = ScoreWait(share=0.1, cap_s=60.0)
    fut: Future = Future()
    threading.Timer(0.02, fut.set_result, (None,)).start()
    waited = w.wait([fut])
    assert fut.done() and 0 < w.allowance < 60.0  # stopped at the score, not at the cap
    assert waited > 0 and w.allowance == 60.0 - waited  # what it returns is what it deducted


def test_a_wait_is_given_the_allowance_left_as_its_timeout(monkeypatch):
    asked = []
    monkeypatch.setattr(score_mod.concurrent.futures, "wait", lambda fs, timeout: asked.append(timeout))
    w = ScoreWait(share=0.1, cap_s=10.0)
    w.allowance = 0.25
    w.wait([Future()])
    assert asked == [0.25]


def test_an_unfinished_score_spends_the_allowance_and_no_more():
    w = ScoreWait(share=0.1, cap_s=0.01)
    never: Future = Future()
    w.wait([never])
    assert w.allowance <= 1e-3  # the whole allowance (the timeout may return a hair early)
    w.wait([never])  # spent: the next step does not wait
    assert not never.done()


# --------------------------------------------------------------------------- in the worker's loop

FINISH = {"g0": 2, "g1": 6}  # the decode step on which each group's samples finish


class ScriptedDecoder:
    """A decoder whose requests of group g finish on decode step FINISH[g] with two tokens each."""

    def __init__(self, engine: Any, mode: str) -> None:
        self.engine, self.version, self.steps = engine, 0, 0
        self.live: list[Any] = []

    @property
    def idle(self) -> bool:
        return not self.live

    def add(self, requests: list[Any]) -> None:
        self.live += [(r, self.steps + FINISH[r.tag[0]]) for r in requests]

    def update_weights(self, state: Any, version: int) -> None:
        self.version = version

    def step(self) -> list[GenResult]:
        self.steps += 1
        now = [r for r, at in self.live if at == self.steps]
        self.live = [(r, at) for r, at in self.live if at != self.steps]
        return [GenResult(r, [20, 21], [-1.0, -1.0], [0, 0], "stop") for r in now]


class StepsAtPut:
    """A result sink that notes how many decode steps the decoder had taken when each result came."""

    def __init__(self) -> None:
        self.decoder: ScriptedDecoder | None = None
        self.results: queue.Queue = queue.Queue()

    def put(self, item: Any) -> None:
        self.results.put((item, self.decoder.steps if self.decoder else -1))


def test_a_group_goes_out_before_the_next_decode_step_while_its_score_is_briefly_late(tiny, monkeypatch):
    sink = StepsAtPut()

    def decoder(engine: Any, mode: str) -> ScriptedDecoder:
        sink.decoder = ScriptedDecoder(engine, mode)
        return sink.decoder

    monkeypatch.setattr("streamrl.engine.continuous.ContinuousDecoder", decoder)
    submit = score_mod.Scoring.submit

    def late_submit(self: Any, problem: Any, traj: Any) -> Future:  # the score lands 30 ms later
        late: Future = Future()
        real = submit(self, problem, traj)
        threading.Timer(0.03, lambda: late.set_result(real.result())).start()
        return late

    monkeypatch.setattr(score_mod.Scoring, "submit", late_submit)
    # an allowance that outlasts a loaded machine's timer delays (the scripted decoder earns nothing)
    monkeypatch.setattr(score_mod, "ScoreWait", lambda: ScoreWait(share=0.1, cap_s=10.0))
    cfg = load_config(None, [*TINY, "rollout.samples_per_prompt=2"])
    requests: queue.Queue = queue.Queue()
    problem = next(iter(task_from_config(cfg).train_stream(cfg.seed, set())))
    for gid in ("g1", "g0"):  # g1 keeps the decoder stepping after g0 is done
        requests.put(GroupRequest(gid, problem, [1, 2, 3], 2, 0))
    worker = threading.Thread(
        target=_loop, args=(0, to_dict(cfg), requests, sink, StillWeights(), lambda: False), daemon=True
    )
    worker.start()
    first, steps = sink.results.get(timeout=120)
    second, steps_second = sink.results.get(timeout=120)
    requests.put(STOP)
    worker.join(60)
    assert not worker.is_alive() and not first.error and not second.error
    # g0's samples finished on step 2: without the wait its score is still out when the loop looks, and
    # the group would leave only after step 3
    assert (first.group_id, steps) == ("g0", FINISH["g0"])
    assert (second.group_id, steps_second) == ("g1", FINISH["g1"])
    assert [t.reward_info["reward_error"] for t in first.group.trajectories] == [None, None]


class WaitClock:
    """A perf_counter that stands still but for each wait for scores, which moves it on by 5 s."""

    def __init__(self) -> None:
        self.now, self.waits = 100.0, 0

    def perf_counter(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return time.monotonic()

    def wait(self, futures: list[Future]) -> float:
        for f in futures:
            f.result(timeout=60)
        self.now += 5.0 if futures else 0.0
        self.waits += bool(futures)
        return 5.0 if futures else 0.0


def test_the_wait_for_scores_counts_as_engine_idle_time_not_generating_time(tiny, monkeypatch):
    monkeypatch.setattr("streamrl.engine.continuous.ContinuousDecoder", ScriptedDecoder)
    clock = WaitClock()
    monkeypatch.setattr(worker_mod, "time", clock)
    monkeypatch.setattr(score_mod.ScoreWait, "wait", lambda self, futures: clock.wait(futures))
    cfg = load_config(None, [*TINY, "rollout.samples_per_prompt=2"])
    problem = next(iter(task_from_config(cfg).train_stream(cfg.seed, set())))
    res = one_group_in_a_thread(cfg, GroupRequest("g0", problem, [1, 2, 3], 2, 0), StillWeights(), 120)
    assert not res.error and clock.waits == 1
    # the clock moved only while waiting: the 5 s are idle, none of them generating
    assert (res.busy_s, res.idle_s) == (0.0, 5.0)


def test_a_score_that_lands_as_the_budget_runs_out_counts():
    """The score arrives between the look at the future and the cancel: the cancel fails, and the real
    score is kept (not 0 for the step budget while the service counted a success)."""
    from types import SimpleNamespace

    from streamrl.rewards.service import RewardOutcome
    from streamrl.rollout.score import Scoring

    class ScoredJustAfterTheLook(Future):
        looks = 0

        def done(self) -> bool:
            self.looks += 1
            return self.looks > 1 and super().done()

    fut = ScoredJustAfterTheLook()
    fut.set_running_or_notify_cancel()
    fut.set_result(RewardOutcome(1.0, {"correct": True}, None, 0.1))
    scoring = SimpleNamespace(expired=0, budget_s=5.0)
    out = Scoring.outcome(scoring, fut)
    assert (out.reward, out.error, scoring.expired) == (1.0, None, 0)
    queued: Future = Future()  # never scored: the budget's 0, and counted
    out = Scoring.outcome(scoring, queued)
    assert (out.reward, out.error, scoring.expired, queued.cancelled()) == (0.0, "step_budget", 1, True)
