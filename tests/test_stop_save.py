"""A run saves each step's state once, however it ends: a step the loop ends after (max_steps, max_time,
Ctrl-C or SIGTERM) on a train.save_every step is saved by the final save that follows the loop, not by a
periodic save as well; a stop during a periodic save keeps it. A stop saves as soon as the loop ends,
before the rollout workers are stopped, and again (the same state directory) only if their stop
brought something new."""

from __future__ import annotations

import copy
import json
import os
import shutil
import signal
import threading
import time
import types

import pytest
from tiny_args import TINY

from streamrl.cli import main
from streamrl.loop import budget, job
from streamrl.loop.budget import RunBudget
from streamrl.loop.ledger import Ledger
from streamrl.loop.run_dir import PeriodicSaver, StopSaver
from streamrl.loop.signals import StopFlag
from streamrl.loop.state import RunState, StateSaveError, load_state, same_save
from streamrl.rollout.worker import GroupRequest, GroupResult


def _count_saves(monkeypatch, during=None) -> list[int]:
    """The steps job.save_state writes, in order; `during(step)` runs inside each save."""
    real_save, saved = job.save_state, []

    def save_state(run_dir, snapshot, *args, **kw):
        saved.append(snapshot.step)
        if during is not None:
            during(snapshot.step)
        return real_save(run_dir, snapshot, *args, **kw)

    monkeypatch.setattr(job, "save_state", save_state)
    return saved


def _states(run) -> list[str]:
    return sorted(p.name for p in (run / "state").iterdir())


def test_a_stop_on_a_save_every_step_saves_the_state_once(tmp_path, monkeypatch) -> None:
    saved = _count_saves(monkeypatch)

    def periodic_eval(*args, **kw):  # step 2's evaluation: a real SIGINT, taken by the run's handler
        os.kill(os.getpid(), signal.SIGINT)
        return {}

    monkeypatch.setattr(job, "periodic_eval", periodic_eval)
    run = tmp_path / "run"
    args = ["max_steps=6", "train.save_every=2", "eval.every=2", "eval.after=false", f"run_dir={run}"]
    assert main(["train", *TINY, *args]) == 0
    # as the loop ended, and again if the workers' stop brought groups back: one state directory
    assert saved[0] == 2 and set(saved) == {2} and len(saved) <= 2
    assert _states(run) == ["step-000002"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] and summary["timings"]["periodic_saves"] == 0.0  # the final save's


@pytest.mark.parametrize("mode", [["runtime.mode=colocated", "max_staleness=0"], ["runtime.mode=async"]])
def test_a_run_max_time_ends_on_a_save_every_step_saves_it_once(tmp_path, monkeypatch, mode) -> None:
    saved = _count_saves(monkeypatch)
    clock = [0.0]  # seconds the run's time budget is pushed on by
    monkeypatch.setattr(
        budget, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + clock[0])
    )

    def periodic_eval(*args, **kw):  # step 2's evaluation: max_time is spent by the end of step 3
        clock[0] = 1e6
        return {}

    monkeypatch.setattr(job, "periodic_eval", periodic_eval)
    run = tmp_path / "run"
    args = ["max_steps=6", "max_time=1000", "train.save_every=3", "eval.every=2", "eval.after=false"]
    assert main(["train", *TINY, *mode, *args, f"run_dir={run}"]) == 0
    assert saved == [3]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and not summary["interrupted"]
    assert summary["timings"]["periodic_saves"] == 0.0  # the final save wrote it, not a periodic one
    assert _states(run) == ["step-000003"]


def test_max_time_spent_during_a_save_every_steps_evaluation_saves_each_step_once(
    tmp_path, monkeypatch
) -> None:
    saved = _count_saves(monkeypatch)
    clock = [0.0]
    monkeypatch.setattr(
        budget, "time", types.SimpleNamespace(perf_counter=lambda: time.perf_counter() + clock[0])
    )

    def periodic_eval(*args, **kw):  # step 3's evaluation: max_time is spent after step 3 was done
        clock[0] = 1e6
        return {}

    monkeypatch.setattr(job, "periodic_eval", periodic_eval)
    run = tmp_path / "run"
    args = ["runtime.mode=colocated", "max_staleness=0", "max_steps=6", "max_time=1000", "train.save_every=3"]
    assert main(["train", *TINY, *args, "eval.every=3", "eval.after=false", f"run_dir={run}"]) == 0
    # step 3 is saved periodically, as its record said the run goes on; step 4 is the last
    assert saved == [3, 4]
    assert _states(run) == ["step-000003", "step-000004"]


