"""The run directory: claimed once, refused when it already holds a run, reconciled on resume, and
saved into periodically so that a crash costs at most the steps since the last save."""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from streamrl.files import file_digest, sync_dir, write_text_atomic
from streamrl.loop.durable import recover
from streamrl.loop.state import STATE_DIR, RunState, StateSaveError, latest_state, same_save
from streamrl.observe.wandb_sink import rewind_wandb_run
from streamrl.preflight import check_run_dir
from streamrl.run_dirs import holds_run, no_state_message

LOGS = ("metrics.jsonl", "groups.jsonl")  # one line per step / per trained group, each with "step"


def claim_run_dir(run_dir: str, resume: bool, overwrite: bool) -> Path:
    """The run's directory, checked before anything is written: a directory that holds a run is
    refused unless resumed or overwritten, one of files that are not a run and one another process
    trains into always; a resume needs a saved state. The caller then holds it (files.hold_run_dir)
    while it trains."""
    path = Path(run_dir) if run_dir else Path("runs") / time.strftime("%Y%m%d-%H%M%S")
    check_run_dir(path, resume or overwrite, training=True, resume=resume)
    if resume:
        recover(path / STATE_DIR)  # a save's swap a kill cut short: its state is put back first
        if latest_state(path) is None:  # check_run_dir saw one: only a state gone since is missing
            raise ValueError(no_state_message(path))
    elif overwrite and holds_run(path):  # never a directory of yours: check_run_dir refused it
        shutil.rmtree(path)
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_run_files(path: Path, config_text: str, environment: dict[str, Any]) -> None:
    """environment.json, then config.yaml, each whole (a resume's start, killed, keeps the old ones). A
    kill between the two leaves the lock and environment.json, which a new run takes as a start cut
    short (run_dirs.not_a_run_message); config.yaml alone would be refused as a directory of yours."""
    write_text_atomic(path / "environment.json", json.dumps(environment, indent=2))
    write_text_atomic(path / "config.yaml", config_text)


def reconcile_logs(run_dir: Path, step: int) -> dict[str, int]:
    """Resuming from the state of `step`: log lines of later steps (written before a crash, whose
    groups will be trained again) move to NAME.orphaned, and a torn last line is dropped, so every step
    and every group id appears once. Returns the lines moved per file.

    W&B ignores the steps trained again if its run logged them: the switch to a new W&B run is written
    before metrics.jsonl is cut, so a kill between the two finds the lines there again and the next
    resume completes the same switch (observe/wandb_sink.py), never misses it."""
    metrics = run_dir / LOGS[0]
    if metrics.is_file() and _split(metrics, step)[1]:
        rewind_wandb_run(run_dir, step)
    return {name: _set_aside(run_dir, name, step) for name in LOGS if (run_dir / name).is_file()}


def _split(path: Path, step: int) -> tuple[list[str], list[str]]:
    """The log's lines up to `step`, and those past it (a torn last line among them)."""
    keep: list[str] = []
    orphaned: list[str] = []
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:  # the line a crash cut short
            orphaned.append(line)
            continue
        (keep if int(row["step"]) <= step else orphaned).append(line)
    return keep, orphaned


def _set_aside(run_dir: Path, name: str, step: int) -> int:
    """Move the lines of `name` past `step` to NAME.orphaned -> how many. A move is journaled
    (NAME.orphaning: the .orphaned file's size before it and the log's digest before its cut), so a
    move a crash cut short is finished on the next try, each line set aside exactly once."""
    path, aside, journal = run_dir / name, run_dir / f"{name}.orphaned", run_dir / f"{name}.orphaning"
    finished = 0
    if journal.is_file():  # a move cut short
        entry = json.loads(journal.read_text())
        if file_digest(path) == entry["log"]:  # the log was not cut yet: undo a partial append, redo it
            if aside.is_file() and aside.stat().st_size > entry["size"]:
                os.truncate(aside, entry["size"])
        else:  # the log was cut: the move is complete
            finished = int(entry["lines"])
        journal.unlink()
    keep, orphaned = _split(path, step)
    if not orphaned:
        return finished
    size = aside.stat().st_size if aside.is_file() else 0
    write_text_atomic(journal, json.dumps({"size": size, "log": file_digest(path), "lines": len(orphaned)}))
    with aside.open("a", encoding="utf-8") as f:
        f.write("".join(x + "\n" for x in orphaned))
        f.flush()
        os.fsync(f.fileno())
    sync_dir(run_dir)
    write_text_atomic(path, "".join(x + "\n" for x in keep))
    journal.unlink()
    sync_dir(run_dir)
    return finished + len(orphaned)


def stop_message(reason: str, step: int, run_dir: Path) -> str:
    """What a run stopped by `reason` at `step` keeps, and how to continue it."""
    return f"stopped by {reason} at step {step}: state saved; continue with `streamrl train resume={run_dir}`"


class PeriodicSaver:
    """Saves every `every` steps and/or every `every_s` seconds (0 turns either off). `stopped`: whether
    a stop was requested; one that came during a step's save ends the loop after it, and that save,
    made after the step, is the step's state: `stopped_in_save` names the step and `stopped_state` is
    what it wrote, which the save after the loop writes again only if the workers' stop added to it."""

    def __init__(
        self, every: int, every_s: float, save: Callable[[], RunState], stopped: Callable[[], bool]
    ) -> None:
        self.every, self.every_s, self.save, self.stopped = every, every_s, save, stopped
        self.last = time.monotonic()
        self.seconds = 0.0  # time spent saving
        self.count = 0
        self.stopped_in_save: int | None = None  # the step whose save a stop came during
        self.stopped_state: RunState | None = None  # what that save wrote

    def after_step(self, step: int) -> bool:
        due = (self.every > 0 and step % self.every == 0) or (
            self.every_s > 0 and time.monotonic() - self.last >= self.every_s
        )
        if due:
            t0 = time.perf_counter()
            saved = self.save()
            self.seconds += time.perf_counter() - t0
            self.count += 1
            self.last = time.monotonic()
            if self.stopped():
                self.stopped_in_save, self.stopped_state = step, saved
        return due


class StopSaver:
    """The state a stop ends the loop with, saved at once: before the rollout workers are stopped (up to
    STOP_TIMEOUT_S and their joins), which may outlast the seconds a container runtime leaves between its
    SIGTERM and its SIGKILL. A step whose periodic save a stop came during is not saved again here: that
    save stands for this one.
    `needed(state)`: whether the save after the workers stopped has anything to add (groups that came
    back meanwhile); it replaces this one then, both being of the same step."""

    def __init__(self, save: Callable[[RunState], RunState], periodic: PeriodicSaver) -> None:
        self.save, self.periodic = save, periodic
        self.saved: RunState | None = None
        self.failed = False  # the save failed to write (StateSaveError): not tried again
        self.seconds = 0.0  # time spent saving

    def __call__(self, snapshot: RunState) -> None:
        if self.periodic.stopped_in_save == snapshot.step:
            self.saved = self.periodic.stopped_state
            return
        t0 = time.perf_counter()
        try:
            self.saved = self.save(snapshot)
        except StateSaveError:  # a full disk: the save after the loop would fail the same way
            self.failed = True
            raise
        finally:
            self.seconds += time.perf_counter() - t0

    def needed(self, state: RunState) -> bool:
        return not self.failed and (self.saved is None or not same_save(self.saved, state))
