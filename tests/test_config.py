import re

import pytest

from streamrl.cli import main
from streamrl.config import ConfigError, load_config, parse_override


def test_defaults_and_overrides_are_typed():
    cfg = load_config(None, ["max_steps=3", "train.lr=2e-5", "rollout.temperature=1", "model=tiny-random"])
    assert cfg.max_steps == 3
    assert cfg.train.lr == 2e-5
    assert isinstance(cfg.rollout.temperature, float) and cfg.rollout.temperature == 1.0
    assert cfg.model == "tiny-random"


def test_yaml_file_then_overrides(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("max_steps: 7\ntrain:\n  lr: 0.001\ntask_config:\n  args: {min_terms: 2}\n")
    cfg = load_config(f, ["train.grad_clip=0.5"])
    assert (cfg.max_steps, cfg.train.lr, cfg.train.grad_clip) == (7, 0.001, 0.5)
    assert cfg.task_config.args == {"min_terms": 2}


def test_a_yaml_file_may_write_floats_as_pyyaml_reads_them(tmp_path):
    """PyYAML (YAML 1.1) reads 1e-5 as the string '1e-5': a float key takes it as the number."""
    f = tmp_path / "c.yaml"
    f.write_text("train:\n  lr: 1e-5\n  grad_clip: 5E-1\nrollout:\n  top_p: .9\n")
    cfg = load_config(f, [])
    assert (cfg.train.lr, cfg.train.grad_clip, cfg.rollout.top_p) == (1e-5, 0.5, 0.9)
    f.write_text("train:\n  lr: fast\n")
    with pytest.raises(ConfigError, match="config key 'train.lr' expects float, got 'fast'"):
        load_config(f, [])


DATA_ONLY = (
    "applies to data tasks (task=data:FILE or hf:NAME); {who} makes its own problems and held-out set: "
    "drop it"
)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["task_config.eval_data=test"],
            "'task_config.eval_data' " + DATA_ONLY.format(who="task 'rg:chain_sum'"),
        ),
        (
            ["task_config.eval_split=test"],
            "'task_config.eval_split' " + DATA_ONLY.format(who="task 'rg:chain_sum'"),
        ),
        (
            ["task_config.columns={prompt: q}"],
            "'task_config.columns' " + DATA_ONLY.format(who="task 'rg:chain_sum'"),
        ),
        (["task_config.split=dev"], "'task_config.split' " + DATA_ONLY.format(who="task 'rg:chain_sum'")),
        (
            ["task_config.streaming=true"],
            "'task_config.streaming' " + DATA_ONLY.format(who="task 'rg:chain_sum'"),
        ),
        (
            ["task=code", "task_config.shuffle_buffer=5"],
            "'task_config.shuffle_buffer' " + DATA_ONLY.format(who="task 'code'"),
        ),
        (
            ["task=code:x.jsonl", "task_config.columns={prompt: q}"],
            "'task_config.columns' " + DATA_ONLY.format(who="task 'code:x.jsonl'"),
        ),
        (
            ["task=agent:streamrl.envs.agents:calculator", "task_config.columns={prompt: q}"],
            "'task_config.columns' "
            + DATA_ONLY.format(who="the agent's base task 'rg:chain_sum' (task_config.args.base)"),
        ),
        (
            ["task=mix", "task_config.sources=[{task: data:a.jsonl}]", "task_config.columns={prompt: q}"],
            "'task_config.columns' is not read with task=mix: set it on each data source "
            "(task_config.sources[i].columns)",
        ),
        (
            [
                "task=mix",
                "task_config.sources=[{task: data:a.jsonl, eval_data: b.jsonl}, {task: rg:chain_sum, "
                "columns: {prompt: q}}]",
            ],
            "'task_config.sources[1].columns' applies to data sources (hf:NAME, data:PATH); 'rg:chain_sum' "
            "makes its own problems and held-out set: drop it",
        ),
    ],
)
def test_a_data_key_for_a_task_that_makes_its_own_problems_is_refused(overrides, message):
    with pytest.raises(ConfigError) as e:
        load_config(None, ["task=rg:chain_sum", *overrides])
    assert str(e.value) == f"config key {message}"