def test_a_run_max_steps_ends_on_a_save_every_step_saves_each_step_once(tmp_path, monkeypatch) -> None:
    saved = _count_saves(monkeypatch)
    run = tmp_path / "run"
    args = [
        "runtime.mode=colocated",
        "max_staleness=0",
        "max_steps=4",
        "train.save_every=2",
        "eval.after=false",
    ]
    assert main(["train", *TINY, *args, f"run_dir={run}"]) == 0
    assert saved == [2, 4]
    assert _states(run) == ["step-000002", "step-000004"]


def test_a_stop_during_a_periodic_save_keeps_that_save(tmp_path, monkeypatch) -> None:
    def during(step: int) -> None:  # a SIGTERM while step 2's state is written: the loop ends after it
        if step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

    saved = _count_saves(monkeypatch, during)
    run = tmp_path / "run"
    args = [
        "runtime.mode=colocated",
        "max_staleness=0",
        "max_steps=6",
        "train.save_every=2",
        "eval.after=false",
    ]
    assert main(["train", *TINY, *args, f"run_dir={run}"]) == 0
    assert saved == [2]
    assert _states(run) == ["step-000002"]
    assert json.loads((run / "summary.json").read_text())["interrupted"]


def test_an_async_stop_during_a_periodic_save_keeps_what_came_back_after_it(tmp_path, monkeypatch) -> None:
    """Async: a SIGTERM while step 2's periodic state is written ends the loop after it; the groups that
    come back meanwhile and during the workers' stop are not thrown away: step 2 is written again with
    them, and the state, accounting.json and the summary count the same groups."""
    from streamrl.loop.admission import Admission

    saving = threading.Event()  # step 2's state was taken (before its save began): the save is under way
    came_back = threading.Event()  # a group the workers sent after that snapshot was taken up
    real_accept = Admission.accept

    def accept(self, res: GroupResult) -> None:
        after = saving.is_set()
        real_accept(self, res)
        if after and not res.error:  # a generated group (error is "" then)
            came_back.set()

    def during(step: int) -> None:
        if step == 2 and not saving.is_set():
            saving.set()
            os.kill(os.getpid(), signal.SIGTERM)
            # the workers go on: a group comes back during the save, if one was in flight or the
            # staleness bound lets one be admitted (neither is certain: then none comes back)
            came_back.wait(5)

    monkeypatch.setattr(Admission, "accept", accept)
    saved = _count_saves(monkeypatch, during)
    run = tmp_path / "run"
    args = ["runtime.mode=async", "max_steps=6", "train.save_every=2", "eval.after=false"]
    assert main(["train", *TINY, *args, f"run_dir={run}"]) == 0
    assert _states(run) == ["step-000002"]
    # the periodic save stands for the stop's; the save after the workers' stop adds what came back
    # during the save (and during their stop, which may bring groups back as well)
    assert saved == [2, 2] if came_back.is_set() else saved in ([2], [2, 2])
    state = load_state(run)[0]
    counts = Ledger.from_state_dict(state.ledger).counts()
    summary = json.loads((run / "summary.json").read_text())
    on_disk = json.loads((run / "accounting.json").read_text())
    assert counts["generated"] == summary["accounting"]["generated"] == on_disk["generated"]
    carried = [r.group_id for r in state.finished] + [q.group_id for q in state.unfinished]
    assert counts["lost"] == 0 and counts["carried_over"] == len(carried) == len(set(carried))


def test_max_times_verdict_after_a_step_holds_through_its_save(monkeypatch) -> None:
    now = [0.0]
    monkeypatch.setattr(budget, "time", types.SimpleNamespace(perf_counter=lambda: now[0]))
    b = RunBudget(max_steps=10, max_time=5.0, stop=StopFlag())
    assert b.more(1)  # step 1 done at t=0: the run goes on
    now[0] = 6.0  # its periodic save took the run past max_time
    assert b.more(1)  # the loop still starts step 2, as step 1's record said
    assert not b.more(2)  # step 2 done past max_time: the run ends
    now[0] = 0.0
    assert not b.more(2)
    assert not RunBudget(max_steps=2, max_time=0.0, stop=StopFlag()).more(2)  # max_time=0: no limit
    assert RunBudget(max_steps=3, max_time=0.0, stop=StopFlag()).more(2)


