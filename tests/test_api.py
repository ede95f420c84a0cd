"""Your own model, reward functions and data, through the Python API and through the CLI with --config:
rows from a datasets.Dataset and from a JSONL file, reward functions from a file in the working
directory, each function's reward in metrics.jsonl, and bad arguments refused before anything is
written."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tiny_args import TINY

import streamrl
from streamrl.config import parse_override

REWARDS = textwrap.dedent(
    """
    def brevity(prompts, completions, completion_ids, **columns):
        return [1.0 / (1 + len(ids)) for ids in completion_ids]

    def has_digit(prompts, completions, answer, **columns):
        return [float(any(ch.isdigit() for ch in c)) for c in completions]
    """
)
ROWS = [
    {"prompt": f"What is {a} + {b}?", "answer": str(a + b), "level": a % 3}
    for a in range(6)
    for b in range(4)
]
SETTINGS = dict(parse_override(o) for o in TINY) | {"max_steps": 2, "checkpoint.save": True}


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "my_rewards.py").write_text(REWARDS)
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("STREAMRL_CACHE", str(tmp_path / "cache"))  # the rows' JSONL copy goes here
    yield tmp_path
    sys.modules.pop("my_rewards", None)


def _metric_keys(run_dir: Path) -> list[set[str]]:
    return [set(json.loads(x)) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_the_python_api_trains_on_a_dataset_with_weighted_functions(workdir: Path) -> None:
    import datasets
    import my_rewards
    from transformers import AutoModelForCausalLM

    handlers = [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)]
    run = streamrl.train(
        reward_fn=[(my_rewards.brevity, 0.5), my_rewards.has_digit],
        train_data=datasets.Dataset.from_list(ROWS),
        run_dir=str(workdir / "run"),
        **SETTINGS,
    )
    assert run.run_dir == workdir / "run" and run.steps == 2
    assert [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)] == handlers  # Ctrl-C is yours again
    assert [m["step"] for m in run.metrics] == [1, 2]
    for m in run.metrics:
        assert m["reward_mean"] == pytest.approx(0.5 * m["reward/brevity"] + m["reward/has_digit"])
    cfg = (run.run_dir / "config.yaml").read_text()
    assert "fn: my_rewards:brevity" in cfg and "weight: 0.5" in cfg  # a resumable, readable record
    groups = [json.loads(x) for x in (run.run_dir / "groups.jsonl").read_text().splitlines()]
    questions = {f"row-{__import__('hashlib').sha1(r['prompt'].encode()).hexdigest()[:16]}" for r in ROWS}
    assert {g["problem_id"] for g in groups} <= questions  # trained on these rows, nothing else
    AutoModelForCausalLM.from_pretrained(run.checkpoint)
    assert run.final_accuracy == run.evaluation["final"]["accuracy"]

    result = streamrl.evaluate(run.checkpoint, eval_data=ROWS[:3], **{"eval.max_new_tokens": 4})
    assert result["problems"] == 3 and result["model"] == str(run.checkpoint)


def test_the_cli_trains_with_a_config_file_on_jsonl_rows(workdir: Path) -> None:
    from streamrl.cli import main

    (workdir / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    config = {
        **{k: v for k, v in SETTINGS.items() if "." not in k},
        "task": "data:rows.jsonl",
        "reward": {
            "extract": "last_number",
            "fns": [{"fn": "my_rewards.py:brevity", "weight": 2.0}, {"fn": "task", "name": "verifier"}],
        },
    }
    (workdir / "job.yaml").write_text(json.dumps(config))
    dotted = [f"{k}={json.dumps(v)}" for k, v in SETTINGS.items() if "." in k and k != "reward.extract"]
    assert main(["train", "--config", "job.yaml", *dotted, f"run_dir={workdir / 'run'}"]) == 0
    for keys in _metric_keys(workdir / "run"):
        assert {"reward/brevity", "reward/verifier"} <= keys


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"reward_fn": lambda prompts, completions, **kw: [0.0]},
            "reward_fn: .* is not a top-level function; define it at the top level of a module or script",
        ),
        (
            {"train_data": [{"prompt": "x", "answer": "1"}, "oops"]},
            r"train_data\[1\]: expected a dict of columns",
        ),
        ({"train_data": 42}, "train_data: expected a list of dicts, a datasets.Dataset or a path, got int"),
        ({"trian": {"lr": 1}}, "unknown config key 'trian'"),
        (
            {"reward_fn": "missing.py:f"},
            "config key 'reward.fn': file 'missing.py' \\(from 'missing.py:f'\\) not found",
        ),
        ({"model": "./no-such-model"}, "model './no-such-model': not a model directory"),
        (
            {"reward_fn": [("my_rewards.py:brevity", "abc")]},
            r"^reward_fn\[0\]: weight must be a finite number, got 'abc'$",
        ),
        (
            {"reward_fn": [("my_rewards.py:brevity", None)]},
            r"^reward_fn\[0\]: weight must be a finite number, got None$",
        ),
        (
            {"reward_fn": [("my_rewards.py:brevity", 0.2, "x")]},
            r"^reward_fn\[0\]: expected a function or \(function, weight\), got a tuple of 3$",
        ),
        (
            {"reward_fn": 123},
            r"^reward_fn: expected a function, a \(function, weight\) pair or a list of them, got int$",
        ),
        (
            {"train_data": ROWS, "task": "rg:chain_sum"},
            r"^task='rg:chain_sum' and train_data both name the training data: pass one",
        ),
        (
            {"config": {"task": "rg:chain_sum"}, "train_data": ROWS},
            r"^the config dict's 'task': 'rg:chain_sum' and train_data both name the training data: pass one "
            r"\(train_data: rows, a path or 'hf:NAME'; task: a task such as 'rg:NAME'\)$",
        ),
        (
            {"train_data": [{"prompt": r["prompt"]} for r in ROWS]},
            r"^train_data: no usable rows .*; first problem: train_data\[0\]: missing column 'answer'$",
        ),
        (
            {"train_data": ROWS, "eval_data": [{"question": "What is 1 + 1?", "answer": "2"}]},
            r"^eval_data: no usable rows .*; first problem: eval_data\[0\]: missing column 'prompt'$",
        ),
    ],
)
def test_bad_arguments_raise_one_line_and_write_nothing(workdir: Path, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message) as e:
        streamrl.train(run_dir=str(workdir / "run"), **kwargs)
    assert "\n" not in str(e.value)
    assert not (workdir / "run").exists()
    assert not (workdir / "cache").exists()  # rows from code are written only once they are checked


def test_evaluate_names_rows_from_code_as_passed_and_writes_nothing(workdir: Path) -> None:
    rows = [{"prompt": r["prompt"]} for r in ROWS[:3]]
    with pytest.raises(
        streamrl.ConfigError, match=r"first problem: eval_data\[0\]: missing column 'answer'$"
    ):
        streamrl.evaluate("tiny-random", eval_data=rows, run_dir=str(workdir / "run"))
    assert not (workdir / "run").exists() and not (workdir / "cache").exists()


@pytest.mark.parametrize("streaming", [False, True])
def test_rows_from_code_are_named_as_passed_when_skipped(
    workdir: Path, caplog: pytest.LogCaptureFixture, streaming: bool
) -> None:
    """Past the API's check (some rows are usable), the rows are read from their file in the cache; the
    rows skipped are named by the argument and index, not by that file and line."""
    from streamrl.api import make_config
    from streamrl.tasks import task_from_config

    train = [*ROWS[:3], {"prompt": "What is 9 + 9?"}, {"prompt": "", "answer": "2"}]
    held = [{"prompt": "What is 7 + 7?", "answer": None}, {"prompt": "What is 8 + 8?", "answer": "16"}]
    task_config = {"streaming": streaming}
    cfg = make_config(train_data=train, eval_data=held, task_config=task_config, **{"eval.size": 1})
    assert Path(cfg.task.removeprefix("data:")).name.startswith("train_data-")
    task_from_config(cfg)
    warnings = [r.getMessage() for r in caplog.records if r.name == "streamrl.data"]
    assert warnings == [
        "train_data: skipped 2 malformed row(s): train_data[3]: no 'answer' key (other rows have it): add it "
        "or drop the row; train_data[4]: column 'prompt' must be a non-empty string",
        "eval_data: skipped 1 malformed row(s): eval_data[0]: column 'answer' is empty",
    ]


def test_evaluate_takes_the_eval_commands_short_keys(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import streamrl.eval_cli

    made = []
    monkeypatch.setattr(streamrl.eval_cli, "run_eval", lambda cfg: made.append(cfg) or {})
    streamrl.evaluate("tiny-random", k=[1, 4], n=8, temperature=0.5, size=3)
    streamrl.evaluate("tiny-random", k=[1, 8])  # k alone samples n = max(k), as `streamrl eval k=1,8`
    assert [(c.eval.k, c.eval.n, c.eval.size) for c in made] == [
        ((1, 4), 8, 3),
        ((1, 8), 8, made[1].eval.size),
    ]
    assert made[0].eval.temperature == 0.5
    for both in ({"eval.n": 2}, {"eval": {"n": 2}}):  # dotted or nested, before or after the short key
        for keywords in ({"n": 4, **both}, {**both, "n": 4}):
            with pytest.raises(streamrl.ConfigError, match=r"^n= and eval.n both set eval.n: pass one$"):
                streamrl.evaluate("tiny-random", **keywords)


def test_rows_without_reference_answers_train_on_your_own_reward(workdir: Path) -> None:
    import my_rewards

    rows = [{"prompt": f"Say something about {x}."} for x in ("cats", "dogs", "rain", "tea", "maps", "jazz")]
    with pytest.raises(ValueError, match=r"rows without reference answers: answer: null"):
        streamrl.train(reward_fn=my_rewards.brevity, train_data=rows, run_dir=str(workdir / "a"), **SETTINGS)
    with pytest.raises(ValueError, match=r"'task_config.columns.answer' is null .* \(without fn: task\)"):
        streamrl.train(train_data=rows, task_config={"columns": {"answer": None}}, **SETTINGS)
    assert not (workdir / "a").exists()
    run = streamrl.train(
        reward_fn=my_rewards.brevity,
        train_data=rows,
        task_config={"columns": {"answer": None}},
        run_dir=str(workdir / "run"),
        **{**SETTINGS, "eval.size": 2},
    )
    assert [m["step"] for m in run.metrics] == [1, 2]
    assert all(m["reward_mean"] == pytest.approx(m["reward/brevity"]) for m in run.metrics)


def test_evaluate_takes_eval_data_as_the_held_out_rows_whatever_the_task(monkeypatch):
    """task= says how rows are scored (here GSM8K's); eval_data= rows are what is evaluated."""
    import streamrl.eval_cli as eval_cli

    seen = []
    monkeypatch.setattr(eval_cli, "run_eval", lambda cfg: seen.append(cfg) or {})
    rows = [{"prompt": "What is 2+2?", "answer": "4"}]
    streamrl.evaluate("tiny-random", task="hf:openai/gsm8k:main", eval_data=rows)
    [cfg] = seen
    assert cfg.task == "hf:openai/gsm8k:main"
    assert cfg.task_config.eval_data.endswith(".jsonl") and Path(cfg.task_config.eval_data).is_file()
    assert json.loads(Path(cfg.task_config.eval_data).read_text()) == rows[0]


@pytest.mark.parametrize(
    ("size", "expected"),
    [({}, 450), ({"eval": {"size": 10}}, 10), ({"eval.size": 7}, 7), ({"config": {"eval": {"size": 9}}}, 9)],
)
def test_evaluate_takes_every_row_given_from_code_unless_told_how_many(monkeypatch, size, expected):
    import streamrl.eval_cli as eval_cli

    seen = []
    monkeypatch.setattr(eval_cli, "run_eval", lambda cfg: seen.append(cfg) or {})
    rows = [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in range(450)]
    streamrl.evaluate("tiny-random", eval_data=rows, **size)
    assert seen[0].eval.size == expected  # not the default 400 of a task's own held-out set


def test_evaluate_takes_a_hub_name_as_eval_data(monkeypatch):
    import streamrl.eval_cli as eval_cli

    seen = []
    monkeypatch.setattr(eval_cli, "run_eval", lambda cfg: seen.append(cfg) or {})
    streamrl.evaluate("tiny-random", eval_data="hf:openai/gsm8k:main")
    assert (seen[0].task, seen[0].task_config.eval_data) == ("hf:openai/gsm8k:main", "hf:openai/gsm8k:main")


@pytest.mark.parametrize(
    ("train_data", "task"),
    [
        ("hf:openai/gsm8k:main", "hf:openai/gsm8k:main"),
        ("data:rows.jsonl", "data:rows.jsonl"),
        ("rows.jsonl", "data:rows.jsonl"),
        ("some/dir", "data:some/dir"),
    ],
)
def test_train_data_as_a_string_is_a_source_spec_or_a_path(workdir: Path, train_data: str, task: str) -> None:
    from streamrl.api import make_config

    (workdir / "rows.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    (workdir / "some" / "dir").mkdir(parents=True)
    assert make_config(train_data=train_data).task == task


def test_a_data_path_to_nothing_is_named_by_the_argument_that_gave_it(workdir: Path) -> None:
    """train_data / eval_data naming a file that is not there: refused at once, naming the argument (the
    task and task_config.eval_data they become are keys the user never set)."""
    from streamrl.api import make_config
    from streamrl.data.loading import open_splits

    (workdir / "rows.jsonl").write_text(json.dumps(ROWS[0]) + "\n")
    for kwargs, key, name in (
        ({"train_data": "nope.jsonl"}, "train_data", "nope.jsonl"),
        ({"train_data": "data:nope.jsonl"}, "train_data", "nope.jsonl"),
        ({"train_data": "rows.jsonl", "eval_data": "held.jsonl"}, "eval_data", "held.jsonl"),
    ):
        with pytest.raises(streamrl.ConfigError) as e:
            make_config(**kwargs)
        assert str(e.value) == f"{key}: data file '{name}' not found (relative to {workdir})"
    with pytest.raises(streamrl.ConfigError) as e:
        streamrl.evaluate("tiny-random", eval_data=str(workdir / "held.jsonl"))
    assert str(e.value) == f"eval_data: data file '{workdir / 'held.jsonl'}' not found"
    with pytest.raises(ValueError) as e:  # a task the user set is named as the config key it is
        open_splits(make_config(task="data:nope.jsonl").task, False)
    assert str(e.value) == f"config key 'task': data file 'nope.jsonl' not found (relative to {workdir})"
    assert not (workdir / "cache").exists()


def test_string_keys_take_paths(workdir: Path) -> None:
    """A Path (as a Run gives its run_dir and checkpoint) is taken for a key of text; other objects are
    not."""
    from streamrl.api import make_config
    from streamrl.config import config_yaml

    run = workdir / "run"
    cfg = make_config(model=workdir / "ckpt", run_dir=run)
    assert (cfg.model, cfg.run_dir) == (str(workdir / "ckpt"), str(run))
    run.mkdir()
    (run / "config.yaml").write_text(config_yaml(make_config(run_dir=str(run))))
    (run / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    resumed = make_config(resume=run)
    assert (resumed.resume, resumed.run_dir) == (str(run), str(run))
    for value in (42, b"run"):
        with pytest.raises(streamrl.ConfigError) as e:
            make_config(run_dir=value)
        assert str(e.value) == f"config key 'run_dir' expects str, got {value!r}"


def test_evaluate_takes_no_reward_fn() -> None:
    with pytest.raises(streamrl.ConfigError) as e:
        streamrl.evaluate("tiny-random", reward_fn="my_rewards.py:brevity")
    assert str(e.value) == (
        "evaluate() has no reward_fn: held-out problems are scored by the task's own verifier (pass "
        "reward_fn to train())"
    )


@pytest.mark.parametrize(
    ("config", "keywords", "message"),
    [
        (
            {"reward": {"fns": [{"fn": "my_rewards.py:brevity"}]}},
            {},
            "the config dict's 'reward.fns' and reward_fn both name reward functions: pass one",
        ),
        (
            {"reward.fn": "my_rewards.py:brevity"},
            {},
            "the config dict's 'reward.fn' and reward_fn both name reward functions: pass one",
        ),
        (
            None,
            {"reward": {"fn": "my_rewards.py:brevity"}},
            "reward.fn= and reward_fn both name reward functions: pass one",
        ),
        (
            None,
            {"reward.fns": [{"fn": "task"}]},
            "reward.fns= and reward_fn both name reward functions: pass one",
        ),
        (
            "c.yaml",
            {},
            "config file 'c.yaml' sets reward.fns, and reward_fn names reward functions too: remove "
            "reward.fns from the file, or pass no reward_fn",
        ),
    ],
)
def test_reward_fn_beside_the_configs_reward_functions_is_refused(
    workdir: Path, config: dict | str | None, keywords: dict, message: str
) -> None:
    """reward_fn sets the reward functions: beside the config's, it would replace reward.fn silently or
    clash with reward.fns under a key the user never set."""
    (workdir / "c.yaml").write_text("reward:\n  fns:\n  - fn: my_rewards.py:brevity\nmax_steps: 2\n")
    with pytest.raises(streamrl.ConfigError) as e:
        streamrl.train(config, reward_fn="my_rewards.py:has_digit", run_dir=str(workdir / "run"), **keywords)
    assert str(e.value) == message
    assert not (workdir / "run").exists()


def test_reward_fn_beside_a_config_that_names_no_reward_function_is_taken(workdir: Path) -> None:
    """A run's config.yaml (or a whole config dict) holds reward.fn and reward.fns, empty: reward_fn is
    taken."""
    from streamrl.api import make_config

    (workdir / "c.yaml").write_text('reward:\n  fn: ""\n  fns: []\nmax_steps: 2\n')
    for config in ("c.yaml", {"reward": {"fn": "", "fns": []}}, {"reward.fns": []}):
        cfg = make_config(config, reward_fn="my_rewards.py:has_digit")
        assert (cfg.reward.fn, cfg.reward.fns) == ("my_rewards.py:has_digit", ())


def test_settings_given_as_a_dict_and_as_keywords_merge_key_by_key() -> None:
    """A keyword naming a section sets its own keys and leaves the config dict's other keys of that
    section alone (a dict merge replaced the whole section)."""
    from streamrl.api import make_config

    cfg = make_config({"train": {"lr": 1e-5, "warmup_steps": 3}}, train={"grad_clip": 0.5})
    assert (cfg.train.lr, cfg.train.warmup_steps, cfg.train.grad_clip) == (1e-5, 3, 0.5)
    cfg = make_config({"algo": "grpo", "loss": {"eps_high": 0.3}}, eval={"k": (1, 4)})
    assert (cfg.loss.eps_high, cfg.loss.kl_coef, cfg.eval.n) == (
        0.3,
        make_config(algo="grpo").loss.kl_coef,
        4,
    )


def test_a_section_given_in_the_dict_and_as_a_keyword_keeps_both_sets_of_keys() -> None:
    from streamrl.api import make_config
    from streamrl.config import ConfigError

    assert make_config({"eval": {"n": 8}}, eval={"k": [4]}).eval.n == 8  # n was given: k leaves it
    with pytest.raises(
        ConfigError, match=r"^config key 'loss.eps_high'=0.5 is not read by loss.name=reinforce"
    ):
        make_config({"algo": "grpo", "loss": {"eps_high": 0.5}}, loss={"name": "reinforce"})


def test_a_config_made_before_takes_keywords_as_a_fresh_one_does() -> None:
    from streamrl.api import make_config
    from streamrl.config import Config, ConfigError

    assert make_config(Config(), eval={"k": (1, 4)}).eval.n == 4  # k=4 alone asks for 4 samples
    assert make_config(Config(), eval={"k": (1, 4), "n": 8}).eval.n == 8
    assert make_config(Config(), eval={"k": []}).eval.k == ()
    made = make_config(Config(), **{"eval.k": [1, 4], "eval.n": 6})
    assert make_config(made, seed=3).eval.n == 6  # k not given again: the n it was made with stays
    with pytest.raises(ConfigError, match=r"^algo= cannot go on a Config made before .*: pass algo= to "):
        make_config(Config(), algo="grpo")  # would record grpo and train the default loss


def test_two_reward_functions_of_one_name_are_told_apart_by_module(tmp_path):
    """The Python API has no `name:` field: a.score and b.score log as reward/a.score and reward/b.score."""
    import importlib.util

    from streamrl.api import make_config

    modules = []
    for name in ("a", "b"):  # modules a and b, not registered in sys.modules
        (tmp_path / f"{name}.py").write_text("def score(completions, **kw):\n    return [1.0]\n")
        spec = importlib.util.spec_from_file_location(name, tmp_path / f"{name}.py")
        modules.append(importlib.util.module_from_spec(spec))
        spec.loader.exec_module(modules[-1])
    a, b = modules

    cfg = make_config(None, reward_fn=[(a.score, 1.0), (b.score, 2.0)])
    assert list(cfg.reward.fns) == [
        {"fn": "a:score", "weight": 1.0, "name": "a.score"},
        {"fn": "b:score", "weight": 2.0, "name": "b.score"},
    ]


def test_a_script_without_a_main_guard_trains_once(tmp_path):
    """`streamrl.train(reward_fn=f)` at the top level of a script: its reward function is read from the
    running script, which is not run a second time (that would start a second, nested job)."""
    settings = SETTINGS | {"max_steps": 1, "checkpoint.save": False, "eval.after": False}
    settings |= {"runtime.mode": "colocated", "max_staleness": 0}  # no worker process re-runs the script
    script = textwrap.dedent(
        f"""
        import streamrl

        with open("ran.txt", "a") as f:
            f.write("x")

        def brevity(prompts, completions, completion_ids, **columns):
            return [1.0 / (1 + len(ids)) for ids in completion_ids]

        streamrl.train(reward_fn=brevity, run_dir="run", **{settings!r})
        """
    )
    (tmp_path / "train.py").write_text(script)
    res = subprocess.run(
        [sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=600
    )
    assert res.returncode == 0, res.stderr[-3000:]
    assert (tmp_path / "ran.txt").read_text() == "x"  # the script's top level ran once
    rows = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1] and "reward/brevity" in rows[0]


def test_a_function_from_a_notebook_cell_is_refused_with_where_to_put_it():
    """A notebook registers its cells in linecache under names of files that do not exist: no worker
    could import the function from there."""
    import linecache

    from streamrl.api import make_config

    cell = "/nonexistent-kernel-dir/cell_3.py"
    code = "def score(completions, **kw):\n    return [1.0]\n"
    linecache.cache[cell] = (len(code), None, code.splitlines(True), cell)
    namespace: dict = {"__name__": "__main__"}
    exec(compile(code, cell, "exec"), namespace)
    try:
        with pytest.raises(ValueError) as e:
            make_config(None, reward_fn=namespace["score"])
        assert str(e.value) == (
            "reward_fn: score is defined interactively; put it in a .py file and pass it from there "
            "(rollout workers import it by name)"
        )
    finally:
        linecache.cache.pop(cell, None)


def test_run_metrics_read_as_the_report_reads_them(tmp_path, monkeypatch):
    """Run.metrics drops a NaN metric written as null (and names it) and skips a torn last line."""
    import streamrl.loop.job as job

    lines = [
        json.dumps({"step": 1, "loss": 0.5, "entropy": None, "non_finite": ["entropy"]}),
        json.dumps({"step": 2, "loss": 0.25, "entropy": 1.5}),
        '{"step": 3, "lo',
    ]
    (tmp_path / "metrics.jsonl").write_text("\n".join(lines))
    monkeypatch.setattr(job, "run_train", lambda cfg: {"run_dir": str(tmp_path)})
    run = streamrl.train(model="tiny-random", run_dir=str(tmp_path))
    assert run.metrics == [
        {"step": 1, "loss": 0.5, "non_finite": ["entropy"]},
        {"step": 2, "loss": 0.25, "entropy": 1.5},
    ]


def test_a_run_recorded_with_the_older_name_of_its_rows_file_resumes_with_the_same_rows(
    workdir: Path,
) -> None:
    """A run started when rows from code were written to `<digest>.jsonl` (now `train_data-<digest>.jsonl`)
    resumes on the file its config.yaml names when the same rows are passed; other rows are refused, as
    rows, not as an override the user never gave."""
    from streamrl.api import make_config
    from streamrl.config import config_yaml

    held = [{"prompt": "What is 7 + 7?", "answer": "14"}]
    run = workdir / "run"
    cfg = make_config(train_data=ROWS, eval_data=held, run_dir=str(run))
    new = [Path(cfg.task.removeprefix("data:")), Path(cfg.task_config.eval_data)]
    old = [p.with_name(p.name.partition("-")[2]) for p in new]
    for a, b in zip(new, old):
        a.rename(b)  # the cache as the run left it
    cfg.task, cfg.task_config.eval_data = f"data:{old[0]}", str(old[1])
    run.mkdir()
    (run / "config.yaml").write_text(config_yaml(cfg))
    (run / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    resumed = make_config(train_data=ROWS, eval_data=held, resume=str(run))
    assert (resumed.task, resumed.task_config.eval_data) == (f"data:{old[0]}", str(old[1]))
    made = make_config(resume=str(run))  # a Config made before, then the rows
    again = make_config(made, train_data=ROWS, eval_data=held)
    assert (again.task, again.task_config.eval_data) == (f"data:{old[0]}", str(old[1]))
    assert not any(p.exists() for p in new)
    fix = "or no {0} (the run reads its own), or start a new run from its checkpoint"
    for config, resume in ((None, {"resume": str(run)}), (made, {})):
        with pytest.raises(streamrl.ConfigError) as e:
            make_config(config, train_data=ROWS[1:], eval_data=held, **resume)
        assert str(e.value) == (
            f"resume: train_data holds other rows than {run}/config.yaml names (task: 'data:{old[0]}'): a "
            "resumed run keeps them (the data position is the saved stream's); pass the rows it started "
            "with, " + fix.format("train_data")
        )
    with pytest.raises(streamrl.ConfigError) as e:
        make_config({"resume": str(run)}, train_data=ROWS, eval_data=held * 2)
    assert str(e.value) == (
        f"resume: eval_data holds other rows than {run}/config.yaml names (task_config.eval_data: "
        f"'{old[1]}'): a resumed run keeps them (the held-out set, and so the training stream, are the saved "
        "ones); pass the rows it started with, " + fix.format("eval_data")
    )
    fresh = make_config({"resume": str(run)}, resume="", train_data=ROWS[1:])  # resume="": a new run
    assert fresh.resume == "" and fresh.task not in (f"data:{old[0]}", f"data:{new[0]}")


def test_a_config_files_task_beside_train_data_is_refused(workdir: Path) -> None:
    (workdir / "c.yaml").write_text("task: rg:chain_sum\nmax_steps: 2\n")
    with pytest.raises(streamrl.ConfigError) as e:
        streamrl.train("c.yaml", train_data=ROWS, run_dir=str(workdir / "run"))
    assert str(e.value) == (
        "config file 'c.yaml' sets task: 'rg:chain_sum', and train_data names the training data too: remove "
        "task from the file, or pass no train_data"
    )
    assert not (workdir / "run").exists() and not (workdir / "cache").exists()


@pytest.mark.parametrize("streaming", [False, True])
def test_repeated_rows_from_code_are_named_as_passed(
    workdir: Path, caplog: pytest.LogCaptureFixture, streaming: bool
) -> None:
    from streamrl.api import make_config
    from streamrl.tasks import task_from_config

    rows = [dict(r, uid=f"u{i}") for i, r in enumerate(ROWS[:4])]
    rows.append(dict(rows[1], answer="5", uid="u4"))  # row 4 gives row 1's prompt another answer
    task_config = {"streaming": streaming, "columns": {"id": "uid"}}
    task_from_config(make_config(train_data=rows, task_config=task_config, **{"eval.size": 1}))
    warnings = [r.getMessage() for r in caplog.records if r.name == "streamrl.data"]
    if streaming:
        assert warnings == [
            "train_data: 1 row(s) read at set-up give the prompt of an earlier row other answers or tests "
            "(train_data[4] (as train_data[1])): a streamed source reads each row as a problem of its own, "
            "scored by its own answer; give a prompt one row (with a list of accepted answers), or read the "
            "source without streaming"
        ]
    else:
        assert warnings == [
            "train_data: 1 row(s) give the prompt of an earlier row another answer (train_data[4] (as "
            "train_data[1])): a prompt is read once, its answers merged as accepted alternatives"
        ]
    rows[2]["uid"] = "u0"
    with pytest.raises(ValueError) as e:
        task_from_config(make_config(train_data=rows, task_config=task_config, **{"eval.size": 1}))
    assert str(e.value) == (
        "task_config.columns.id: column 'uid' repeats 'u0' (train_data[0] and train_data[2], different "
        "prompts): map a column unique per row, or drop columns.id"
    )
