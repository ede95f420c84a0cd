"""The rollout workers' start and stop: the loop starts once every worker is ready, the job starts them
before the base evaluation, a stop ends the wait for workers still starting, workers a loop never runs
do not outlive it, and a stop keeps what the workers sent last, kills one that never reads it with one
line, and carries every group over even when it fails. Scripted workers (no model) keep it fast."""

from __future__ import annotations

import json
import threading

import pytest
from scripted_runs import _balanced, _runner  # tests/ is on sys.path (rootdir conftest)

from streamrl.config import load_config
from streamrl.loop.asynchronous import AsyncRunner
from streamrl.placement import backend as backend_mod


def test_the_loop_starts_once_every_worker_is_ready(tiny, tmp_path, monkeypatch):
    """start() spawns the workers (the job calls it before the base evaluation); wait_ready() returns
    once each polls its requests, which is when the loop and its clock may start."""
    starting = tmp_path / "starting"
    starting.touch()
    monkeypatch.setenv("SCRIPTED_STARTUP_FILE", str(starting))
    runner, state = _runner(tiny, ["max_steps=2"])
    runner.start()
    workers = runner.backend.workers
    try:
        assert runner.backend.wait_ready(0.5) is False  # still starting: returns at the timeout
        assert [w.heartbeat.value for w in workers] == [0.0, 0.0]
        starting.unlink()
        runner.wait_ready()
        assert runner.backend.wait_ready(0.0) is True
        assert all(w.heartbeat.value > 0 for w in workers)
        records: list = []
        runner.run(records.append)  # the workers already started are the loop's
    finally:
        runner.close()
    assert [r.step for r in records] == [1, 2]
    assert all(not w.proc.is_alive() for w in workers)
    _balanced(runner, state, records)


@pytest.mark.parametrize("how", ["stopped", "never_run"])
def test_workers_started_for_a_loop_that_never_runs_are_stopped(tiny, how):
    """Ctrl-C during the base evaluation (the loop returns at once), or an error before the loop (the
    job's closers call close): the started workers do not outlive the run."""
    runner, state = _runner(tiny, [])
    runner.start()
    runner.wait_ready()
    workers = runner.backend.workers
    if how == "stopped":
        runner.stop.request("SIGINT")
        runner.run(lambda rec: None)
    else:
        runner.close()
    assert workers and all(not w.proc.is_alive() for w in workers)
    assert runner.ledger.counts()["admitted"] == 0 and state.step == 0


def test_a_stop_ends_the_wait_for_starting_workers(tiny, tmp_path, monkeypatch):
    """SIGTERM while the workers still load their model: the wait ends, the loop does not start."""
    starting = tmp_path / "starting"
    starting.touch()
    monkeypatch.setenv("SCRIPTED_STARTUP_FILE", str(starting))
    runner, state = _runner(tiny, [])
    runner.start()
    workers = runner.backend.workers
    runner.stop.request("SIGTERM")
    runner.wait_ready()  # returns although no worker is ready (the file is still there)
    assert [w.heartbeat.value for w in workers] == [0.0, 0.0]
    # the stop does not wait for workers still loading their model (they hold nothing): with a stop
    # timeout far beyond this test's limit, it ends at once all the same
    monkeypatch.setattr(backend_mod, "STOP_TIMEOUT_S", 3600.0)
    done = threading.Thread(target=runner.run, args=(lambda rec: None,), daemon=True)
    done.start()
    done.join(timeout=120)  # a limit against a hang, not a speed check
    assert not done.is_alive(), "the stop waited for workers still loading their model"
    assert all(not w.proc.is_alive() for w in workers) and state.step == 0


def test_nothing_to_train_starts_no_worker(tiny):
    """max_steps reached (an evaluate-only run, a finished run resumed): no worker is spawned."""
    runner, state = _runner(tiny, ["max_steps=0"])
    runner.run(lambda rec: None)
    assert runner.backend.workers == [] and state.step == 0


