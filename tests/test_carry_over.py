"""Carry-over accounting on the local backend: a stop keeps every admitted, untrained group, and a
resumed run trains each of them exactly once (scripted rollout workers, no model generation)."""

from __future__ import annotations

import copy
import itertools
import time

import pytest
from scripted_worker import scripted_worker  # tests/ is on sys.path (rootdir conftest)

from streamrl.config import load_config
from streamrl.loop.asynchronous import AsyncRunner
from streamrl.loop.ledger import Ledger
from streamrl.loop.signals import StopFlag
from streamrl.loop.state import RunState
from streamrl.rollout.worker import GroupResult
from streamrl.types import Group, Trajectory

ARGS = [
    "max_steps=6",
    "max_staleness=2",
    "rollout.prompts_per_step=3",
    "rollout.samples_per_prompt=2",
    "runtime.rollout_workers=2",
    "rollout.dynamic_sampling=false",  # every returned group is kept: exact counts below
]


HOLD_FROM = 12  # the scripted worker never finishes groups g12 onwards (the stop test)


def _task():
    from streamrl.data.task import default_task_args
    from streamrl.tasks import make_task

    return make_task("rg:chain_sum", default_task_args("rg:chain_sum"), "", "", "answer_is")


def _runner(tiny, state: RunState, stop: StopFlag, version: int = 0) -> AsyncRunner:
    from streamrl.trainer.trainer import Trainer

    cfg = load_config(None, ARGS)
    trainer = Trainer.from_config(copy.deepcopy(tiny[0]), cfg, pad_id=0)
    trainer.version = version
    stream = itertools.islice(_task().train_stream(0, set()), state.problems_drawn, None)
    return AsyncRunner(cfg, trainer, tiny[1], stream, state, stop, scripted_worker)


def _trained(records) -> list[str]:
    return [g.trajectories[0].group_id for r in records for g in r.groups]


def test_lost_counts_running_and_buffered_groups():
    led = Ledger()
    for gid in ("run", "buf", "done"):
        led.admitted(gid)
    led.returned("buf")
    led.returned("done")
    led.trained("done")
    assert led.counts()["lost"] == 2  # one still running, one returned but neither trained nor filtered
    assert led.carry_over() == ["run", "buf"]
    assert led.counts()["lost"] == 0 and led.counts()["carried_over"] == 2


def test_stop_carries_over_finished_and_unfinished_groups_then_resume_trains_each_once(tiny, monkeypatch):
    monkeypatch.setenv("SCRIPTED_HOLD_FROM", str(HOLD_FROM))  # these groups stay in flight until the stop
    stop = StopFlag()
    state = RunState()
    runner = _runner(tiny, state, stop)
    first: list[dict] = []

    def on_step(record):
        first.append(record)
        if record.step == 3:  # stop with finished, untrained groups waiting in the buffer
            deadline = time.monotonic() + 60
            while not buffered_and_held() and time.monotonic() < deadline:
                time.sleep(0.01)
            stop.request("test")

    def buffered_and_held() -> bool:
        """A finished group waits and a held one (never finishes) is in flight. Any in-flight group is
        not enough: g9-g11 may all return before the stop, and g12 may not be admitted yet."""
        with runner.sh.cond:
            held = [g for g in runner.sh.inflight if int(g.lstrip("g")) >= HOLD_FROM]
            return bool(runner.sh.buffer) and bool(held)

    runner.run(on_step)
    c = runner.ledger.counts()
    trained = _trained(first)
    finished = [r.group_id for r in state.finished]
    unfinished = [r.group_id for r in state.unfinished]
    assert len(trained) == len(set(trained)) == c["trained"] == 9
    assert finished, "the buffer held finished groups at the stop: they must be in the state"
    assert unfinished, "requests were in flight at the stop: they must be in the state"
    assert all(len(r.group.trajectories) == 2 for r in state.finished)
    # each returned group counted once: trained, filtered, or carried over as finished
    assert c["generated"] == c["trained"] + c["filtered"] + len(finished)
    carried = {g for g, s in runner.ledger.state.items() if s == "carried_over"}
    assert carried == set(finished) | set(unfinished) and len(carried) == c["carried_over"]
    assert carried.isdisjoint(trained) and c["lost"] == 0
    assert c["admitted"] == c["trained"] + c["filtered"] + c["carried_over"] == state.groups_made

    monkeypatch.delenv("SCRIPTED_HOLD_FROM")
    resumed_state = copy.deepcopy(state)  # what save_state/load_state round-trip
    second: list[dict] = []
    runner2 = _runner(tiny, resumed_state, StopFlag(), version=state.version)
    runner2.run(second.append)
    again = _trained(second)
    assert [r.step for r in second] == [4, 5, 6]
    c2 = runner2.ledger.counts()
    # finished groups come first: trained, or filtered if the resumed version left them too stale
    assert all(runner2.ledger.state[g] in ("trained", "filtered") for g in finished)
    kept = [g for g in finished if runner2.ledger.state[g] == "trained"]
    assert again[: len(kept)] == kept
    everything = trained + again
    assert len(everything) == len(set(everything)) == 18  # no group trained twice, none lost
    assert c2["lost"] == 0 and c2["trained"] == 18
    assert c2["admitted"] == c2["trained"] + c2["filtered"] + c2["carried_over"] == resumed_state.groups_made


