"""Carry-over accounting on the local backend: a stop keeps every admitted, untrained group, and a
resumed run trains each of them exactly once (scripted rollout workers, no model generation)."""

from __future__ import annotations

import copy
import itertools
import time
from types import SimpleNamespace

import pytest
from scripted_worker import scripted_worker  # tests/ is on sys.path (rootdir conftest)

from streamrl.config import load_config
from streamrl.loop.asynchronous import AsyncRunner
from streamrl.loop.episode_errors import EpisodeErrors
from streamrl.loop.ledger import Ledger
from streamrl.loop.signals import StopFlag
from streamrl.loop.state import RunState, carried_mismatch
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


def _runner(
    tiny, state: RunState, stop: StopFlag, version: int = 0, extra: tuple[str, ...] = ()
) -> AsyncRunner:
    from streamrl.trainer.trainer import Trainer

    cfg = load_config(None, [*ARGS, *extra])
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
    reached: list[tuple[list[str], list[str]]] = []  # (in flight, buffered) when the stop was requested

    def on_step(record):
        first.append(record)
        if record.step == 3:  # stop with finished, untrained groups waiting in the buffer
            deadline = time.monotonic() + 60
            while not buffered_and_held() and time.monotonic() < deadline:  # a limit against a hang
                time.sleep(0.01)
            with runner.sh.cond:
                reached.append((list(runner.sh.inflight), [r.group_id for r in runner.sh.buffer]))
            stop.request("test")

    def buffered_and_held() -> bool:
        """A finished group waits and a held one (never finishes) is in flight. Any in-flight group is
        not enough: g9-g11 may all return before the stop, and g12 may not be admitted yet."""
        with runner.sh.cond:
            held = [g for g in runner.sh.inflight if int(g.lstrip("g")) >= HOLD_FROM]
            return bool(runner.sh.buffer) and bool(held)

    runner.run(on_step)
    [(inflight, buffered)] = reached
    assert buffered and any(int(g.lstrip("g")) >= HOLD_FROM for g in inflight), reached
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
    assert c2["regenerated"] == len(unfinished)  # each group in flight at the stop generated again, once
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


