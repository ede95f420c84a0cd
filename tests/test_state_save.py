"""A run state or checkpoint that cannot be written (a full disk) stops the run with one line and keeps
the newest complete state to resume from (and an earlier complete checkpoint)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from safetensors import SafetensorError
from tiny_args import TINY

from streamrl.cli import main
from streamrl.config import load_config
from streamrl.loop import state as state_mod
from streamrl.loop.durable import swap_in, temp_beside
from streamrl.loop.state import RunState, StateSaveError, load_state, save_state, state_dirs
from streamrl.trainer.trainer import Trainer

TORN = "[enforce fail at inline_container.cc:672] . unexpected pos 68736 vs 68628"


def _failing_from(n: int):
    """torch.save that writes the first n - 1 times, then fails as it does on a full disk."""
    real, calls = torch.save, []

    def save(*args, **kwargs):
        calls.append(1)
        if len(calls) >= n:
            raise RuntimeError(TORN)
        return real(*args, **kwargs)

    return save


def test_a_failed_save_removes_its_partial_state_and_names_the_one_kept(tiny, tmp_path, monkeypatch):
    model, tok = tiny
    trainer = Trainer.from_config(copy.deepcopy(model), load_config(None, ["train.precision=fp32"]), 0)
    save_state(tmp_path, RunState(step=1, version=1), trainer, tok)
    monkeypatch.setattr(state_mod.torch, "save", _failing_from(1))
    with pytest.raises(StateSaveError) as err:
        save_state(tmp_path, RunState(step=2, version=2), trainer, tok)
    msg = str(err.value)
    assert msg.startswith(f"could not write the run state {tmp_path / 'state' / 'step-000002'} (")
    assert "unexpected pos 68736 vs 68628); " in msg and " MB free on that disk. " in msg
    assert "the newest complete state, step-000001, is kept" in msg and "train.keep_states=2" in msg
    assert "\n" not in msg
    assert [p.name for p in (tmp_path / "state").iterdir()] == ["step-000001"]  # no partial directory
    state, _, _ = load_state(tmp_path)
    assert state.step == 1


FULL = 'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left" })'


@pytest.mark.parametrize(
    ("error", "stops"),
    [
        (SafetensorError(FULL), True),  # save_pretrained's weights on a full disk
        (OSError(28, "No space left on device"), True),  # the tokenizer or a JSON file
        (RuntimeError("Error(s) in loading state_dict: size mismatch for lm_head.weight"), False),
        (ValueError("bad config"), False),
    ],
)
def test_only_a_failed_write_becomes_the_one_line_stop(tiny, tmp_path, monkeypatch, error, stops):
    """A write that fails for lack of space, however its library reports it, is the one-line stop; any
    other error (a bug in what is saved) is raised as it is. The partial directory goes either way."""
    model, tok = tiny
    trainer = Trainer.from_config(copy.deepcopy(model), load_config(None, ["train.precision=fp32"]), 0)

    def fail(*args, **kwargs):
        raise error

    monkeypatch.setattr(trainer, "save", fail)
    with pytest.raises(StateSaveError if stops else type(error)) as err:
        save_state(tmp_path, RunState(step=2, version=2), trainer, tok)
    assert isinstance(err.value, StateSaveError) == stops
    if stops:
        assert str(err.value).startswith("could not write the run state ")
        assert "no earlier state was saved" in str(err.value)
    assert list((tmp_path / "state").iterdir()) == []


def test_train_stops_with_one_line_when_its_state_cannot_be_written(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    args = [*TINY, "runtime.mode=colocated", "max_staleness=0", "max_steps=3", "train.save_every=1"]
    monkeypatch.setattr(state_mod.torch, "save", _failing_from(2))  # step 1's state, then a full disk
    assert main(["train", *args, f"run_dir={run}"]) == 1
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("streamrl: stopped:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith(f"streamrl: stopped: could not write the run state {run / 'state'}/step-00000")
    assert lines[0].endswith(
        f"is kept: free disk space (each state holds the weights and the optimizer; "
        f"train.keep_states=2 are kept) and resume with resume={run}"
    )
    assert [d.name for d in state_dirs(run)] == ["step-000001"]
    assert load_state(run)[0].step == 1


def _failing_checkpoints(monkeypatch):
    """Trainer.save writes run states; on a checkpoint it writes the files, then fails as safetensors
    does when a full disk cuts a file short."""
    real = Trainer.save

    def save(self, path, *args, **kwargs):
        real(self, path, *args, **kwargs)
        if Path(path).name.startswith(".tmp-checkpoint-"):
            raise SafetensorError(FULL)

    monkeypatch.setattr(Trainer, "save", save)


def test_train_stops_with_one_line_when_its_checkpoint_cannot_be_written(tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    args = [*TINY, "runtime.mode=colocated", "max_staleness=0", "max_steps=2", "eval.after=false"]
    assert main(["train", *args, "checkpoint.save=true", f"run_dir={run}"]) == 0
    done = (run / "checkpoint" / "model.safetensors").read_bytes()
    _failing_checkpoints(monkeypatch)
    assert main(["train", *args, "max_steps=3", f"resume={run}", "checkpoint.save=true"]) == 1
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("streamrl: stopped:")]
    assert len(lines) == 1 and "Traceback" not in err
    assert lines[0] == (
        f"streamrl: stopped: could not write the checkpoint {run / 'checkpoint'} ({FULL}); "
        f"{lines[0].split('); ')[1].split(' MB')[0]} MB free on that disk. The run state in "
        f"{run / 'state'} holds the same model (model/ in its newest step)"
    )
    # the earlier checkpoint is whole and nothing half-written is left beside it
    assert (run / "checkpoint" / "model.safetensors").read_bytes() == done  # step 2's, not step 3's
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == ["checkpoint"]
    assert load_state(run)[0].step == 3
    # a later export that succeeds replaces it whole
    monkeypatch.undo()
    assert main(["train", *args, "max_steps=4", f"resume={run}", "checkpoint.save=true"]) == 0
    files = sorted(p.name for p in (run / "checkpoint").iterdir())
    assert "README.md" in files and "model.safetensors" in files
    assert (run / "checkpoint" / "model.safetensors").read_bytes() != done
    assert sorted(p.name for p in run.iterdir() if "checkpoint" in p.name) == ["checkpoint"]


def test_a_failed_swap_puts_the_replaced_directory_back(tmp_path, monkeypatch):
    final = tmp_path / "checkpoint"
    final.mkdir()
    (final / "weights").write_text("old")
    tmp = temp_beside(final)
    (tmp / "weights").write_text("new")
    real = Path.rename

    def rename(self, target):
        if self.name.startswith(".tmp-"):
            raise OSError(28, "No space left on device")
        return real(self, target)

    monkeypatch.setattr(Path, "rename", rename)
    with pytest.raises(OSError):
        swap_in(tmp, final)
    assert (final / "weights").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == [tmp.name, "checkpoint"]  # the caller removes tmp


def test_a_swap_cut_short_by_a_crash_is_finished(tiny, tmp_path):
    """A crash after a state was moved aside, before its replacement took its name: resuming puts it
    back; a moved-aside directory whose replacement did arrive is removed at the next save."""
    model, tok = tiny
    trainer = Trainer.from_config(copy.deepcopy(model), load_config(None, ["train.precision=fp32"]), 0)
    save_state(tmp_path, RunState(step=1, version=1), trainer, tok)
    root = tmp_path / "state"
    (root / "step-000001").rename(root / ".old-step-000001-4242")
    assert load_state(tmp_path)[0].step == 1
    assert [p.name for p in root.iterdir()] == ["step-000001"]
    save_state(tmp_path, RunState(step=2, version=2), trainer, tok)
    (root / ".old-step-000002-4242").mkdir()  # moved aside, then replaced: the crash came after
    save_state(tmp_path, RunState(step=3, version=3), trainer, tok)
    assert sorted(p.name for p in root.iterdir()) == ["step-000002", "step-000003"]


def test_saves_a_kill_cut_short_are_swept_by_the_next_save(tiny, tmp_path):
    """A killed process's half-written states (.tmp-step-N-PID), of this step or another, are gone after
    the next save; the one being written is named for its step and this process."""
    import os

    model, tok = tiny
    trainer = Trainer.from_config(copy.deepcopy(model), load_config(None, ["train.precision=fp32"]), 0)
    root = tmp_path / "state"
    for name in (".tmp-step-000004-4242", ".tmp-step-000007-4243"):
        (root / name).mkdir(parents=True)
        (root / name / "trainer.pt").write_bytes(b"torn")
    assert temp_beside(root / "step-000004") == root / f".tmp-step-000004-{os.getpid()}"
    assert sorted(p.name for p in root.iterdir()) == [
        ".tmp-step-000004-" + str(os.getpid()),
        ".tmp-step-000007-4243",
    ]
    (root / f".tmp-step-000004-{os.getpid()}").rmdir()
    save_state(tmp_path, RunState(step=4, version=4), trainer, tok)
    assert [p.name for p in root.iterdir()] == ["step-000004"]


def test_a_file_written_atomically_is_old_or_new_never_torn(tmp_path, monkeypatch):
    """eval.json and accounting.json, read by a resume: a write cut short (here the sync fails, as a kill
    or a full disk would stop it) leaves the previous content under the name."""
    import os

    from streamrl.files import write_text_atomic

    path = tmp_path / "eval.json"
    write_text_atomic(path, '{"old": 1}')
    assert path.read_text() == '{"old": 1}'

    def cut(_fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", cut)
    with pytest.raises(OSError):
        write_text_atomic(path, '{"new": 2, "much": "' + "x" * 100_000 + '"}')
    assert path.read_text() == '{"old": 1}'
    monkeypatch.undo()
    (tmp_path / ".tmp-eval.json-4194305").write_text('{"torn')  # above Linux's largest pid: killed
    write_text_atomic(path, '{"new": 2}')
    assert path.read_text() == '{"new": 2}'
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json"]  # no temporary left behind


def test_a_failed_export_names_the_state_whatever_the_strategy(tmp_path):
    """A checkpoint that cannot be written says what failed and names the run state, which holds the
    same model: train.strategy=fsdp2 saves states too (gathered whole from the ranks' shards)."""
    from streamrl.config import Config
    from streamrl.loop.export import CheckpointWriteError, export_checkpoint

    class FullDisk:
        def save(self, *args: object) -> None:
            raise OSError(28, "No space left on device")

    for strategy in ("fsdp2", "single"):
        cfg = Config(run_dir=str(tmp_path))
        cfg.train.strategy = strategy
        with pytest.raises(CheckpointWriteError) as e:
            export_checkpoint(FullDisk(), None, tmp_path / "checkpoint", cfg, 1, None, None)
        assert str(e.value).startswith(f"could not write the checkpoint {tmp_path / 'checkpoint'} (")
        assert "holds the same model (model/ in its newest step)" in str(e.value)


def test_a_failed_periodic_export_leaves_the_state_before_it_to_resume_from(tmp_path, monkeypatch, capsys):
    """A periodic export that cannot be written (a full disk) stops the run without saving that step's
    state, whose write would meet the same disk: the state before it stays the newest, loadable, and
    its resume trains the step again and exports it."""
    import errno

    real, tried = Trainer.save, []

    def save(self, path, *args, **kwargs):
        if Path(path).parent.name == "checkpoints" and Path(path).name.startswith(".tmp-step-4-"):
            tried.append(path)
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, path, *args, **kwargs)

    monkeypatch.setattr(Trainer, "save", save)
    run = tmp_path / "run"
    args = [*TINY, "runtime.mode=colocated", "max_staleness=0", "train.save_every=2", "checkpoint.every=2"]
    assert main(["train", *args, "max_steps=6", "eval.after=false", f"run_dir={run}"]) == 1
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.startswith("streamrl: stopped:")]
    assert len(tried) == 1 and len(lines) == 1 and "Traceback" not in err
    free = lines[0].split("); ")[1].split(" MB")[0]
    assert lines[0] == (
        f"streamrl: stopped: could not write the checkpoint {run / 'checkpoints' / 'step-4'} ([Errno 28] No "
        f"space left on device); {free} MB free on that disk. Step 4's state is not saved, so that a resume "
        f"trains and exports it again: free disk space and resume with resume={run} (from its newest "
        "state, step-000002)"
    )
    assert [d.name for d in state_dirs(run)] == ["step-000002"]
    assert load_state(run)[0].step == 2
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2"]  # nothing half-written
    monkeypatch.undo()  # space freed: the resume trains steps 3 and 4 again and exports step 4
    assert main(["train", *args, "max_steps=4", "eval.after=false", f"resume={run}"]) == 0
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-2", "step-4"]
    assert load_state(run)[0].step == 4


def test_a_failed_periodic_export_before_any_state_says_to_train_again(tmp_path):
    from streamrl.loop.export import export_stop

    said = export_stop(tmp_path, 2, OSError(28, "No space left on device"))
    assert said.startswith(f"could not write the checkpoint {tmp_path / 'checkpoints' / 'step-2'} (")
    assert said.endswith(
        "Step 2's state is not saved, so that a resume trains and exports it again: no state was saved yet: "
        "free disk space and train again with overwrite=true"
    )
