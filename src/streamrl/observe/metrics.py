"""One metrics stream: every step's dict goes to metrics.jsonl (the source of truth the report and the
diagnostics read), to TensorBoard scalars, and to any extra sinks (W&B)."""

from __future__ import annotations

import contextlib
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol


def sync_file(f: Any) -> None:
    """Flush an open log and fsync it: lines as old as a saved run state survive a power loss too."""
    if not f.closed:
        f.flush()
        os.fsync(f.fileno())


NON_FINITE_KEY = "non_finite"  # a metrics.jsonl line's keys whose value was NaN or infinite (written as null)


def nan_or_inf_keys(row: dict[str, Any]) -> list[str]:
    """The top-level keys of a metrics row whose value is a NaN or infinite float, in the row's order (an
    int or bool is always finite; the tables a row nests, counts by reason, hold ints)."""
    return [k for k, v in row.items() if isinstance(v, float) and not math.isfinite(v)]


def _finite_or_none(v: Any) -> Any:
    """v with every NaN or infinite float, nested ones too, replaced by None."""
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite_or_none(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite_or_none(x) for x in v]
    return v


def json_line(record: dict[str, Any]) -> str:
    """The record as one line of strict JSON: a NaN or infinite number (which JSON has no word for) is
    written as null, and the top-level keys that held one are listed under NON_FINITE_KEY, so a reader
    of the file still sees that the run logged them (observe/run_data.py read_metrics)."""
    bad = nan_or_inf_keys(record)
    row = _finite_or_none(record)
    if bad:
        row[NON_FINITE_KEY] = bad
    return json.dumps(row, allow_nan=False)


class Sink(Protocol):
    def write(self, record: dict[str, Any]) -> None: ...
    def close(self) -> None: ...


class MetricsWriter:
    def __init__(
        self,
        run_dir: Path,
        tensorboard: bool = True,
        sinks: Sequence[Sink] = (),
        purge_step: int | None = None,
    ) -> None:
        """purge_step: a resumed run's first step; TensorBoard drops the events it had logged from there."""
        self._sinks = list(sinks)
        self.path = run_dir / "metrics.jsonl"
        self._file = self.path.open("a", buffering=1)  # line-buffered: a crash loses at most one line
        self._tb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(log_dir=str(run_dir / "tensorboard"), purge_step=purge_step)

    def write(self, record: dict[str, Any]) -> None:
        self._file.write(json_line(record) + "\n")  # the record itself is not changed: the live
        # diagnostics read it next, with its NaN and infinite values
        if self._tb is not None:
            step = int(record["step"])
            for k, v in record.items():
                if (
                    k != "step"
                    and isinstance(v, (int, float))
                    and not isinstance(v, bool)
                    and math.isfinite(v)
                ):
                    self._tb.add_scalar(k, v, step)
        for sink in self._sinks:
            sink.write(record)

    def sync(self) -> None:
        """metrics.jsonl on disk and TensorBoard's pending events written out (its writer does so on its
        own only every two minutes): both as of the state being saved."""
        sync_file(self._file)
        flush = getattr(self._tb, "flush", None)  # None without TensorBoard
        if flush is not None:
            flush()

    def close(self) -> None:
        """Each part is closed whatever another raises (an error is raised once all were tried)."""
        with contextlib.ExitStack() as closing:
            for sink in reversed(self._sinks):
                closing.callback(sink.close)
            if self._tb is not None:
                closing.callback(self._tb.close)
            closing.callback(self._file.close)
            self.sync()


class GroupLog:
    """groups.jsonl: one line per trained group (id, problem, rewards, versions): the audit trail that
    exactly-once accounting is checked against, and a place to read what the policy wrote."""

    def __init__(self, path: Path) -> None:
        self._file = path.open("a", buffering=1)

    def write(self, groups: list[Any], step: int, advantages: Sequence[float] | None = None) -> None:
        """advantages: one per trajectory, in the groups' order (None: token-level, not logged)."""
        start = 0
        for g in groups:
            versions = [v for t in g.trajectories for v in t.versions] or [0]
            row = {
                "step": step,
                "group_id": g.trajectories[0].group_id,
                "problem_id": g.problem.id,
                "rewards": g.rewards,
                "version_min": min(versions),
                "version_max": max(versions),
                "sample": g.trajectories[0].text[:200],
            }
            if advantages is not None:
                row["advantages"] = list(advantages[start : start + len(g.trajectories)])
                start += len(g.trajectories)
            if getattr(g, "baseline", None) is not None:
                row["greedy_reward"] = g.baseline.reward
            self._file.write(json.dumps(row) + "\n")

    def sync(self) -> None:
        sync_file(self._file)

    def close(self) -> None:
        self.sync()
        self._file.close()
