"""A run that fails inside a step (its update applied in part) keeps its newest complete state, not the
half-applied one; a step whose evaluation fails is still logged; a resumed run's rates count only the
steps it ran. Each run resumes to the end with every step logged once and no group lost or repeated."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tiny_args import TINY

from streamrl.cli import main
from streamrl.loop.state import latest_state
from streamrl.trainer.trainer import Trainer

ARGS = [*TINY, "max_staleness=1", "train.save_every=1", "train.lr=1e-3", "max_steps=4"]
MODES = {"colocated": ["runtime.mode=colocated", "max_staleness=0"], "async": []}


def _lines(path: Path) -> list[dict]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.is_file() else []


def _finishes_exactly_once(run: Path, steps: int) -> None:
    """Resumed to the end: each step logged once, each group trained once, none lost."""
    assert main(["train", f"resume={run}"]) == 0
    assert [r["step"] for r in _lines(run / "metrics.jsonl")] == list(range(1, steps + 1))
    trained = [g["group_id"] for g in _lines(run / "groups.jsonl")]
    assert len(trained) == len(set(trained)) == 2 * steps
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == 2 * steps


@pytest.mark.parametrize("mode", MODES)
def test_a_failure_inside_a_step_keeps_the_last_complete_state(tmp_path, monkeypatch, mode):
    """The third update is applied and then the step fails (an out-of-memory error, a dead rank): the
    state left for resume= is the second step's, with the second step's weights."""
    from safetensors.torch import load_file

    real, calls, after_two = Trainer.step, [0], {}

    def step(self, batch):
        out = real(self, batch)
        calls[0] += 1
        if calls[0] == 2:
            after_two.update({k: v.detach().clone() for k, v in self.model.state_dict().items()})
        if calls[0] == 3:
            raise RuntimeError("injected failure after the update")
        return out

    monkeypatch.setattr(Trainer, "step", step)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="injected failure"):
        main(["train", *ARGS, *MODES[mode], f"run_dir={run}"])
    monkeypatch.undo()
    newest = latest_state(run)
    assert newest is not None and newest.name == "step-000002"
    assert json.loads((newest / "run_state.json").read_text())["step"] == 2
    saved = load_file(str(newest / "model" / "model.safetensors"))
    shared = [k for k in saved if k in after_two]
    assert shared and [k for k in shared if not torch.equal(saved[k], after_two[k])] == []
    _finishes_exactly_once(run, 4)


def _rollouts_fail_at(monkeypatch, failing: int) -> None:
    """The colocated rollouts of step `failing` raise once generated (the weights are the last step's)."""
    from streamrl.loop.colocated import ColocatedRunner

    real = ColocatedRunner._batch

    def batch(self, step):
        out = real(self, step)
        if step == failing:
            raise RuntimeError("injected rollout failure")
        return out

    monkeypatch.setattr(ColocatedRunner, "_batch", batch)


def test_a_colocated_rollout_failure_saves_the_step_before(tmp_path, monkeypatch):
    """Generating does not change the weights: when step 3's rollouts fail, the state saved is step 2's
    (here the only save), and what step 3 had generated is counted as dropped, not lost."""
    _rollouts_fail_at(monkeypatch, 3)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="injected rollout failure"):
        main(["train", *ARGS, *MODES["colocated"], "train.save_every=0", f"run_dir={run}"])
    monkeypatch.undo()
    assert latest_state(run).name == "step-000002"
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == 4 and acc["filtered"] >= 2
    _finishes_exactly_once(run, 4)


def test_a_colocated_step_run_again_numbers_its_groups_after_the_failed_attempts(tmp_path, monkeypatch):
    """One training problem: step 2's rollouts fail after drawing it, and the resumed step 2 draws it
    again. Its groups get new ids; the failed attempt's stay filtered (the same id would be refused)."""
    data = tmp_path / "five.jsonl"  # eval.size=4 holds four out: one problem left to train on
    data.write_text(
        "".join(json.dumps({"prompt": f"{i} + 1 = ?", "answer": str(i + 1)}) + "\n" for i in range(5))
    )
    _rollouts_fail_at(monkeypatch, 2)
    run = tmp_path / "run"
    args = [*ARGS, *MODES["colocated"], f"task=data:{data}", "rollout.dynamic_sampling=false", "max_steps=3"]
    with pytest.raises(RuntimeError, match="injected rollout failure"):
        main(["train", *args, f"run_dir={run}"])
    monkeypatch.undo()
    assert main(["train", f"resume={run}"]) == 0
    steps = [r["step"] for r in _lines(run / "metrics.jsonl")]
    trained = [g["group_id"] for g in _lines(run / "groups.jsonl")]
    assert steps == [1, 2, 3] and len(trained) == len(set(trained)) == 6
    assert sorted(g.split("-")[1] for g in trained if g.startswith("s2-")) == ["2", "3"]
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == 6 and acc["filter_reasons"] == {"failed_step": 2}


