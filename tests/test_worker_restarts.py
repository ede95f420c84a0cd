"""The local backend supervises its rollout worker processes: a worker killed (kill -9) or silent (kill
-STOP) is restarted and its groups go to the new process; when restarts run out the run stops cleanly.
Scripted workers (no model) keep it fast; the ledger proves nothing was lost or trained twice."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
from scripted_runs import BASE, _balanced, _runner  # tests/ is on sys.path (rootdir conftest)
from scripted_worker import scripted_worker

from streamrl.config import load_config
from streamrl.loop.asynchronous import AsyncRunner
from streamrl.loop.state import RunState
from streamrl.placement import backend as backend_mod
from streamrl.placement.backend import RolloutFailure


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSTOP, "hang"], ids=["kill", "stop", "deadlock"])
def test_a_dead_or_silent_worker_is_restarted_and_its_groups_reassigned(
    tiny, sig, capfd, tmp_path, monkeypatch
):
    """kill -9; kill -STOP (the whole process frozen); a deadlocked loop in a live process."""
    hold, hang = tmp_path / "hold", tmp_path / "hang"
    monkeypatch.setenv("SCRIPTED_HOLD_FILE", str(hold))
    monkeypatch.setenv("SCRIPTED_HANG_FILE", str(hang))
    runner, state = _runner(tiny, ["runtime.worker_timeout_s=3"])
    records: list = []
    held: set[str] = set()

    def wait(cond, what):
        deadline = time.monotonic() + 120  # a limit against a hang, not a speed check
        while not cond():
            assert time.monotonic() < deadline, what
            time.sleep(0.05)

    def on_step(rec):
        records.append(rec)
        if rec.step == 1:
            if runner.threads is not None:  # waiting for the workers below, the trainer lends its
                runner.threads.wait()  # threads, as it does waiting for a batch
            hold.touch()  # worker 0 keeps what it holds until it is killed
            w0 = runner.backend.workers[0]
            wait(lambda: w0.held and w0.heartbeat.value, "worker 0 never started and held a group")
            held.update(runner.backend.workers[0].held)
            if sig == "hang":
                hang.touch()
            else:
                os.kill(runner.backend.workers[0].proc.pid, sig)
            wait(lambda: runner.backend.restarts >= 1, "the worker was never restarted")
            hang.unlink(missing_ok=True)
            hold.unlink()
            wait(lambda: not held & set(runner.sh.inflight), "its groups never came back")

    runner.run(on_step)
    assert [r.step for r in records] == list(range(1, 7))
    assert records[-1].metrics["worker_restarts"] == 1
    assert state.counters["worker_restarts"] == 1  # what a resume continues from
    c = _balanced(runner, state, records)
    assert c["trained"] == 18
    trained = {g.trajectories[0].group_id for r in records for g in r.groups}
    returned = trained | {r.group_id for r in state.finished}
    assert held and held <= returned, {g: runner.ledger.state[g] for g in held}  # none lost or redone
    how = "killed by SIGKILL" if sig == signal.SIGKILL else "silent for"
    [event] = runner.backend.events
    assert event.startswith(f"rollout worker 0 {how}") and "restarted (1 of 3)" in event
    assert f"streamrl: {event}" in capfd.readouterr().err  # one line, as it happened


def test_a_resumed_run_counts_the_restarts_and_resent_groups_from_before_the_resume(tiny):
    """The step records' event counters count the whole run: a resume continues them from the state."""
    before = {"worker_restarts": 2, "groups_resent": 5, "duplicate_results": 1}
    runner, state = _runner(tiny, ["max_steps=2"], RunState(counters=dict(before)))
    records: list = []
    runner.run(records.append)
    assert [{k: r.metrics[k] for k in before} for r in records] == [before, before]
    assert state.counters == before
    assert runner.snapshot().counters == before
    stopped, state = _runner(tiny, ["max_steps=1"], RunState(counters=dict(before)))
    stopped.close()  # a resume that stops before its first step (a final evaluation to finish, say)
    assert state.counters == before


def test_the_counters_a_stop_saves_count_the_restarts_since_the_last_step() -> None:
    """At a stop the backend is asked again (a restart after the last step counts); if it cannot
    answer, the last step's figures are saved."""
    import types

    from streamrl.loop.shared import RunCounters

    counters = RunCounters({"worker_restarts": 2, "groups_resent": 1})
    assert counters.step({"worker_restarts": 1, "cores_total": 2}, 0, 3) == {
        "worker_restarts": 3,
        "cores_total": 2,
        "groups_resent": 4,
        "duplicate_results": 0,
    }

    def broken():
        raise OSError("closed")

    counters.refresh(types.SimpleNamespace(stats=broken))
    assert counters.total(0, 3)["worker_restarts"] == 3
    counters.refresh(types.SimpleNamespace(stats=lambda: {"worker_restarts": 2}))  # one more since the step
    assert counters.total(0, 3)["worker_restarts"] == 4


