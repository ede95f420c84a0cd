"""Elastic cores: threads lent while a process waits, never more threads held than cores."""

import json
import multiprocessing as mp
import os
import random
import signal
import subprocess
import sys
import threading
import time

import pytest
from tiny_args import TINY

from streamrl.config import load_config
from streamrl.placement.cores import ElasticCores, elastic_enabled

CTX = mp.get_context("spawn")


def _in_thread(fn, *args):
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    return t, out


def _asked(cores: ElasticCores, p: int) -> None:
    """Until slot p, started in a thread, reached its boundary: it lends no more (set under the lock,
    so the next call sees what that boundary decided)."""
    deadline = time.monotonic() + 60  # a limit against a hang, not a speed check
    while cores._slots[3 * p + 1] and time.monotonic() < deadline:
        time.sleep(0.005)


def test_a_waiting_trainer_lends_its_thread_and_takes_it_back_at_the_workers_next_boundary():
    cores = ElasticCores([1, 1], CTX, policy="lend")  # slot 0: trainer, slot 1: a rollout worker
    assert cores.held() == [1, 1]
    cores.wait(0)  # the trainer waits for rollouts
    assert cores.held() == [0, 1]
    assert cores.work(1) == 2  # the worker's next decode step runs on both cores
    t, got = _in_thread(cores.work, 0)  # the batch is ready: the trainer wants its core back ...
    _asked(cores, 0)
    assert t.is_alive() and got == []  # ... and waits while the worker still holds it
    assert cores.held() == [0, 2]
    assert cores.work(1) == 1  # the worker's next boundary gives it back
    t.join(10)
    assert got == [1] and cores.held() == [1, 1]
    s = cores.stats()
    assert (s["cores_peak_held"], s["cores_borrows"], s["cores_reclaims_waited"]) == (2, 1, 1)
    assert (s["cores_trainer_max"], s["cores_worker_max"], s["cores_reclaim_timeouts"]) == (1, 2, 0)


def test_an_idle_worker_lends_to_the_trainer():
    cores = ElasticCores([1, 1], CTX, policy="lend")
    cores.wait(1)
    assert cores.work(0) == 2
    assert cores.work(0) == 2  # still lent at the next micro-batch
    t, got = _in_thread(cores.work, 1)
    _asked(cores, 1)
    assert got == []
    assert cores.work(0) == 1
    t.join(10)
    assert got == [1] and cores.held() == [1, 1]


def test_a_trainer_between_steps_gives_back_what_it_borrowed_at_once():
    """Between steps the trainer has no boundaries for seconds (a save, an evaluation): `own` hands the
    borrowed thread back there and then, so the lender that gets work takes it without waiting."""
    cores = ElasticCores([1, 1], CTX, policy="lend")
    cores.wait(1)
    assert cores.work(0) == 2  # the step trained on the idle worker's thread too
    assert cores.own(0) == 1 and cores.held() == [1, 0]
    t, got = _in_thread(cores.work, 1)  # the worker gets a request while the trainer saves
    t.join(10)
    assert got == [1] and cores.held() == [1, 1]
    s = cores.stats()
    assert (s["cores_reclaims_waited"], s["cores_reclaim_timeouts"], s["cores_peak_held"]) == (0, 0, 2)
    cores.wait(0)  # the trainer waited for rollouts and the worker took its thread
    assert cores.work(1) == 2
    t, got = _in_thread(cores.own, 0)  # its own thread is held: it waits for the worker's boundary
    _asked(cores, 0)
    assert got == [] and cores.held() == [0, 2]
    assert cores.work(1) == 1
    t.join(10)
    assert got == [1] and cores.held() == [1, 1]
    cores.wait(0)
    assert cores.own(0) == 1 and cores.work(1) == 1  # taken back before anyone borrowed it
    alternate = ElasticCores([1, 1], CTX, policy="alternate")
    alternate.wait(1)
    assert alternate.own(0) == 2 and alternate.held() == [2, 0]  # there the trainer keeps every core


