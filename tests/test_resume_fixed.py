"""A resumed run keeps the keys its saved state fixes however they are changed: a `key=value` override
(tests/test_config.py), a keyword of streamrl.train, or an attribute of a Config made with resume=,
each refused in the same line before anything in the run directory is written; the keys a
resume may change still pass, rollout.replay_capacity among them (applied to the saved successes)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiny_args import TINY

import streamrl
from streamrl.api import make_config
from streamrl.config import RESUME_FIXED, config_yaml, load_config, refuse_changes_a_resume_would_ignore
from streamrl.data.replay import ReplayBuffer, make_replay
from streamrl.eval_settings import eval_config
from streamrl.observe.model_card import reproduce_command
from streamrl.preflight import preflight
from streamrl.types import TrainBatch, Trajectory

# a key the saved state fixes: its value in the saved run, another one
CHANGES = [
    ("train.lr", 2e-05, 3e-4),
    ("seed", 0, 3),
    ("model", "tiny-random", "smollm2-135m-instruct"),
    ("train.betas", (0.9, 0.99), (0.8, 0.9)),
    ("eval.max_new_tokens", 8, 16),
    ("advantage.name", "grpo", "gae"),  # a value head the saved optimizer state does not hold
]


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A run directory as a run leaves it (its config.yaml, its log, a saved state's directory), to resume
    as far as preflight."""
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "run"
    (run / "state" / "step-000001").mkdir(parents=True)
    (run / "config.yaml").write_text(config_yaml(load_config(None, [*TINY, f"run_dir={run}"])))
    (run / "metrics.jsonl").touch()
    return run


def _files(run: Path) -> dict[str, bytes]:
    return {str(p.relative_to(run)): p.read_bytes() for p in sorted(run.rglob("*")) if p.is_file()}


def _line(run: Path, key: str, old: Any, new: Any) -> str:
    return (
        f"resume: config key '{key}' is {old!r} in {run}/config.yaml, not {new!r}: a resumed run keeps "
        f"it ({RESUME_FIXED[key]}); drop the override, or start a new run from its checkpoint"
    )


@pytest.mark.parametrize(("key", "old", "new"), CHANGES)
def test_train_refuses_a_fixed_key_given_on_a_resumed_config(run: Path, key: str, old: Any, new: Any) -> None:
    """streamrl.train(make_config(resume=RUN), **{key: value}): the CLI's line, nothing written."""
    before = _files(run)
    cfg = make_config(resume=str(run))
    with pytest.raises(streamrl.ConfigError) as e:
        streamrl.train(cfg, **{key: new})
    assert str(e.value) == _line(run, key, old, new)
    assert _files(run) == before


@pytest.mark.parametrize(("key", "old", "new"), CHANGES)
def test_train_refuses_a_fixed_key_set_on_the_config_object(run: Path, key: str, old: Any, new: Any) -> None:
    """cfg.train.lr = ... on a Config made with resume=: refused as an override is."""
    before = _files(run)
    cfg = make_config(resume=str(run))
    *path, name = key.split(".")
    part = cfg
    for p in path:
        part = getattr(part, p)
    setattr(part, name, new)
    with pytest.raises(streamrl.ConfigError) as e:
        streamrl.train(cfg)
    assert str(e.value) == _line(run, key, old, new)
    assert _files(run) == before


@pytest.mark.parametrize(("key", "old", "new"), CHANGES)
def test_make_config_refuses_a_fixed_key_at_once(run: Path, key: str, old: Any, new: Any) -> None:
    """make_config(resume=RUN, key=...) and make_config(a Config made with resume=, key=...): the line
    comes from make_config itself, not later from train's preflight; the Config made before is kept."""
    with pytest.raises(streamrl.ConfigError) as given:
        make_config(resume=str(run), **{key: new})
    cfg = make_config(resume=str(run))
    with pytest.raises(streamrl.ConfigError) as layered:
        make_config(cfg, **{key: new})
    assert str(given.value) == str(layered.value) == _line(run, key, old, new)
    assert (cfg.model, cfg.seed, cfg.train.lr) == ("tiny-random", 0, 2e-05)