@pytest.mark.parametrize("sampler", ["uniform", "mopps"])
def test_a_colocated_step_run_again_trains_the_problems_its_failed_attempt_drew(
    tmp_path, monkeypatch, sampler
):
    """Step 3's rollouts fail after drawing two problems: the resumed run draws those two again (MoPPS
    with its posteriors, pool and RNG from before them), so each step trains on what an uninterrupted
    run trains on (none skipped, none repeated). Meanwhile the sampler's whole state is taken for the
    final save only, not at every step: MoPPS's posteriors grow with every prompt it has seen."""
    from streamrl.data.samplers import MoPPSSampler

    args = [*ARGS, *MODES["colocated"], "rollout.dynamic_sampling=false", "train.save_every=0"]
    args.append(f"rollout.sampler={sampler}")

    def problems(run: Path) -> list[tuple[int, str]]:
        return sorted((g["step"], g["problem_id"]) for g in _lines(run / "groups.jsonl"))

    taken, real = [], MoPPSSampler.state_dict
    monkeypatch.setattr(MoPPSSampler, "state_dict", lambda self: taken.append(self.draws) or real(self))
    assert main(["train", *args, f"run_dir={tmp_path / 'whole'}"]) == 0
    assert taken == ([8] if sampler == "mopps" else [])  # the final save's, after 4 steps of 2 draws
    _rollouts_fail_at(monkeypatch, 3)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="injected rollout failure"):
        main(["train", *args, f"run_dir={run}"])
    monkeypatch.undo()
    assert main(["train", f"resume={run}"]) == 0
    assert problems(run) == problems(tmp_path / "whole")
    if sampler == "uniform":  # MoPPS may draw a prompt again
        assert len({p for _, p in problems(run)}) == 8


def test_a_step_whose_evaluation_fails_is_logged(tmp_path, monkeypatch):
    """The periodic evaluation of step 2 raises: step 2 is trained and counted, so it has its line."""
    import streamrl.loop.job as job

    def failing(*_a, **_k):
        raise RuntimeError("injected evaluation failure")

    monkeypatch.setattr(job, "periodic_eval", failing)
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="injected evaluation failure"):
        main(["train", *ARGS, *MODES["colocated"], "eval.every=2", f"run_dir={run}"])
    monkeypatch.undo()
    assert [r["step"] for r in _lines(run / "metrics.jsonl")] == [1, 2]
    assert latest_state(run).name == "step-000002"
    _finishes_exactly_once(run, 4)


def test_a_step_whose_groups_log_fails_still_has_its_metrics_line(tmp_path, monkeypatch):
    import streamrl.observe.metrics as metrics

    real = metrics.GroupLog.write

    def write(self, groups, step, advantages=None):
        if step == 2:
            raise OSError("injected: no space left on device")
        return real(self, groups, step, advantages)

    monkeypatch.setattr(metrics.GroupLog, "write", write)
    run = tmp_path / "run"
    with pytest.raises(OSError, match="no space left on device"):
        main(["train", *ARGS, *MODES["colocated"], f"run_dir={run}"])
    assert [r["step"] for r in _lines(run / "metrics.jsonl")] == [1, 2]


def test_when_the_groups_log_and_the_metrics_both_fail_the_groups_log_error_is_raised(
    tmp_path, monkeypatch, capsys
):
    """A full disk fails both writes of step 2: the first failure is the error raised, the second is
    printed, not raised in its place."""
    import streamrl.observe.live as live
    import streamrl.observe.metrics as metrics

    real_write, real_on_step = metrics.GroupLog.write, live.RunObserver.on_step

    def write(self, groups, step, advantages=None):
        if step == 2:
            raise OSError("injected: the groups' log cannot write")
        return real_write(self, groups, step, advantages)

    def on_step(self, record):
        if record["step"] == 2:
            raise OSError("injected: the metrics cannot write")
        return real_on_step(self, record)

    monkeypatch.setattr(metrics.GroupLog, "write", write)
    monkeypatch.setattr(live.RunObserver, "on_step", on_step)
    with pytest.raises(OSError, match="^injected: the groups' log cannot write$"):
        main(["train", *ARGS, *MODES["colocated"], f"run_dir={tmp_path / 'run'}"])
    out = " ".join("".join(capsys.readouterr()).split())  # the console wraps long lines
    assert "step 2's metrics failed too: OSError('injected: the metrics cannot write')" in out