def test_a_stop_after_a_periodic_save_saves_the_step_again_with_what_arrived(tmp_path, monkeypatch) -> None:
    """Async: a Ctrl-C while the trainer waits for step 2's batch, after step 1's periodic save, ends the
    loop without a new step; the stop's save writes step 1 again, with the groups that came back since
    (the periodic save cannot hold them), and a resume continues from it."""
    from streamrl.loop import asynchronous

    saved = _count_saves(monkeypatch)
    real_take, calls = asynchronous.AsyncRunner._take_batch, []

    def take(self):
        calls.append(1)
        if len(calls) == 2:  # step 1 is trained, logged and saved: the stop comes while step 2 waits
            os.kill(os.getpid(), signal.SIGINT)
        return real_take(self)

    monkeypatch.setattr(asynchronous.AsyncRunner, "_take_batch", take)
    run = tmp_path / "run"
    args = ["runtime.mode=async", "max_steps=4", "train.save_every=1", "eval.after=false"]
    assert main(["train", *TINY, *args, f"run_dir={run}"]) == 0
    assert saved[:2] == [1, 1] and set(saved) == {1} and len(saved) <= 3
    assert _states(run) == ["step-000001"]
    assert json.loads((run / "summary.json").read_text())["interrupted"]


def test_the_saver_names_the_step_whose_save_a_stop_came_during() -> None:
    """Only a save that a stop came during (or before the saver asked) is the step's last: a step not
    due for one, or a save before any stop, names nothing."""
    from streamrl.loop.run_dir import PeriodicSaver
    from streamrl.loop.state import RunState

    stop: list[str] = []

    def save() -> RunState:
        if during:
            stop.append("SIGTERM")
        return RunState()

    during = False
    saver = PeriodicSaver(2, 0.0, save, lambda: bool(stop))
    assert not saver.after_step(1) and saver.after_step(2) and saver.stopped_in_save is None
    during = True
    assert not saver.after_step(3) and saver.stopped_in_save is None  # not due: no save, no stop
    assert saver.after_step(4) and saver.stopped_in_save == 4
    assert saver.count == 2
    late = PeriodicSaver(2, 0.0, RunState, lambda: True)  # a stop with no save at the step
    assert not late.after_step(1) and late.stopped_in_save is None


def _lines(path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()]


