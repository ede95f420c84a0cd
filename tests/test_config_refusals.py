"""Settings that would be accepted and then do nothing, or do something else than they say: refused in
one line naming the key, before any work."""

import pytest

from streamrl.config import ConfigError, config_yaml, load_config


def _saved_run(tmp_path, overrides=()):
    tmp_path.mkdir()
    (tmp_path / "config.yaml").write_text(config_yaml(load_config(None, list(overrides))))
    (tmp_path / "metrics.jsonl").touch()  # a run's, beside its config.yaml
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


MEASURED = (
    "the base model's evaluation in eval.json and the periodic ones so far were measured with the saved value"
)


@pytest.mark.parametrize(
    ("override", "key", "old", "new", "why"),
    [
        (
            "task_config.system_prompt=Be brief.",
            "task_config.system_prompt",
            "You are a calculator. Reply in the form 'The answer is <number>.'",
            "Be brief.",
            MEASURED,
        ),
        (
            "task_config.instruction=Show your work.",
            "task_config.instruction",
            "",
            "Show your work.",
            MEASURED,
        ),
        (
            "task_config.chat_template=/t/plain.jinja",
            "task_config.chat_template",
            "",
            "/t/plain.jinja",
            MEASURED,
        ),
        ("reward.extract=boxed", "reward.extract", "answer_is", "boxed", MEASURED),
        ("eval.max_new_tokens=96", "eval.max_new_tokens", 48, 96, MEASURED),
        (
            "eval.temperature=0.6",
            "eval.temperature",
            1.0,
            0.6,
            "the periodic evaluations' pass@k, maj@k and avg@n were sampled at the saved value",
        ),
        ("env.max_turns=2", "env.max_turns", 4, 2, MEASURED),
        ("env.max_total_tokens=512", "env.max_total_tokens", 256, 512, MEASURED),
        ("env.max_tokens_per_turn=32", "env.max_tokens_per_turn", 64, 32, MEASURED),
        ("env.top_k=5", "env.top_k", 3, 5, MEASURED),
        ("env.max_observation_chars=200", "env.max_observation_chars", 400, 200, MEASURED),
        ("env.code_timeout=10", "env.code_timeout", 5.0, 10.0, MEASURED),
        ("env.agent_timeout_s=60", "env.agent_timeout_s", 300.0, 60.0, MEASURED),
    ],
)
def test_a_resume_keeps_what_its_held_out_evaluations_were_measured_with(
    tmp_path, override, key, old, new, why
):
    """The base model's evaluation (eval.json) is not made again on resume and the periodic ones are
    logged already: the prompts, the template, the scoring and the limits the final and later ones read
    stay the saved ones, so base -> final compares one measurement."""
    run = _saved_run(tmp_path / "run")
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"resume={run}", override])
    assert str(e.value) == (
        f"resume: config key '{key}' is {old!r} in {run}/config.yaml, not {new!r}: a resumed run keeps it "
        f"({why}); drop the override, or start a new run from its checkpoint"
    )


def test_a_resume_may_change_how_it_trains_and_when_it_evaluates(tmp_path):
    """What only training reads (its sampling, lengths, loss and reward shaping), and whether, when and
    with how many samples the held-out set is evaluated, are the user's to change on resume."""
    run = _saved_run(tmp_path / "run", ["eval.every=2"])
    changes = {
        "rollout.max_new_tokens": 96,
        "rollout.temperature": 0.8,
        "loss.kl_coef": 0.01,
        "loss.eps_high": 0.3,
        "reward.format_weight": 0.0,
        "eval.before": False,
        "eval.after": False,
        "eval.every": 5,
        "eval.n": 8,
        "max_steps": 40,
    }
    cfg = load_config(None, [f"resume={run}", *(f"{k}={v}" for k, v in changes.items())])
    for key, value in changes.items():
        section, _, name = key.rpartition(".")
        assert getattr(getattr(cfg, section) if section else cfg, name) == value, key
    same = ["reward.extract=answer_is", "eval.max_new_tokens=48", "env.agent_timeout_s=300"]
    assert load_config(None, [f"resume={run}", *same]).reward.extract == "answer_is"  # given again: no change


def test_a_resume_given_its_chat_template_by_another_name_of_the_file_keeps_it(tmp_path, monkeypatch):
    """The saved template path is absolute (preflight records it so): the same file named relative is
    the same template; another file is refused."""
    (tmp_path / "plain.jinja").write_text("{{ messages[0].content }}")
    run = _saved_run(tmp_path / "run", [f"task_config.chat_template={tmp_path / 'plain.jinja'}"])
    monkeypatch.chdir(tmp_path)
    cfg = load_config(None, [f"resume={run}", "task_config.chat_template=plain.jinja"])
    assert cfg.task_config.chat_template == "plain.jinja"
    with pytest.raises(ConfigError, match=r"^resume: config key 'task_config.chat_template' is "):
        load_config(None, [f"resume={run}", "task_config.chat_template=other.jinja"])


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


@pytest.mark.parametrize("override", ["train.lora_alpha=16", "train.lora_targets=[q_proj]"])
def test_lora_keys_without_lora_are_refused(override):
    """train.lora_rank=0 trains every weight: a LoRA key given with it would be ignored."""
    key = override.split("=")[0]
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert str(e.value) == (
        f"config key '{key}' applies to LoRA, but train.lora_rank=0 trains every weight: "
        "set train.lora_rank > 0, or drop it"
    )
    assert load_config(None, [override, "train.lora_rank=4"]).train.lora_rank == 4


def test_a_resumed_run_saved_with_lora_keys_it_never_read_drops_them(tmp_path):
    """A run saved before they were refused resumes, as it trained: with every weight."""
    run = tmp_path / "run"
    run.mkdir()
    saved = config_yaml(load_config(None, [])).replace("lora_alpha: 32.0", "lora_alpha: 64.0")
    assert "lora_alpha: 64.0" in saved
    (run / "config.yaml").write_text(saved)
    (run / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    cfg = load_config(None, [f"resume={run}"])
    assert (cfg.train.lora_rank, cfg.train.lora_alpha) == (0, 32.0)
    with pytest.raises(ConfigError, match=r"^config key 'train.lora_alpha' applies to LoRA"):
        load_config(None, [f"resume={run}", "train.lora_alpha=64"])