def test_the_job_starts_its_workers_before_the_base_evaluation(tmp_path, monkeypatch):
    """`streamrl train`: the workers load while the base model is evaluated; what is left of their start
    (wait_ready's seconds) is set-up time, not training time."""
    from tiny_args import TINY

    from streamrl.cli import main
    from streamrl.loop import job

    events: list[str] = []
    real_start, real_wait, real_eval = AsyncRunner.start, AsyncRunner.wait_ready, job.evaluate

    def start(self):
        events.append("start")
        real_start(self)

    def wait_ready(self):
        events.append("wait_ready")
        return real_wait(self) + 1000.0  # a start that took 1000 s more: all of it set-up

    def evaluate(*args, **kw):
        events.append("evaluate")
        return real_eval(*args, **kw)

    monkeypatch.setattr(AsyncRunner, "start", start)
    monkeypatch.setattr(AsyncRunner, "wait_ready", wait_ready)
    monkeypatch.setattr(job, "evaluate", evaluate)
    run = tmp_path / "run"
    assert main(["train", *TINY, "max_steps=1", "eval.before=true", f"run_dir={run}"]) == 0
    # the base evaluation between the start and the wait (the loop's own start and wait then return at
    # once), the final evaluation last
    assert events[:3] == ["start", "evaluate", "wait_ready"] and events.count("evaluate") == 2
    assert events[-1] == "evaluate"
    timings = json.loads((run / "summary.json").read_text())["timings"]
    assert timings["setup"] >= 1000.0 > timings["train_clock"]


def test_a_worker_that_never_reads_the_stop_is_killed_with_one_line(monkeypatch, capfd):
    import torch
    from scripted_worker import deaf_worker

    monkeypatch.setattr(backend_mod, "STOP_TIMEOUT_S", 0.5)
    backend = backend_mod.LocalRollouts(load_config(None, ["runtime.elastic_cores=fixed"]), deaf_worker)
    backend.start({"w": torch.zeros(2)}, 0)
    assert backend.wait_ready(120)
    assert backend.stop() == []
    err = capfd.readouterr().err.splitlines()
    killed = [x for x in err if "did not stop" in x]
    assert len(killed) == 1 and killed[0].startswith(
        "streamrl: warning: rollout worker 0 did not stop within 0.5 s: killed (the groups it held are "
        "carried over)"
    )
    assert not backend.workers[0].proc.is_alive()


def test_a_large_result_sent_just_before_the_stop_is_kept_and_its_worker_exits(monkeypatch, capfd):
    """A worker's process exits only once what it put on its result queue has left the pipe: the stop
    reads the results while the workers exit, instead of waiting for them to exit first."""
    import torch
    from scripted_worker import LATE_PAYLOAD, late_sender_worker

    monkeypatch.setattr(backend_mod, "STOP_TIMEOUT_S", 5.0)
    cfg = load_config(None, ["runtime.elastic_cores=fixed"])
    backend = backend_mod.LocalRollouts(cfg, late_sender_worker)
    backend.start({"w": torch.zeros(2)}, 0)
    assert backend.wait_ready(120)
    got: list = []
    stopping = threading.Thread(target=lambda: got.append(backend.stop()), daemon=True)
    stopping.start()
    stopping.join(timeout=60)  # a limit against a hang: a read of a killed worker's half-sent result
    assert got, "the stop did not return"
    assert [(r.group_id, len(r.extra["payload"])) for r in got[0]] == [("late", LATE_PAYLOAD)]
    assert "did not stop" not in capfd.readouterr().err
    assert backend.workers[0].proc.exitcode == 0


def test_workers_that_exit_on_the_stop_are_not_restarted_by_a_later_supervision():
    """The admission thread may outlive its join and supervise the workers once more while they stop:
    a worker that exited on the STOP is not restarted (its replacement would never read that STOP)."""
    import torch
    from scripted_worker import scripted_worker

    cfg = load_config(None, ["runtime.elastic_cores=fixed", "runtime.rollout_workers=2"])
    backend = backend_mod.LocalRollouts(cfg, scripted_worker)
    backend.start({"w": torch.zeros(2)}, 0)
    assert backend.wait_ready(120)
    assert backend.stop() == []
    assert backend._supervise() == [] and backend.restarts == 0
    assert not any(w.proc.is_alive() for w in backend.workers)


def test_a_stop_that_fails_still_carries_everything_over(tiny, monkeypatch):
    """The backend's stop raises: the run's state still carries over every group admitted and not
    trained, so a resume neither loses nor trains one twice."""
    runner, state = _runner(tiny, ["max_steps=2"])
    real_stop = runner.backend.stop

    def failing_stop():
        real_stop()
        raise RuntimeError("the stop failed")

    monkeypatch.setattr(runner.backend, "stop", failing_stop)
    records: list = []
    with pytest.raises(RuntimeError, match="the stop failed"):
        runner.run(records.append)
    assert [r.step for r in records] == [1, 2]
    c = _balanced(runner, state, records)
    assert c["carried_over"] > 0
