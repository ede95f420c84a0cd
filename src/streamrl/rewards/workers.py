"""The worker side of RewardService: the scoring loop, run in a spawned process or a thread.

Protocol over one duplex pipe per worker: the worker sends ("ready",) once started; the parent sends
(task id, args, seconds the score may take) one at a time, or None to stop; the worker answers
(task id, "ok", reward, info, {}) or (task id, "err", reason, detail, kept): kept is what a ScoreFailed
carried (the task's verdict when only your own function failed). Mid-score, a scorer may send ("kept",
task id, info) through keep_on_failure: what survives if the rest of the score hangs past its deadline
or its worker dies. Scorer exceptions never leave the worker as exceptions. A scorer that runs steps
of its own (the code task's tests) asks `time_left()` between them: a thread worker's score runs on
after the service gave up on it (a thread cannot be killed), so it stops there instead of doing work
nobody reads.
"""

from __future__ import annotations

import math
import multiprocessing as mp
import pickle
import signal
import threading
import time
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from streamrl.observe.error_examples import fit_message

# of the task this thread is scoring: send (keep_on_failure), deadline and cancel (time_left)
_current = threading.local()


def time_left() -> float:
    """Seconds the score this thread is running has before the service gives up on it: math.inf outside
    a service's worker (or in another thread), 0.0 once the service gave up (its deadline passed, or
    a thread worker was abandoned: replaced at its timeout, or the service closed without waiting)."""
    cancel = getattr(_current, "cancel", None)
    if cancel is not None and cancel.is_set():
        return 0.0
    return max(0.0, getattr(_current, "deadline", math.inf) - time.monotonic())


def keep_on_failure(info: dict[str, Any]) -> None:
    """Called by a scorer mid-score: `info` goes into the outcome if the rest of the score times out or
    kills its worker (the task's verdict before your own functions run). A no-op outside a worker."""
    send = getattr(_current, "send", None)
    if send is not None:
        send(dict(info))


class ScoreFailed(Exception):
    """A scorer's failure that keeps part of its result: `info` (e.g. {"correct": the task's verdict}
    when only your own reward function failed) goes into the failed outcome's info."""

    def __init__(self, cause: BaseException, info: dict[str, Any]) -> None:
        super().__init__(str(cause))
        self.cause, self.info = cause, info


def call_scorer(scorer: Callable[..., Any], args: tuple) -> tuple:
    """-> ("ok", reward, info, {}) | ("err", reason, detail, kept). Runs in the worker. detail: the
    exception's message as fit_message leaves it (what crosses the pipe is bounded); the message the
    step record keeps (score.error_message) may cut it further for its reason and where, and reads as if
    cut once: fit_message keeps no more of a detail than this did."""
    try:
        out = scorer(*args)
        reward, info = out if isinstance(out, tuple) else (out, {})
        reward = float(reward)
        if not math.isfinite(reward):
            raise ValueError(f"scorer returned a non-finite reward ({reward})")
        return ("ok", reward, dict(info), {})
    except ScoreFailed as e:
        return ("err", error_label(e.cause), fit_message("", str(e.cause)), dict(e.info))
    except (Exception, SystemExit) as e:  # SystemExit too: sys.exit() in a scorer is one bad reward
        return ("err", error_label(e), fit_message("", str(e)), {})


def check_picklable(scorer: Callable[..., Any]) -> None:
    """ValueError of one line unless `scorer` can travel to a worker process (mode='process')."""
    try:
        pickle.dumps(scorer)
    except Exception as e:
        raise ValueError(
            f"scorer_fn cannot be pickled for mode='process' ({e}); define it at module top level "
            "(or as a top-level class instance), or use mode='thread'"
        ) from None


def error_label(e: BaseException) -> str:
    """The reason a failed score is counted under: the exception's type, and a judge's own reason
    after it ("JudgeError/timeout", "JudgeError/http 500"), so a dead endpoint and an unreadable
    verdict are told apart."""
    from streamrl.rewards.judge import JudgeError

    return f"JudgeError/{e.reason}" if isinstance(e, JudgeError) else type(e).__name__


def serve(scorer: Callable[..., Any], conn: Connection, cancel: threading.Event | None = None) -> None:
    """Worker loop (process or thread): set up (a scorer's optional `setup()`: importing your functions,
    building the task, within the service's start_timeout_s rather than the first score's timeout_s),
    announce readiness, then (task id, args, seconds) in, result out. cancel: a thread worker's, set
    when the service abandons it (time_left)."""
    _current.cancel = cancel
    try:
        if (setup := getattr(scorer, "setup", None)) is not None:
            try:
                setup()
            except Exception:  # each score will fail the same way, and say why
                pass
        conn.send(("ready",))
        while True:
            msg = conn.recv()
            if msg is None:
                return
            tid, args, budget_s = msg
            _current.send = lambda info, tid=tid: conn.send(("kept", tid, info))
            _current.deadline = time.monotonic() + budget_s
            result = call_scorer(scorer, args)
            _current.send, _current.deadline = None, math.inf
            try:
                conn.send((tid, *result))
            except (pickle.PicklingError, TypeError, AttributeError) as e:  # pickled before any byte is sent
                conn.send((tid, "err", "UnpicklableResult", f"scorer info could not be sent: {e}", {}))
    except (EOFError, OSError):  # parent gone, or this thread was abandoned after a timeout
        return
    finally:
        conn.close()


def _ignore(signum: int, frame: object) -> None:
    """A SIGTERM to the whole job: the parent decides when this process stops."""


def process_main(scorer: Callable[..., Any], conn: Connection) -> None:
    # Ctrl-C, and a SIGTERM sent to the whole group (Slurm, systemd), reach this process too: the parent
    # decides when it stops, and scores what is in flight meanwhile
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a handler, not SIG_IGN: a program your reward function starts keeps SIGTERM's default action
    signal.signal(signal.SIGTERM, _ignore)
    signal.siginterrupt(signal.SIGTERM, False)  # system calls under way resume rather than fail
    serve(scorer, conn)


@dataclass
class Task:
    tid: int
    args: tuple
    key: Hashable | None
    future: Future
    submitted: float


class Worker:
    """One process or thread with its pipe, its current task and that task's deadline."""

    def __init__(self, ctx: Any, scorer: Callable[..., Any], mode: str, name: str) -> None:
        self.conn, child = mp.Pipe()
        self.proc: Any = None
        self.cancel = threading.Event()  # a thread worker's: set when it is abandoned (time_left)
        if mode == "process":
            self.proc = ctx.Process(target=process_main, args=(scorer, child), name=name, daemon=True)
            self.proc.start()
            child.close()  # only the worker holds its end: the parent sees EOF when it dies
        else:
            threading.Thread(target=serve, args=(scorer, child, self.cancel), name=name, daemon=True).start()
        self.ready = False
        self.task: Task | None = None
        self.kept: dict[str, Any] = {}  # what the current task's scorer kept (keep_on_failure)
        self.deadline = math.inf
        self.started = time.monotonic()

    def waitables(self) -> list[Any]:
        return [self.conn] if self.proc is None else [self.conn, self.proc.sentinel]

    def kill(self) -> None:
        self.cancel.set()  # a thread cannot be killed: its score stops at its next time_left()
        if self.proc is not None and self.proc.is_alive():
            self.proc.kill()  # SIGKILL: a scorer stuck in C code or ignoring SIGTERM still stops
            self.proc.join(5)
        self.conn.close()

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        if self.proc is not None:
            self.proc.join(2)
        self.kill()