def test_the_carry_over_saves_the_restarts_the_workers_stop_cost() -> None:
    """A worker restarted after the last step (or killed by the stop itself) counts in the state the
    run ends with, as in a stop's early save."""
    import types

    from streamrl.loop.signals import StopFlag
    from streamrl.loop.state import RunState

    cfg = load_config(None, [])
    backend = types.SimpleNamespace(trainer_threads=lambda: None, stats=lambda: {"worker_restarts": 2})
    state = RunState(counters={"worker_restarts": 1})
    trainer = types.SimpleNamespace(version=0)
    runner = AsyncRunner(cfg, trainer, None, iter([]), state, StopFlag(), backend=backend)  # type: ignore[arg-type]
    assert runner.snapshot().counters["worker_restarts"] == 1  # as of the last step: none since
    runner.close()
    assert state.counters["worker_restarts"] == 3


def test_agent_episodes_a_stopped_run_had_not_logged_are_logged_after_its_resume(tiny):
    """Episodes returned after the last logged step are in the state a stop leaves, and in the resumed
    run's first record, not lost with the stop."""
    pending = {"episodes": 8, "reasons": {"TimeoutError": 2, "ValueError": 1}}
    runner, state = _runner(tiny, ["max_steps=1"], RunState(episodes=pending))
    assert runner.snapshot().episodes == pending
    runner.episode_errors.active = True  # an agent task's records carry the counts
    records: list = []
    runner.run(records.append)
    [m] = [r.metrics for r in records]
    assert (m["episodes"], m["episode_errors"]) == (8, 3)
    assert m["episode_error_reasons"] == {"TimeoutError": 2, "ValueError": 1}
    assert state.episodes == {}  # logged: nothing left for a later resume

    stopped, state = _runner(tiny, ["max_steps=1"], RunState(episodes=pending))
    stopped.close()  # stopped before its first step: the counts go back into the state
    assert state.episodes == pending


def test_a_silent_worker_beside_a_starting_one_gets_its_own_time_limit(tmp_path, monkeypatch):
    """Worker 0 is still starting (its longer start-up allowance) while worker 1 hangs: worker 1 is
    killed after runtime.worker_timeout_s, not after the start-up allowance, and with no restart left
    the threads it held go back to the others."""
    import types

    cfg = load_config(None, [*BASE, "runtime.worker_timeout_s=3", "runtime.max_restarts=0"])
    backend = backend_mod.LocalRollouts(cfg, scripted_worker)
    killed: list[int] = []
    reset: list[int] = []

    def worker(index: int, beat: float, spawned: float):
        proc = types.SimpleNamespace(
            is_alive=lambda: True, kill=lambda: killed.append(index), join=lambda timeout: None
        )
        log = tmp_path / f"w{index}.log"
        log.write_text("stuck")
        return types.SimpleNamespace(
            index=index,
            heartbeat=types.SimpleNamespace(value=beat),
            spawned=spawned,
            proc=proc,
            log=log,
            log_start=0,
            held={},
        )

    now = time.monotonic()
    backend.workers = [worker(0, 0.0, now), worker(1, now - 5, now - 60)]
    backend.cores = types.SimpleNamespace(reset=reset.append)
    assert backend._supervise() == []
    assert killed == [1] and reset == [2]  # slot 1 + i: worker i
    assert backend.failure() == (
        "rollout worker 1 silent for 5 s (runtime.worker_timeout_s=3): killed; no restarts left "
        "(runtime.max_restarts=0); its stderr ended: 'stuck'"
    )


def test_when_restarts_run_out_the_run_stops_with_its_groups_carried_over(tiny):
    runner, state = _runner(tiny, ["runtime.max_restarts=0", "max_steps=50"])
    records: list = []

    def on_step(rec):
        records.append(rec)
        if rec.step == 2:
            for w in runner.backend.workers:
                os.kill(w.proc.pid, signal.SIGKILL)

    with pytest.raises(RolloutFailure, match=r"rollout worker \d killed by SIGKILL; no restarts left"):
        runner.run(on_step)
    c = _balanced(runner, state, records)
    assert c["carried_over"] > 0  # what the workers held is in the state, for resume=


def test_a_step_that_fails_carries_its_groups_over(tiny, monkeypatch):
    """The second update raises (an out-of-memory error, say): the groups it took are carried over, not
    dropped, and the runner says it stopped inside a step (so the job keeps its last complete state)."""
    runner, state = _runner(tiny, [])
    real = runner.trainer.step

    def step(batch):
        if runner.state.step == 1:
            raise RuntimeError("injected failure")
        return real(batch)

    monkeypatch.setattr(runner.trainer, "step", step)
    records: list = []
    with pytest.raises(RuntimeError, match="injected failure"):
        runner.run(records.append)
    assert [r.step for r in records] == [1] and runner.in_step
    c = _balanced(runner, state, records)
    assert c["trained"] == 3 and c["carried_over"] >= 3  # the failed step's three groups at least