@pytest.mark.parametrize("mode", MODES)
def test_a_step_whose_statistics_fail_is_logged(tmp_path, monkeypatch, mode):
    """A statistic of step 2 raises after its update counted (the rollout backend's, the agents'):
    step 2 still has its line, and the run resumes from it with every step logged once."""
    import streamrl.loop.colocated as colocated
    import streamrl.placement.backend as backend

    calls = {"n": 0}

    def failing_second(real):
        def stats(*a, **k):
            calls["n"] += 1
            if calls["n"] == 2:
                raise RuntimeError("injected statistics failure")
            return real(*a, **k)

        return stats

    if mode == "async":
        monkeypatch.setattr(backend.LocalRollouts, "stats", failing_second(backend.LocalRollouts.stats))
    else:
        monkeypatch.setattr(colocated.EpisodeErrors, "take", failing_second(colocated.EpisodeErrors.take))
    run = tmp_path / "run"
    with pytest.raises(RuntimeError, match="injected statistics failure"):
        main(["train", *ARGS, *MODES[mode], f"run_dir={run}"])
    monkeypatch.undo()
    assert [r["step"] for r in _lines(run / "metrics.jsonl")] == [1, 2]
    assert latest_state(run).name == "step-000002"
    _finishes_exactly_once(run, 4)


def test_the_final_state_is_saved_before_the_logs_close(tmp_path, monkeypatch):
    """Closing a log sink can fail or take long (an online W&B run uploading while a SIGKILL follows a
    SIGTERM): the last step's state is saved first, and the other sinks still close."""
    import streamrl.observe.metrics as metrics

    closed = []

    def failing_close(self):
        closed.append(Path(self._file.name).name)
        self._file.close()
        raise OSError("injected close failure")

    monkeypatch.setattr(metrics.MetricsWriter, "close", failing_close)
    monkeypatch.setattr(metrics.GroupLog, "close", lambda self: closed.append("groups") or self._file.close())
    run = tmp_path / "run"
    with pytest.raises(OSError, match="injected close failure"):
        main(["train", *ARGS, *MODES["colocated"], "max_steps=2", f"run_dir={run}"])
    monkeypatch.undo()
    assert sorted(closed) == ["groups", "metrics.jsonl"]
    assert latest_state(run).name == "step-000002"
    _finishes_exactly_once(run, 2)


def test_a_streamrl_eval_record_written_during_the_run_is_kept(tmp_path, monkeypatch):
    """`streamrl eval run_dir=RUN` may score a checkpoint while the run trains: the run's own eval.json
    at its end keeps that record."""
    import streamrl.loop.job as job

    real = job.save_state

    def save(run_dir, state, *a, **k):
        out = real(run_dir, state, *a, **k)
        if state.step == 1:  # what eval_cli writes into a run directory without a run record yet
            (run_dir / "eval.json").write_text(json.dumps({"sampled": {"model": "step-1", "accuracy": 0.5}}))
        return out

    monkeypatch.setattr(job, "save_state", save)
    run = tmp_path / "run"
    assert (
        main(["train", *ARGS, *MODES["colocated"], "max_steps=2", "eval.after=true", f"run_dir={run}"]) == 0
    )
    evals = json.loads((run / "eval.json").read_text())
    assert evals["sampled"] == {"model": "step-1", "accuracy": 0.5}
    assert evals["final"]["n"] == 4


@pytest.mark.parametrize("mode", MODES)
def test_a_resumed_run_counts_its_own_samples_per_second(tmp_path, mode):
    """samples_per_s is this run's samples over this run's seconds: after a resume at step 2, the one
    step run (8 samples) cannot have taken less time than its own training."""
    run = tmp_path / "run"
    assert main(["train", *ARGS, *MODES[mode], "max_steps=2", f"run_dir={run}"]) == 0
    assert main(["train", f"resume={run}", "max_steps=3"]) == 0
    last = _lines(run / "metrics.jsonl")[-1]
    assert last["step"] == 3
    # seconds within this run's elapsed time: the colocated step's wall, the async trainer's wait + train
    own = last.get("step_time", last["train_time"] + last.get("trainer_wait_time", 0.0))
    assert 0 < last["samples_per_s"] * own <= 8 * (1 + 1e-6)


def test_the_logs_are_synced_before_each_state_that_counts_their_steps(tmp_path, monkeypatch):
    """A state saved at step N says lines 1..N exist: they reach the disk first (a power loss after
    the save must not leave a resumed run without them)."""
    import streamrl.loop.job as job
    import streamrl.observe.metrics as metrics

    events: list[str] = []
    real_sync, real_save = metrics.sync_file, job.save_state

    def sync(f):
        events.append(Path(f.name).name)
        real_sync(f)

    def save(run_dir, state, *a, **k):
        events.append(f"save {state.step}")
        return real_save(run_dir, state, *a, **k)

    monkeypatch.setattr(metrics, "sync_file", sync)
    monkeypatch.setattr(job, "save_state", save)
    assert main(["train", *ARGS, *MODES["colocated"], "max_steps=2", f"run_dir={tmp_path / 'run'}"]) == 0
    saves = [i for i, e in enumerate(events) if e.startswith("save")]
    assert [events[i] for i in saves] == ["save 1", "save 2"]
    for i in saves:
        assert {"metrics.jsonl", "groups.jsonl"} <= set(events[i - 2 : i]), events
