"""A finished run resumed for more steps: until it ends again, its directory no longer says it finished
(the report reads eval.json's final evaluation and summary.json), its base evaluation, with the sample
responses read from it, stays, and exports past the restored state are removed at once."""

import json

import pytest
from tiny_args import TINY

from streamrl.cli import main
from streamrl.trainer.trainer import Trainer

ARGS = [*TINY, "runtime.mode=colocated", "max_staleness=0", "eval.before=true"]


def test_a_resumed_finished_run_drops_its_earlier_end_until_it_ends_again(tmp_path, monkeypatch):
    run = tmp_path / "run"
    assert main(["train", *ARGS, "max_steps=2", f"run_dir={run}"]) == 0
    first = json.loads((run / "eval.json").read_text())
    assert first["final"] and (run / "summary.json").is_file()

    real, calls = Trainer.step, [0]

    def step(self, batch):  # the resumed run's second step fails
        calls[0] += 1
        if calls[0] == 2:
            raise RuntimeError("injected failure")
        return real(self, batch)

    monkeypatch.setattr(Trainer, "step", step)
    (run / "checkpoints" / "step-3").mkdir(parents=True)  # an export past the saved state (a killed run's)
    with pytest.raises(RuntimeError, match="injected failure"):
        main(["train", f"resume={run}", "max_steps=4"])
    monkeypatch.undo()
    midway = json.loads((run / "eval.json").read_text())
    assert "final" not in midway and "difference" not in midway and not (run / "summary.json").exists()
    assert not (run / "checkpoints" / "step-3").exists()  # removed at the resume, not at a later export
    assert midway["base"] == first["base"] and midway["samples"] == {"base": first["samples"]["base"]}

    assert main(["train", f"resume={run}", "max_steps=4"]) == 0
    end = json.loads((run / "eval.json").read_text())
    assert end["final"] and end["base"] == first["base"] and "difference" in end
    assert end["samples"]["base"] == first["samples"]["base"] and end["samples"]["final"]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4