def test_requests_are_admitted_under_weights_already_published(tiny, monkeypatch):
    """Between the trainer's update and its publish (slowed here), groups dropped by dynamic sampling
    free slots and new requests are admitted: they carry the published version, never one the workers
    cannot load yet (a worker would reload its old weights every decode step until it arrives)."""
    import threading

    monkeypatch.setenv("SCRIPTED_DELAY_SCALE", "20")  # groups of ~0.2 s: some are in flight at a publish
    runner, state = _runner(tiny, ["rollout.dynamic_sampling=true", "max_steps=6"])
    backend, published, seen = runner.backend, [0], []
    real_publish, real_submit = backend.publish, backend.submit
    in_publish, admitted_meanwhile = threading.Event(), threading.Event()

    def in_flight() -> int:
        with runner.sh.cond:
            return len(runner.sh.inflight)

    def publish(weights, version):
        in_publish.set()
        # held while groups are in flight (one dropped by dynamic sampling frees a slot) until a request
        # is admitted; with none in flight nothing can be admitted before the publish
        deadline = time.monotonic() + 30  # a limit against a hang
        while not admitted_meanwhile.is_set() and in_flight() and time.monotonic() < deadline:
            time.sleep(0.005)
        real_publish(weights, version)
        published[0] = version
        in_publish.clear()

    def submit(req):
        seen.append((req.admitted_version, published[0], in_publish.is_set()))
        if in_publish.is_set():
            admitted_meanwhile.set()
        real_submit(req)

    monkeypatch.setattr(backend, "publish", publish)
    monkeypatch.setattr(backend, "submit", submit)
    records: list = []
    runner.run(records.append)
    assert [r.step for r in records] == [1, 2, 3, 4, 5, 6]
    assert any(during for _, _, during in seen), "no request was admitted during a publish"
    assert all(admitted <= ready for admitted, ready, _ in seen), seen


def _run_within(runner: AsyncRunner, limit_s: float) -> list:
    """The run's step records; a stop is requested after limit_s (a limit against a hang)."""
    records: list = []
    limit = threading.Timer(limit_s, runner.stop.request, args=("a limit against a hang",))
    limit.start()
    try:
        runner.run(records.append)
    finally:
        limit.cancel()
    return records


def test_a_worker_killed_while_it_sends_a_result_is_restarted(tiny, tmp_path, monkeypatch, capfd):
    """The parent is reading a result whose sender is killed before it wrote the rest: it holds no write
    end of the pipe, so it reads EOF instead of waiting for the rest forever, and the worker restarts."""
    torn = tmp_path / "torn"
    monkeypatch.setenv("SCRIPTED_TORN_ONCE", str(torn))
    runner, state = _runner(tiny, ["max_steps=3"])
    records = _run_within(runner, 120)
    assert torn.exists()
    assert [r.step for r in records] == [1, 2, 3]
    assert records[-1].metrics["worker_restarts"] == 1
    assert "rollout worker 0 killed by SIGKILL; restarted (1 of 3)" in capfd.readouterr().err
    _balanced(runner, state, records)


def test_a_group_lost_inside_a_live_worker_is_sent_again_and_trained_once(tiny, capfd, tmp_path, monkeypatch):
    """The worker takes g4 and drops it without dying: its heartbeat goes on, nothing restarts it. Once
    the trainer has waited runtime.worker_timeout_s with nothing coming back, what is in flight is sent
    again with one line, and the run ends with every step and every group trained once."""
    monkeypatch.setenv("SCRIPTED_DROP_ONCE", f"g4:{tmp_path / 'dropped'}")
    runner, state = _runner(tiny, ["runtime.worker_timeout_s=2", "runtime.rollout_workers=1"])
    resent: list[str] = []
    real_resend = runner.backend.resend
    monkeypatch.setattr(
        runner.backend, "resend", lambda req, **kw: (resent.append(req.group_id), real_resend(req, **kw))
    )
    records = _run_within(runner, 120)
    assert (tmp_path / "dropped").exists()  # the worker did lose it
    assert [r.step for r in records] == [1, 2, 3, 4, 5, 6]
    c = _balanced(runner, state, records)
    assert c["trained"] == 18 and "g4" in {g.trajectories[0].group_id for r in records for g in r.groups}
    lines = [x for x in capfd.readouterr().err.splitlines() if "sent again" in x]
    assert len(lines) >= 1 and "g4" in lines[0]
    assert lines[0].startswith("streamrl: warning: the trainer has waited ")
    assert records[-1].metrics["groups_resent"] == len(resent) >= 1 and "g4" in resent  # to their holder
    # copies that came back twice were dropped, never trained twice (_balanced)
    assert records[-1].metrics["duplicate_results"] <= records[-1].metrics["groups_resent"]