@pytest.mark.parametrize("task", ["env:python_tool", "agent:streamrl.envs.agents:calculator"])
def test_sampled_evaluation_of_multi_turn_tasks_is_refused(task):
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"task={task}", "eval.n=4"])
    assert str(e.value) == (
        f"eval.n > 0 samples single-turn responses; task={task} runs multi-turn episodes: set eval.n=0"
    )


@pytest.mark.parametrize(
    ("override", "key", "default"),
    [
        ("reward.fn=my_rewards:score", "reward.fn", "''"),
        ("reward.fns=[{fn: my_rewards:score}]", "reward.fns", "[]"),
        ("reward.scorer=judge", "reward.scorer", "task"),
        ("reward.overlong_buffer=16", "reward.overlong_buffer", "0"),  # DAPO's overlong shaping
        ("reward.length_penalty=0.01", "reward.length_penalty", "0"),
    ],
)
@pytest.mark.parametrize(
    ("task", "whose"),
    [
        ("env:python_tool", "its environment"),
        ("agent:streamrl.envs.agents:calculator", "the base task's score of the final text"),
    ],
)
def test_reward_keys_a_multi_turn_episode_never_reads_are_refused(task, whose, override, key, default):
    """An episode's reward is its environment's or the base task's score of the agent's final text: a
    reward function, a judge or response shaping would be set and silently never applied."""
    extra = ["reward.judge_url=http://127.0.0.1:9/v1", "reward.judge_model=m"] if "judge" in override else []
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"task={task}", override, *extra])
    assert str(e.value) == (
        f"config key '{key}' does not apply to task={task}: an episode's reward is {whose}; "
        f"set {key}={default}"
    )