def test_a_stop_saves_the_state_before_the_rollout_workers_are_stopped(tmp_path, monkeypatch) -> None:
    """Async: a stop after step 2 saves step 2, the groups buffered or in flight carried over, before the
    workers' stop, which may take longer than a container runtime waits before its SIGKILL. The run
    directory as it stands when that stop begins (what such a kill leaves) resumes, and trains every
    step and every group once."""
    from interrupt import stop_after

    from streamrl.placement.backend import LocalRollouts

    run, killed = tmp_path / "run", tmp_path / "killed"
    real_stop = LocalRollouts.stop

    def stop(self):
        if not killed.exists():
            shutil.copytree(run, killed, ignore=shutil.ignore_patterns(".lock"))
        return real_stop(self)

    monkeypatch.setattr(LocalRollouts, "stop", stop)
    stop_after(monkeypatch, 2)
    args = ["runtime.mode=async", "max_steps=4", "train.save_every=0", "eval.after=false"]
    assert main(["train", *TINY, *args, f"run_dir={run}"]) == 0
    monkeypatch.undo()
    assert _states(killed) == ["step-000002"] and _states(run) == ["step-000002"]
    state = load_state(killed)[0]
    counts = Ledger.from_state_dict(state.ledger).counts()
    carried = [r.group_id for r in state.finished] + [q.group_id for q in state.unfinished]
    assert counts["lost"] == 0 and counts["trained"] == 4 and counts["carried_over"] == len(carried)
    assert counts["admitted"] == 4 + counts["filtered"] + len(carried) == state.groups_made
    assert main(["train", f"resume={killed}"]) == 0
    trained = [g["group_id"] for g in _lines(killed / "groups.jsonl")]
    assert [r["step"] for r in _lines(killed / "metrics.jsonl")] == [1, 2, 3, 4]
    assert len(trained) == len(set(trained)) == 8
    acc = json.loads((killed / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == 8


@pytest.mark.parametrize("mode", [["runtime.mode=colocated", "max_staleness=0"], ["runtime.mode=async"]])
def test_a_stop_during_the_base_evaluation_saves_step_zero_once(tmp_path, monkeypatch, mode) -> None:
    """A stop before the first step (here during the base model's evaluation) saves step 0 once: the
    workers' stop that follows brings nothing back, as nothing was admitted, so it adds nothing."""
    saved = _count_saves(monkeypatch)
    real_evaluate = job.evaluate

    def evaluate(*args, **kw):  # the base evaluation: a real SIGINT, taken by the run's handler
        os.kill(os.getpid(), signal.SIGINT)
        return real_evaluate(*args, **kw)

    monkeypatch.setattr(job, "evaluate", evaluate)
    run = tmp_path / "run"
    args = ["max_steps=3", "eval.before=true", "eval.after=false"]
    assert main(["train", *TINY, *mode, *args, f"run_dir={run}"]) == 0
    assert saved == [0] and _states(run) == ["step-000000"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["interrupted"] and summary["steps"] == 0
    assert summary["accounting"]["admitted"] == 0


def _request(gid: str) -> GroupRequest:
    return GroupRequest(gid, None, [1], 2, 0)  # type: ignore[arg-type]


def test_a_stops_second_save_is_made_only_if_the_workers_stop_changed_the_state() -> None:
    """Compared by what is saved: the groups carried over (by id), the ledger, the data position; not the
    clock and the replay buffer, which the job's save sets from the same values both times."""
    early = RunState(step=2, ledger={"state": {"g4": "carried_over"}}, unfinished=[_request("g4")])
    same = copy.deepcopy(early)
    same.clock, same.replay = {"time": 5.0}, [1]
    assert same_save(early, same)
    came_back = copy.deepcopy(early)
    came_back.unfinished, came_back.finished = [], [GroupResult("g4", None, 0)]
    assert not same_save(early, came_back)
    admitted = copy.deepcopy(early)
    admitted.unfinished.append(_request("g5"))
    assert not same_save(early, admitted)
    drawn = copy.deepcopy(early)
    drawn.sampler = {"drawn": 1}
    assert not same_save(early, drawn)

    written: list[int] = []
    saver = StopSaver(lambda s: written.append(s.step) or s, PeriodicSaver(0, 0.0, RunState, lambda: True))
    assert saver.needed(early)  # no stop's save: the save after the loop is the only one
    saver(early)
    assert written == [2] and not saver.needed(same) and saver.needed(came_back)


def test_a_stop_during_a_periodic_save_is_not_saved_again_as_the_loop_ends() -> None:
    """That save stands for the stop's: the save after the workers' stop compares with what it wrote."""
    periodic = PeriodicSaver(2, 0.0, lambda: RunState(step=2, groups_made=4), lambda: True)
    assert periodic.after_step(2) and periodic.stopped_in_save == 2
    written: list[int] = []
    saver = StopSaver(lambda s: written.append(s.step) or s, periodic)
    saver(RunState(step=2, groups_made=4))
    assert written == [] and saver.saved is periodic.stopped_state
    assert not saver.needed(RunState(step=2, groups_made=4))
    assert saver.needed(RunState(step=2, groups_made=6))  # admitted after the periodic save's snapshot
    saver(RunState(step=3))  # a later step: not the periodic save's
    assert written == [3]


def test_a_stops_save_that_could_not_be_written_is_not_tried_again() -> None:
    """A full disk fails the stop's save (StateSaveError, raised): the save after the loop would fail the
    same way, so it is not made; any other error leaves the later save to try."""

    def full(state: RunState) -> RunState:
        raise StateSaveError("no space left on device")

    saver = StopSaver(full, PeriodicSaver(0, 0.0, RunState, lambda: True))
    with pytest.raises(StateSaveError):
        saver(RunState(step=2))
    assert saver.failed and not saver.needed(RunState(step=2))

    def broken(state: RunState) -> RunState:
        raise OSError("the mount went away")

    other = StopSaver(broken, PeriodicSaver(0, 0.0, RunState, lambda: True))
    with pytest.raises(OSError):
        other(RunState(step=2))
    assert other.needed(RunState(step=2))
