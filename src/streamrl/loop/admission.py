"""Admission: the asynchronous loop's side that feeds the rollout workers and takes their results in.

One thread (`start`) asks the staleness manager for a slot, draws the next request (a carried-over
one first, else the stream's next problem), submits it, and accepts the groups that come back into
the buffer the trainer takes its batches from (loop/asynchronous.py); groups that never come back are
sent again (loop/stall.py). A failure reaches the trainer thread through `sh.errors`.

Thread-safety: `sh.cond` (loop/shared.py) guards everything this class touches that the trainer
thread touches too: the buffer, the requests in flight, the errors and counters of `sh`, `readmit`,
the run state's draw counters and the stream, the ledger, the draft store, the episode errors, the
dynamic-sampling filter, the stall watch and the carry-over mark. `next_request` and `stop_drawing`
are called under it; `accept` takes it. The staleness manager has its own lock, and the backend is
called outside `sh.cond` (a submit or a poll may wait on a worker). `published` is written by the
trainer thread alone, one assignment, after the weights reached the workers.
"""

from __future__ import annotations

import sys
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from streamrl.data.prompts import render_prompt_ids
from streamrl.loop.shared import LoopParts
from streamrl.rollout.trajectory import RolloutSettings
from streamrl.rollout.worker import GroupRequest, GroupResult
from streamrl.types import Group


class Admission:
    """Admits requests under the staleness bound and accepts their results (see the module's text).

    `parts` holds the pieces shared with the trainer side (the runner's); this class owns the requests
    to re-admit (`readmit`, the state's unfinished ones), the newest published version and its thread."""

    def __init__(
        self,
        parts: LoopParts,
        *,
        tokenizer: Any,
        settings: RolloutSettings,
        on_group_scored: Callable[[Group], None] | None,
        published: int,
    ) -> None:
        self.parts, self.tokenizer, self.settings = parts, tokenizer, settings
        self.sh = parts.sh  # the one every method takes its lock from
        self.on_group_scored = on_group_scored  # the sampler's feedback on each returned group
        self.readmit: deque[GroupRequest] = deque(parts.state.unfinished)
        self.published = published  # the newest weights the workers can load (the trainer sets it)
        self._stopping = threading.Event()
        self._carried = False  # the state holds the carry-over: nothing more is drawn (sh.cond)
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Run the admission loop on a thread of its own."""
        self._thread = threading.Thread(target=self.run, daemon=True)
        self._thread.start()

    def stop(self, timeout: float) -> None:
        """Tell the loop to end and wait up to `timeout` seconds for its thread (if started)."""
        self._stopping.set()
        if self._thread is not None:
            self._thread.join(timeout=timeout)

    def stop_drawing(self) -> None:
        """The run state holds the carry-over now: a thread that outlived `stop` draws no more, which
        would advance the saved sampler unrecorded (under sh.cond)."""
        self._carried = True

    def next_request(self) -> GroupRequest:
        """A carried-over request first, else a new one for the stream's next problem (under sh.cond)."""
        p = self.parts
        if self.readmit:
            req = self.readmit.popleft()
            p.ledger.requeue(req.group_id, "running")
        else:
            problem = next(p.stream)
            p.state.problems_drawn += 1
            gid = f"g{p.state.groups_made}"
            p.state.groups_made += 1
            ids = render_prompt_ids(self.tokenizer, problem.messages)
            req = GroupRequest(gid, problem, ids, self.settings.samples, 0, self.settings.greedy_baseline)
            if p.drafts is not None:
                req.drafts = p.drafts.drafts(problem.id)
            p.ledger.admitted(gid)
        # the published version: the trainer's own runs ahead between its update and the publish, and a
        # request admitted under it would make its worker reload the old weights every decode step
        req.admitted_version = self.published
        return req

    def run(self) -> None:
        """The admission loop, until `stop`; an exception is handed to the trainer thread (sh.errors)."""
        p = self.parts
        try:
            while not self._stopping.is_set():
                while not self._stopping.is_set() and p.staleness.try_admit():
                    with self.sh.cond:
                        if self._carried:  # a draw now would advance the saved sampler, unrecorded
                            return
                        req = self.next_request()
                        self.sh.inflight[req.group_id] = req
                    p.backend.submit(req)
                for res in p.backend.poll(0.05):
                    self.accept(res)
                with self.sh.cond:
                    again, warning = p.stall.due(self.sh.inflight)
                for req in again:  # the first copy back counts (accept), later ones are duplicates
                    p.backend.resend(req, elsewhere=req.group_id in p.stall.repeated)
                if warning:
                    print(warning, file=sys.stderr, flush=True)
        except Exception as e:  # a backend failure must reach the trainer thread, not die silently
            with self.sh.cond:
                self.sh.errors.append(f"rollout admission failed: {type(e).__name__}: {e}")
                self.sh.cond.notify_all()

    def accept(self, res: GroupResult) -> None:
        """A worker's result: its counters, then the group into the buffer, filtered or dropped as a
        duplicate (takes sh.cond, notifies the trainer)."""
        p = self.parts
        with self.sh.cond:
            # the work behind every result counts, a duplicate's too (the counters run since the
            # worker's previous result)
            self.sh.busy += res.busy_s
            self.sh.idle += res.idle_s
            self.sh.generated += res.tokens
            self.sh.rows += res.rows
            self.sh.cache_rows += res.cache_rows
            if res.error:
                self.sh.errors.append(f"rollout worker {res.worker} failed:\n{res.error}")
            elif res.group_id not in self.sh.inflight:
                # already returned (a dead actor's group was re-generated and both copies arrived):
                # the first copy counts, this one is dropped, so no group is trained twice
                self.sh.duplicates += 1
            else:
                group = res.group
                assert group is not None
                # what can raise (the sampler's feedback, the filter, the draft store, the episode
                # counts) runs first: a group it fails on stays in flight, a stop carries it over to be
                # generated again, and the error reaches the trainer (run). The drafts before the
                # counts: a group generated again only refreshes its drafts, but would count twice
                if group.trajectories and self.on_group_scored is not None:
                    self.on_group_scored(group)
                keep = bool(group.trajectories) and p.sampling.keep(group)
                if p.drafts is not None:
                    p.drafts.add(group)
                p.episode_errors.add(group)  # all or nothing
                del self.sh.inflight[res.group_id]
                p.stall.returned()
                p.ledger.returned(res.group_id)
                if not group.trajectories:  # agents that made no call: nothing to train on
                    p.ledger.filtered(res.group_id, "no_calls")
                    p.staleness.on_return(kept=False)
                elif not keep:
                    # its slot goes to a new group at once, so the engine refills while the trainer trains
                    p.ledger.filtered(res.group_id, "zero_variance")
                    p.staleness.on_return(kept=False)
                else:
                    p.staleness.on_return(kept=True)
                    self.sh.buffer.append(res)
            self.sh.cond.notify_all()