def test_a_group_stuck_inside_a_live_worker_is_generated_by_another(tiny, capfd, tmp_path, monkeypatch):
    """Worker A never finishes g4 but keeps beating. The first copy goes to A, which ignores it (it still
    generates g4); at the next firing g4 is still in flight, so the copy goes to worker B, and the run
    trains every step with g4 once."""
    monkeypatch.setenv("SCRIPTED_STUCK_ONCE", f"g4:{tmp_path / 'stuck'}")
    runner, state = _runner(tiny, ["runtime.worker_timeout_s=2"])  # two workers
    records = _run_within(runner, 60)
    assert (tmp_path / "stuck").exists()
    assert [r.step for r in records] == [1, 2, 3, 4, 5, 6]
    c = _balanced(runner, state, records)
    assert c["trained"] == 18 and "g4" in {g.trajectories[0].group_id for r in records for g in r.groups}
    lines = [x for x in capfd.readouterr().err.splitlines() if "sent again" in x]
    assert any("g4 sent before: to another worker" in x for x in lines), lines


def test_a_failing_worker_reports_its_traceback_on_its_stderr_too(capfd):
    """serve() sends the error to the controller and prints it, so a worker's log tail names it even if
    the report is lost with its process."""
    import queue as queue_mod

    from scripted_worker import StillWeights

    from streamrl.rollout.worker import serve

    results: queue_mod.Queue = queue_mod.Queue()
    serve(0, {"no_such_key": 1}, queue_mod.Queue(), results, StillWeights(), lambda: False)
    report = results.get_nowait().error
    assert report.startswith("Traceback") and report.strip() in capfd.readouterr().err


def test_a_worker_that_reports_an_error_and_exits_keeps_its_report(monkeypatch, tmp_path):
    """A failing worker sends its traceback and exits with code 0. Found dead before its report was
    read, the report is still read (not dropped with the queue its restart replaces)."""
    import torch
    from scripted_worker import failing_once_worker

    monkeypatch.setenv("SCRIPTED_FAILED_FILE", str(tmp_path / "failed"))
    cfg = load_config(None, ["runtime.elastic_cores=fixed", "runtime.max_restarts=2"])
    backend = backend_mod.LocalRollouts(cfg, failing_once_worker)
    backend.start({"w": torch.zeros(2)}, 0)
    try:
        first = backend.workers[0].proc
        first.join(timeout=120)  # it exited before anyone read its queue
        assert first.exitcode == 0
        got = backend.poll(0.1)
        assert [r.error for r in got] == ["Traceback ...\nValueError: boom"]
        assert backend.restarts == 1 and backend.workers[0].proc is not first
    finally:
        backend.stop()


def test_a_group_whose_feedback_fails_is_carried_over_not_lost(tiny):
    """The sampler's feedback on a returned group raises (a curriculum that cannot build its next
    level, say): the group stays in flight, so the stop carries it over and nothing is lost."""
    runner, state = _runner(tiny, [])
    seen: list[str] = []

    def feedback(group):
        seen.append(group.trajectories[0].group_id)
        if len(seen) == 4:
            raise RuntimeError("sampler feedback failed")

    runner.admission.on_group_scored = feedback
    records: list = []
    with pytest.raises(RuntimeError, match="sampler feedback failed"):
        runner.run(records.append)
    c = _balanced(runner, state, records)
    assert seen[3] in {r.group_id for r in state.unfinished} and c["lost"] == 0


def test_the_trainer_lends_its_threads_outside_the_buffers_lock(tiny):
    """Lending may wait on the cores' lock, which a worker stopped inside it (kill -STOP) holds: the
    trainer must not hold the buffer's lock meanwhile, or the admission thread, which restarts that
    worker, could never take it."""
    runner, _ = _runner(tiny, ["max_steps=2"])
    free: list[bool] = []

    class Probe:
        def wait(self) -> None:  # another thread can take the buffer's lock while the trainer lends
            def take() -> None:
                got = runner.sh.cond.acquire(timeout=5)
                free.append(got)
                if got:
                    runner.sh.cond.release()

            t = threading.Thread(target=take)
            t.start()
            t.join()

        def work(self, *a, **k) -> int:
            return 1

        def own(self) -> int:
            return 1

    runner.threads = Probe()
    records: list = []
    runner.run(records.append)
    assert [r.step for r in records] == [1, 2]
    # once per wait for a batch (two steps) and once at the end: lent threads stay lent until taken back
    assert all(free) and 1 <= len(free) <= 3, free
