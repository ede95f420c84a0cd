"""env.agent_timeout_s: an agent stuck in its code or tools ends its episode; model calls do not count."""

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import openai
import pytest
from scripted_chat import ScriptedEngine, gated_proxy
from test_agent_task import TINY

from streamrl.engine.base import GenRequest, GenResult
from streamrl.engine.serving import BatchingEngine, DecoderFront
from streamrl.envs.proxy import EpisodeEnded
from streamrl.rollout.agent import TIMEOUT_ERROR, agent_client, overdue

MSGS = [{"role": "user", "content": "2+2?"}]


class FakeClock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _wait_for(cond, what):
    for _ in range(6000):
        if cond():
            return
        threading.Event().wait(0.01)
    raise AssertionError(f"never happened: {what}")


def test_the_proxy_clocks_the_time_an_episode_spends_in_model_calls(tiny):
    clock = FakeClock(10.0)
    with gated_proxy(tiny[1], clock=clock) as (proxy, scripted, gate):
        assert proxy.model_seconds("ep", 10.0) == 0.0
        proxy.open_episode("ep")
        client = openai.OpenAI(base_url=proxy.url, api_key="ep", max_retries=0, timeout=60)
        calls = [
            threading.Thread(target=client.chat.completions.create, kwargs={"model": "p", "messages": MSGS})
            for _ in range(2)
        ]
        calls[0].start()  # the first call starts at 10
        _wait_for(lambda: proxy.model_seconds("ep", 12.0) == 2.0, "the first call clocked from 10")
        clock.t = 11.0
        calls[1].start()  # a second call at 11 overlaps the first: time counts once
        _wait_for(lambda: "ep" in proxy._episodes and proxy._episodes["ep"].running == 2, "both calls in")
        assert proxy.model_seconds("ep", 13.0) == 3.0  # 10 .. 13, in calls all along
        clock.t = 15.0
        gate.set()  # both end at 15
        for c in calls:
            c.join(60)
        assert proxy.model_seconds("ep", 40.0) == 5.0  # 10 .. 15 and nothing since
        assert proxy.model_seconds("other", 40.0) == 0.0
        assert len(proxy.pop_episode("ep")) == 2
        assert proxy.model_seconds("ep", 40.0) == 0.0  # popped: forgotten


@pytest.mark.parametrize("refuse_later", [True, False])
def test_a_call_running_when_its_episode_is_popped_is_not_recorded(tiny, refuse_later):
    """An episode popped while one of its calls runs (ended by its time limit, or an agent that gave up on
    a call and returned): the call's answer and time go nowhere; an ended episode is refused from then
    on, with a 410 the client does not retry, a popped one as unknown (401)."""
    with gated_proxy(tiny[1]) as (proxy, scripted, gate):
        proxy.open_episode("ep")
        client = agent_client(proxy.url, "ep")
        kwargs = {"model": "p", "messages": MSGS}
        running = threading.Thread(target=client.chat.completions.create, kwargs=kwargs)
        running.start()
        _wait_for(lambda: len(scripted.prompts) == 1, "the call reaches the engine")
        assert proxy.pop_episode("ep", refuse_later=refuse_later) == []
        gate.set()
        running.join(60)
        assert proxy.calls("ep") == [] and proxy.model_seconds("ep", 1e9) == 0.0  # nothing left behind
        assert proxy.refused("ep") == refuse_later
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(**kwargs)
        if refuse_later:
            assert e.value.status_code == 410
            assert "episode 'ep' has ended (env.agent_timeout_s)" in str(e.value)
        else:  # popped: no longer open, so unknown
            assert e.value.status_code == 401 and "no open episode 'ep'" in str(e.value)
        assert len(scripted.prompts) == 1  # refused before the engine, and not retried
        assert proxy.calls("ep") == [] and "ep" not in proxy._episodes


def test_a_call_let_through_as_its_episode_ends_is_refused_and_leaves_nothing(tiny):
    """A call checked just before pop_episode(refuse_later=True) ended its episode reaches complete()
    after it: refused there, under the proxy's lock, rather than starting a new episode never popped."""
    with gated_proxy(tiny[1]) as (proxy, scripted, gate):
        gate.set()
        proxy.pop_episode("ep", refuse_later=True)
        with pytest.raises(EpisodeEnded):
            asyncio.run(proxy.complete("ep", "", proxy.parse({"model": "p", "messages": MSGS})))
        assert proxy.calls("ep") == [] and scripted.prompts == []
        assert "ep" not in proxy._episodes


def test_closing_the_engine_front_ends_the_batch_it_runs_before_it_returns():
    """An orphaned call (its agent timed out) may still decode when a colocated step's episodes end, and
    the trainer updates the weights it decodes with right after: close() aborts that batch at its next
    decode step and returns only once it ended; a call not started fails."""
    started, inside = threading.Event(), threading.Event()

    class Slow:
        version = 0

        def generate(self, requests, stop=None):
            inside.set()
            started.set()
            for _ in range(6000):  # a long generation (60 s at most): it ends when told to
                if stop is not None and stop():
                    break
                threading.Event().wait(0.01)
            inside.clear()
            return [GenResult(r, finish_reason="abort") for r in requests]

    front = BatchingEngine(Slow(), max_batch=1)
    running = front.submit(GenRequest([1], 8, 1.0, 1.0))
    assert started.wait(30)
    queued = front.submit(GenRequest([2], 8, 1.0, 1.0))
    closing = threading.Thread(target=front.close)
    closing.start()
    closing.join(30)
    assert not closing.is_alive(), "close() never returned: the running batch was not told to stop"
    assert not inside.is_set()  # the batch ended before close returned
    assert running.result(0).finish_reason == "abort"
    with pytest.raises(RuntimeError, match="closed before this call was generated"):
        queued.result(0)


