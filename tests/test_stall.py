"""StallWatch: groups in flight that never come back are sent again once the trainer has waited its
limit with nothing returned (loop/stall.py)."""

from __future__ import annotations

from dataclasses import dataclass

from streamrl.loop.stall import StallWatch


@dataclass
class _Req:
    group_id: str


def _held(*group_ids: str) -> dict:
    """group id -> request, as the runner's in-flight map and a worker's held groups are"""
    return {g: _Req(g) for g in group_ids}


def _watch(now: list[float], limit: float = 10.0) -> StallWatch:
    return StallWatch(limit, clock=lambda: now[0])


def test_nothing_is_sent_again_before_the_limit_or_while_the_trainer_trains() -> None:
    now = [0.0]
    w = _watch(now)
    inflight = _held("g1", "g2")
    now[0] = 50.0
    assert w.due(inflight) == ([], None)  # the trainer is not waiting: nothing is due back
    w.waiting(True)  # it starts waiting at 50
    now[0] = 59.9
    assert w.due(inflight) == ([], None)  # 9.9 s of its wait: under the limit though 59.9 s since a return


def test_after_the_limit_what_is_in_flight_is_sent_again_once() -> None:
    now = [0.0]
    w = _watch(now)
    inflight = _held("g1", "g2")
    w.waiting(True)
    now[0] = 10.0
    again, line = w.due(inflight)
    assert again == list(inflight.values()) and w.resent == 2
    assert line == (
        "streamrl: warning: the trainer has waited 10 s and none of the 2 group(s) in flight has come "
        "back (g1, g2), though the rollout workers are alive; they are sent again "
        "(runtime.worker_timeout_s=10)"
    )
    now[0] = 19.9
    assert w.due(inflight) == ([], None)  # the next try after another full limit
    now[0] = 20.0
    assert w.due(inflight)[0] == list(inflight.values()) and w.resent == 4


def test_a_return_restarts_the_quiet_time_and_an_end_of_the_wait_stops_it() -> None:
    now = [0.0]
    w = _watch(now)
    w.waiting(True)
    now[0] = 8.0
    w.returned()
    now[0] = 17.9
    assert w.due(_held("g1")) == ([], None)  # 9.9 s since the last return
    w.waiting(False)
    now[0] = 100.0
    assert w.due(_held("g1")) == ([], None)
    w.waiting(True)  # a new wait begins at 100
    w.waiting(True)  # and its start does not move while it lasts
    now[0] = 110.0
    assert w.due(_held("g1"))[0] == [_Req("g1")]


def test_a_group_still_in_flight_at_the_next_firing_is_named_as_stuck() -> None:
    now = [0.0]
    w = _watch(now)
    w.waiting(True)
    now[0] = 10.0
    assert w.due(_held("g1", "g2"))[0] == [_Req("g1"), _Req("g2")] and w.repeated == set()
    now[0] = 20.0  # g2 came back meanwhile (a return would restart the quiet time: not modelled here)
    again, line = w.due(_held("g1", "g3"))
    assert again == [_Req("g1"), _Req("g3")] and w.repeated == {"g1"}
    assert line.endswith(
        "are sent again (runtime.worker_timeout_s=10); g1 sent before: to another worker, if there is one"
    )
    now[0] = 30.0
    assert w.due(_held("g4"))[0] == [_Req("g4")] and w.repeated == set()


def test_nothing_in_flight_is_nothing_to_send_and_long_lists_are_cut() -> None:
    now = [0.0]
    w = _watch(now)
    w.waiting(True)
    now[0] = 99.0
    assert w.due({}) == ([], None) and w.resent == 0
    again, line = w.due(_held(*(f"g{i}" for i in range(7))))
    assert len(again) == 7 and "(g0, g1, g2, g3, g4, ...)" in line and "none of the 7 group(s)" in line


def test_a_worker_sent_a_group_it_still_generates_keeps_one_copy() -> None:
    import queue
    import threading

    from scripted_worker import StillWeights
    from tiny_args import TINY

    from streamrl.config import load_config, to_dict
    from streamrl.data.prompts import render_prompt_ids
    from streamrl.models import load_tokenizer, resolve_model_dir
    from streamrl.rollout.worker import STOP, GroupRequest, serve
    from streamrl.tasks import task_from_config

    cfg = load_config(None, [*TINY, "rollout.dynamic_sampling=false"])
    tokenizer = load_tokenizer(resolve_model_dir(cfg.model, cfg.seed))
    stream = task_from_config(cfg).train_stream(cfg.seed, set())
    requests: queue.Queue = queue.Queue()
    results: queue.Queue = queue.Queue()
    a, b = next(stream), next(stream)
    first = GroupRequest("g0", a, render_prompt_ids(tokenizer, a.messages), 4, 0)
    for req in (first, first, GroupRequest("g1", b, render_prompt_ids(tokenizer, b.messages), 4, 0)):
        requests.put(req)  # g0 twice: sent again while the worker generates it
    worker = threading.Thread(
        target=serve, args=(0, to_dict(cfg), requests, results, StillWeights(), lambda: False)
    )
    worker.start()
    try:
        out = [results.get(timeout=120) for _ in range(2)]
    finally:
        requests.put(STOP)
        worker.join(timeout=60)
    assert not [r.error for r in out if r.error]
    assert sorted(r.group_id for r in out) == ["g0", "g1"]
    assert [len(r.group.trajectories) for r in out] == [4, 4]
    assert results.empty()  # no second g0


