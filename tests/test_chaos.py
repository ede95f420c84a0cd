"""Crash-proof runs: kill -9 at random moments, resume each time, and nothing is lost or counted twice.

The whole process group is killed five times (the run is resumed each time) and a rollout worker alone
twice (the run restarts it, logs one line and goes on).

The run saves its state every step (train.save_every=1); each kill costs at most the steps since the
last complete save, whose log lines move to *.orphaned on resume and whose groups are trained again.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tiny_args import TINY

from streamrl.cli import main
from streamrl.files import hold_run_dir, in_use_message, run_dir_in_use
from streamrl.loop.durable import recover
from streamrl.loop.run_dir import claim_run_dir, reconcile_logs
from streamrl.loop.state import latest_state, state_dirs
from streamrl.observe.environment import collect_environment
from streamrl.placement import leftovers
from streamrl.run_dirs import STATE_DIR

STEPS = 24  # room for seven kills, each after a new step, whatever the machine's speed
ARGS = [*TINY, f"max_steps={STEPS}", "max_staleness=1", "train.save_every=1", "checkpoint.save=true"]


def _lines(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by the kill
            pass
    return out


def _start(args: list[str], pids: set[str] | None = None, stderr: Path | None = None) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamrl.cli", "train", *args],
        start_new_session=True,  # its own process group: the kill takes its workers too
        stdout=subprocess.DEVNULL,
        stderr=stderr.open("ab") if stderr is not None else subprocess.PIPE,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    if pids is not None:
        pids.add(str(proc.pid))
    return proc


def _descendants(pid: int) -> list[int]:
    out, todo = [], [pid]
    while todo:
        try:
            tasks = list(Path(f"/proc/{todo.pop()}/task").iterdir())
        except OSError:  # gone meanwhile
            continue
        for task in tasks:
            try:
                children = [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                continue
            out += children
            todo += children
    return out


# a rollout worker's stderr: RUN_DIR/rollout-worker<i>.log, or a temporary streamrl-worker<i>-*.log
WORKER_LOGS = ("rollout-worker", "streamrl-worker")


def _rollout_workers(pid: int) -> list[int]:
    """The rollout worker processes of the run `pid` (forked by its fork server, a child of the run):
    its descendants whose stderr is a worker log."""
    out = []
    for child in _descendants(pid):
        try:
            if Path(os.readlink(f"/proc/{child}/fd/2")).name.startswith(WORKER_LOGS):
                out.append(child)
        except OSError:  # gone meanwhile
            pass
    return out


def _restart_lines(err: Path) -> list[str]:
    return [x for x in err.read_text().splitlines() if "rollout worker 0 killed by SIGKILL; restarted" in x]


def _kill_after_progress(
    proc: subprocess.Popen, run: Path, rng: random.Random, whole: bool, err: Path
) -> None:
    """Once the run has logged a new step, after a random extra delay (during generation, a train step,
    a save or a weight update: wherever it happens to be), SIGKILL its process group (`whole`) or one
    rollout worker alone, which the run restarts and goes on."""
    seen = len(_lines(run / "metrics.jsonl"))
    deadline = time.monotonic() + 180  # a limit against a hang, not a speed check
    while len(_lines(run / "metrics.jsonl")) <= seen and proc.poll() is None:
        assert time.monotonic() < deadline, "no new step logged"
        time.sleep(0.02)
    time.sleep(rng.uniform(0.0, 0.3))
    if proc.poll() is not None:
        return
    if not whole:
        workers = _rollout_workers(proc.pid)
        while not workers and proc.poll() is None:  # a resumed run may train carried-over groups
            assert time.monotonic() < deadline, "no rollout worker started"  # while its worker starts
            time.sleep(0.05)
            workers = _rollout_workers(proc.pid)
        if workers:
            restarted = len(_restart_lines(err))
            os.kill(rng.choice(workers), signal.SIGKILL)
            while len(_restart_lines(err)) == restarted and proc.poll() is None:  # the run notices first
                assert time.monotonic() < deadline, "the killed worker was never restarted"
                time.sleep(0.05)
        return
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)


def _carried(state: Path) -> tuple[int, list[str], set[str]]:
    """Of a saved state: the ledger's count of groups generated again, the unfinished groups a resume
    generates again, and every group id the ledger knows."""
    ledger = json.loads((state / "run_state.json").read_text())["ledger"]
    with (state / "carried.pkl").open("rb") as f:
        unfinished = [r.group_id for r in pickle.load(f)["unfinished"]]
    return int(ledger["regenerated"]), unfinished, set(ledger["state"])


# the whole process group five times; a rollout worker alone twice (the run restarts it and goes on)
KILLS = [True, False, True, True, False, True, True]


def test_kill_minus_nine_five_times_then_finish(tmp_path: Path) -> None:
    rng = random.Random(7)
    run, err = tmp_path / "run", tmp_path / "stderr.log"
    pids: set[str] = set()
    proc = _start([*ARGS, f"run_dir={run}"], pids, err)
    kills, steps = 0, STEPS
    resumed: tuple[int, list[str], set[str]] = (0, [], set())  # a fresh run's
    for i, whole in enumerate(KILLS):
        _kill_after_progress(proc, run, rng, whole, err)
        if proc.poll() is not None and proc.returncode == 0:
            break  # finished before the kill landed
        kills += 1
        if whole and (run / STATE_DIR).is_dir():  # the run is dead: nothing else moves its states now
            recover(run / STATE_DIR)  # a swap the kill cut short is finished as the resume would
        state = latest_state(run)
        if whole and state is None:  # killed before its first save: nothing to resume
            proc = _start([*ARGS, f"run_dir={run}", "overwrite=true"], pids, err)
        elif whole:
            last = []
            if i == len(KILLS) - 1:  # after the last kill, two steps past the saved one are enough
                steps = int(state.name.split("-")[1]) + 2
                last = [f"max_steps={steps}"]
                resumed = _carried(state)
            proc = _start([f"resume={run}", *last], pids, err)
    assert kills == len(KILLS), "the run finished before every kill landed: lower the step time"
    assert proc.wait(timeout=600) == 0, err.read_text()[-3000:]
    log = err.read_text()
    assert len(_restart_lines(err)) == 2, log[-3000:]  # one line each
    assert "Traceback" not in log

    rows = _lines(run / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, steps + 1))  # every step once
    groups = _lines(run / "groups.jsonl")
    ids = [g["group_id"] for g in groups]
    assert len(ids) == len(set(ids)) == steps * 2  # every trained group once
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == len(groups)
    # the groups in flight at the last resumed save are generated again, before any new problem is drawn
    regenerated, unfinished, known = resumed
    if set(ids) - known:  # a new group was admitted: every unfinished one went before it
        assert acc["regenerated"] == regenerated + len(unfinished)
    else:
        assert regenerated <= acc["regenerated"] <= regenerated + len(unfinished)
    assert acc["admitted"] == acc["trained"] + acc["filtered"] + acc["carried_over"]
    assert len(state_dirs(run)) <= 2  # train.keep_states
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run / "checkpoint")
    # the killed runs' semaphores were removed by the runs after them; the last one released its own
    assert [
        f.name for f in leftovers.SHM.glob(f"sem.{leftovers.PREFIX}*") if f.name.split("-")[2] in pids
    ] == []


def test_a_run_dir_that_holds_a_run_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "run"
    assert main(["train", *ARGS, "max_steps=1", f"run_dir={run}"]) == 0
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    capsys.readouterr()
    assert main(["train", *ARGS, "max_steps=1", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert f"run_dir {run} already holds a run: continue it with resume={run}, start it over with " in err
    assert "overwrite=true" in err and err.count("\n") == 1
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before  # nothing touched
    assert main(["train", *ARGS, "max_steps=1", f"run_dir={run}", "overwrite=true"]) == 0
    assert [r["step"] for r in _lines(run / "metrics.jsonl")] == [1]  # a fresh run, not appended


def test_a_run_dir_another_process_trains_into_is_refused(tmp_path: Path, capsys, monkeypatch) -> None:
    """A second `streamrl train` into a run directory (a resume while the run still trains or saves, an
    overwrite) would interleave its logs and states: refused in one line, nothing touched."""
    import streamrl.loop.job as job

    run, held = tmp_path / "run", []
    real = job.save_state

    def save(run_dir, *a, **k):
        held.append(run_dir_in_use(run_dir))
        return real(run_dir, *a, **k)

    monkeypatch.setattr(job, "save_state", save)
    assert main(["train", *ARGS, "max_steps=1", f"run_dir={run}"]) == 0
    monkeypatch.undo()
    assert held == [True] and not run_dir_in_use(run)  # held while it ran, released at its end
    before = {p: p.stat().st_mtime_ns for p in run.rglob("*")}
    capsys.readouterr()
    with hold_run_dir(run):  # what the process training into it holds
        for args in (
            [f"resume={run}", "max_steps=2"],
            [*ARGS, "max_steps=1", f"run_dir={run}", "overwrite=true"],
        ):
            assert main(["train", *args]) == 2
            assert capsys.readouterr().err == f"streamrl: error: {in_use_message(run)}\n"
    assert {p: p.stat().st_mtime_ns for p in run.rglob("*")} == before
    assert main(["train", f"resume={run}", "max_steps=2"]) == 0  # the lock went with its holder
    assert [r["step"] for r in _lines(run / "metrics.jsonl")] == [1, 2]


def test_a_run_dir_on_a_filesystem_without_flock_trains_unlocked(tmp_path: Path, monkeypatch, caplog) -> None:
    """Lustre without -o flock and some NFS mounts refuse flock (ENOLCK, ENOSYS): the run goes on
    unlocked and says so, rather than failing every `streamrl train` there."""
    import errno
    import fcntl
    import logging

    def refuse(*_a):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", refuse)
    (tmp_path / ".lock").touch()
    assert not run_dir_in_use(tmp_path)
    with caplog.at_level(logging.WARNING, logger="streamrl.files"), hold_run_dir(tmp_path):
        pass
    assert f"run_dir {tmp_path} cannot be locked" in caplog.text and "No locks available" in caplog.text


def test_a_resume_without_a_saved_state_changes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: tiny-random\n")
    env = collect_environment("tiny-random", 1, 1, 1)
    (run / "environment.json").write_text(json.dumps(env))  # a run killed before its first save
    before = (run / "config.yaml").read_text()
    assert main(["train", f"resume={run}", "max_steps=3"]) == 2
    err = capsys.readouterr().err
    assert f"resume: {run} has no saved state (state/step-*)" in err and err.count("\n") == 1
    assert sorted(p.name for p in run.iterdir()) == ["config.yaml", "environment.json"]
    assert (run / "config.yaml").read_text() == before


def test_a_resume_finds_a_state_a_kill_left_moved_aside_mid_swap(tmp_path: Path) -> None:
    """The same step saved twice (a periodic save, then the stop's): the first is moved aside before
    the second takes its name; a kill between the two renames leaves it only under .old-*."""
    run = tmp_path / "run"
    (run / "state" / ".old-step-00000003-4242").mkdir(parents=True)
    (run / "config.yaml").write_text("model: tiny-random\n")
    assert claim_run_dir(str(run), resume=True, overwrite=False) == run
    assert [d.name for d in state_dirs(run)] == ["step-00000003"]


def test_pruning_exports_keeps_the_newest_and_sweeps_what_killed_writers_left(tmp_path: Path) -> None:
    from streamrl.loop.export import prune_exports

    for name in ("step-2", "step-10", "step-9", ".tmp-step-11-4242", f".tmp-step-12-{os.getpid()}", "other"):
        (tmp_path / name).mkdir()
    (tmp_path / "step-14").mkdir()  # a killed run's export, past the state its resume restored
    assert [d.name for d in prune_exports(tmp_path, 2, 10)] == ["step-2", "step-14"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        f".tmp-step-12-{os.getpid()}",
        "other",
        "step-10",
        "step-9",
    ]
    assert prune_exports(tmp_path, 0, 10) == [] and len(list(tmp_path.iterdir())) == 4  # 0: keep them all


def test_reconcile_moves_lines_past_the_saved_step(tmp_path: Path) -> None:
    rows = [{"step": s, "group_id": f"g{s}"} for s in (1, 2, 3, 4)]
    (tmp_path / "groups.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"step": 5, "gro')
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in (1, 2, 3)))
    assert reconcile_logs(tmp_path, 2) == {"metrics.jsonl": 1, "groups.jsonl": 3}
    assert [r["step"] for r in _lines(tmp_path / "groups.jsonl")] == [1, 2]
    assert [r["step"] for r in _lines(tmp_path / "metrics.jsonl")] == [1, 2]
    orphaned = (tmp_path / "groups.jsonl.orphaned").read_text().splitlines()
    assert orphaned[:2] == [json.dumps(rows[2]), json.dumps(rows[3])] and orphaned[2] == '{"step": 5, "gro'


def test_a_second_crashs_identical_lines_are_set_aside_too(tmp_path: Path) -> None:
    # groups.jsonl rows have no timestamp: step 3 trained again from the same groups logs the same rows
    row = json.dumps({"step": 3, "group_id": "g3", "rewards": [1, 0]})
    log, aside = tmp_path / "groups.jsonl", tmp_path / "groups.jsonl.orphaned"
    log.write_text("".join(json.dumps({"step": s, "group_id": f"g{s}"}) + "\n" for s in (1, 2)) + row + "\n")
    assert reconcile_logs(tmp_path, 2) == {"groups.jsonl": 1}
    log.write_text(log.read_text() + row + "\n")  # resumed, step 3 again, crashed again
    assert reconcile_logs(tmp_path, 2) == {"groups.jsonl": 1}
    assert aside.read_text().splitlines() == [row, row]
    assert [r["step"] for r in _lines(log)] == [1, 2]


@pytest.mark.parametrize("cut", ["mid-append", "before-the-log-cut", "before-the-journal-removal"])
def test_a_reconcile_cut_short_moves_no_line_twice(tmp_path: Path, monkeypatch, cut: str) -> None:
    from streamrl.loop import run_dir

    lines = [json.dumps({"step": s}) for s in (1, 2, 3, 4)]
    log, aside = tmp_path / "metrics.jsonl", tmp_path / "metrics.jsonl.orphaned"
    journal = tmp_path / "metrics.jsonl.orphaning"
    log.write_text("".join(x + "\n" for x in lines))
    aside.write_text(json.dumps({"step": 9}) + "\n")  # an earlier crash's line
    written = {}
    real = run_dir.write_text_atomic

    def write(path: Path, text: str) -> None:
        written[path.name] = text
        if path == log and cut != "before-the-journal-removal":
            raise KeyboardInterrupt  # the kill
        real(path, text)

    monkeypatch.setattr(run_dir, "write_text_atomic", write)
    with (
        pytest.raises(KeyboardInterrupt) if cut != "before-the-journal-removal" else contextlib.nullcontext()
    ):
        reconcile_logs(tmp_path, 2)
    monkeypatch.undo()
    if cut == "mid-append":  # killed while appending: a part of the lines reached the file
        aside.write_text(json.dumps({"step": 9}) + "\n" + lines[2][:5])
    if cut == "before-the-journal-removal":  # the log was cut, its journal not yet removed
        journal.write_text(written[journal.name])
    assert journal.is_file()
    assert reconcile_logs(tmp_path, 2) == {"metrics.jsonl": 2}
    assert aside.read_text().splitlines() == [json.dumps({"step": 9}), lines[2], lines[3]]
    assert log.read_text().splitlines() == lines[:2]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.jsonl", "metrics.jsonl.orphaned"]
    # a later crash past step 1 orphans line 2, and lines 3 and 4 again: a second crash's lines are kept
    log.write_text("".join(x + "\n" for x in lines))
    assert reconcile_logs(tmp_path, 1) == {"metrics.jsonl": 3}
    assert aside.read_text().splitlines() == [json.dumps({"step": 9}), *lines[2:], *lines[1:]]


@pytest.mark.parametrize("cut", ["before-the-log-cut", "before-the-journal-removal"])
def test_a_resume_killed_while_it_sets_lines_aside_still_rewinds_wandb_once(
    tmp_path: Path, monkeypatch, cut: str
) -> None:
    """The switch to a new W&B run is written before metrics.jsonl is cut: a kill between the two leaves
    the lines past the state in the log, and the next resume completes the same switch, not another."""
    from streamrl.loop import run_dir

    lines = [json.dumps({"step": s, "time": float(s)}) for s in (1, 2, 3, 4)]
    log, switch_file = tmp_path / "metrics.jsonl", tmp_path / "wandb_switch.json"
    log.write_text("".join(x + "\n" for x in lines))
    (tmp_path / "wandb_run_id").write_text("oldrun\n")  # as if the run logged to W&B
    real = run_dir.write_text_atomic

    def write(path: Path, text: str) -> None:
        if path == log and cut == "before-the-log-cut":
            raise KeyboardInterrupt  # the kill
        real(path, text)
        if path == log:
            raise KeyboardInterrupt  # the kill, the log cut and its journal left

    monkeypatch.setattr(run_dir, "write_text_atomic", write)
    with pytest.raises(KeyboardInterrupt):
        reconcile_logs(tmp_path, 2)
    monkeypatch.undo()
    switch = json.loads(switch_file.read_text())
    assert switch["from"] == "oldrun" and switch["step"] == 2
    assert reconcile_logs(tmp_path, 2) == {"metrics.jsonl": 2}
    assert json.loads(switch_file.read_text()) == switch  # the same switch, not one from its new run
    assert (tmp_path / "wandb_run_id").read_text() == switch["id"] + "\n"
    assert [r["step"] for r in _lines(log)] == [1, 2]
    # the new W&B run logs step 3 again and the run is killed before it saves: rewound again
    log.write_text(log.read_text() + json.dumps({"step": 3, "time": 30.0}) + "\n")
    assert reconcile_logs(tmp_path, 2) == {"metrics.jsonl": 1}
    again = json.loads(switch_file.read_text())
    assert again["from"] == switch["id"] != again["id"] and again["step"] == 2
    assert (tmp_path / "wandb_run_id").read_text() == again["id"] + "\n"


def test_periodic_saves_keep_the_newest_states(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = [*ARGS, "runtime.mode=colocated", "max_staleness=0", "max_steps=5", "train.keep_states=3"]
    assert main(["train", *args, "checkpoint.every=1", "checkpoint.keep=2", f"run_dir={run}"]) == 0
    assert [d.name for d in state_dirs(run)] == ["step-000003", "step-000004", "step-000005"]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-4", "step-5"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(run / "checkpoints" / "step-4")
    assert not list((run / "state").glob(".tmp-*"))


_KILLED_IN_EXPORT = """
import os, sys
from streamrl.loop import job
from streamrl.cli import main

real = job.export_checkpoint

def export(trainer, tokenizer, path, *args):
    if path.name == "step-2":
        os._exit(9)  # killed mid-export: what kill -9 leaves, no finally runs
    real(trainer, tokenizer, path, *args)

job.export_checkpoint = export
sys.exit(main(["train", *sys.argv[1:]]))
"""


def test_an_export_a_kill_cut_short_is_written_by_the_resume(tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = [*ARGS, "runtime.mode=colocated", "max_staleness=0", "max_steps=3", "checkpoint.every=1"]
    killed = subprocess.run(
        [sys.executable, "-c", _KILLED_IN_EXPORT, *args, "checkpoint.keep=0", f"run_dir={run}"],
        capture_output=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert killed.returncode == 9, killed.stderr.decode()[-2000:]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1"]
    assert main(["train", f"resume={run}"]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-1", "step-2", "step-3"]
    assert "- Steps trained: 2\n" in (run / "checkpoints" / "step-2" / "README.md").read_text()


def test_colocated_run_killed_and_resumed_ends_bitwise_equal(tmp_path: Path) -> None:
    """kill -9 mid-run (wherever it lands: a step, a save), resume from the newest complete state: the
    final weights equal an uninterrupted run's bit for bit (weights, optimizer, RNGs, data position)."""
    import torch
    from safetensors.torch import load_file

    sync = [
        *ARGS,
        "runtime.mode=colocated",
        "max_staleness=0",
        "max_steps=6",
        "train.lr=1e-3",
        "eval.before=true",
    ]
    whole, split = tmp_path / "whole", tmp_path / "split"
    assert main(["train", *sync, f"run_dir={whole}"]) == 0
    proc = _start([*sync, f"run_dir={split}"])
    deadline = time.monotonic() + 180
    while len(_lines(split / "metrics.jsonl")) < 3 and proc.poll() is None:
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    assert latest_state(split) is not None and not latest_state(split).name.endswith("000006")
    ev = json.loads((split / "eval.json").read_text())  # `streamrl eval run_dir=...` adds its record
    (split / "eval.json").write_text(json.dumps({**ev, "sampled": {"model": "x", "pass@1": 0.5}}))
    with (split / "metrics.jsonl").open("a") as f:  # a step logged past any saved state
        f.write(json.dumps({"step": 99}) + "\n")
    (split / "wandb_run_id").write_text("oldrun\n")  # as if the run logged to W&B
    saved = int(latest_state(split).name.split("-")[1])
    assert main(["train", f"resume={split}"]) == 0
    # W&B ignores steps below the last one a run logged: the steps trained again go to a new W&B run,
    # decided on disk before the resume trains (observe/wandb_sink.py)
    switch = json.loads((split / "wandb_switch.json").read_text())
    assert switch["from"] == "oldrun" and switch["step"] == saved
    assert (split / "wandb_run_id").read_text() == switch["id"] + "\n" != "oldrun\n"
    a = load_file(str(latest_state(whole) / "model" / "model.safetensors"))
    b = load_file(str(latest_state(split) / "model" / "model.safetensors"))
    assert [k for k in a if not torch.equal(a[k], b[k])] == []
    rows = _lines(split / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(1, 7))
    for key in ("time", "train_elapsed"):  # the resumed run's clocks continue the saved ones
        assert all(a[key] < b[key] for a, b in zip(rows, rows[1:])), [r[key] for r in rows]
    assert _lines(whole / "groups.jsonl") == _lines(split / "groups.jsonl")
    # the base model's evaluation was on disk before the kill: the resumed run compares against it
    ev, ev_whole = (json.loads((d / "eval.json").read_text()) for d in (split, whole))
    assert ev["per_problem_correct"] == ev_whole["per_problem_correct"] and ev["base"]["n"] == 4
    assert ev["difference"] == ev_whole["difference"]
    assert ev["sampled"] == {"model": "x", "pass@1": 0.5}  # the resume keeps what it did not measure


def test_a_second_stop_request_during_the_stop_is_refused_and_nothing_is_lost(tmp_path: Path) -> None:
    """Ctrl-C, then a SIGTERM to the whole job while it stops and saves (a scheduler ending it): the
    first is taken at once, said so, and the second refused. Two different signals, as two SIGINTs
    sent close together may reach the process as one; the handlers run in signal order, SIGINT's first."""
    from streamrl.loop.signals import REFUSED, STOPPING

    run, err_file = tmp_path / "run", tmp_path / "stderr"
    proc = _start([*ARGS, "train.save_every=0", f"run_dir={run}"], stderr=err_file)
    deadline = time.monotonic() + 180
    while len(_lines(run / "metrics.jsonl")) < 2 and proc.poll() is None:
        assert time.monotonic() < deadline, "no progress"
        time.sleep(0.02)
    os.killpg(proc.pid, signal.SIGINT)
    os.killpg(proc.pid, signal.SIGTERM)  # impatient: at once, long before the stop and its save end
    assert proc.wait(timeout=120) == 0
    err = err_file.read_text()
    said = [line for line in err.splitlines() if line.startswith("streamrl:")]
    assert said[:2] == [STOPPING.format(signal="SIGINT"), REFUSED], err
    assert "Traceback" not in err
    steps = len(_lines(run / "metrics.jsonl"))
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == 2 * steps
    assert latest_state(run).name == f"step-{steps:06d}"
    assert steps < 8
    assert main(["train", f"resume={run}", "max_steps=8"]) == 0  # resumed to a nearer end than STEPS
    assert [r["step"] for r in _lines(run / "metrics.jsonl")] == list(range(1, 9))


def test_semaphores_of_a_killed_process_are_removed_by_the_next_run() -> None:
    code = (
        "import multiprocessing as mp, os, signal\n"
        "from streamrl.placement.leftovers import name_semaphores_after_this_process\n"
        "name_semaphores_after_this_process()\n"
        "q = mp.get_context('spawn').Queue()\n"
        "os.killpg(os.getpid(), signal.SIGKILL)  # the resource tracker dies with it\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], start_new_session=True)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    mine = f"sem.{leftovers.PREFIX}{proc.pid}-"
    assert [f for f in leftovers.SHM.glob(f"{mine}*")], "the killed process left no named semaphore"
    assert leftovers.remove_leftovers() >= 1
    assert not list(leftovers.SHM.glob(f"{mine}*"))
