"""The command line and its config: --config, --version, `streamrl config`, YAML errors, the range of every
numeric key, the judge settings, eval k without n. Bad input: one line, exit 2, nothing written."""

from __future__ import annotations

import dataclasses
import json
import typing
from pathlib import Path

import pytest

import streamrl
from streamrl.cli import main
from streamrl.config import Config, load_config
from streamrl.config_bounds import BOUNDS
from streamrl.config_docs import render
from streamrl.eval_cli import expand_shorthands


def _error(capsys: pytest.CaptureFixture[str]) -> str:
    """The whole of stderr, which must be exactly one line."""
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    return err


def _all_keys(cls: type = Config, prefix: str = "") -> list[tuple[str, typing.Any]]:
    hints = typing.get_type_hints(cls)
    out = []
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            out += _all_keys(hints[f.name], f"{prefix}{f.name}.")
        else:
            out.append((prefix + f.name, hints[f.name]))
    return out


# ---- --config FILE and the positional file ----------------------------------------------------------


@pytest.fixture
def captured(monkeypatch: pytest.MonkeyPatch) -> dict[str, Config]:
    """Replace the train and eval jobs by recorders of the Config they get that create cfg.run_dir as the
    jobs would: a check that lets bad input through shows as a written run_dir, in a second, not as a
    real training run."""
    import streamrl.eval_cli
    import streamrl.loop.job

    got: dict[str, Config] = {}

    def job(name: str) -> typing.Callable[[Config], None]:
        def run(cfg: Config, checked: typing.Any = None) -> None:
            got[name] = cfg
            if cfg.run_dir:
                Path(cfg.run_dir).mkdir(parents=True)

        return run

    monkeypatch.setattr(streamrl.loop.job, "run_train", job("train"))
    monkeypatch.setattr(streamrl.eval_cli, "run_eval", job("eval"))
    return got


def test_config_flag_reads_the_file_with_overrides_on_either_side(tmp_path, captured):
    f = tmp_path / "job.yaml"
    # the tiny model: preflight resolves the model, and the default one is converted from its GGUF
    f.write_text("model: tiny-random\nmax_steps: 7\ntrain:\n  lr: 0.001\nrollout:\n  prompts_per_step: 3\n")
    assert main(["train", "max_steps=2", "--config", str(f), "rollout.prompts_per_step=5"]) == 0
    cfg = captured["train"]
    assert (cfg.max_steps, cfg.train.lr, cfg.rollout.prompts_per_step) == (2, 0.001, 5)
    assert main(["eval", "--config", str(f), "n=4"]) == 0
    assert (captured["eval"].train.lr, captured["eval"].eval.n) == (0.001, 4)


def test_positional_file_still_works(tmp_path, captured):
    f = tmp_path / "job.yaml"
    f.write_text("model: tiny-random\nmax_steps: 7\n")  # the tiny model: preflight resolves it
    assert main(["train", str(f), "seed=3"]) == 0
    assert (captured["train"].max_steps, captured["train"].seed) == (7, 3)


def test_config_flag_and_positional_file_together_is_one_line(tmp_path, capsys, captured):
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("max_steps: 1\n")
    b.write_text("max_steps: 2\n")
    assert main(["train", str(a), "--config", str(b)]) == 2
    assert (
        _error(capsys) == f"streamrl: error: two config files, '{a}' and --config '{b}': give one of them\n"
    )
    assert captured == {}


def test_config_flag_with_a_missing_file(tmp_path, capsys, captured):
    assert main(["eval", "--config", str(tmp_path / "nope.yaml")]) == 2
    assert _error(capsys) == f"streamrl: error: config file '{tmp_path / 'nope.yaml'}' not found\n"


