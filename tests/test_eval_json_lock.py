"""eval.json is updated by the training run and by `streamrl eval` into its directory: each reads, merges
and writes it under one lock (files.update_json), so neither drops the other's record."""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import multiprocessing as mp
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from tiny_args import TINY

from streamrl.cli import main
from streamrl.files import update_json

FORK = mp.get_context("fork")
LOCK = ".eval.json.lock"


def _add(path: Path, key: str, n: int) -> None:
    """n read-modify-writes of `path`, each adding 1 to its own key, with a window another would race."""

    def merge(old: dict[str, Any]) -> dict[str, Any]:
        time.sleep(0.001)
        return {**old, key: old.get(key, 0) + 1}

    for _ in range(n):
        update_json(path, merge)


def test_two_processes_and_two_threads_updating_it_keep_every_record(tmp_path):
    path = tmp_path / "eval.json"
    procs = [FORK.Process(target=_add, args=(path, f"process{i}", 25)) for i in range(2)]
    threads = [threading.Thread(target=_add, args=(path, f"thread{i}", 25)) for i in range(2)]
    for w in [*procs, *threads]:
        w.start()
    for w in [*procs, *threads]:
        w.join(timeout=120)  # a limit against a hang, not a speed check
    assert not any(w.is_alive() for w in [*procs, *threads]), "an updater never got the lock"
    assert json.loads(path.read_text()) == {"process0": 25, "process1": 25, "thread0": 25, "thread1": 25}


def _free(lock: Path) -> bool:
    with lock.open("a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
    return True


def test_the_lock_is_a_sibling_file_let_go_after_each_update_even_a_failed_one(tmp_path):
    path = tmp_path / "eval.json"
    assert update_json(path, lambda old: {**old, "a": 1}) == {"a": 1}
    assert (tmp_path / LOCK).is_file() and _free(tmp_path / LOCK)
    assert not (tmp_path / ".lock").exists()  # the training process's own lock is another file

    def fail(old: dict[str, Any]) -> dict[str, Any]:
        raise RuntimeError("merge failed")

    with pytest.raises(RuntimeError, match="merge failed"):
        update_json(path, fail)
    assert _free(tmp_path / LOCK) and json.loads(path.read_text()) == {"a": 1}


def test_an_update_waits_for_the_holder_of_the_lock(tmp_path):
    path = tmp_path / "eval.json"
    done = threading.Event()
    with (tmp_path / LOCK).open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        t = threading.Thread(target=lambda: (update_json(path, lambda old: {"b": 2}), done.set()))
        t.start()
        assert not done.wait(0.5) and not path.exists()
    t.join(timeout=30)
    assert done.is_set() and json.loads(path.read_text()) == {"b": 2}


def test_a_filesystem_without_flock_updates_unlocked(tmp_path, monkeypatch, caplog):
    def refuse(*_a: Any) -> None:
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    path = tmp_path / "eval.json"
    path.write_text(json.dumps({"base": 1}))
    with caplog.at_level(logging.WARNING, logger="streamrl.files"):
        assert update_json(path, lambda old: {**old, "sampled": 2}) == {"base": 1, "sampled": 2}
    assert json.loads(path.read_text()) == {"base": 1, "sampled": 2}
    assert f"{path} cannot be locked" in caplog.text and "No locks available" in caplog.text


@pytest.fixture
def locked(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files flock'ed exclusively, in order (the real flock still runs)."""
    names: list[str] = []
    real = fcntl.flock

    def flock(f: Any, op: int) -> None:
        if op & fcntl.LOCK_EX:
            names.append(Path(f.name).name)
        real(f, op)

    monkeypatch.setattr(fcntl, "flock", flock)
    return names


def test_the_eval_command_updates_a_runs_eval_json_under_the_lock(tmp_path, locked):
    (tmp_path / "config.yaml").write_text("model: tiny-random\n")
    (tmp_path / "eval.json").write_text(json.dumps({"base": {"accuracy": 0.5}}))
    args = ["model=tiny-random", "size=2", "eval.max_new_tokens=2", "reward.extract=last_number"]
    assert main(["eval", *args, f"run_dir={tmp_path}"]) == 0
    assert locked.count(LOCK) == 1
    out = json.loads((tmp_path / "eval.json").read_text())
    assert out["base"] == {"accuracy": 0.5} and out["sampled"]["problems"] == 2


def test_a_training_run_updates_its_eval_json_under_the_lock(tmp_path, locked):
    run = tmp_path / "run"
    args = [*TINY, "runtime.mode=colocated", "max_staleness=0", "eval.before=true", "max_steps=1"]
    assert main(["train", *args, f"run_dir={run}"]) == 0
    assert locked.count(LOCK) == 2  # the base model's record, then the run's at its end
    assert {"base", "final"} <= set(json.loads((run / "eval.json").read_text()))
