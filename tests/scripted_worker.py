"""A rollout worker without a model: random delays, random rewards, versions as a real engine stamps
them. Importable by spawned processes (it lives in its own module)."""

from __future__ import annotations

import os
import queue
import random
import signal
import struct
import threading
import time
from typing import Any

from streamrl.config import Config, to_dict
from streamrl.rollout.worker import STOP, GroupRequest, GroupResult, _loop
from streamrl.types import Group, Trajectory


def scripted_worker(
    worker_id: int, cfg_dict: dict[str, Any], requests: Any, results: Any, weights: Any, threads: int
) -> None:
    seed = cfg_dict["seed"] * 100 + worker_id
    rng = random.Random(seed)
    constant = os.environ.get("SCRIPTED_CONSTANT_REWARD") == "1"  # a saturated task
    scale = float(os.environ.get("SCRIPTED_DELAY_SCALE", "1"))  # slower groups: more in flight at a time
    hold_from = int(os.environ.get("SCRIPTED_HOLD_FROM", "-1"))  # groups g<N>, N >= this, never finish
    running: list[tuple[float, Any, list[int]]] = []  # (finish time, request, versions so far)
    hang = os.environ.get("SCRIPTED_HANG_FILE", "")  # while this file exists, worker 0's loop is stuck
    starting = os.environ.get("SCRIPTED_STARTUP_FILE", "")  # while this file exists, no worker has started
    # "GROUP:FILE": the first worker to take GROUP drops it (a bug that loses it) and creates FILE
    drop_group, _, dropped = os.environ.get("SCRIPTED_DROP_ONCE", "").partition(":")
    # "GROUP:FILE": the first worker to take GROUP never finishes it (stuck on it, still beating)
    stuck_group, _, stuck = os.environ.get("SCRIPTED_STUCK_ONCE", "").partition(":")
    # FILE: worker 0 dies (SIGKILL) in the middle of sending its first result, once (FILE created then)
    torn = os.environ.get("SCRIPTED_TORN_ONCE", "")
    while starting and os.path.exists(starting):
        time.sleep(0.02)  # imports and a model load: the request queue is not polled yet
    while True:
        while worker_id == 0 and hang and os.path.exists(hang):
            time.sleep(0.05)  # a deadlock: the process and its threads live on, the loop does not
        try:
            item = requests.get(timeout=0.002)
            if item == STOP:
                return
            if any(r.group_id == item.group_id for _, r, _ in running):
                continue  # sent again while still generated: one copy, as serve()'s take does
            if item.group_id == drop_group and not os.path.exists(dropped):
                open(dropped, "w").close()  # noqa: SIM115
                continue
            delay = rng.expovariate(1 / 0.01) * (15 if rng.random() < 0.15 else 1) * scale  # long tail
            if 0 <= hold_from <= int(item.group_id.lstrip("g")):
                delay = float("inf")  # in flight until the worker is stopped
            if item.group_id == stuck_group and not os.path.exists(stuck):
                open(stuck, "w").close()  # noqa: SIM115
                delay = float("inf")
            running.append((time.monotonic() + delay, item, []))
        except queue.Empty:
            pass
        now = time.monotonic()
        version = weights.version
        for _, req, versions in running:
            versions.append(max(version, req.admitted_version))  # one "token" per tick, in flight
        hold = os.environ.get("SCRIPTED_HOLD_FILE", "")  # while this file exists, nothing finishes
        if hold and os.path.exists(hold):
            continue  # what is due comes back once the file is gone
        done = [r for r in running if r[0] <= now]
        running = [r for r in running if r[0] > now]
        for _, req, versions in done:
            n = min(len(versions), 6) or 1
            vs = (versions[:1] + versions[-(n - 1) :]) if n > 1 else versions[:1] or [version]
            trajs = []
            for k in range(req.samples):
                comp = [rng.randrange(3, 200) for _ in vs]
                trajs.append(
                    Trajectory(
                        problem_id=req.problem.id,
                        group_id=req.group_id,
                        sample_id=f"{req.group_id}-{k}",
                        prompt_ids=req.prompt_ids,
                        completion_ids=comp,
                        behaviour_logprobs=[-5.0] * len(vs),
                        versions=list(vs),
                        finish_reason="stop",
                        reward=1.0 if constant else float(rng.random() < 0.5),
                    )
                )
                trajs[-1].correct = trajs[-1].reward == 1.0
            tokens = sum(len(t.completion_ids) for t in trajs)
            # a scripted engine that decoded every token on a row shared by two sequences
            done = GroupResult(req.group_id, Group(req.problem, trajs), worker_id, 0.01, tokens=tokens)
            done.rows, done.cache_rows = 2 * tokens, tokens
            if worker_id == 0 and torn and not os.path.exists(torn):
                open(torn, "w").close()  # noqa: SIM115
                # a message's length header and its first bytes, then killed: the reader has what it
                # needs to start reading it (and waits for the rest) before the process is gone
                os.write(results._writer.fileno(), struct.pack("!i", 1 << 20) + b"x" * 100)
                time.sleep(1.0)
                os.kill(os.getpid(), signal.SIGKILL)
            results.put(done)