def test_local_workers_get_the_copy_of_a_group_they_hold() -> None:
    """A copy goes to the worker holding the group (which ignores it while it generates it), not to the
    least-loaded one, which would generate it a second time; a group no worker holds goes to the
    least-loaded."""
    import queue
    from types import SimpleNamespace

    from streamrl.config import load_config
    from streamrl.placement.backend import LocalRollouts

    backend = LocalRollouts(load_config(None, ["runtime.elastic_cores=fixed"]), lambda *a: None)
    busy = SimpleNamespace(held=_held("g1", "g2", "g3"), requests=queue.Queue())
    idle = SimpleNamespace(held=_held("g4"), requests=queue.Queue())
    backend.workers = [idle, busy]
    backend.resend(_Req("g2"))
    assert [busy.requests.get_nowait().group_id] == ["g2"] and idle.requests.empty()
    assert set(busy.held) == {"g1", "g2", "g3"} and set(idle.held) == {"g4"}
    backend.resend(_Req("g9"))  # came back meanwhile, or never reached a worker
    assert idle.requests.get_nowait().group_id == "g9" and "g9" in idle.held and busy.requests.empty()
    backend.resend(_Req("g2"), elsewhere=True)  # its worker is stuck on it: another one generates it
    assert idle.requests.get_nowait().group_id == "g2" and "g2" in idle.held and busy.requests.empty()
    backend._returned(_Req("g2"))  # one copy came back: neither worker holds it any more
    assert "g2" not in idle.held and "g2" not in busy.held
    backend.workers = [busy]
    backend.resend(_Req("g3"), elsewhere=True)  # no other worker: its own
    assert busy.requests.get_nowait().group_id == "g3"


def test_ray_actors_get_the_copy_of_a_group_they_hold() -> None:
    from streamrl.config import load_config
    from streamrl.placement.ray_rollouts import RayRollouts

    backend = RayRollouts(load_config(None, ["runtime.backend=ray", "runtime.rollout_workers=3"]))
    backend.held = [_held("g4"), _held("g1", "g2"), {}]
    backend.outbox = [[], [], [_Req("g5")]]
    backend.resend(_Req("g2"))
    assert [[r.group_id for r in box] for box in backend.outbox] == [[], ["g2"], ["g5"]]
    backend.resend(_Req("g5"))  # not sent yet: the copy waiting in the outbox is the one
    assert [[r.group_id for r in box] for box in backend.outbox] == [[], ["g2"], ["g5"]]
    backend.retired = {1}  # its actor is gone for good: a group it held goes to a live one
    backend.resend(_Req("g1"))
    assert [[r.group_id for r in box] for box in backend.outbox] == [["g1"], ["g2"], ["g5"]]
    backend.retired, backend.outbox = set(), [[], [], []]
    backend.resend(_Req("g4"), elsewhere=True)  # its actor is stuck on it: the least-loaded other one
    assert [[r.group_id for r in box] for box in backend.outbox] == [[], [], ["g4"]]


def test_a_dead_actors_groups_are_dispatched_again_once_each() -> None:
    """A copy sent again waits in the outbox of the actor that also holds the group: when that actor
    dies, the group is dispatched again once, and not at all if its restart already has it."""
    from streamrl.config import load_config
    from streamrl.placement.ray_rollouts import RayRollouts

    backend = RayRollouts(load_config(None, ["runtime.backend=ray", "runtime.rollout_workers=2"]))
    backend.held = [_held("g1", "g2"), {}]
    backend.outbox = [[_Req("g2"), _Req("g3")], []]
    backend._redispatch(0)
    assert sorted(r.group_id for box in backend.outbox for r in box) == ["g1", "g2", "g3"]
    assert backend.redispatched == 3
    backend.held = [_held("g1", "g2"), {}]
    backend.outbox = [[_Req("g2")], []]
    backend._redispatch(0, keep={"g2"})  # its new incarnation has g2
    assert sorted(r.group_id for box in backend.outbox for r in box) == ["g1"]


def test_an_actor_restarted_between_two_calls_has_one_call_in_flight(monkeypatch) -> None:
    """A reply from a new incarnation (the actor died and Ray restarted it between two calls) counts
    one death and leaves one exchange in flight to the slot, as every other reply does."""
    import ray

    from streamrl.config import load_config
    from streamrl.placement.ray_rollouts import RayRollouts

    class Remote:
        def __init__(self, fn) -> None:
            self.remote = fn

    class Actor:
        def __init__(self) -> None:
            self.exchange = Remote(lambda reqs, wait: object())
            self.announce = Remote(lambda *a: None)

    backend = RayRollouts(load_config(None, ["runtime.backend=ray", "runtime.rollout_workers=1"]))
    backend.actors = [Actor()]
    backend.publisher = type("P", (), {"announcement": lambda self: (0, [])})()
    replies: dict = {}
    monkeypatch.setattr(ray, "wait", lambda refs, **kw: (list(refs), []))
    monkeypatch.setattr(ray, "get", lambda ref: replies[ref])
    backend._exchange(0)
    [first] = backend.pending
    replies[first] = ("incarnation-1", [])
    assert backend.poll(0.01) == [] and len(backend.pending) == 1
    [second] = backend.pending
    replies[second] = ("incarnation-2", [])  # restarted between the two calls
    backend.poll(0.01)
    assert (len(backend.pending), backend.deaths, backend.restarts) == (1, [1], 1)
    assert backend.incarnation == ["incarnation-2"]
