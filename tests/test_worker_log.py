"""placement/worker_log.py: what a dead rollout worker's restart or failure message quotes from its log,
and the Ray controller's death event that quotes it."""

from __future__ import annotations

from types import SimpleNamespace

from streamrl.placement.ray_rollouts import RayRollouts
from streamrl.placement.worker_log import incarnation_tail, start_line

FIRST = start_line(0, "aaa")
SECOND = start_line(0, "bbb")


def test_the_tail_of_an_incarnation_stops_at_its_restarts_start_line(tmp_path):
    log = tmp_path / "rollout-worker0.log"
    log.write_text(f"{FIRST}loading\nTraceback: boom\n{SECOND}loading again\n")
    assert incarnation_tail(log, "aaa") == repr("loading\nTraceback: boom")
    assert incarnation_tail(log, "bbb") == repr("loading again")
    assert incarnation_tail(log, "aaa", n=4) == repr("boom")


def test_an_incarnation_that_wrote_nothing_or_is_not_in_the_log(tmp_path):
    assert incarnation_tail(tmp_path / "missing.log", "aaa") == "(no log)"
    log = tmp_path / "rollout-worker0.log"
    log.write_text(f"{FIRST}{SECOND}--- not a start line\n")
    assert incarnation_tail(log, "aaa") == "(nothing)"
    assert incarnation_tail(log, "bbb") == repr("--- not a start line")
    assert incarnation_tail(log, "ccc") == "(no log)"
    assert incarnation_tail(log, "") == "(no log)"


class _Call:
    def remote(self, *args):
        return object()


def test_a_dead_actors_event_quotes_its_own_stderr(tmp_path, capsys, monkeypatch):
    import streamrl.placement.ray_rollouts as rr

    monkeypatch.setattr(rr, "resolved_weight_sync", lambda cfg: "object_store")
    cfg = SimpleNamespace(
        runtime=SimpleNamespace(rollout_workers=2, sync_timeout_s=10.0),
        ray=SimpleNamespace(max_restarts=1),
        run_dir=str(tmp_path),
    )
    ctl = RayRollouts(cfg)
    ctl.actors = [SimpleNamespace(announce=_Call(), exchange=_Call()) for _ in range(2)]
    ctl.publisher = SimpleNamespace(announcement=lambda: ())
    (tmp_path / "rollout-worker0.log").write_text(f"{FIRST}CUDA error: out of memory\n{SECOND}")
    ctl._on_death(0, RuntimeError("actor died unexpectedly\nmore"), dead="aaa")
    ctl._on_death(0, RuntimeError("again"), dead="bbb")
    quoted = repr("CUDA error: out of memory")
    assert ctl.events == [
        f"rollout actor 0 died (actor died unexpectedly); restarted (1 of 1), 0 group(s) re-dispatched; "
        f"its stderr ended: {quoted}",
        "rollout actor 0 died (again); retired, 0 group(s) re-dispatched; its stderr ended: (nothing)",
    ]
    assert capsys.readouterr().err.count("streamrl: rollout actor 0 died") == 2
    ctl._on_death(1, RuntimeError("gone"), dead=None)
    ctl._on_death(1, RuntimeError("gone"), dead=None)
    assert ctl.events[-1] == "rollout actor 1 died (gone); retired, 0 group(s) re-dispatched"
    assert ctl.fatal == "all 2 rollout actors died (ray.max_restarts=1 each); last: gone"
