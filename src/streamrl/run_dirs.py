"""What a run directory is, judged before anything is written into it: a streamrl run (its config.yaml
beside a file only a run writes), a directory of your own (a config.yaml with your notes and scripts is no
run: never trained into, never deleted by overwrite=true), and whether it can be created and written."""

from __future__ import annotations

import json
import os
from pathlib import Path

from streamrl.files import MOVED_ASIDE, RUN_LOCK, dead_writers_temp

STATE_DIR, STATE_PREFIX = "state", "step-"  # RUN/state/step-N: a saved state (loop/state.py)
# what a run writes beside its config.yaml; a directory of your own that keeps a config.yaml has none
RUN_MARKERS = ("metrics.jsonl", STATE_DIR, "environment.json", "summary.json")
# what streamrl leaves in a directory before it holds a run: the lock of a run killed while its model
# loaded, the update lock of eval.json
OWN_FILES = (RUN_LOCK, ".eval.json.lock")
# what a run writes before its config.yaml (loop/run_dir.write_run_files), with keys it always holds:
# beside the run's lock and nothing else, a start a kill cut short, which a new run takes over
BEFORE_CONFIG = {"environment.json": ("trainer_threads", "rollout_workers")}
SHOWN = 3  # the names a refusal lists


def holds_run(path: Path) -> bool:
    """Does `path` hold a streamrl run: its config.yaml and one of RUN_MARKERS? (Not the lock a run
    takes first: a run killed while its model loaded leaves it alone, and files of yours may follow.)"""
    return (path / "config.yaml").is_file() and any(_marks_a_run(path / name) for name in RUN_MARKERS)


def _marks_a_run(path: Path) -> bool:
    """A marker that exists, and for environment.json holds what a run writes there (not a file of yours
    of that name)."""
    return path.exists() and (path.name not in BEFORE_CONFIG or _as_a_run_writes(path))


def has_saved_state(path: Path) -> bool:
    """Does the run in `path` hold a saved state to resume: state/step-N, or one a kill left moved aside
    mid-swap (.old-step-N-PID, which the resume puts back)? Read only: nothing is moved here."""
    root = path / STATE_DIR
    names = [d.name for d in root.iterdir() if d.is_dir()] if root.is_dir() else []
    return any(n.startswith((STATE_PREFIX, MOVED_ASIDE + STATE_PREFIX)) for n in names)


def no_state_message(path: Path) -> str:
    return (
        f"resume: {path} has no saved state (state/step-*): the run stopped before its first save "
        "(train.save_every steps); start it again with overwrite=true"
    )


def _not_own(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.name not in OWN_FILES)


def started_only(path: Path) -> bool:
    """Is `path` a run's start a kill cut short: its lock, and nothing but what a run writes before its
    config.yaml (as a run writes it) and the temporary files of those writes or of config.yaml's, their
    writer dead? A new run takes it as it would an empty directory."""
    if not (path / RUN_LOCK).is_file():
        return False
    names = _not_own(path)
    writes = (*BEFORE_CONFIG, "config.yaml")
    left = [n for n in names if not any(dead_writers_temp(n, w) for w in writes)]
    return bool(names) and all(n in BEFORE_CONFIG and _as_a_run_writes(path / n) for n in left)


def _as_a_run_writes(path: Path) -> bool:
    try:
        data = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return False
    return isinstance(data, dict) and all(key in data for key in BEFORE_CONFIG[path.name])


def not_a_run_message(path: Path) -> str | None:
    """The line refusing to train into `path` when it holds files but no run; None otherwise (nothing but
    streamrl's own files: a lock, and what a start a kill cut short wrote before its config.yaml)."""
    if not path.is_dir() or holds_run(path):
        return None
    names = _not_own(path)
    if not names or started_only(path):
        return None
    return f"run_dir {path} holds files that are not a streamrl run ({_first(names)}): choose another run_dir"


def no_run_to_resume_message(path: Path) -> str:
    """The line refusing resume=`path` when it holds no config.yaml: what is there instead."""
    fix = "give resume the run_dir of the run to continue"
    if not path.exists():
        return f"resume: '{path}' does not exist: {fix}"
    names = sorted(p.name for p in path.iterdir())
    held = f"it holds {_first(names)}" if names else "it is empty"
    return f"resume: '{path}' is not a run directory (no config.yaml; {held}): {fix}"


def _first(names: list[str]) -> str:
    """The first SHOWN names, and ', ...' if there are more."""
    return ", ".join(names[:SHOWN]) + (", ..." if len(names) > SHOWN else "")


def unwritable_message(path: Path) -> str | None:
    """The line saying `path` cannot be written into: not writable, or not to be created (its nearest
    existing ancestor is a file, or a directory that is not writable); None otherwise."""
    if os.path.isdir(path):
        return None if _writable(path) else f"run_dir {path} is not writable; choose another run_dir"
    for ancestor in path.parents:
        if not os.path.exists(ancestor):
            continue
        if not os.path.isdir(ancestor):
            return f"run_dir {path} cannot be created: {ancestor} is a file; choose another run_dir"
        if not _writable(ancestor):
            return f"run_dir {path} cannot be created: {ancestor} is not writable; choose another run_dir"
        return None
    return None


def _writable(directory: Path) -> bool:
    return os.access(directory, os.W_OK | os.X_OK)