def test_the_seconds_and_thread_seconds_each_phase_held_are_counted_at_its_boundaries():
    """Trainer and worker start on one thread each at t=0. t=2: the trainer waits, so from the worker's
    boundary at t=3 it decodes on two threads; t=7: the worker waits; t=8: the trainer works on both,
    still at its next micro-batch (t=11); t=12: the trainer waits."""
    now = [0.0]
    cores = ElasticCores([1, 1], CTX, policy="lend", clock=lambda: now[0])
    for t, call in [
        (2, "wait 0"),
        (3, "work 1"),
        (7, "wait 1"),
        (8, "work 0"),
        (11, "work 0"),
        (12, "wait 0"),
    ]:
        now[0] = float(t)
        verb, slot = call.split()
        getattr(cores, verb)(int(slot))
    assert cores.held() == [0, 0]
    s = cores.stats()
    # trainer: 1 thread over [0, 2), none until 8, 2 threads over [8, 12) -> 6 s held, 10 thread-s
    assert (s["cores_trainer_held_s"], s["cores_trainer_thread_s"]) == (6.0, 10.0)
    # worker: 1 thread over [0, 3), 2 over [3, 7) -> 7 s held, 11 thread-s
    assert (s["cores_worker_held_s"], s["cores_worker_thread_s"]) == (7.0, 11.0)


def test_two_borrowers_share_what_one_lender_lends_without_exceeding_the_cores():
    cores = ElasticCores([2, 1, 1], CTX, policy="lend")  # 4 cores: trainer 2, two workers 1 each
    cores.wait(0)
    assert cores.work(1) == 3  # base 1 + the trainer's 2
    assert cores.work(2) == 1  # only its own: the lent threads are taken
    assert sum(cores.held()) == 4
    assert cores.work(1) == 3
    assert cores.stats()["cores_peak_held"] == 4


def test_a_dead_borrowers_threads_are_freed_by_reset():
    cores = ElasticCores([1, 1], CTX)
    cores.wait(0)
    assert cores.work(1) == 2
    cores.reset(1)  # the supervisor found worker 0 dead
    assert cores.work(0) == 2  # nothing held elsewhere, and the dead slot lends
    assert cores.stats()["cores_reclaims_waited"] == 0


def test_a_borrower_that_never_returns_costs_a_counted_timeout():
    cores = ElasticCores([1, 1], CTX, reclaim_timeout_s=0.05)
    cores.wait(0)
    assert cores.work(1) == 2
    assert cores.work(0) == 1  # gave up waiting: goes on with its own thread ...
    s = cores.stats()
    assert s["cores_reclaim_timeouts"] == 1 and s["cores_peak_held"] == 3  # ... and the peak says so


def test_every_process_needs_a_thread_and_a_known_policy():
    with pytest.raises(ValueError, match=r"at least one thread of its own, got \[1, 0\]"):
        ElasticCores([1, 0], CTX)
    with pytest.raises(ValueError, match=r"^core policy 'share': use one of lend, alternate$"):
        ElasticCores([1, 1], CTX, policy="share")


def test_alternate_never_runs_the_trainer_and_a_worker_at_once():
    cores = ElasticCores([1, 1], CTX, policy="alternate")
    cores.wait(0)  # the trainer waits for rollouts: the worker decodes on both cores
    assert cores.work(1) == 2
    t, got = _in_thread(cores.work, 0)  # the batch is ready: the trainer wants every core
    _asked(cores, 0)
    assert got == [] and cores.held() == [0, 2]
    w, wgot = _in_thread(cores.work, 1)  # the worker's next boundary: it yields and waits ...
    t.join(10)
    assert got == [2] and cores.held() == [2, 0]
    w.join(0.3)
    assert wgot == []  # ... while the trainer trains, however long (no timeout for a yielding worker)
    assert cores.work(0) == 2  # the next micro-batch: still every core
    cores.wait(0)  # the trainer waits again: the worker goes on with both cores
    w.join(10)
    assert wgot == [2] and cores.held() == [0, 2]
    s = cores.stats()
    assert s["cores_peak_held"] == 2 and s["cores_reclaim_timeouts"] == 0


def test_a_yielding_worker_whose_trainer_is_gone_stops_waiting():
    cores = ElasticCores([1, 1], CTX, policy="alternate", reclaim_timeout_s=0.01)
    cores.wait(1)
    assert cores.work(0) == 2
    assert cores.work(1, give_up=lambda: True) == 1  # the loop then sees its parent gone and exits
    assert cores.stats()["cores_reclaim_timeouts"] == 1