class ModelTime:
    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def model_seconds(self, episode: str, now: float) -> float:
        return self.seconds


@pytest.mark.parametrize(
    "model_s, limit, ends",
    [(0.0, 5.0, True), (6.0, 5.0, False), (4.0, 5.0, True), (5.0, 5.0, False), (0.0, 0.0, False)],
)
def test_an_episode_is_overdue_when_its_own_time_passes_the_limit(model_s, limit, ends):
    # started at 100, now 110: own time = 10 - model_s; the limit is passed when it is strictly over
    run = overdue(ModelTime(model_s), "g1-0", 100.0, limit, 110.0)  # type: ignore[arg-type]
    if not ends:
        assert run is None
        return
    assert run is not None and run.error == TIMEOUT_ERROR and run.text == ""
    own = int(10 - model_s)
    assert run.detail == (
        f"EpisodeTimeout: the agent ran {own} s outside its model calls, over env.agent_timeout_s=5; "
        "the episode was ended and its calls so far are trained on"
    )


@pytest.mark.parametrize(
    "mode, agent, limit, reason",
    [
        ("colocated", "call_then_hang", 1, TIMEOUT_ERROR),
        ("async", "call_then_hang", 1, TIMEOUT_ERROR),
        ("colocated", "call_then_exit", 0, "SystemExit"),  # no limit: the episode must return by itself
        ("async", "call_then_exit", 0, "SystemExit"),
    ],
)
def test_a_hung_or_exiting_agent_ends_its_episode_and_the_run_goes_on(tmp_path, mode, agent, limit, reason):
    run = tmp_path / mode
    args = list(TINY)
    if mode == "async":
        args = [a for a in TINY if not a.startswith(("runtime.mode", "max_staleness"))]
        args += ["runtime.mode=async", "max_staleness=1"]
    task = f"task=agent:agents_for_tests:{agent}"
    cmd = [
        sys.executable,
        "-m",
        "streamrl.cli",
        "train",
        task,
        *args,
        f"env.agent_timeout_s={limit}",
        f"run_dir={run}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    proc = subprocess.Popen(cmd, env=env, start_new_session=True, stdout=subprocess.DEVNULL)
    try:  # a run held by its agents would never end: a limit turns that into a failure
        assert proc.wait(timeout=150) == 0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["policy_version"] for r in rows] == [1, 2]
    for r in rows:  # every episode ended after its call (or, timed out, before it if slow to start)
        assert r["episodes"] >= 4 and r["episode_errors"] == r["episodes"]
        assert r["episode_error_reasons"] == {reason: r["episodes"]}
        assert r["reward_mean"] == 0 and r["tokens_trained"] > 0  # the calls made are trained on
    if mode == "async":
        acc = json.loads((run / "accounting.json").read_text())
        assert acc["lost"] == 0 and acc["admitted"] == acc["trained"] + acc["filtered"] + acc["carried_over"]


def test_a_cancelled_call_is_not_generated_and_the_fronts_keep_serving(tiny):
    """A caller that cancels its future (the proxy's handlers at its shutdown) must not break the
    batching thread, the worker loop's drain or the fronts' close."""
    _, tok = tiny
    gate = threading.Event()
    scripted = ScriptedEngine(tok, lambda prompt: "4" if gate.wait(60) else "")
    batching = BatchingEngine(scripted)
    try:
        first = batching.submit(GenRequest([1, 2], 4, 1.0, 1.0))
        _wait_for(lambda: len(scripted.prompts) == 1, "the first request runs")
        assert not first.cancel()  # running: too late to cancel
        second = batching.submit(GenRequest([3, 4], 4, 1.0, 1.0))
        assert second.cancel()
        gate.set()
        assert first.result(60).finish_reason == "stop"
        assert batching.submit(GenRequest([5, 6], 4, 1.0, 1.0)).result(60).finish_reason == "stop"
        assert len(scripted.prompts) == 2  # the cancelled one was never generated
    finally:
        gate.set()
        batching.close()
    front = DecoderFront()
    kept, dropped, left = (front.submit(GenRequest([i], 4, 1.0, 1.0)) for i in range(3))
    assert dropped.cancel()
    taken = front.drain()
    assert [r.prompt_ids for r in taken] == [[0], [2]] and not kept.cancel()
    assert front.pending == 2
    late = front.submit(GenRequest([9], 4, 1.0, 1.0))
    assert late.cancel()
    front.close()  # fails what is open, the cancelled one included, without raising
    assert isinstance(kept.exception(1), RuntimeError) and isinstance(left.exception(1), RuntimeError)
    assert late.cancelled()