def _response(req) -> Trajectory:
    """The one response of `req`'s group: token 5, generated by version 0, rewarded 1.0."""
    return Trajectory(
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


def test_duplicate_result_is_dropped(tiny):
    """A group's second result (regenerated after its worker died, the first copy arrived too) is dropped."""
    runner = _runner(tiny, RunState(), StopFlag())
    req = runner.admission.next_request()
    runner.sh.inflight[req.group_id] = req
    assert runner.staleness.try_admit()
    traj = _response(req)
    runner.admission.accept(GroupResult(req.group_id, Group(req.problem, [traj]), 0))
    runner.admission.accept(GroupResult(req.group_id, Group(req.problem, [traj]), 1))
    assert len(runner.sh.buffer) == 1 and runner.sh.duplicates == 1
    assert runner.ledger.counts()["generated"] == 1


def _returned(req, logprobs: list[float] | None) -> GroupResult:
    """`req`'s group back from a worker: one response, its log-probs `logprobs`, one episode error."""
    traj = _response(req)
    traj.behaviour_logprobs = logprobs  # type: ignore[assignment]  # None: what the draft store cannot keep
    group = Group(req.problem, [traj], episode_errors=["TimeoutError"], episode_error_details=["slow"])
    return GroupResult(req.group_id, group, 0)


def test_a_group_whose_bookkeeping_fails_stays_in_flight_and_is_carried_over(tiny):
    """A returned group the draft store cannot keep (a response without log-probs) leaves the requests
    in flight only once all of its bookkeeping succeeded: the error is raised, the group is neither
    counted nor returned in the ledger, and the carry-over keeps it for the resume to generate again."""
    runner = _runner(tiny, RunState(), StopFlag(), extra=("rollout.spec_drafts=2",))
    req = runner.admission.next_request()
    runner.sh.inflight[req.group_id] = req
    assert runner.staleness.try_admit()
    with pytest.raises(TypeError):
        runner.admission.accept(_returned(req, None))
    assert list(runner.sh.inflight) == [req.group_id] and not runner.sh.buffer
    assert runner.ledger.state == {req.group_id: "running"} and runner.ledger.generated == 0
    assert runner.episode_errors.pending() == {} and runner.drafts.state_dict() == []
    runner._carry_over([])  # as close() does
    assert [r.group_id for r in runner.state.unfinished] == [req.group_id]
    assert runner.ledger.counts()["carried_over"] == 1 and carried_mismatch(runner.state) is None
    # the same group generated again, with its log-probs: taken in, counted once
    runner2 = _runner(tiny, runner.state, StopFlag(), extra=("rollout.spec_drafts=2",))
    again = runner2.admission.next_request()
    runner2.sh.inflight[again.group_id] = again
    assert runner2.staleness.try_admit()
    runner2.admission.accept(_returned(again, [-1.0]))
    assert runner2.episode_errors.pending() == {
        "episodes": 1,
        "reasons": {"TimeoutError": 1},
        "examples": {"TimeoutError": "slow"},
    }
    assert [r.group_id for r in runner2.sh.buffer] == [req.group_id] and not runner2.sh.inflight


def test_an_admission_failure_reaches_the_trainer_with_the_group_still_in_flight(tiny):
    """The admission thread that fails on a result ends with the error for the trainer, not silently."""
    runner = _runner(tiny, RunState(), StopFlag(), extra=("rollout.spec_drafts=2",))
    req = runner.admission.next_request()
    runner.sh.inflight[req.group_id] = req
    assert runner.staleness.try_admit()
    runner.staleness.try_admit = lambda: False  # type: ignore[method-assign]  # nothing more drawn
    runner.parts.backend.poll = lambda timeout: [_returned(req, None)]  # type: ignore[method-assign]
    runner.admission.run()
    assert len(runner.sh.errors) == 1
    assert runner.sh.errors[0].startswith("rollout admission failed: TypeError: ")
    assert list(runner.sh.inflight) == [req.group_id]


def test_episode_counts_are_all_or_nothing():
    class Unprintable:
        def __str__(self) -> str:
            raise ValueError("no text")

    errors = EpisodeErrors(True, {"episodes": 2, "reasons": {"KeyError": 1}, "examples": {"KeyError": "k"}})
    before = errors.pending()
    group = SimpleNamespace(episode_errors=["", "TimeoutError"], episode_error_details=["", Unprintable()])
    with pytest.raises(ValueError, match="^no text$"):
        errors.add(group)  # type: ignore[arg-type]
    assert errors.pending() == before


def test_a_failure_before_the_loop_carries_over_what_the_admission_thread_drew(tiny):
    """Anything that raises once the admission thread draws (here the trainer's core boundaries) stops
    the thread and carries over what it drew: the state's stream position is past those draws, so a
    group drawn and carried over nowhere would be a problem the resume skips."""
    state = RunState()
    runner = _runner(tiny, state, StopFlag())
    runner.threads = SimpleNamespace(work=lambda: None, wait=lambda: None, own=lambda: None)

    def set_boundary(fn) -> None:
        deadline = time.monotonic() + 60
        while fn is not None and state.groups_made < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        if fn is not None:
            raise RuntimeError("no boundaries")

    runner.trainer.set_boundary = set_boundary  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match="^no boundaries$"):
        runner.run(lambda rec: None)
    assert not runner.admission._thread.is_alive()  # type: ignore[union-attr]
    assert state.groups_made >= 2 and state.problems_drawn == state.groups_made
    held = sorted(r.group_id for r in [*state.finished, *state.unfinished])
    assert held == sorted(f"g{i}" for i in range(state.groups_made))
    assert carried_mismatch(state) is None