def test_evaluate_takes_a_resumed_config_with_another_model(
    run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An evaluation continues no run: a Config made with resume= may evaluate another model (the run's
    export, say) on another number of problems; only make_config, for training, refuses them."""
    monkeypatch.setattr("streamrl.eval_cli.run_eval", lambda cfg: {"config": cfg})
    cfg = make_config(resume=str(run))
    out = streamrl.evaluate("smollm2-135m-instruct", cfg, eval={"size": 2})
    assert (out["config"].model, out["config"].eval.size) == ("smollm2-135m-instruct", 2)
    assert (out["config"].resume, out["config"].eval.max_new_tokens) == (str(run), 8)


def test_a_resumed_config_refuses_the_same_change_as_the_cli(run: Path) -> None:
    """The same line from load_config (the CLI's overrides) and from preflight (every training run)."""
    with pytest.raises(streamrl.ConfigError) as cli:
        load_config(None, [f"resume={run}", "train.lr=3e-4"])
    cfg = make_config(resume=str(run))
    cfg.train.lr = 3e-4
    with pytest.raises(streamrl.ConfigError) as api:
        preflight(cfg)
    assert str(cli.value) == str(api.value) == _line(run, "train.lr", 2e-05, 3e-4)


def test_a_resumed_config_may_change_what_its_state_does_not_fix(run: Path) -> None:
    """max_steps, max_time, rollout.max_new_tokens, the replay capacity: preflight passes, and writes
    nothing in the run directory."""
    before = _files(run)
    allowed = {
        "max_steps": 40,
        "max_time": 600.0,
        "rollout.max_new_tokens": 16,
        "rollout.replay_capacity": 8,
        "eval.every": 2,
        "advantage.name": "rloo",  # no critic, as the saved grpo
    }
    cfg = make_config(make_config(resume=str(run)), **allowed)
    assert (cfg.max_steps, cfg.max_time, cfg.rollout.replay_capacity) == (40, 600.0, 8)
    assert preflight(cfg).task is not None
    cfg = make_config(resume=str(run), **allowed)  # as the CLI layers them
    assert preflight(cfg).task is not None
    assert _files(run) == before


def test_a_run_saved_with_eval_length_0_resumes(run: Path) -> None:
    """A config.yaml written unvalidated keeps eval.max_new_tokens 0 (held-out replies as long as the
    training ones): the resume compares it as validate resolves it, and passes."""
    text = (run / "config.yaml").read_text()
    assert "max_new_tokens: 8" in text
    lines = text.splitlines()
    at = lines.index("eval:")
    key = next(i for i in range(at, len(lines)) if lines[i].strip().startswith("max_new_tokens:"))
    lines[key] = lines[key].split(":")[0] + ": 0"
    (run / "config.yaml").write_text("\n".join(lines) + "\n")
    cfg = make_config(resume=str(run))
    assert cfg.eval.max_new_tokens == cfg.rollout.max_new_tokens
    assert preflight(cfg).task is not None


def test_a_run_saved_with_keys_it_never_read_resumes_through_the_python_api(run: Path) -> None:
    """A run saved with LoRA keys and no LoRA (before they were refused): the resume drops them, and the
    check before training compares the saved config as the resume read it, not its raw keys."""
    saved = (run / "config.yaml").read_text()
    (run / "config.yaml").write_text(saved.replace("lora_alpha: 32.0", "lora_alpha: 64.0"))
    cfg = make_config(resume=str(run))
    assert (cfg.train.lora_rank, cfg.train.lora_alpha) == (0, 32.0)
    refuse_changes_a_resume_would_ignore(cfg)  # no line: the run never read lora_alpha
    cfg.train.lora_rank = 4
    with pytest.raises(streamrl.ConfigError) as e:
        refuse_changes_a_resume_would_ignore(cfg)
    assert str(e.value) == _line(run, "train.lora_rank", 0, 4)


def _traj(i: int) -> Trajectory:
    return Trajectory(
        problem_id=f"p{i}",
        group_id=f"g{i}",
        sample_id=f"s{i}",
        prompt_ids=[1],
        completion_ids=[2],
        behaviour_logprobs=[-0.5],
        versions=[0],
        finish_reason="stop",
        reward=1.0,
        correct=True,
    )


def _saved_buffer() -> list[Any]:
    """The state of a buffer of capacity 6 holding six successes, s0 the oldest."""
    buf = ReplayBuffer(share=0.5, capacity=6, seed=0)
    buf.add(TrainBatch([_traj(i) for i in range(6)], [1.0] * 6), step=1)
    buf.replayed_total = 5
    return buf.state()


@pytest.mark.parametrize(("capacity", "kept"), [(3, ["s3", "s4", "s5"]), (6, None), (10, None)])
def test_a_resumed_replay_buffer_takes_the_configured_capacity(capacity: int, kept: list[str] | None) -> None:
    """rollout.replay_capacity given on resume applies: a smaller one keeps the newest saved successes,
    a larger one keeps them all and takes new ones up to it."""
    cfg = load_config(None, ["rollout.replay_share=0.5", f"rollout.replay_capacity={capacity}"])
    buf = make_replay(cfg)
    assert buf is not None
    buf.load(_saved_buffer())
    assert buf.items.maxlen == capacity and buf.replayed_total == 5
    assert [r.trajectory.sample_id for r in buf.items] == (kept or [f"s{i}" for i in range(6)])
    buf.add(TrainBatch([_traj(i) for i in range(6, 12)], [1.0] * 6), step=2)
    assert len(buf.items) == capacity and buf.items[-1].trajectory.sample_id == "s11"


def test_a_config_file_that_sets_resume_is_refused_with_both_ways_out(run: Path) -> None:
    """A resumed run's config.yaml records what it resumed: given as a config file it neither resumes
    (resume= alone does) nor silently starts a new run that continues another's state."""
    saved = run / "config.yaml"
    saved.write_text(saved.read_text().replace("resume: ''", f"resume: {run}"))
    with pytest.raises(streamrl.ConfigError) as e:
        load_config(saved, [f"run_dir={run.parent / 'new'}"])
    assert str(e.value) == (
        f"config file '{saved}' sets resume: {run}: to continue that run give resume={run} alone; to start "
        "a new run from this file, add resume= (empty) or delete its resume line"
    )
    assert load_config(None, [f"resume={run}"]).resume == str(run)  # the run's own resume reads it
    with pytest.raises(streamrl.ConfigError, match="drop the config file"):  # the last resume= counts
        load_config(saved, ["resume=", f"resume={run}"])
    # the model card's command trains it again (resume= clears it); an evaluation resumes nothing
    cfg = load_config(None, [f"resume={run}"])
    command = reproduce_command(cfg).split()
    assert command[:3] == ["streamrl", "train", str(saved)] and command[-1] == "resume="
    assert load_config(saved, command[3:]).resume == ""
    assert eval_config(str(saved), [])[0].resume == ""
    result = streamrl.evaluate(config=str(saved), run_dir=str(run.parent / "ev"), size=2)
    assert result["problems"] == 2


def test_a_resume_naming_an_unknown_estimator_gets_validates_line(run: Path) -> None:
    """Not a traceback from the critic check: validate's line naming the estimators there are."""
    with pytest.raises(streamrl.ConfigError, match="advantage.name") as e:
        load_config(None, [f"resume={run}", "advantage.name=gea"])
    assert "resume:" not in str(e.value)