def test_a_model_or_a_directory_in_the_config_files_place_is_named_for_what_it_is(tmp_path, capsys, captured):
    model, run, own, other = tmp_path / "m", tmp_path / "run", tmp_path / "own", tmp_path / "d"
    bare = tmp_path / "bare"  # a run that exported no model
    for d in (model, run, own, other, bare):
        d.mkdir()
    (model / "config.json").write_text("{}")
    for d in (run, own, bare):
        (d / "config.yaml").write_text("max_steps: 1\n")
    for d in (run, bare):
        (d / "metrics.jsonl").touch()  # a run's, beside its config.yaml, with a saved state to resume
        (d / "state" / "step-000001").mkdir(parents=True)
    (run / "checkpoint").mkdir()
    (run / "checkpoint" / "config.json").write_text("{}")
    evaluated = (
        f"config file '{run}' is a run's directory: evaluate the model it trained with "
        f"model={run / 'checkpoint'} (its task settings are taken), or give its config file, "
        f"{run / 'config.yaml'}"
    )
    cases = [
        (["eval", str(model)], f"config file '{model}' is a model directory: give it as model={model}"),
        (
            ["train", str(run)],
            f"config file '{run}' is a directory: give the config file in it, {run / 'config.yaml'} (or "
            f"resume={run} to continue the run saved there)",
        ),
        (["eval", str(run)], evaluated),  # an evaluation of a run: the model it trained
        (
            ["eval", str(bare)],
            f"config file '{bare}' is a run's directory, which has exported no model to evaluate (no "
            f"{bare / 'checkpoint'}): give its config file, {bare / 'config.yaml'}, with the model to "
            "evaluate",
        ),
        (  # a config.yaml of your own is no run to resume
            ["train", str(own)],
            f"config file '{own}' is a directory: give the config file in it, {own / 'config.yaml'}",
        ),
        (["train", str(other)], f"config file '{other}' is a directory, not a YAML file"),
        (
            ["train", "tiny-random"],
            "config file 'tiny-random' not found (a model is given as model=tiny-random)",
        ),
    ]
    qwen = "Qwen/Qwen2.5-0.5B-Instruct"
    cases.append((["train", qwen], f"config file '{qwen}' not found (a model is given as model={qwen})"))
    for argv, said in cases:
        assert main(argv) == 2
        assert _error(capsys) == f"streamrl: error: {said}\n"
    assert captured == {}
    import streamrl

    with pytest.raises(streamrl.ConfigError) as e:  # the Python API's evaluation says the same
        streamrl.evaluate(config=str(run))
    assert str(e.value) == evaluated


# ---- --version, streamrl config, --help ------------------------------------------------------------