def test_a_rollout_error_after_the_last_batch_is_printed_once(tiny, capsys):
    """A worker's failure that arrives after the trainer took its last batch (here: during a stop)
    ends no step, so nothing raises it: it is printed at the end of the run, not dropped."""
    stop = StopFlag()
    state = RunState()
    runner = _runner(tiny, state, stop)

    def on_step(record):
        with runner.sh.cond:
            runner.sh.errors.append("rollout worker 1 failed:\nValueError: boom")
        stop.request("test")

    runner.run(on_step)
    err = capsys.readouterr().err
    assert state.step == 1
    assert err.count("ValueError: boom") == 1
    assert "streamrl: warning: at the end of the run, rollout worker 1 failed:" in err


def test_a_rollout_error_that_ends_the_run_is_raised_and_not_printed_again(tiny, capsys):
    state = RunState()
    runner = _runner(tiny, state, StopFlag())

    def on_step(record):
        with runner.sh.cond:
            runner.sh.errors.append("rollout worker 0 failed:\nValueError: boom")

    with pytest.raises(RuntimeError, match="^rollout worker 0 failed:\nValueError: boom$"):
        runner.run(on_step)
    assert state.step == 1
    assert "boom" not in capsys.readouterr().err


def test_an_admission_thread_that_outlives_the_stop_draws_nothing_after_the_carry_over(tiny):
    """close() joins the admission thread with a timeout: if it is still alive (a hung worker being
    killed), a problem it drew after the carry-over would advance the saved sampler, recorded nowhere."""
    state = RunState()
    runner = _runner(tiny, state, StopFlag())
    runner._carry_over([])  # as close() does once the workers stopped
    # one admission allowed, then the thread is told to stop
    runner.staleness.try_admit = lambda: runner.admission.stop(timeout=0) or True
    runner.admission.run()
    assert state.problems_drawn == 0 and state.groups_made == 0 and not runner.sh.inflight
    assert runner.ledger.counts()["admitted"] == 0 and not runner.sh.errors


def test_duplicate_result_is_dropped(tiny):
    """A group's second result (regenerated after its worker died, the first copy arrived too) is dropped."""
    runner = _runner(tiny, RunState(), StopFlag())
    req = runner.admission.next_request()
    runner.sh.inflight[req.group_id] = req
    assert runner.staleness.try_admit()
    traj = Trajectory(
        problem_id=req.problem.id,
        group_id=req.group_id,
        sample_id=f"{req.group_id}-0",
        prompt_ids=req.prompt_ids,
        completion_ids=[5],
        behaviour_logprobs=[-1.0],
        versions=[0],
        finish_reason="stop",
        reward=1.0,
    )
    runner.admission.accept(GroupResult(req.group_id, Group(req.problem, [traj]), 0))
    runner.admission.accept(GroupResult(req.group_id, Group(req.problem, [traj]), 1))
    assert len(runner.sh.buffer) == 1 and runner.sh.duplicates == 1
    assert runner.ledger.counts()["generated"] == 1