def test_a_state_that_would_lose_groups_says_which(tmp_path, capsys):
    """The groups a state's ledger carries over are the ones it holds: a save that breaks it says so."""
    from streamrl.loop.state import latest_state, save_state

    state = RunState(step=4, ledger={"state": {"g1": "carried_over", "g2": "carried_over", "g3": "trained"}})
    state.unfinished = [SimpleNamespace(group_id="g2"), SimpleNamespace(group_id="g9")]
    said = (
        "the state of step 4 carries over 1 group(s) (g1) neither finished nor unfinished: a resume never "
        "makes them; it holds 1 group(s) (g9), which its ledger does not carry over"
    )
    assert carried_mismatch(state) == said
    trainer = SimpleNamespace(
        save=lambda d, tokenizer: None, optimizer_state=dict, scheduler=SimpleNamespace(state_dict=dict)
    )
    save_state(tmp_path, state, trainer, None)  # saved even so: the newest state there is
    assert capsys.readouterr().err == f"streamrl: warning: {said}\n"
    assert latest_state(tmp_path).name == "step-000004"  # type: ignore[union-attr]
    state.finished, state.unfinished = [SimpleNamespace(group_id="g1")], [SimpleNamespace(group_id="g2")]
    assert carried_mismatch(state) is None


def test_a_resumed_state_that_does_not_add_up_counts_its_lost_groups_and_trains_nothing_twice():
    """A state an older version saved wrong: a group its ledger carries over and it does not hold is
    counted lost (no resume can make it), one it holds that was trained is not trained again, one the
    ledger never saw is carried over; the state then adds up, so later saves say nothing."""
    from streamrl.loop.state import reconcile_carried

    ledger = {"state": {"g1": "carried_over", "g2": "carried_over", "g3": "trained"}, "generated": 2}
    state = RunState(step=4, ledger={**ledger, "filter_reasons": {}})
    state.finished = [SimpleNamespace(group_id="g3")]
    state.unfinished = [SimpleNamespace(group_id="g2"), SimpleNamespace(group_id="g9")]
    said = reconcile_carried(state)
    assert said == (
        "the state of step 4 carries over 1 group(s) (g1) neither finished nor unfinished: a resume never "
        "makes them; it holds 2 group(s) (g3, g9), which its ledger does not carry over. Resumed with 1 "
        "group(s) (g1) counted lost and 1 group(s) (g3) already trained or filtered, not taken up again"
    )
    carried = {"g2": "carried_over", "g9": "carried_over"}
    assert state.ledger["state"] == {"g1": "lost", "g3": "trained", **carried}
    assert state.finished == [] and [r.group_id for r in state.unfinished] == ["g2", "g9"]
    assert carried_mismatch(state) is None and reconcile_carried(state) is None
    counts = Ledger.from_state_dict(state.ledger).counts()
    assert (counts["lost"], counts["carried_over"], counts["trained"]) == (1, 2, 1)
    # held twice (or held, and running in its ledger: an older version's state) -> carried over once
    state = RunState(step=5, ledger={"state": {"g4": "carried_over", "g5": "running"}, "generated": 1})
    state.finished = [SimpleNamespace(group_id="g4", at="finished")]
    state.unfinished = [SimpleNamespace(group_id="g4", at="unfinished"), SimpleNamespace(group_id="g5")]
    assert reconcile_carried(state) == (
        "the state of step 5 holds 1 group(s) (g5), which its ledger does not carry over; it holds 1 "
        "group(s) (g4) twice. Resumed with each group it holds carried over once"
    )
    assert [(r.group_id, r.at) for r in state.finished] == [("g4", "finished")]
    assert [r.group_id for r in state.unfinished] == ["g5"]
    assert state.ledger["state"] == {"g4": "carried_over", "g5": "carried_over"}


def test_a_resume_of_a_state_that_lost_a_group_says_so_once_and_counts_it(tmp_path, capsys):
    import json

    from tiny_args import TINY

    from streamrl.cli import main

    run = tmp_path / "run"
    assert main(["train", *TINY, "max_steps=2", "eval.after=false", f"run_dir={run}"]) == 0
    meta = run / "state" / "step-000002" / "run_state.json"
    d = json.loads(meta.read_text())
    d["ledger"]["state"]["g999"] = "carried_over"  # carried over, held nowhere
    meta.write_text(json.dumps(d))
    capsys.readouterr()
    assert main(["train", f"resume={run}", "max_steps=3", "train.save_every=1"]) == 0
    err = capsys.readouterr().err
    assert err.count("warning: the state of step") == 1 and "1 group(s) (g999) counted lost" in err
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 1 and acc["admitted"] == acc["trained"] + acc["filtered"] + acc["carried_over"] + 1
