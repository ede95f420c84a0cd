"""The run directory, judged before the model is resolved and before anything is written: a directory of
your own (a config.yaml beside your notes and scripts) is no run, never trained into nor deleted by
overwrite=true; a run_dir that cannot be created or written is one line, for `streamrl train` and
`streamrl eval` alike."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tiny_args import TINY
from train_cli import train

from streamrl.cli import main
from streamrl.eval_settings import trained_run
from streamrl.loop.run_dir import claim_run_dir
from streamrl.observe.environment import collect_environment
from streamrl.run_dirs import RUN_MARKERS, holds_run, started_only

RUN_ENVIRONMENT = json.dumps(collect_environment("tiny-random", 1, 1, 1))  # as a run writes it

HUB = "model=Qwen/Qwen2.5-7B-Instruct"  # resolving it would download GBs: refusals come first


@pytest.fixture
def resolved(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models preflight resolves, recorded instead."""
    import streamrl.preflight as preflight

    names: list[str] = []
    for step in ("resolve_model_files", "resolve_model_dir"):
        monkeypatch.setattr(preflight, step, lambda name, seed=0: names.append(name))
    return names


@pytest.fixture
def unread(monkeypatch: pytest.MonkeyPatch) -> None:
    """An evaluation that reads its task fails the test."""
    import streamrl.tasks

    def read(*_a: object, **_k: object) -> None:
        raise AssertionError("the task was read")

    monkeypatch.setattr(streamrl.tasks, "task_from_config", read)


