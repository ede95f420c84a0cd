"""Settings that would be accepted and then do nothing, or do something else than they say: refused in
one line naming the key, before any work."""

import pytest

from streamrl.config import ConfigError, config_yaml, load_config


def _saved_run(tmp_path, overrides=()):
    tmp_path.mkdir()
    (tmp_path / "config.yaml").write_text(config_yaml(load_config(None, list(overrides))))
    return tmp_path


def test_a_resume_continues_in_its_own_directory(tmp_path):
    run = _saved_run(tmp_path / "run")
    assert load_config(None, [f"resume={run}", f"run_dir={run}/"]).run_dir == str(
        run
    )  # the same, spelt apart
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"resume={run}", f"run_dir={tmp_path / 'other'}"])
    assert str(e.value) == (
        f"resume: run_dir='{tmp_path / 'other'}' is not the run resumed, '{run}': a resumed run continues in "
        "its own directory; drop run_dir (to train again elsewhere, start a new run from its checkpoint)"
    )


def test_eval_k_given_to_a_resume_asks_for_its_samples(tmp_path):
    """The saved eval.n is a resolved value (0 here): eval.k alone raises it to max(eval.k), as it would
    in a new run, rather than being refused as larger than eval.n."""
    run = _saved_run(tmp_path / "run", ["eval.every=2"])
    cfg = load_config(None, [f"resume={run}", "eval.k=1,4"])
    assert (cfg.eval.n, cfg.eval.k) == (4, (1, 4))
    assert load_config(None, [f"resume={run}", "eval.k=1,4", "eval.n=8"]).eval.n == 8
    run16 = _saved_run(tmp_path / "run16", ["eval.every=2", "eval.n=16"])
    assert load_config(None, [f"resume={run16}", "eval.k=1,4"]).eval.n == 16  # already enough


def test_greedy_sampled_evaluation_is_refused():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["eval.n=4", "eval.temperature=0"])
    assert str(e.value) == (
        "config key 'eval.temperature' is 0 (greedy) with eval.n=4: the samples would all be alike; set "
        "eval.temperature > 0 (e.g. 1.0) or eval.n=0"
    )


def test_training_refuses_samples_it_would_never_draw():
    """Training draws eval.n samples per held-out problem only at its periodic evaluations."""
    from streamrl.preflight import preflight

    with pytest.raises(ValueError) as e:
        preflight(load_config(None, ["model=tiny-random", "eval.n=4"]))
    assert str(e.value) == (
        "config key 'eval.n' is 4, but training samples the held-out set only at its periodic evaluations: "
        "set eval.every > 0 (or eval.n=0 eval.k=[]), or score the checkpoint after with `streamrl eval "
        "model=RUN/checkpoint eval.n=...`"
    )


def test_an_agent_is_not_a_mixture_source():
    from streamrl.tasks import task_from_config

    sources = "[{task: 'agent:streamrl.envs.agents:calculator'}, {task: rg:chain_sum}]"
    with pytest.raises(ValueError) as e:
        task_from_config(load_config(None, ["task=mix", f"task_config.sources={sources}"]))
    assert str(e.value) == (
        "task_config.sources[0]: 'agent:streamrl.envs.agents:calculator' cannot be mixed: an agent over a "
        "mixture is task=agent:streamrl.envs.agents:calculator with task_config.args.base=mix and these "
        "sources"
    )