@pytest.mark.parametrize("task", ["env:python_tool", "agent:streamrl.envs.agents:calculator"])
def test_a_presets_response_shaping_goes_back_to_its_default_for_episodes(task, tmp_path):
    """algo=dapo sets DAPO's overlong shaping, which no episode reads: it goes back to 0 (a run saved
    before such keys were refused resumes the same way); given by the user it is still refused."""
    from streamrl.config import config_yaml

    cfg = load_config(None, [f"task={task}", "algo=dapo"])
    assert cfg.reward.overlong_buffer == 0 and cfg.loss.eps_high == 0.28  # the rest of the preset stays
    with pytest.raises(ConfigError, match=r"^config key 'reward.overlong_buffer' does not apply"):
        load_config(None, [f"task={task}", "algo=dapo", "reward.overlong_buffer=16"])
    saved = config_yaml(cfg).replace("overlong_buffer: 0", "overlong_buffer: 16")
    assert "overlong_buffer: 16" in saved
    (tmp_path / "config.yaml").write_text(saved)
    (tmp_path / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    assert load_config(None, [f"resume={tmp_path}"]).reward.overlong_buffer == 0
    with pytest.raises(ConfigError, match=r"^config key 'reward.length_penalty' does not apply"):
        load_config(None, [f"resume={tmp_path}", "reward.length_penalty=0.01"])


@pytest.mark.parametrize(
    ("override", "key", "old", "new"),
    [
        ("train.lr=1e-3", "train.lr", 2e-05, 0.001),
        ("seed=3", "seed", 0, 3),
        ("runtime.mode=colocated", "runtime.mode", "async", "colocated"),
        ("task=rg:products", "task", "rg:chain_sum", "rg:products"),
        ("eval.size=10", "eval.size", 400, 10),
        ("task_config.few_shot_n=2", "task_config.few_shot_n", 0, 2),
        ("rollout.sampler=mopps", "rollout.sampler", "uniform", "mopps"),
        ("algo=dapo", "algo", "", "dapo"),
    ],
)
def test_a_resume_refuses_an_override_its_saved_state_would_ignore(tmp_path, override, key, old, new):
    from streamrl.config import RESUME_FIXED, config_yaml

    (tmp_path / "config.yaml").write_text(config_yaml(load_config(None, [])))
    (tmp_path / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    assert load_config(None, [f"resume={tmp_path}", "max_steps=40"]).max_steps == 40  # what may change
    extra = ["max_staleness=0"] if new == "colocated" else []
    with pytest.raises(ConfigError) as e:
        load_config(None, [f"resume={tmp_path}", override, *extra])
    assert str(e.value) == (
        f"resume: config key '{key}' is {old!r} in {tmp_path}/config.yaml, not {new!r}: a resumed run keeps "
        f"it ({RESUME_FIXED[key]}); drop the override, or start a new "
        "run from its checkpoint"
    )
    with pytest.raises(ConfigError, match="resume: config key 'train.lr'"):  # a section dict, as from Python
        load_config(None, [f"resume={tmp_path}"], values={"train": {"lr": 1e-3}})


def test_data_keys_are_read_by_an_agent_over_a_data_base_task():
    cfg = load_config(
        None,
        [
            "task=agent:streamrl.envs.agents:calculator",
            "task_config.args={base: 'data:rows.jsonl'}",
            "task_config.columns={prompt: q}",
            "task_config.eval_data=held.jsonl",
        ],
    )
    assert cfg.task_config.columns == {"prompt": "q"} and cfg.task_config.eval_data == "held.jsonl"


def test_a_mix_source_without_answers_needs_a_reward_of_your_own():
    src = "task_config.sources=[{task: data:a.jsonl, columns: {answer: null}}]"
    with pytest.raises(ConfigError) as e:
        load_config(None, ["task=mix", src])
    assert str(e.value) == (
        "config key 'task_config.sources[0].columns.answer' is null (no reference answers), but the task's "
        "verifier scores the rewards: score with your own reward.fn / reward.fns (without fn: task)"
    )
    assert load_config(None, ["task=mix", src, "reward.fn=my_rewards.py:brevity"]).task == "mix"


def test_unknown_key_names_key_and_valid_keys():
    with pytest.raises(ConfigError) as e:
        load_config(None, ["rollout.temprature=0.5"])
    msg = str(e.value)
    assert "unknown config key 'rollout.temprature'" in msg
    assert "did you mean 'rollout.temperature'" in msg
    assert "prompts_per_step" in msg and "\n" not in msg


def test_unknown_top_level_key():
    with pytest.raises(ConfigError, match="unknown config key 'modle'.*did you mean 'model'"):
        load_config(None, ["modle=x"])


@pytest.mark.parametrize(
    "override, fragment",
    [
        ("max_steps=abc", "config key 'max_steps' expects int, got 'abc'"),
        ("max_steps=1.5", "config key 'max_steps' expects int"),
        (
            "train.precision=fp16",
            "config key 'train.precision' expects one of 'auto', 'fp32', 'bf16', got 'fp16'",
        ),
        ("train.betas=[0.9]", "config key 'train.betas' expects"),
        ("eval.before=maybe", "config key 'eval.before' expects bool"),
        (
            "loss.name=nope",
            "config key 'loss.name' must be one of cispo, decoupled_ppo, gspo, gspo_token, m2po, ppo_clip",
        ),
        ("loss.dual_clip=0.5", "config key 'loss.dual_clip' must be 0 (off) or > 1, got 0.5"),
        ("algo=ppo2", "config key 'algo': unknown algo preset 'ppo2'; choose from cispo, dapo, dr_grpo"),
        ("rollout.samples_per_prompt=0", "config key 'rollout.samples_per_prompt' must be > 0"),
        ("rollout.top_p=1.5", "config key 'rollout.top_p' must be in (0, 1]"),
        ("train=3", "config key 'train' is a section"),
        ("checkpoint.dtype=fp16", "config key 'checkpoint.dtype' expects one of 'bf16', 'fp32', got 'fp16'"),
        ("checkpoint.every=-1", "config key 'checkpoint.every' must be >= 0, got -1"),
        ("max_steps", "must look like key=value"),
    ],
)
def test_bad_values_fail_with_one_line(override, fragment):
    with pytest.raises(ConfigError) as e:
        load_config(None, [override])
    assert fragment in str(e.value)


def test_parse_override_scalars():
    assert parse_override("a=1e-5") == ("a", 1e-5)
    assert parse_override("a=true") == ("a", True)
    assert parse_override("a=[1, 2]") == ("a", [1, 2])
    assert parse_override("a=rg:chain_sum") == ("a", "rg:chain_sum")
    assert parse_override("a={b: 1}") == ("a", {"b": 1}) and parse_override("a='x #1'") == ("a", "x #1")
    assert parse_override("a=null") == ("a", None) and parse_override("a=~") == ("a", None)


def test_an_override_means_what_it_spells_where_yaml_1_1_reads_otherwise():
    """A date is a run name, a leading zero is no octal, a pair takes the comma form lists take."""
    assert load_config(None, ["run_dir=2024-05-01"]).run_dir == "2024-05-01"
    with pytest.raises(ConfigError, match=r"^config key 'max_steps' expects int, got '010'$"):
        load_config(None, ["max_steps=010"])  # YAML 1.1 reads 8
    assert load_config(None, ["max_steps=10"]).max_steps == 10
    assert load_config(None, ["train.betas=0.9,0.95"]).train.betas == (0.9, 0.95)
    with pytest.raises(ConfigError, match=r"^config key 'train.betas' expects"):
        load_config(None, ["train.betas=0.9,0.95,0.99"])


def test_a_preset_key_the_loss_chosen_over_it_does_not_read_goes_back_to_its_default():
    """algo=grpo loss.name=reinforce: grpo's clip range is not the user's to remove; one the user sets
    for a loss that does not read it is still refused."""
    cfg = load_config(None, ["algo=grpo", "loss.name=reinforce"])
    assert cfg.loss.eps_high == type(cfg.loss)().eps_high and cfg.advantage.name == "grpo"
    assert load_config(None, ["algo=rloo", "loss.name=m2po"]).loss.name == "m2po"
    with pytest.raises(
        ConfigError, match=r"^config key 'loss.eps_high'=0.3 is not read by loss.name=reinforce"
    ):
        load_config(None, ["algo=grpo", "loss.name=reinforce", "loss.eps_high=0.3"])
    assert load_config(None, ["algo=grpo"]).loss.eps_high == 0.2  # kept where its loss reads it


def test_a_text_override_is_kept_whole_where_yaml_would_cut_it():
    cfg = load_config(
        None,
        [
            "task_config.instruction=Put the final answer after #### at the end",
            "task_config.system_prompt=Reply in the form: The answer is N",
        ],
    )
    for text in ("Write your result after Answer:", "#### then the number"):  # a mapping, a comment
        assert load_config(None, [f"task_config.instruction={text}"]).task_config.instruction == text
    assert cfg.task_config.instruction == "Put the final answer after #### at the end"  # not a comment
    assert cfg.task_config.system_prompt == "Reply in the form: The answer is N"  # not a mapping


def test_cli_bad_key_exits_2_before_any_work(capsys):
    assert main(["train", "max_stepz=2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1
    assert err[0].startswith("streamrl: error: unknown config key 'max_stepz' (did you mean 'max_steps'?)")


@pytest.mark.parametrize(
    "old, new",
    [("train.save_checkpoint=false", "checkpoint.save"), ("train.checkpoint_every=5", "checkpoint.every")],
)
def test_a_moved_key_names_its_new_name(tmp_path, capsys, old, new):
    key = old.split("=")[0]
    assert main(["train", old, f"run_dir={tmp_path / 'r'}"]) == 2
    assert capsys.readouterr().err == f"streamrl: error: config key '{key}' is now '{new}': rename it\n"
    assert not (tmp_path / "r").exists()
    f = tmp_path / "old.yaml"  # in a YAML section too
    f.write_text(f"train:\n  {key.split('.')[1]}: {old.split('=')[1]}\n")
    with pytest.raises(ConfigError, match=f"^config key '{key}' is now '{new}': rename it$"):
        load_config(f)


def test_checkpoint_section_defaults():
    c = load_config(None, []).checkpoint
    assert (c.save, c.every, c.dtype) == (True, 0, "bf16")


def test_cli_missing_config_file(capsys):
    assert main(["train", "nope.yaml"]) == 2
    assert "config file 'nope.yaml' not found" in capsys.readouterr().err


def test_engine_vllm_config_errors(not_installed):
    not_installed("vllm")
    with pytest.raises(ConfigError, match=r"engine=vllm needs vLLM: pip install 'streamrl\[vllm\]'"):
        load_config(None, ["engine=vllm"])
    with pytest.raises(ConfigError, match="engine=vllm runs in the async rollout workers only"):
        load_config(None, ["engine=vllm", "runtime.mode=colocated", "max_staleness=0"])
    with pytest.raises(ConfigError, match="'vllm.kv_cache_gib' must be > 0"):
        load_config(None, ["engine=vllm", "vllm.kv_cache_gib=0"])
    with pytest.raises(ConfigError) as e:  # before the install hint: the key is wrong either way
        load_config(None, ["engine=vllm", "rollout.precision=bf16"])
    assert str(e.value) == (
        "config key 'rollout.precision'=bf16 is not the rollouts' dtype with engine=vllm (vLLM decodes in "
        "vllm.dtype): set vllm.dtype (float32, bfloat16 or auto) and drop rollout.precision"
    )
    with pytest.raises(ConfigError, match="engine"):
        load_config(None, ["engine=sglang"])


def test_a_training_temperature_below_its_floor_is_refused():
    """Below 1e-4 a training sample is the greedy one and its log-prob under T has no gradient but at tied
    top logits, where it grows as 1/T: refused, 0 (greedy) and 1e-4 accepted; an evaluation samples at any
    temperature (nothing trains on it). The range reads 0 (greedy), not 0 (off)."""
    RANGE = "0 (greedy) or >= 0.0001"
    for t, shown in (("1e-39", "1e-39"), ("9e-6", "9e-06"), ("9.9e-5", "9.9e-05")):
        with pytest.raises(ConfigError) as e:
            load_config(None, [f"rollout.temperature={t}"])
        assert str(e.value) == f"config key 'rollout.temperature' must be {RANGE}, got {shown}"
    for t in ("0", "1e-4"):
        assert load_config(None, [f"rollout.temperature={t}"]).rollout.temperature == float(t)
    assert load_config(None, ["eval.temperature=1e-39"]).eval.temperature == 1e-39


def test_engine_hf_ignores_the_vllm_section():
    assert load_config(None, ["vllm.dtype=bfloat16"]).vllm.dtype == "bfloat16"


@pytest.mark.parametrize(
    "source, message",
    [
        ("weight: .nan", "'task_config.sources[0].weight' must be a finite number > 0, got nan"),
        ("weight: .inf", "'task_config.sources[0].weight' must be a finite number > 0, got inf"),
        ("columns: question", "'task_config.sources[0].columns' expects"),
        ("shuffle_buffer: 0", "'task_config.sources[0].shuffle_buffer' must be > 0, got 0"),
        ("streaming: maybe", "'task_config.sources[0].streaming' expects"),
        ("args: 5", "'task_config.sources[0].args' must be a mapping of the task's settings, got 5"),
    ],
)
def test_a_mixture_sources_keys_are_checked_as_the_same_top_level_keys(source, message):
    with pytest.raises(ConfigError, match="^config key " + re.escape(message)):
        load_config(None, ["task=mix", f"task_config.sources=[{{task: data:a.jsonl, {source}}}]"])
    cfg = load_config(
        None,
        [
            "task=mix",
            "task_config.sources=[{task: data:a.jsonl, shuffle_buffer: 8, streaming: true, weight: 2}]",
        ],
    )
    assert cfg.task_config.sources[0]["shuffle_buffer"] == 8


def test_a_vllm_run_saved_with_rollout_precision_resumes_as_it_ran(tmp_path, not_installed):
    """rollout.precision with engine=vllm is refused in a new run; a run saved before that refusal resumes
    with it (its evaluations keep their precision): the next check it meets is vLLM's install."""
    from streamrl.config import Config, config_yaml

    not_installed("vllm")
    saved = Config(engine="vllm")
    saved.rollout.precision, saved.run_dir = "bf16", str(tmp_path)
    (tmp_path / "config.yaml").write_text(config_yaml(saved))
    (tmp_path / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    with pytest.raises(ConfigError, match=r"^engine=vllm needs vLLM"):
        load_config(None, [f"resume={tmp_path}"])
    with pytest.raises(ConfigError, match=r"^config key 'rollout.precision'=bf16 is not the rollouts' dtype"):
        load_config(tmp_path / "config.yaml", [f"run_dir={tmp_path / 'again'}"])  # a new run of it
