"""RewardService: exact rewards, timeouts, isolation of raising and dying scorers, recovery, caching,
metrics and real concurrency. Scorers sleep rather than burn CPU: the machine has 2 shared cores."""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
import types
from concurrent.futures import wait
from pathlib import Path

import pytest
import reward_scorers as rs
from bounded import call_bounded, wait_until
from openai_stub import StubServer

from streamrl.rewards.judge import make_judge_scorer
from streamrl.rewards.service import RewardService

# Bound on waiting for an outcome while a scorer is held (rs.wait_for_gate holds it up to 60 s): far
# above the deadlines under test, it only turns "the service waited for the scorer" into a failure.
HANG_S = 30.0


@pytest.fixture
def service():
    made: list[RewardService] = []

    def make(scorer, **kw) -> RewardService:
        made.append(RewardService(scorer, **{"workers": 2, "timeout_s": 10.0, **kw}))
        return made[-1]

    yield make
    for s in made:
        s.close(wait=False)


@pytest.mark.parametrize("mode", ["process", "thread", "inline"])
def test_exact_rewards(service, mode: str) -> None:
    svc = service(rs.length_reward, mode=mode)
    out = svc.score_many([("abc",), ("",), ("hello",)])
    assert [o.reward for o in out] == [3.0, 0.0, 5.0]
    assert [(o.error, o.cached) for o in out] == [(None, False)] * 3
    svc2 = service(rs.sum_with_info, mode=mode)
    (o,) = svc2.score_many([(2.0, 3.5)])
    assert (o.reward, o.info) == (5.5, {"terms": [2.0, 3.5]})
    assert svc2.submit(1.0, 1.0).result().reward == 2.0


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_timeout_costs_one_reward_and_the_next_call_works(service, mode: str, tmp_path: Path) -> None:
    svc = service(rs.wait_for_gate, timeout_s=0.5, mode=mode)
    assert svc.wait_ready(60)
    gate = tmp_path / "gate"
    fut = svc.submit(str(gate), 1.0)
    # the scorer is held until the gate opens, and it opens only after this wait: an outcome now can
    # only come from the 0.5 s deadline
    done, _ = wait([fut], timeout=HANG_S)
    gate.touch()
    assert done, "no outcome while the scorer was held: the 0.5 s deadline was not enforced"
    o = fut.result()
    assert (o.reward, o.error) == (0.0, "timeout")
    assert svc.submit(str(gate), 2.0).result(timeout=60).reward == 2.0
    m = svc.metrics()
    assert (m["reward/timeouts"], m["reward/errors"], m["reward/worker_restarts"], m["reward/count"]) == (
        1,
        0,
        1,
        2,
    )


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_result_sent_while_the_monitor_was_descheduled_is_no_timeout(
    service, mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The monitor takes which pipes are ready, is descheduled (a loaded machine) while the scorer sends
    its result, and wakes past the deadline: the result in the pipe counts, the worker is not replaced."""
    import time

    import streamrl.rewards.service as service_mod

    real, gate = service_mod.wait, tmp_path / "gate"
    svc = service(rs.wait_for_gate, timeout_s=0.5, mode=mode)
    assert svc.wait_ready(60)

    def descheduled(objs: list, timeout: float | None = None) -> list:
        busy = [w for w in svc._pool if w.task is not None]
        if gate.exists() or not busy:
            return real(objs, timeout)
        ready = real(objs, 0)  # the scorer is held at its gate: nothing to read yet
        gate.touch()
        real([busy[0].conn], 60)  # its result is in the pipe now
        time.sleep(max(0.0, busy[0].deadline - time.monotonic()) + 0.05)  # and the deadline is past
        return ready

    monkeypatch.setattr(service_mod, "wait", descheduled)
    o = svc.submit(str(gate), 1.0).result(timeout=60)
    assert (o.reward, o.error) == (1.0, None)
    assert (svc.metrics()["reward/timeouts"], svc.metrics()["reward/worker_restarts"]) == (0, 0)


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_what_a_scorer_kept_survives_its_timeout_and_only_for_its_own_task(
    service, mode: str, tmp_path: Path
) -> None:
    svc = service(rs.keep_then_wait, workers=1, timeout_s=0.5, mode=mode)
    assert svc.wait_ready(60)
    opened = tmp_path / "open"
    opened.touch()
    done = svc.submit(str(opened), "first").result(timeout=HANG_S)
    assert (done.reward, done.error, done.info) == (1.0, None, {})  # kept, then scored: nothing extra
    plain = svc.submit(str(tmp_path / "shut"), "").result(timeout=HANG_S)  # kept nothing, then timed out
    assert plain.error == "timeout" and "kept" not in plain.info
    kept = svc.submit(str(tmp_path / "shut"), "second").result(timeout=HANG_S)
    assert kept.error == "timeout" and kept.info["kept"] == "second"
    (tmp_path / "shut").touch()


def test_hung_worker_process_is_killed_not_leaked(service, tmp_path: Path) -> None:
    pid_file = tmp_path / "pid"
    svc = service(rs.record_pid_then_sleep, workers=1, timeout_s=1.0)
    assert svc.submit(str(pid_file), 60.0).result().error == "timeout"
    with pytest.raises(ProcessLookupError):
        os.kill(int(pid_file.read_text()), 0)  # killed and reaped, not left sleeping
    assert svc.submit(str(pid_file), 0.0).result().reward == 1.0


def test_a_sigterm_to_the_process_group_does_not_cost_a_reward(service, tmp_path: Path) -> None:
    """Slurm and systemd stop a job by sending SIGTERM to all of its processes: the parent stops the run
    at a safe point, and a scorer process keeps scoring what is in flight meanwhile."""
    pid_file = tmp_path / "pid"
    svc = service(rs.record_pid_then_sleep, workers=1)
    future = svc.submit(str(pid_file), 1.0)
    wait_until(pid_file.is_file, HANG_S, "the scorer never started")
    os.kill(int(pid_file.read_text()), signal.SIGTERM)
    o = future.result()
    assert (o.reward, o.error) == (1.0, None)
    assert svc.metrics()["reward/worker_restarts"] == 0


def test_raising_scorer(service) -> None:
    svc = service(rs.raise_value_error)
    o = svc.submit("bad input").result()
    assert (o.reward, o.error, o.info["error_detail"]) == (0.0, "ValueError", "bad input")
    svc.score_many([("again",), ("and again",)])
    m = svc.metrics()
    assert (m["reward/errors/ValueError"], m["reward/errors"], m["reward/worker_restarts"]) == (3, 3, 0)


def test_bad_return_values(service) -> None:
    for scorer, error in [
        (rs.nan_reward, "ValueError"),
        (rs.not_a_number, "ValueError"),
        (rs.unpicklable_info, "UnpicklableResult"),
    ]:
        o = service(scorer, workers=1).submit().result()
        assert (o.reward, o.error) == (0.0, error), scorer.__name__


def test_dead_worker_costs_one_reward_and_is_replaced(service) -> None:
    svc = service(rs.maybe_die)
    out = svc.score_many([(0,), (1,), (0,), (3,)])
    assert [o.reward for o in out] == [1.0, 0.0, 1.0, 0.0]
    assert [o.error for o in out] == [None, "WorkerDied", None, "WorkerDied"]
    assert "code 1" in out[1].info["error_detail"] and "code 3" in out[3].info["error_detail"]
    assert [o.reward for o in svc.score_many([(0,)] * 4)] == [1.0] * 4  # the pool still serves
    m = svc.metrics()
    assert (m["reward/errors/WorkerDied"], m["reward/worker_restarts"]) == (2, 2)


def test_segfault_is_isolated(service) -> None:
    svc = service(rs.maybe_segfault, workers=1)
    o = svc.submit(True).result()
    assert (o.reward, o.error) == (0.0, "WorkerDied")
    assert "code -11" in o.info["error_detail"]  # killed by SIGSEGV
    assert svc.submit(False).result().reward == 1.0


def test_cache_hits_make_no_call(service, tmp_path: Path) -> None:
    calls = tmp_path / "calls.txt"
    svc = service(rs.count_calls, cache_size=2)
    first = svc.submit(str(calls), "abc").result()
    again = svc.submit(str(calls), "abc").result()
    assert (first.reward, first.cached, again.reward, again.cached) == (3.0, False, 3.0, True)
    assert calls.read_text().split() == ["abc"]
    # LRU of 2: after abc, b, c the oldest (abc) is evicted; c stays
    for text in ["b", "c", "abc", "c", "b"]:
        svc.submit(str(calls), text).result()
    assert calls.read_text().split() == ["abc", "b", "c", "abc", "b"]
    m = svc.metrics()
    assert (m["reward/count"], m["reward/cache_hits"], m["reward/cache_size"]) == (7, 2, 2)
    assert m["reward/cache_hit_rate"] == pytest.approx(2 / 7)


def test_identical_requests_in_flight_share_one_call(service, tmp_path: Path) -> None:
    calls = tmp_path / "calls.txt"
    svc = service(rs.count_calls)
    out = svc.score_many([(str(calls), "same")] * 5)
    assert [o.reward for o in out] == [4.0] * 5
    assert calls.read_text().split() == ["same"]
    assert sum(o.cached for o in out) == 4


def test_unhashable_args_score_uncached_unless_keyed(service) -> None:
    calls: list[int] = []

    def score(row: dict) -> float:  # a dict argument cannot be a cache key
        calls.append(row["x"])
        return float(row["x"])

    svc = service(score, mode="thread")
    assert [o.reward for o in svc.score_many([({"x": 2},), ({"x": 2},)])] == [2.0, 2.0]
    assert calls == [2, 2]
    keyed = [svc.submit({"x": 3}, cache_key="row-3").result() for _ in range(2)]
    assert [(o.reward, o.cached) for o in keyed] == [(3.0, False), (3.0, True)]
    assert calls == [2, 2, 3]


def test_errors_are_not_cached(service) -> None:
    svc = service(rs.raise_value_error)
    assert [o.cached for o in svc.score_many([("x",)]) + svc.score_many([("x",)])] == [False, False]
    assert svc.metrics()["reward/errors/ValueError"] == 2


def test_two_workers_overlap(service, tmp_path: Path) -> None:
    svc = service(rs.meet, workers=2, timeout_s=120.0)
    assert svc.wait_ready(60)
    out = svc.score_many([(str(tmp_path), "a", 2), (str(tmp_path), "b", 2)])
    # each call scores 1.0 only once both are inside the scorer; one after the other, the first gives up
    # after its 30 s and scores 0.0
    assert [o.reward for o in out] == [1.0, 1.0], "the two calls never ran at the same time"
    m = svc.metrics(reset=True)
    assert m["reward/count"] == 2 and 0 < m["reward/latency_mean_s"] <= m["reward/latency_max_s"]
    assert svc.metrics()["reward/count"] == 0  # reset


def test_unpicklable_scorer_needs_thread_mode() -> None:
    with pytest.raises(ValueError, match="mode='thread'"):
        RewardService(lambda text: 1.0, mode="process")
    with RewardService(lambda text: float(len(text)), mode="thread") as svc:
        assert svc.submit("four").result().reward == 4.0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="mode 'gpu' is unknown"):
        RewardService(rs.length_reward, mode="gpu")
    with pytest.raises(ValueError, match="workers >= 1"):
        RewardService(rs.length_reward, workers=0)


def test_close(service, tmp_path: Path) -> None:
    gate, started = tmp_path / "gate", tmp_path / "started"
    svc = service(rs.wait_for_gate, workers=1, timeout_s=120.0)
    running = svc.submit(str(gate), 1.0, str(started))
    queued = svc.submit(str(gate), 2.0)
    try:
        wait_until(started.exists, 60, "the first call never reached the scorer")
        # the running call is held until the gate opens, after close returns: close must not wait for it
        call_bounded(lambda: svc.close(wait=False), HANG_S, "close(wait=False) waited for the running call")
    finally:
        gate.touch()
    assert [running.result().error, queued.result().error] == ["ServiceClosed", "ServiceClosed"]
    with pytest.raises(RuntimeError, match="closed"):
        svc.submit(0.0, 1.0)


def test_scorer_that_cannot_start_fails_requests_instead_of_respawning(service) -> None:
    ghost = types.ModuleType("ghost_scorers")  # exists only in this process: workers cannot import it

    def score(text: str) -> float:
        return 1.0

    score.__module__, score.__qualname__ = "ghost_scorers", "score"
    ghost.score = score
    sys.modules["ghost_scorers"] = ghost
    try:
        pickle.dumps(score)
        svc = service(score, workers=1, start_timeout_s=30.0)
        assert not svc.wait_ready(60)
        o = svc.submit("x").result(timeout=60)
    finally:
        del sys.modules["ghost_scorers"]
    assert (o.reward, o.error) == (0.0, "WorkerStartFailed")
    assert svc.metrics()["reward/worker_restarts"] == 3


def test_judge_as_scorer(service) -> None:
    server = StubServer([(200, "Same number.\nVERDICT: CORRECT", 0), (200, "Hmm, hard to say.", 0)])
    try:
        judge = make_judge_scorer(base_url=server.base_url, model="judge-model", retries=0, timeout_s=5)
        svc = service(judge, workers=1)  # one worker: replies are consumed in submit order
        ok, bad = svc.score_many([("1+1?", "2", "2"), ("1+1?", "2", "two-ish")])
    finally:
        server.close()
    assert (ok.reward, ok.error, ok.info["judge_attempts"]) == (1.0, None, 1)
    assert (bad.reward, bad.error) == (0.0, "JudgeError/unparseable verdict")  # the judge's reason
    assert bad.info["error_detail"].startswith("unparseable verdict")
    assert svc.metrics()["reward/errors/JudgeError/unparseable verdict"] == 1


def test_cancelled_queued_request_is_skipped_and_its_followers_still_scored(service) -> None:
    # a step past reward.step_budget_s cancels its queued requests (rollout/score.py): the service must
    # not score them for nobody, and a later identical request that waits on a cancelled one still gets
    # a real score
    gate, calls = threading.Event(), []

    def score(text: str) -> float:
        calls.append(text)
        if text == "block":
            gate.wait(HANG_S)
        return float(len(text))

    svc = service(score, mode="thread", workers=1, timeout_s=120.0)
    busy = svc.submit("block")  # holds the only worker
    wait_until(lambda: calls == ["block"], HANG_S, "the worker never took the first request")
    dropped = [svc.submit(f"dropped-{i}") for i in range(40)]  # queued behind it
    leader = svc.submit("shared")
    follower = svc.submit("shared")  # the same request: it waits on the queued one
    assert all(f.cancel() for f in dropped) and leader.cancel()
    gate.set()
    # each skipped request hands the next at once: were the monitor to sleep its 1 s idle wait per
    # cancelled request, the 40 would outlast the bound
    out = call_bounded(lambda: follower.result(), HANG_S, "cancelled requests stalled the queue")
    assert (out.reward, out.error, busy.result().reward) == (6.0, None, 5.0)
    assert calls == ["block", "shared"]  # the cancelled ones never ran


def test_a_task_whose_send_failed_is_requeued_and_scored(service, monkeypatch) -> None:
    """A worker that dies between two tasks makes the send of the next one fail: the task goes back to
    the queue (its future already running) and is scored, and the service goes on scoring."""
    real_spawn = RewardService._spawn
    failed: list[int] = []

    def spawn(self, i):
        w = real_spawn(self, i)
        send = w.conn.send

        def send_once_broken(msg):
            if not failed:
                failed.append(1)
                raise BrokenPipeError("the worker just died")
            send(msg)

        w.conn.send = send_once_broken
        return w

    monkeypatch.setattr(RewardService, "_spawn", spawn)
    svc = service(rs.length_reward, workers=1)
    fut = svc.submit("abcd")
    out = call_bounded(lambda: fut.result(timeout=60), 90, "the requeued task was never scored")
    assert failed == [1] and (out.reward, out.error) == (4.0, None)
    assert [o.reward for o in svc.score_many([("ab",), ("abc",)])] == [2.0, 3.0]


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_a_fault_of_the_monitor_fails_every_request_instead_of_leaving_it_waiting(
    service, monkeypatch, mode: str
) -> None:
    """A bug in the monitor thread (none known: here its result check raises once a task is running)
    resolves the running request, the queued ones and every later one with "ServiceFailed"."""
    real_check = RewardService._check

    def check(self, w, ready):
        if w.task is not None:
            raise RuntimeError("bookkeeping bug")
        return real_check(self, w, ready)

    monkeypatch.setattr(RewardService, "_check", check)
    svc = service(rs.length_reward, workers=1, mode=mode)
    futures = [svc.submit("a" * n) for n in range(1, 4)]  # one running, two queued
    outs = [call_bounded(lambda f=f: f.result(timeout=30), 40, "a request was left waiting") for f in futures]
    later = svc.submit("abcd").result(timeout=10)
    for out in [*outs, later]:
        assert (out.reward, out.error) == (0.0, "ServiceFailed")
        assert "RuntimeError: bookkeeping bug" in out.info["error_detail"]
    assert svc.metrics()["reward/errors/ServiceFailed"] == 4


def test_a_monitor_fault_after_a_worker_was_replaced_leaves_no_request_waiting(service, monkeypatch):
    """A worker past its deadline is replaced, and starting its replacement fails: the timed-out request
    keeps its "timeout", and the queued ones resolve with "ServiceFailed" (none is resolved twice)."""
    real_spawn, spawned = RewardService._spawn, []

    def spawn(self, i):
        spawned.append(i)
        if len(spawned) > 1:
            raise OSError("cannot start a process")
        return real_spawn(self, i)

    def score(text: str) -> float:
        if text == "slow":
            threading.Event().wait(HANG_S)
        return float(len(text))

    monkeypatch.setattr(RewardService, "_spawn", spawn)
    svc = service(score, mode="thread", workers=1, timeout_s=0.5)
    futures = [svc.submit(t) for t in ("slow", "ab", "abc")]
    outs = [call_bounded(lambda f=f: f.result(timeout=30), 40, "a request was left waiting") for f in futures]
    assert [o.error for o in outs] == ["timeout", "ServiceFailed", "ServiceFailed"]
    assert "OSError: cannot start a process" in outs[1].info["error_detail"]


class _Unsendable:
    def __reduce__(self):
        raise ValueError("this argument cannot travel")


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_an_argument_that_cannot_be_sent_costs_its_own_reward_only(service, mode: str) -> None:
    svc = service(rs.length_reward, workers=1, mode=mode)
    bad, good = svc.submit(_Unsendable()), svc.submit("abcd")
    out = call_bounded(lambda: bad.result(timeout=30), 40, "the unsendable request was left waiting")
    assert (out.reward, out.error) == (0.0, "UnpicklableArgs")
    assert "this argument cannot travel" in out.info["error_detail"]
    assert (good.result(timeout=30).reward, svc.submit("ab").result(timeout=30).reward) == (4.0, 2.0)
