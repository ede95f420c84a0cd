"""A run state that cannot be written (a full disk) stops the run with one line and keeps the newest
complete state to resume from."""

from __future__ import annotations

import copy

import pytest
import torch
from tiny_args import TINY

from streamrl.cli import main
from streamrl.config import load_config
from streamrl.loop import state as state_mod
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
