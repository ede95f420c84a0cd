"""The rollout actor's own logic (placement/ray_actor.py), without Ray: the class is plain Python that
Ray wraps, so its loop is replaced here by an echo of the requests it is handed."""

from __future__ import annotations

import threading

import pytest

from streamrl.placement import ray_actor
from streamrl.placement.weight_sync import ObjectStoreReceiver
from streamrl.rollout.worker import STOP

CFG = {"runtime": {"rollout_threads": 1, "sync_timeout_s": 5.0}}


@pytest.fixture
def actor(monkeypatch):
    """A RolloutActor whose loop answers each request with ("done", request) and records STOP."""
    seen: list = []
    release = threading.Event()

    def echo(worker_id, cfg, requests, outbox, weights, stopped):
        while (item := requests.get()) is not STOP:
            release.wait(10)  # the test lets the answers out together
            outbox.put(("done", worker_id, item))
        seen.append(STOP)

    monkeypatch.setattr(ray_actor, "serve", echo)
    a = ray_actor.RolloutActor(3, CFG, {"mode": "object_store"})
    yield a, seen, release
    release.set()
    a.stop(timeout=5)


def test_exchange_returns_every_finished_group_at_once_and_waits_for_the_first(actor):
    a, _, release = actor
    incarnation, got = a.exchange([], wait_s=0.05)  # nothing finished: an empty answer after the wait
    assert got == [] and incarnation == a.incarnation
    release.set()
    _, got = a.exchange(["r1", "r2", "r3"], wait_s=5)
    while len(got) < 3:  # the first answer can come before the loop has put the other two
        got += a.exchange([], wait_s=5)[1]
    assert got == [("done", 3, "r1"), ("done", 3, "r2"), ("done", 3, "r3")]


def test_exchange_hands_back_what_is_already_finished_with_the_first(actor):
    a, _, release = actor
    for r in ("a", "b", "c"):
        a.requests.put(r)
    release.set()
    while a.outbox.qsize() < 3:
        threading.Event().wait(0.01)
    assert a.exchange([], wait_s=5)[1] == [("done", 3, "a"), ("done", 3, "b"), ("done", 3, "c")]


def test_stop_ends_the_loop_and_returns_what_it_finished_meanwhile(actor):
    a, seen, release = actor
    a.requests.put("late")
    release.set()
    assert a.stop(timeout=5) == [("done", 3, "late")] and seen == [STOP]
    assert not a.loop.is_alive() and a.stopped.is_set()


def test_each_actor_has_its_own_incarnation_and_the_configured_receiver(actor, monkeypatch):
    a, _, _ = actor
    b = ray_actor.RolloutActor(4, CFG, {"mode": "object_store"})
    try:
        assert a.incarnation != b.incarnation and len(a.incarnation) == 32  # a restart shows as new
        assert isinstance(b.weights, ObjectStoreReceiver) and b.weights.timeout == 5.0
    finally:
        b.stop(timeout=5)
    made = []
    monkeypatch.setattr(
        "streamrl.placement.weight_sync.BroadcastReceiver", lambda *args: made.append(args) or object()
    )
    sync = {"mode": "broadcast", "layout": "L", "host": "h", "port": 1, "rank": 2, "world": 3}
    ray_actor.make_receiver({**sync, "backend": "gloo", "epoch": 7}, 9.0)
    assert made == [("L", "h", 1, 2, 3, 9.0, "gloo", 7)]


class _Died(Exception):
    actor_init_failed = False


class _InitFailed(Exception):
    actor_init_failed = True


def test_an_actors_death_is_told_in_one_line_without_rays_ids() -> None:
    """Ray's words for a death, its tab-indented ids left out; for a failed __init__, what it raised."""
    died = _Died(
        "The actor died unexpectedly before finishing this task.\n\tclass_name: RolloutActor\n"
        "\tactor_id: 3f2a9c\n\nThe actor's worker process was killed: out of memory."
    )
    assert ray_actor._death(died) == (
        "The actor died unexpectedly before finishing this task. The actor's worker process was killed: "
        "out of memory."
    )
    init = _InitFailed(
        'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: no model at /x\n'
    )
    assert ray_actor._death(init) == "ValueError: no model at /x"
    assert ray_actor._death(_Died("\n\tactor_id: 3f2a9c\n")) == "_Died"