def _hammer(cores, slot, seed, rounds):
    rng = random.Random(seed)
    for _ in range(rounds):
        r = rng.random()
        if r < 0.3:
            cores.wait(slot)
        elif r < 0.4:
            assert 1 <= cores.own(slot) <= cores.total
        else:
            k = cores.work(slot)
            assert 1 <= k <= cores.total
    cores.wait(slot)  # done: lend (a trainer that stops working releases the waiting workers)


@pytest.mark.parametrize("policy", ["lend", "alternate"])
def test_processes_lending_at_random_never_hold_more_threads_than_cores(policy):
    cores = ElasticCores([1, 1, 2], CTX, policy=policy)
    procs = [CTX.Process(target=_hammer, args=(cores, s, s, 400)) for s in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
        assert p.exitcode == 0
    s = cores.stats()
    assert s["cores_peak_held"] <= 4 and s["cores_reclaim_timeouts"] == 0
    assert s["cores_borrows"] > 0  # threads really moved between processes


@pytest.mark.parametrize(
    ("overrides", "on"),
    [
        ([], True),
        (["runtime.elastic_cores=fixed"], False),
        (["runtime.elastic_cores=lend"], True),
        (["runtime.mode=colocated", "max_staleness=0"], False),
        (["runtime.backend=ray"], False),
        (["device=cuda"], False),
        (["train.world_size=2", "train.strategy=ddp"], False),
    ],
)
def test_lending_only_where_the_phases_share_cores(overrides, on):
    assert elastic_enabled(load_config(None, overrides)) is on


@pytest.mark.parametrize("policy", ["lend", "alternate"])
def test_a_run_lends_the_trainers_core_to_generation_and_loses_nothing(tmp_path, policy):
    """The trainer waits for its first batch, so the worker decodes on every core; the peak stays at
    the cores, the staleness bound holds, every admitted group is accounted for, and at the end the
    worker reaches the stop request (under `alternate` it yields to a trainer that no longer trains).
    The run is a process of its own with a time limit: a worker yielding for ever would hang it."""
    run_dir = tmp_path / "run"
    args = [*TINY, "max_steps=4", "max_staleness=1", "train.token_budget=200"]
    cmd = [sys.executable, "-m", "streamrl.cli", "train", *args, f"runtime.elastic_cores={policy}"]
    proc = subprocess.Popen(
        [*cmd, f"run_dir={run_dir}"],
        start_new_session=True,  # its own group: the kill on a hang takes its workers too
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:  # a limit against a hang, not a speed check
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, err[-2000:]
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    last = rows[-1]
    cores = os.cpu_count() or 1
    assert last["cores_total"] == cores and last["cores_peak_held"] <= cores
    assert last["cores_worker_max"] == cores  # the trainer's share was lent to the worker
    if policy == "alternate":  # the trainer trains on every core
        assert last["cores_trainer_max"] == cores
    assert last["cores_reclaim_timeouts"] == 0
    assert all(r["staleness_max"] <= 1 for r in rows)
    acc = json.loads((run_dir / "accounting.json").read_text())
    assert acc["lost"] == 0
    assert acc["admitted"] == acc["trained"] + acc["filtered"] + acc["carried_over"]
    assert "did not stop" not in err  # not killed after the stop's time limit


def _die_holding_the_lock(cores: ElasticCores) -> None:
    with cores._locked():
        os.kill(os.getpid(), 9)  # SIGKILL at a boundary, inside the lock


def test_a_worker_killed_inside_the_lock_does_not_stop_the_others():
    """A SIGKILL can land while a worker holds the shared lock (it takes it at every decode step). The
    kernel frees it with the dead worker; the supervisor's reset of that slot and the trainer go on."""
    cores = ElasticCores([1, 1], CTX, policy="lend")
    child = mp.get_context("fork").Process(target=_die_holding_the_lock, args=(cores,))
    child.start()
    child.join()
    assert child.exitcode == -9  # died holding it
    t, out = _in_thread(cores.reset, 1)
    t.join(timeout=60)  # a limit against a hang, not a speed check
    assert not t.is_alive(), "reset waited forever for the dead worker's lock"
    assert cores.work(0) == 2  # the trainer takes the dead worker's lent thread too
    assert cores.held() == [2, 0]


def test_a_worker_handed_work_after_lending_takes_its_threads_before_it_computes(monkeypatch):
    """A worker idle past LEND_AFTER_S lends its thread and the trainer borrows it. When a blocking poll
    then returns a group (a restarted worker's first, or any after a pause), the prefill that follows
    runs only once the worker holds its own thread again: the trainer gives it back at its next
    boundary, and the two never hold more than the cores."""
    import functools
    import queue
    from types import SimpleNamespace

    import torch

    from streamrl.placement import backend
    from streamrl.placement.cores import ThreadSetter

    monkeypatch.setattr(torch, "set_num_threads", lambda k: None)  # this test process keeps its own
    monkeypatch.setattr(backend, "LEND_AFTER_S", 0.0)
    cores = ElasticCores([1, 1], CTX, policy="lend")
    q: queue.Queue = queue.Queue()
    requests = backend._BeatingRequests(q, SimpleNamespace(value=0.0), ThreadSetter(cores, 1))
    for _ in range(2):  # nothing to decode: the second blocking poll lends the thread
        with pytest.raises(queue.Empty):
            requests.get(timeout=0.01)
    assert cores.work(0) == 2  # the trainer borrows it
    q.put("group")
    t, out = _in_thread(functools.partial(requests.get, timeout=1))
    time.sleep(0.1)
    assert cores.held() == [2, 0]  # the worker has not computed yet: it waits for its thread
    assert cores.work(0) == 1  # the trainer's next boundary gives it back
    t.join(timeout=60)  # a limit against a hang, not a speed check
    assert not t.is_alive() and out == ["group"]
    assert cores.held() == [1, 1] and cores.stats()["cores_peak_held"] == 2
    cores.wait(0)  # the trainer now waits for a batch: the worker's next decode step borrows its thread
    q.put("next")
    assert requests.get_nowait() == "next" and cores.held() == [0, 2]


def test_a_run_gives_back_the_borrowed_thread_before_each_step_is_recorded(tiny, monkeypatch):
    """Each step trains on a lender's thread too; while the step is recorded (on_step: where the job
    logs, saves and evaluates, with no boundary for seconds) the trainer holds its own thread only, and
    the lender that gets work meanwhile takes its thread back without waiting."""
    import copy
    import itertools

    import torch
    from scripted_worker import scripted_worker  # tests/ is on sys.path (rootdir conftest)

    from streamrl.data.task import default_task_args
    from streamrl.loop.asynchronous import AsyncRunner
    from streamrl.loop.signals import StopFlag
    from streamrl.loop.state import RunState
    from streamrl.placement.cores import ThreadSetter
    from streamrl.tasks import make_task
    from streamrl.trainer.trainer import Trainer

    set_to: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", set_to.append)  # this test process keeps its own
    args = ["max_steps=3", "max_staleness=1", "rollout.prompts_per_step=2", "runtime.rollout_workers=1"]
    cfg = load_config(None, [*args, "rollout.samples_per_prompt=2", "rollout.dynamic_sampling=false"])
    task = make_task("rg:chain_sum", default_task_args("rg:chain_sum"), "", "", "answer_is")
    trainer = Trainer.from_config(copy.deepcopy(tiny[0]), cfg, pad_id=0)
    stream = itertools.islice(task.train_stream(0, set()), None)
    runner = AsyncRunner(cfg, trainer, tiny[1], stream, RunState(), StopFlag(), scripted_worker)
    cores = ElasticCores([1, 1], CTX, policy="lend")  # the trainer's and a lender's that only this test moves
    runner.threads = ThreadSetter(cores, 0)
    cores.wait(1)
    seen = []

    def on_step(record):
        seen.append((record.step, cores.held(), set_to[-1]))
        t, got = _in_thread(cores.work, 1)  # the lender gets work while the step is recorded
        t.join(10)  # a limit against a wait for a boundary that does not come, not a speed check
        seen.append(got)
        cores.wait(1)  # idle again: the next step borrows

    runner.run(on_step)
    assert seen == [(1, [1, 0], 1), [1], (2, [1, 0], 1), [1], (3, [1, 0], 1), [1]]
    s = cores.stats()
    assert s["cores_trainer_max"] == 2 and s["cores_borrows"] > 0  # every step trained on two threads
    assert (s["cores_reclaims_waited"], s["cores_reclaim_timeouts"]) == (0, 0)