def test_version(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--version"])
    assert e.value.code == 0
    assert capsys.readouterr().out == f"streamrl {streamrl.__version__}\n"


def test_config_command_prints_every_key_with_type_default_and_description(capsys):
    assert main(["config"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "train.lr (float > 0, default 2e-05): AdamW learning rate" in lines
    assert "max_steps (int >= 0, default 20): training steps (0: evaluate only)" in lines
    assert (
        "rollout.precision (auto|fp32|bf16, default auto): dtype of the engine's weights: bf16 decodes ~2x "
        "faster than fp32 on CPUs with bf16 matmul units; the trainer's decoupled-PPO behaviour weights "
        "correct the small engine/trainer log-prob gap; auto: bf16 where the device has bf16 matrix units, "
        "else fp32 (an AVX2-only CPU emulates bf16, far slower)"
    ) in lines  # a comment block above the field, joined into one line
    assert "loss.dual_clip (float 0 (off) or > 1, default 0.0): PPO dual clip c > 1 for A < 0 tokens " in (
        "\n".join(lines)
    )
    assert "[env] Multi-turn environments (task=env:NAME). Token limits count completion tokens " in (
        "\n".join(lines)
    )  # a section's docstring heads it
    keys = _all_keys()
    for key, _ in keys:
        matching = [line for line in lines if line.startswith(f"{key} (")]
        assert len(matching) == 1, key
        assert not matching[0].endswith("): "), f"{key} has no description"
    assert len([line for line in lines if line and not line.startswith("[")]) == len(keys)


def test_config_command_one_section(capsys):
    assert main(["config", "eval"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "[eval]"
    assert lines[1] == "eval.size (int >= 0, default 400): held-out problems, never trained on"
    assert all(line.startswith("eval.") for line in lines[1:])
    assert len(lines) == 1 + len(dataclasses.fields(Config().eval))


def test_config_command_unknown_section_lists_the_sections(capsys):
    assert main(["config", "trian"]) == 2
    assert _error(capsys) == (
        "streamrl: error: unknown config section 'trian'; sections: runtime, ray, task_config, rollout, "
        "reward, loss, advantage, train, checkpoint, eval, env, observe, vllm\n"
    )


def test_every_numeric_key_has_a_bound():
    numeric = {
        key
        for key, tp in _all_keys()
        if tp in (int, float) or (typing.get_origin(tp) is tuple and typing.get_args(tp)[0] in (int, float))
    }
    assert numeric == set(BOUNDS)


@pytest.mark.parametrize("cmd", ["train", "eval"])
def test_help_points_to_the_config_command(cmd, capsys):
    with pytest.raises(SystemExit):
        main([cmd, "--help"])
    out = capsys.readouterr().out
    assert "--config FILE" in out and "streamrl config [SECTION]" in out


def test_render_is_what_the_command_prints(capsys):
    main(["config"])
    assert capsys.readouterr().out == render()


# ---- YAML errors ------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text, message",
    [
        (
            "max_steps: 3\ntrain:\n  lr: [1, 2\n",
            "line 4, column 1: expected ',' or ']', but got '<stream end>' "
            "(while parsing a flow sequence at line 3)",
        ),
        ("max_steps: 3\nseed: 1: 2\n", "line 2, column 8: mapping values are not allowed here"),
        (
            "train:\n  lr: 0.1\ntrain:\n  grad_clip: 2\n",
            "line 3, column 1: key 'train' given twice (first at line 1)",
        ),
    ],
)
def test_yaml_errors_name_file_line_and_column(tmp_path, capsys, captured, text, message):
    f = tmp_path / "bad.yaml"
    f.write_text(text)
    assert main(["train", "--config", str(f), f"run_dir={tmp_path / 'run'}"]) == 2
    assert _error(capsys) == f"streamrl: error: config file '{f}', {message}\n"
    assert not (tmp_path / "run").exists()


# ---- numeric ranges ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "override, message",
    [
        ("max_steps=-5", "config key 'max_steps' must be >= 0, got -5"),
        ("max_time=-10", "config key 'max_time' must be >= 0, got -10"),
        ("max_time=.inf", "config key 'max_time' must be >= 0, got inf"),
        ("seed=-1", "config key 'seed' must be >= 0, got -1"),
        ("train.lr=0", "config key 'train.lr' must be > 0, got 0"),
        ("train.lr=.nan", "config key 'train.lr' must be > 0, got nan"),
        ("train.betas=[0.9,1.5]", "config key 'train.betas' must be in [0, 1) (each value), got [0.9, 1.5]"),
        ("train.grad_clip=0", "config key 'train.grad_clip' must be > 0, got 0"),
        ("train.warmup_steps=-1", "config key 'train.warmup_steps' must be >= 0, got -1"),
        ("train.weight_decay=-0.1", "config key 'train.weight_decay' must be >= 0, got -0.1"),
        ("train.lora_alpha=0", "config key 'train.lora_alpha' must be > 0, got 0"),
        ("train.threads=-2", "config key 'train.threads' must be >= 0, got -2"),
        ("train.save_every_s=-1", "config key 'train.save_every_s' must be >= 0, got -1"),
        (
            "rollout.dynamic_sampling_rounds=-1",
            "config key 'rollout.dynamic_sampling_rounds' must be >= 0, got -1",
        ),
        (
            "reward.judge_pass_threshold=1.5",
            "config key 'reward.judge_pass_threshold' must be in [0, 1], got 1.5",
        ),
        ("reward.overlong_buffer=-4", "config key 'reward.overlong_buffer' must be >= 0, got -4"),
        ("reward.length_penalty=-0.01", "config key 'reward.length_penalty' must be >= 0, got -0.01"),
        ("reward.cache_size=-1", "config key 'reward.cache_size' must be >= 0, got -1"),
        ("loss.kl_coef=-0.1", "config key 'loss.kl_coef' must be >= 0, got -0.1"),
        ("loss.eps_low=-0.2", "config key 'loss.eps_low' must be >= 0, got -0.2"),
        ("loss.m2_threshold=0", "config key 'loss.m2_threshold' must be > 0, got 0"),
        ("loss.dual_clip=0.5", "config key 'loss.dual_clip' must be 0 (off) or > 1, got 0.5"),
        ("eval.temperature=-1", "config key 'eval.temperature' must be >= 0, got -1"),
        ("eval.k=0", "config key 'eval.k' must be >= 1 (each value), got [0]"),
        (
            "vllm.gpu_memory_utilization=0",
            "config key 'vllm.gpu_memory_utilization' must be in (0, 1], got 0",
        ),
        ("observe.report_every=-1", "config key 'observe.report_every' must be >= 0, got -1"),
    ],
)
def test_out_of_range_values_are_one_line_before_anything_is_written(
    tmp_path, capsys, captured, override, message
):
    assert main(["train", override, f"run_dir={tmp_path / 'run'}"]) == 2
    assert _error(capsys) == f"streamrl: error: {message}\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "override",
    ["max_steps=0", "max_time=0", "loss.eps_low=1.0", "loss.dual_clip=0", "loss.entropy_coef=-0.01"],
)
def test_boundary_values_are_accepted(override):
    load_config(None, [override])


# ---- the judge --------------------------------------------------------------------------------------

JUDGE_ENV = ("STREAMRL_JUDGE_URL", "OPENAI_BASE_URL", "STREAMRL_JUDGE_MODEL")


def test_judge_without_endpoint_or_model_is_refused(tmp_path, capsys, monkeypatch, captured):
    for var in JUDGE_ENV:
        monkeypatch.delenv(var, raising=False)
    assert main(["train", "reward.scorer=judge", "reward.judge_model=m", f"run_dir={tmp_path / 'run'}"]) == 2
    assert _error(capsys) == (
        "streamrl: error: reward.scorer=judge needs reward.judge_url (or STREAMRL_JUDGE_URL / "
        "OPENAI_BASE_URL) and reward.judge_model (or STREAMRL_JUDGE_MODEL); missing: reward.judge_url\n"
    )
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    with pytest.raises(ValueError, match=r"missing: reward.judge_model$"):
        load_config(None, ["reward.scorer=judge"])
    monkeypatch.setenv("STREAMRL_JUDGE_MODEL", "m")
    assert load_config(None, ["reward.scorer=judge"]).reward.scorer == "judge"  # both from the environment
    with pytest.raises(
        ValueError, match=r"^reward.judge_url must start with http:// or https://, got 'host:1'$"
    ):
        load_config(None, ["reward.scorer=judge", "reward.judge_url=host:1"])
    with pytest.raises(  # a URL's credentials stay out of the message
        ValueError, match=r"^reward.judge_url must start with http:// or https://, got '\*\*\*@host:1'$"
    ):
        load_config(None, ["reward.scorer=judge", "reward.judge_url=user:secret@host:1"])


def test_a_judge_url_with_credentials_is_refused_naming_where_it_came_from(
    tmp_path, capsys, monkeypatch, captured
):
    """urllib sends no user:password@ from a URL: it would ask the resolver for "user:pass@host" (or read
    a password's '/' as the end of a port), so such a URL is refused before any work."""
    for var in JUDGE_ENV:
        monkeypatch.delenv(var, raising=False)
    judge = ["train", "reward.scorer=judge", "reward.judge_model=m", f"run_dir={tmp_path / 'run'}"]
    assert main([*judge, "reward.judge_url=https://u:ab/cd+ef@judge.example/v1"]) == 2
    assert _error(capsys) == (
        "streamrl: error: reward.judge_url carries credentials (user:...@): remove them and set "
        "STREAMRL_JUDGE_API_KEY\n"
    )
    assert not (tmp_path / "run").exists()
    monkeypatch.setenv("STREAMRL_JUDGE_URL", "http://u:s@127.0.0.1:8000/v1")
    with pytest.raises(ValueError) as e:
        load_config(None, ["reward.scorer=judge", "reward.judge_model=m"])
    assert str(e.value) == (
        "STREAMRL_JUDGE_URL carries credentials (user:...@): remove them and set STREAMRL_JUDGE_API_KEY"
    )


def test_a_judge_call_must_fit_in_the_reward_timeout(tmp_path, capsys, captured):
    judge = ["reward.scorer=judge", "reward.judge_url=http://127.0.0.1:9/v1", "reward.judge_model=m"]
    # 3 attempts of 30 s and 0.5 + 1 s of backoff: 91.5 s, past the default reward.timeout_s of 60
    assert main(["train", *judge, "reward.judge_timeout_s=30", f"run_dir={tmp_path / 'run'}"]) == 2
    assert _error(capsys) == (
        "streamrl: error: config keys 'reward.timeout_s' and 'reward.judge_timeout_s': a judge call may take "
        "91.5 s (3 attempts of reward.judge_timeout_s=30 s and 1.5 s of backoff), longer than "
        "reward.timeout_s=60 gives a response, so its last attempts would count as timeouts: set "
        "reward.timeout_s>=91.5 or reward.judge_timeout_s<=19.5\n"
    )
    assert not (tmp_path / "run").exists()
    with pytest.raises(
        ValueError, match=r"so its last attempts would count as timeouts: set reward.timeout_s>=46.5$"
    ):
        load_config(None, [*judge, "reward.timeout_s=1"])  # below the backoff alone: no attempt fits
    assert (
        load_config(None, [*judge, "reward.judge_timeout_s=30", "reward.timeout_s=91.5"]).reward.timeout_s
        == 91.5
    )
    assert load_config(None, [*judge, "reward.judge_timeout_s=19.5"]).reward.judge_timeout_s == 19.5
    defaults = load_config(None, judge).reward  # the defaults fit: 3 x 15 + 1.5 = 46.5 <= 60
    assert (defaults.judge_timeout_s, defaults.timeout_s) == (15.0, 60.0)
    assert load_config(None, ["reward.judge_timeout_s=30"]).reward.scorer == "task"  # no judge: no check


def test_a_run_saved_with_a_judge_call_longer_than_its_timeout_resumes_as_it_ran(tmp_path, capsys):
    """Saved with the old default reward.judge_timeout_s=30 (3 x 30 + 1.5 s past reward.timeout_s=60): the
    resume keeps both, as the run scored with them, with one warning line; its workers accept the config;
    a judge timeout the user gives is checked as in a new run, and so is a new run of that config."""
    from streamrl.config import config_yaml, from_dict, to_dict

    judge = ["reward.scorer=judge", "reward.judge_url=http://127.0.0.1:9/v1", "reward.judge_model=m"]
    saved = load_config(None, [*judge, f"run_dir={tmp_path}"])
    saved.reward.judge_timeout_s = 30.0
    (tmp_path / "config.yaml").write_text(config_yaml(saved))
    (tmp_path / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    capsys.readouterr()
    cfg = load_config(None, [f"resume={tmp_path}"])
    assert (cfg.reward.judge_timeout_s, cfg.reward.timeout_s) == (30.0, 60.0)
    assert _error(capsys) == (
        f"streamrl: warning: resume: reward.judge_timeout_s=30 in {tmp_path}/config.yaml does not fit in "
        "reward.timeout_s=60 (a judge call may take 91.5 s: 3 attempts and 1.5 s of backoff), which a new "
        "run refuses; the resumed run keeps both as it ran, a call's attempts past 60 s counting as "
        "timeouts\n"
    )
    assert from_dict(to_dict(cfg)).reward.judge_timeout_s == 30.0  # as a rollout worker reads it
    assert load_config(None, [f"resume={tmp_path}", "reward.timeout_s=91.5"]).reward.timeout_s == 91.5
    assert capsys.readouterr().err == ""  # fits: no warning
    for given in ("reward.judge_timeout_s=25", "reward.timeout_s=90"):
        with pytest.raises(ValueError, match=r"^config keys 'reward.timeout_s' and 'reward.judge_timeout_s'"):
            load_config(None, [f"resume={tmp_path}", given])
    with pytest.raises(ValueError, match=r"set reward.timeout_s>=91.5 or reward.judge_timeout_s<=19.5$"):
        load_config(tmp_path / "config.yaml", [f"run_dir={tmp_path / 'again'}"])  # a new run of it
    assert capsys.readouterr().err == ""


def test_the_python_api_keeps_a_resumed_runs_judge_timeouts_on_a_config_made_before(tmp_path, capsys):
    """make_config(resume=RUN) keeps the saved judge timeouts; keywords layered on that Config do too,
    unless they set a judge timeout, which is checked as in a new run."""
    from streamrl.api import _layered
    from streamrl.config import config_yaml

    judge = ["reward.scorer=judge", "reward.judge_url=http://127.0.0.1:9/v1", "reward.judge_model=m"]
    saved = load_config(None, [*judge, f"run_dir={tmp_path}"])
    saved.reward.judge_timeout_s = 30.0
    (tmp_path / "config.yaml").write_text(config_yaml(saved))
    (tmp_path / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    cfg = load_config(None, [f"resume={tmp_path}"])
    assert _layered(cfg, {}, {"max_steps": 3}, None).reward.judge_timeout_s == 30.0
    with pytest.raises(ValueError, match=r"^config keys 'reward.timeout_s' and 'reward.judge_timeout_s'"):
        _layered(cfg, {}, {"reward.judge_timeout_s": 25}, None)


# ---- eval: k without n ------------------------------------------------------------------------------


def test_eval_k_without_n_samples_max_k(tmp_path):
    assert load_config(None, expand_shorthands(["k=4"])).eval.n == 4
    assert load_config(None, expand_shorthands(["k=1,2"])).eval.n == 2
    assert load_config(None, expand_shorthands(["n=8", "k=4"])).eval.n == 8
    f = tmp_path / "e.yaml"
    f.write_text("eval: {k: [1, 3]}\n")
    assert load_config(f).eval.n == 3
    f.write_text("eval: {k: [1, 3], n: 0}\n")  # n given as 0 (greedy only): k cannot be reported
    with pytest.raises(ValueError, match=r"got k=\[1, 3\] with eval.n=0: raise eval.n or leave it unset"):
        load_config(f)


def test_eval_command_with_k_only_samples_k(tmp_path):
    args = ["eval", "model=tiny-random", "size=2", "k=2", "eval.max_new_tokens=3", f"run_dir={tmp_path}"]
    assert main(args) == 0
    out = json.loads((tmp_path / "eval.json").read_text())
    assert (out["problems"], out["n"], out["ks"]) == (2, 2, [2])
    assert "pass@2" in out and "avg@2" in out