def reporting_worker(
    worker_id: int, cfg_dict: dict[str, Any], requests: Any, results: Any, weights: Any, threads: int
) -> None:
    """Reports what a started worker finds: STREAMRL_TEST_MARK from its environment, HF_HOME as
    huggingface_hub read it at import, and whether the engine's modules were already imported before
    its target ran; then waits for STOP."""
    import sys

    from huggingface_hub import constants

    preloaded = "streamrl.engine.hf" in sys.modules
    results.put((os.environ.get("STREAMRL_TEST_MARK"), constants.HF_HOME, preloaded))
    while requests.get() != STOP:
        pass


def deaf_worker(
    worker_id: int, cfg_dict: dict[str, Any], requests: Any, results: Any, weights: Any, threads: int
) -> None:
    """Polls its requests once (so it counts as started), then never again: a stop request goes
    unread, as with a worker stuck in a decode step or waiting for cores."""
    try:
        requests.get_nowait()
    except queue.Empty:
        pass
    time.sleep(3600)


class StillWeights:
    """Shared weights that never change: a worker run in a thread keeps the weights it loaded (version 0)."""

    version = 0

    def load_into(self, model: Any) -> int:
        return 0

    def read(self, consume: Any) -> int:
        return 0


LATE_PAYLOAD = 300_000  # characters: several times a pipe's 64 KiB


def late_sender_worker(
    worker_id: int, cfg_dict: dict[str, Any], requests: Any, results: Any, weights: Any, threads: int
) -> None:
    """Waits for STOP, then sends one large result ("late", as a group of long answers finished just
    before the stop) and returns: its process exits only once that result has left the pipe."""
    while requests.get() != STOP:
        pass
    results.put(GroupResult("late", None, worker_id, extra={"payload": "x" * LATE_PAYLOAD}))


def failing_once_worker(
    worker_id: int, cfg_dict: dict[str, Any], requests: Any, results: Any, weights: Any, threads: int
) -> None:
    """The first process fails as serve() reports a failure: one error result, then a clean exit (code
    0). Its restart (SCRIPTED_FAILED_FILE exists) waits for STOP."""
    try:
        requests.get_nowait()  # a poll: the worker has started
    except queue.Empty:
        pass
    marker = os.environ["SCRIPTED_FAILED_FILE"]
    if not os.path.exists(marker):
        open(marker, "w").close()  # noqa: SIM115
        results.put(GroupResult("", None, worker_id, error="Traceback ...\nValueError: boom"))
        return
    while requests.get() != STOP:
        pass


def one_group_in_a_thread(
    cfg: Config, request: GroupRequest, weights: Any, timeout: float = 300
) -> GroupResult:
    """The rollout worker's loop (rollout/worker.py: _loop) run in a thread on one request -> its result;
    the loop is stopped and joined before returning."""
    requests: queue.Queue = queue.Queue()
    results: queue.Queue = queue.Queue()
    requests.put(request)
    worker = threading.Thread(
        target=_loop, args=(0, to_dict(cfg), requests, results, weights, lambda: False), daemon=True
    )
    worker.start()
    res = results.get(timeout=timeout)
    requests.put(STOP)
    worker.join(60)
    assert not worker.is_alive()
    return res
