"""eval.max_new_tokens follows rollout.max_new_tokens unless set: the held-out replies get the room the
training replies get. The number is resolved when the config is validated, so config.yaml, a resume and
every evaluation read the same one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from streamrl.cli import main
from streamrl.config import Config, config_yaml, from_dict, load_config


def test_the_default_job_evaluates_with_48_tokens_as_before() -> None:
    cfg = load_config(None, [])
    assert (cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens) == (48, 48)
    assert yaml.safe_load(config_yaml(cfg))["eval"]["max_new_tokens"] == 48


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["rollout.max_new_tokens=1024"], 1024),
        (["rollout.max_new_tokens=1024", "eval.max_new_tokens=256"], 256),
        (["eval.max_new_tokens=96"], 96),
        (["rollout.max_new_tokens=16", "eval.max_new_tokens=0"], 16),
    ],
    ids=["follows-rollout", "set-wins-below", "set-wins-above", "zero-follows"],
)
def test_eval_max_new_tokens_follows_rollout_unless_set(overrides: list[str], expected: int) -> None:
    cfg = load_config(None, overrides)
    assert cfg.eval.max_new_tokens == expected
    assert yaml.safe_load(config_yaml(cfg))["eval"]["max_new_tokens"] == expected  # the number, not 0


def test_a_config_file_and_a_dict_resolve_it_too(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text("rollout:\n  max_new_tokens: 300\n")
    assert load_config(f).eval.max_new_tokens == 300
    assert from_dict({"rollout": {"max_new_tokens": 200}}).eval.max_new_tokens == 200


def test_a_negative_limit_is_refused() -> None:
    with pytest.raises(ValueError) as e:
        load_config(None, ["eval.max_new_tokens=-1"])
    assert str(e.value) == "config key 'eval.max_new_tokens' must be >= 0, got -1"


def _saved(run: Path, text: str) -> Path:
    run.mkdir()
    (run / "config.yaml").write_text(text)
    (run / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    return run


def test_a_run_saved_with_48_resumes_with_48(tmp_path: Path) -> None:
    """config.yaml as a run records it (eval.max_new_tokens: 48, rollout 48) resumes unchanged; a resume
    that raises rollout.max_new_tokens keeps the saved evaluation limit, which the base model's
    evaluation was measured with."""
    text = yaml.safe_dump({"rollout": {"max_new_tokens": 48}, "eval": {"max_new_tokens": 48}})
    run = _saved(tmp_path / "run", text)
    assert load_config(None, [f"resume={run}"]).eval.max_new_tokens == 48
    cfg = load_config(None, [f"resume={run}", "rollout.max_new_tokens=1024"])
    assert (cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens) == (1024, 48)


def test_a_run_that_followed_rollout_resumes_with_its_number(tmp_path: Path) -> None:
    run = _saved(tmp_path / "run", config_yaml(load_config(None, ["rollout.max_new_tokens=512"])))
    assert yaml.safe_load((run / "config.yaml").read_text())["eval"]["max_new_tokens"] == 512
    cfg = load_config(None, [f"resume={run}", "rollout.max_new_tokens=64"])
    assert (cfg.rollout.max_new_tokens, cfg.eval.max_new_tokens) == (64, 512)


def test_a_config_made_in_python_gets_the_number_when_validated() -> None:
    from streamrl.api import make_config

    cfg = Config()
    cfg.rollout.max_new_tokens = 40
    assert make_config(cfg).eval.max_new_tokens == 40


def test_streamrl_eval_generates_up_to_rollout_max_new_tokens(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import streamrl.eval.heldout as heldout

    limits: list[int] = []
    real = heldout.evaluate

    def spy(engine: Any, tokenizer: Any, task: Any, problems: Any, max_new_tokens: int, *a: Any, **k: Any):
        limits.append(max_new_tokens)
        return real(engine, tokenizer, task, problems, max_new_tokens, *a, **k)

    monkeypatch.setattr(heldout, "evaluate", spy)
    args = ["eval", "model=tiny-random", "size=2", "rollout.max_new_tokens=5", f"run_dir={tmp_path}"]
    assert main(args) == 0
    assert limits == [5]
