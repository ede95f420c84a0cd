"""Thread-safe fronts for engines: many callers (agents, HTTP handlers), futures for their results.

BatchingEngine (colocated): a background thread takes every request pending at that moment and runs
them through `engine.generate` as one batch, so concurrent agents share forward passes instead of
queueing behind each other. DecoderFront (the async rollout worker): requests join the worker's
continuous decoder between its steps, next to the groups it is generating.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import threading
from collections.abc import Callable
from concurrent.futures import Future, InvalidStateError
from typing import Any

from streamrl.engine.base import GenRequest, GenResult, generate


class BatchingEngine:
    """engine: anything with `generate(list[GenRequest]) -> list[GenResult]` and a `version`; with
    `stop`, its generate takes a `stop` callable too (asked before each decode step: once it says True,
    the batch's unfinished requests end with finish_reason "abort").

    close() returns only once no batch runs: the colocated trainer updates the weights this engine
    decodes with right after. An engine whose generate takes a `stop` aborts the running batch at its
    next decode step; another finishes it (at most max_new_tokens steps)."""

    def __init__(self, engine: Any, max_batch: int = 64, stop: Callable[[], bool] | None = None) -> None:
        self.engine = engine
        self.max_batch = max_batch
        self.stop = stop
        self._stops = "stop" in inspect.signature(engine.generate).parameters  # can end a batch early
        self._pending: list[tuple[GenRequest, Future[GenResult]]] = []
        self._cond = threading.Condition()
        self._closed = False
        self._engine_lock = threading.Lock()  # weights never change in the middle of a batch
        self.batches = 0  # decode loops run: fewer than requests when callers overlap
        self._thread = threading.Thread(target=self._loop, name="batching-engine", daemon=True)
        self._thread.start()

    @property
    def version(self) -> int:
        return int(self.engine.version)

    def submit(self, request: GenRequest) -> Future[GenResult]:
        fut: Future[GenResult] = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("BatchingEngine is closed")
            self._pending.append((request, fut))
            self._cond.notify()
        return fut

    def generate_one(self, request: GenRequest, timeout: float | None = None) -> GenResult:
        return self.submit(request).result(timeout=timeout)

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._pending and not self._closed:
                    self._cond.wait()
                if self._closed and not self._pending:
                    return
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            # a caller that cancelled (an HTTP handler cancelled at the proxy's shutdown) is not generated;
            # the rest run, and can no longer be cancelled, so setting their results below cannot fail
            batch = [(req, fut) for req, fut in batch if fut.set_running_or_notify_cancel()]
            if not batch:
                continue
            try:
                with self._engine_lock:
                    reqs = [req for req, _ in batch]
                    results = generate(self.engine, reqs, self._stop_now if self._stops else self.stop)
            except Exception as e:  # every caller of this batch sees the error; the loop keeps serving
                for _, fut in batch:
                    fut.set_exception(e)
                continue
            self.batches += 1
            for (_, fut), res in zip(batch, results):
                fut.set_result(res)

    @property
    def owns_weights(self) -> bool:
        return bool(getattr(self.engine, "owns_weights", False))

    def update_weights(self, state: dict[str, Any] | None, version: int) -> None:
        """Between batches: no response mixes two policy versions unless the engine itself does."""
        with self._engine_lock:
            self.engine.update_weights(state, version)

    def _stop_now(self) -> bool:
        return self._closed or (self.stop is not None and self.stop())

    def close(self) -> None:
        """Fail the requests not started, abort (or finish) the running batch, and return once it ended."""
        with self._cond:
            self._closed = True
            pending, self._pending = self._pending, []
            self._cond.notify_all()
        for _, fut in pending:
            if fut.set_running_or_notify_cancel():
                fut.set_exception(RuntimeError("the engine was closed before this call was generated"))
        self._thread.join()


class DecoderFront:
    """Requests from other threads (the chat proxy's handlers) for a Decoder that one loop steps.

    `submit` (any thread) queues a request and returns its future; the loop that owns the decoder takes
    the new requests with `drain()` (tagged ("front", n)), hands them to `decoder.add`, and gives every
    finished result to `resolve`, which completes the future if the result is one of ours. `close`
    fails the futures still open, so callers waiting on them return.
    """

    TAG = "front"

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._new: list[GenRequest] = []
        self._open: dict[int, Future[GenResult]] = {}
        self._count = 0
        self._closed = False

    def submit(self, request: GenRequest) -> Future[GenResult]:
        fut: Future[GenResult] = Future()
        with self._lock:
            if self._closed:
                raise RuntimeError("the rollout worker is stopping")
            self._count += 1
            self._open[self._count] = fut
            self._new.append(dataclasses.replace(request, tag=(self.TAG, self._count)))
        return fut

    def drain(self) -> list[GenRequest]:
        """The requests submitted since the last drain, but those whose callers cancelled them; the
        ones returned can no longer be cancelled (their futures run)."""
        with self._lock:
            new, self._new = self._new, []
            taken = []
            for req in new:
                if self._open[req.tag[1]].set_running_or_notify_cancel():
                    taken.append(req)
                else:  # cancelled by its caller: forgotten, never generated
                    del self._open[req.tag[1]]
        return taken

    def owns(self, res: GenResult) -> bool:
        tag = res.request.tag
        return isinstance(tag, tuple) and len(tag) == 2 and tag[0] == self.TAG

    def resolve(self, res: GenResult) -> None:
        with self._lock:
            fut = self._open.pop(res.request.tag[1])
        fut.set_result(res)

    @property
    def pending(self) -> int:
        with self._lock:
            return len(self._open)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            open_futures, self._open, self._new = list(self._open.values()), {}, []
        for fut in open_futures:
            with contextlib.suppress(InvalidStateError):  # cancelled by its caller meanwhile: nothing to tell
                fut.set_exception(RuntimeError("the rollout worker stopped before this call was generated"))