def _yours(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    exp = tmp_path / "exp1"
    (exp / "scripts").mkdir(parents=True)
    files = {"config.yaml": "model: tiny-random\n", "notes.md": "mine", "prepare.py": "print(1)\n"}
    for name, text in files.items():
        (exp / name).write_text(text)
    return exp, files


@pytest.mark.parametrize("extra", [[], ["overwrite=true"]])
def test_a_directory_of_yours_is_never_trained_into_nor_deleted(tmp_path, resolved, capsys, extra) -> None:
    exp, files = _yours(tmp_path)
    assert train([*TINY, HUB, f"run_dir={exp}", *extra]) == 2
    assert capsys.readouterr().err == (
        f"streamrl: error: run_dir {exp} holds files that are not a streamrl run "
        "(config.yaml, notes.md, prepare.py, ...): choose another run_dir\n"
    )
    assert resolved == []
    assert {p.name: p.read_text() for p in exp.iterdir() if p.is_file()} == files
    assert (exp / "scripts").is_dir()


def test_overwrite_deletes_only_a_run(tmp_path: Path) -> None:
    """A run killed before its first step (config.yaml and environment.json) is started over; a run
    killed while its model loaded left only its lock, which is no file of yours."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: tiny-random\n")
    (run / "environment.json").write_text(RUN_ENVIRONMENT)
    assert claim_run_dir(str(run), resume=False, overwrite=True) == run
    assert list(run.iterdir()) == []
    (run / ".lock").touch()
    assert claim_run_dir(str(run), resume=False, overwrite=False) == run
    exp, files = _yours(tmp_path)
    (exp / "environment.json").write_text('{"conda": "base"}')  # a file of yours of that name
    files["environment.json"] = '{"conda": "base"}'
    assert not holds_run(exp)
    with pytest.raises(ValueError, match="holds files that are not a streamrl run"):
        claim_run_dir(str(exp), resume=False, overwrite=True)
    assert {p.name: p.read_text() for p in exp.iterdir() if p.is_file()} == files


@pytest.mark.parametrize("mid_write", [False, True], ids=["before", "mid-write"])
@pytest.mark.parametrize("killed_at", ["environment.json", "config.yaml"])
def test_a_start_killed_while_it_writes_the_runs_files_leaves_a_directory_a_new_run_takes(
    tmp_path: Path, monkeypatch, capsys, killed_at: str, mid_write: bool
) -> None:
    from streamrl.loop import run_dir

    run = tmp_path / "run"
    assert claim_run_dir(str(run), resume=False, overwrite=False) == run
    (run / ".lock").touch()  # the lock a run takes first stays after a kill
    real = run_dir.write_text_atomic
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True)
    environment = json.loads(RUN_ENVIRONMENT)

    def write(path: Path, text: str) -> None:
        if path.name == killed_at:
            if mid_write:  # its temporary file, half written, its writer gone
                (path.parent / f".tmp-{path.name}-{int(dead.stdout)}").write_text(text[:5])
            raise KeyboardInterrupt  # the kill
        real(path, text)

    monkeypatch.setattr(run_dir, "write_text_atomic", write)
    with pytest.raises(KeyboardInterrupt):
        run_dir.write_run_files(run, "model: tiny-random\n", environment)
    monkeypatch.undo()
    # a start cut short, unless the kill came before its first file: then only the lock is there
    assert started_only(run) == (killed_at == "config.yaml" or mid_write)
    if killed_at == "config.yaml":  # environment.json was written: nothing to resume, and it says so
        assert train([f"resume={run}"]) == 2
        assert capsys.readouterr().err == (
            f"streamrl: error: resume: '{run}' holds a run killed at its start, before its config.yaml and "
            f"any saved state: start it again with your config file and settings and run_dir={run}\n"
        )
    assert claim_run_dir(str(run), resume=False, overwrite=False) == run
    run_dir.write_run_files(run, "model: tiny-random\n", environment)  # and its leftover removed
    assert sorted(p.name for p in run.iterdir()) == [".lock", "config.yaml", "environment.json"]
    assert holds_run(run)


def test_an_environment_json_without_a_runs_lock_may_be_yours(tmp_path: Path) -> None:
    exp = tmp_path / "exp"
    exp.mkdir()
    (exp / "environment.json").write_text('{"conda": "base"}')
    with pytest.raises(ValueError, match=r"holds files that are not a streamrl run \(environment.json\)"):
        claim_run_dir(str(exp), resume=False, overwrite=True)
    (exp / ".lock").touch()  # beside a run's lock too: not what a run writes there
    with pytest.raises(ValueError, match=r"holds files that are not a streamrl run \(environment.json\)"):
        claim_run_dir(str(exp), resume=False, overwrite=True)
    assert (exp / "environment.json").read_text() == '{"conda": "base"}'
    (exp / "environment.json").write_text(RUN_ENVIRONMENT)  # as a run writes it, without the lock
    (exp / ".lock").unlink()
    with pytest.raises(ValueError, match=r"holds files that are not a streamrl run \(environment.json\)"):
        claim_run_dir(str(exp), resume=False, overwrite=True)


def test_overwrite_deletes_no_directory_of_yours_whatever_was_checked_before(tmp_path, monkeypatch) -> None:
    import streamrl.loop.run_dir as run_dir

    monkeypatch.setattr(run_dir, "check_run_dir", lambda *_a, **_k: None)
    exp, files = _yours(tmp_path)
    assert claim_run_dir(str(exp), resume=False, overwrite=True) == exp
    assert {p.name: p.read_text() for p in exp.iterdir() if p.is_file()} == files


def test_a_directory_of_yours_is_no_run_to_resume_and_its_config_is_the_way_in(
    tmp_path, resolved, capsys
) -> None:
    exp, files = _yours(tmp_path)
    said = (
        f"streamrl: error: resume: '{exp}' holds a config.yaml but no run (none of metrics.jsonl, state, "
        f"environment.json, summary.json): to train with it, give {exp / 'config.yaml'} as the config file "
        "and drop resume\n"
    )
    assert train([f"resume={exp}"]) == 2
    assert capsys.readouterr().err == said
    assert train([f"resume={exp / 'config.yaml'}"]) == 2
    assert capsys.readouterr().err == (
        f"streamrl: error: resume: '{exp / 'config.yaml'}' is a file, not a run directory: to train with it, "
        "give it as the config file and drop resume\n"
    )
    from streamrl import api

    with pytest.raises(api.ConfigError) as e:  # rows from code are not compared with a config of yours
        api.train(resume=str(exp), train_data=[{"question": "1+1?", "answer": "2"}])
    assert f"streamrl: error: {e.value}\n" == said
    assert resolved == []
    assert {p.name: p.read_text() for p in exp.iterdir() if p.is_file()} == files


def test_resume_of_a_directory_without_a_run_says_what_is_there(tmp_path, resolved, capsys) -> None:
    fix = "give resume the run_dir of the run to continue"
    missing, empty, other = tmp_path / "runs" / "typo", tmp_path / "empty", tmp_path / "other"
    empty.mkdir()
    other.mkdir()
    for name in ("a.txt", "b.txt", "c.txt", "d.txt"):
        (other / name).write_text("x")
    said = {
        missing: f"'{missing}' does not exist: {fix}",
        empty: f"'{empty}' is not a run directory (no config.yaml; it is empty): {fix}",
        other: f"'{other}' is not a run directory (no config.yaml; it holds a.txt, b.txt, c.txt, ...): {fix}",
    }
    for path, line in said.items():
        assert train([f"resume={path}"]) == 2
        assert capsys.readouterr().err == f"streamrl: error: resume: {line}\n"
    assert resolved == [] and not missing.exists() and sorted(p.name for p in other.iterdir())[-1] == "d.txt"


def test_a_run_with_no_saved_state_is_offered_no_resume(tmp_path, resolved, capsys) -> None:
    """A run stopped before its first save (config.yaml, environment.json, no state/step-*): trained
    into, given as the config file or resumed, it is refused in one line that offers overwrite=true,
    not a resume, before anything is read; its config.yaml given as resume names the directory."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("model: tiny-random\n")
    (run / "environment.json").write_text(RUN_ENVIRONMENT)
    before = sorted(p.name for p in run.iterdir())
    said = {
        f"resume={run}/config.yaml": f"resume: '{run}/config.yaml' is a file of a run: give its directory, "
        f"resume={run}",
        f"resume={run}": f"resume: {run} has no saved state (state/step-*): the run stopped before its first "
        "save (train.save_every steps); start it again with overwrite=true",
        f"run_dir={run}": f"run_dir {run} already holds a run, with no saved state to resume: start it over "
        "with overwrite=true, or choose another run_dir",
        str(run): f"config file '{run}' is a directory: give the config file in it, {run / 'config.yaml'}",
    }
    for arg, line in said.items():
        assert train([*TINY, HUB, arg] if arg.startswith("run_dir") else [arg]) == 2
        assert capsys.readouterr().err == f"streamrl: error: {line}\n"
    assert resolved == [] and sorted(p.name for p in run.iterdir()) == before
    (run / "state" / "step-000002").mkdir(parents=True)  # with a saved state, the resume is offered
    assert train([*TINY, HUB, f"run_dir={run}"]) == 2
    assert f"already holds a run: continue it with resume={run}, " in capsys.readouterr().err


def test_a_state_loaded_from_a_run_without_one_is_refused_in_the_preflight_line(tmp_path: Path) -> None:
    """A state gone between the checks and the restore gets the line preflight gives, not another."""
    from streamrl.loop.state import load_state

    (tmp_path / "state" / ".tmp-step-000001-4242").mkdir(parents=True)  # a save a kill cut short
    with pytest.raises(FileNotFoundError) as e:
        load_state(tmp_path)
    assert str(e.value) == (
        f"resume: {tmp_path} has no saved state (state/step-*): the run stopped before its first save "
        "(train.save_every steps); start it again with overwrite=true"
    )


@pytest.mark.parametrize("marker", RUN_MARKERS)
def test_a_run_is_its_config_beside_a_file_only_a_run_writes(tmp_path: Path, marker: str) -> None:
    (tmp_path / "config.yaml").write_text("task: gsm8k\n")
    (tmp_path / "checkpoint").mkdir()
    assert not holds_run(tmp_path) and trained_run(str(tmp_path / "checkpoint")) is None
    if marker == "state":
        (tmp_path / marker).mkdir()
    elif marker == "environment.json":  # as a run writes it: a file of yours of that name is none
        (tmp_path / marker).write_text('{"conda": "base"}')
        assert not holds_run(tmp_path)
        (tmp_path / marker).write_text(RUN_ENVIRONMENT)
    else:
        (tmp_path / marker).write_text("{}")
    assert holds_run(tmp_path)
    assert trained_run(str(tmp_path / "checkpoint")) == (tmp_path, {"task": "gsm8k"})
    (tmp_path / "config.yaml").unlink()
    assert not holds_run(tmp_path)


def _refused(command: str, run_dir: Path) -> int:
    if command == "train":
        return train([*TINY, HUB, f"run_dir={run_dir}"])
    return main(["eval", "model=tiny-random", "size=2", f"run_dir={run_dir}"])


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_run_dir_under_a_file_is_one_line_before_any_work(tmp_path, resolved, unread, capsys, command):
    parent = tmp_path / "hostname"
    parent.write_text("host\n")
    assert _refused(command, parent / "x") == 2
    assert capsys.readouterr().err == (
        f"streamrl: error: run_dir {parent / 'x'} cannot be created: {parent} is a file; "
        "choose another run_dir\n"
    )
    assert resolved == [] and parent.read_text() == "host\n"


def _read_only(tmp_path: Path) -> Path:
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    return locked


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_run_dir_in_a_read_only_directory_is_one_line_before_any_work(
    tmp_path, resolved, unread, capsys, command
):
    locked = _read_only(tmp_path)
    try:
        if os.access(locked, os.W_OK):  # running as root: a 0o500 directory is writable all the same
            pytest.skip("root writes into a 0o500 directory (the test below denies it to root too)")
        assert _refused(command, locked / "run") == 2
        assert _refused(command, locked) == 2
    finally:
        locked.chmod(0o700)
    assert capsys.readouterr().err == (
        f"streamrl: error: run_dir {locked / 'run'} cannot be created: {locked} is not writable; "
        f"choose another run_dir\nstreamrl: error: run_dir {locked} is not writable; choose another run_dir\n"
    )
    assert resolved == [] and list(locked.iterdir()) == []


@pytest.mark.parametrize("command", ["train", "eval"])
def test_a_directory_the_process_may_not_write_is_one_line_even_as_root(
    tmp_path, resolved, unread, capsys, monkeypatch, command
):
    """os.access denying the write, as it does to any user but root in a 0o500 directory."""
    locked = _read_only(tmp_path)
    real = os.access
    monkeypatch.setattr(os, "access", lambda p, *a, **k: Path(p) != locked and real(p, *a, **k))
    assert _refused(command, locked / "a" / "run") == 2
    assert _refused(command, locked) == 2
    locked.chmod(0o700)
    assert capsys.readouterr().err == (
        f"streamrl: error: run_dir {locked / 'a' / 'run'} cannot be created: {locked} is not writable; "
        f"choose another run_dir\nstreamrl: error: run_dir {locked} is not writable; choose another run_dir\n"
    )
    assert resolved == [] and list(locked.iterdir()) == []


def test_an_unset_run_dir_whose_default_cannot_be_created_is_refused_before_any_work(
    tmp_path, monkeypatch, resolved, capsys
):
    """run_dir unset: the run goes to runs/<date-time> in the working directory, refused in one line when
    `runs` there is a file (the same check as a given run_dir's), before the model is resolved."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").write_text("not a directory\n")
    assert train([*TINY, HUB]) == 2
    assert capsys.readouterr().err == (
        f"streamrl: error: run_dir is not set, and its default runs/<date-time> cannot be created in "
        f"{tmp_path}: set run_dir=... to a directory you can write\n"
    )
    assert resolved == [] and sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
