"""The config of `streamrl eval` and streamrl.evaluate: evaluating a trained run's export
(model=RUN/checkpoint or RUN/checkpoints/step-N), it takes from RUN/config.yaml what decides what is
evaluated and how it is prompted and scored, under the settings given (a config file, key=value overrides,
the API's config dict and keywords: a key given there wins), and says so in one line on stderr.

Taken: `task`, the `task_config` section, the reward keys the evaluation's scoring reads (SCORING_KEYS),
`eval.size` and `eval.max_new_tokens`, `rollout.max_new_tokens` (what eval.max_new_tokens=0 follows),
and the `env` section (the limits of env: and agent: episodes). Not the run's model, run_dir, seed or
anything else. With a task given that is not the run's, of
task_config only the keys that shape the prompt (PROMPT_KEYS): the others describe the run's data.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from streamrl.config import Config, ConfigError, _sets, load_config
from streamrl.config_parse import parse_override, read_yaml
from streamrl.run_dirs import holds_run

# the task_config keys that shape the prompt, whatever the task
PROMPT_KEYS = ("system_prompt", "instruction", "chat_template", "few_shot", "few_shot_n")
# the reward keys that score a held-out response (the task's verifier: tasks.task_from_config)
SCORING_KEYS = ("extract", "code_partial_credit", "sandbox_min_isolation", "sandbox_executor")
EVAL_KEYS = ("size", "max_new_tokens")
ROLLOUT_KEYS = ("max_new_tokens",)  # eval.max_new_tokens=0 is the run's reply length, not the default's
# the eval command's and streamrl.evaluate's short keys: n=8 is eval.n=8
SHORTHANDS = {"n": "eval.n", "k": "eval.k", "temperature": "eval.temperature", "size": "eval.size"}


def expand_short_keys(keywords: dict[str, Any]) -> dict[str, Any]:
    """streamrl.evaluate's keywords with n, k, temperature and size as their eval.* keys (SHORTHANDS), in
    the order given; a short key and its eval.* key both given is one line."""
    out: dict[str, Any] = {}
    for key, value in keywords.items():
        full = SHORTHANDS.get(key, key)
        if full != key and _sets(full.split("."), keywords):  # as eval.n=... or eval={"n": ...}
            raise ConfigError(f"{key}= and {full} both set {full}: pass one")
        out[full] = value
    return out


def trained_run(model: str) -> tuple[Path, dict[str, Any]] | None:
    """(run directory, its config.yaml) of the run that exported `model` (RUN/checkpoint or
    RUN/checkpoints/step-N); None for any other model."""
    path = Path(model)
    if not path.is_dir():
        return None
    for run in (path.parent, path.parent.parent):
        if holds_run(run):
            saved = yaml.safe_load((run / "config.yaml").read_text())
            return run, saved if isinstance(saved, dict) else {}
    return None


def run_settings(saved: dict[str, Any], task: str | None) -> dict[str, Any]:
    """The settings an evaluation of a run's model takes from the run's config.yaml (`saved`); `task`:
    the task the evaluation is given, None when it is given none (then it is the run's)."""

    def section(name: str, keys: tuple[str, ...] | None) -> dict[str, Any]:
        part = saved.get(name)
        if not isinstance(part, dict):
            return {}
        return {k: copy.deepcopy(v) for k, v in part.items() if keys is None or k in keys}

    own_task = task is None or task == saved.get("task")
    out: dict[str, Any] = {"task": saved["task"]} if "task" in saved else {}
    out["task_config"] = section("task_config", None if own_task else PROMPT_KEYS)
    out.update(
        reward=section("reward", SCORING_KEYS),
        eval=section("eval", EVAL_KEYS),
        rollout=section("rollout", ROLLOUT_KEYS),
        env=section("env", None),
    )
    return out


def given(key: str, path: str | Path | None, pairs: list[tuple[str, Any]]) -> Any:
    """The value the (key, value) pairs (the last one) or else the config file give the top-level
    `key`; None."""
    for k, v in reversed(pairs):
        if k == key:
            return v
    data = read_yaml(path) if path is not None and Path(path).is_file() else None
    return data.get(key) if isinstance(data, dict) else None


def with_run_settings(
    model: Any, task: Any, load: Callable[[dict[str, Any] | None], Config]
) -> tuple[Config, str | None]:
    """(the evaluation's Config, the line that says which run's settings it took, None when none), the
    same for `streamrl eval` and streamrl.evaluate: `model` and `task` as given (None: not given), `load`
    the caller's loader of its own settings over a base (the run's settings, or None for no run)."""
    found = trained_run(str(model if model is not None else Config.model))
    if found is None:
        return load(None), None
    run, saved = found
    taken = run_settings(saved, None if task is None else str(task))
    try:
        cfg = load(taken)
    except ConfigError as e:
        raise ConfigError(f"{e} (with the task settings of {run}, from its config.yaml)") from None
    if taken.get("task", cfg.task) == cfg.task:
        return cfg, f"taking the task settings of {run} (config.yaml); a key given here overrides them"
    return cfg, (
        f"taking the prompt and scoring settings of {run} (config.yaml), not its data keys: task={cfg.task} "
        f"is not its task, {taken['task']}; a key given here overrides them"
    )


def refuse_a_run_as_config(path: str | Path | None) -> None:
    """An evaluation given a run's directory as its config file: one line naming the model it trained
    (a training run's line offers resume= instead, which continues training)."""
    if path is not None and holds_run(Path(path)):
        run = Path(path)
        if not (run / "checkpoint" / "config.json").is_file():  # killed, or checkpoint.save=false
            raise ConfigError(
                f"config file '{path}' is a run's directory, which has exported no model to evaluate (no "
                f"{run / 'checkpoint'}): give its config file, {run / 'config.yaml'}, with the model to "
                "evaluate"
            )
        raise ConfigError(
            f"config file '{path}' is a run's directory: evaluate the model it trained with "
            f"model={run / 'checkpoint'} (its task settings are taken), or give its config file, "
            f"{run / 'config.yaml'}"
        )


def eval_config(path: str | None, overrides: list[str]) -> tuple[Config, str | None]:
    """`streamrl eval`'s Config from its config file and key=value overrides (with_run_settings)."""
    refuse_a_run_as_config(path)
    pairs = [parse_override(o) for o in overrides]
    return with_run_settings(
        given("model", path, pairs),
        given("task", path, pairs),
        # a config file's resume (a resumed run's records it) is not the evaluation's
        lambda base: load_config(path, ["resume=", *overrides], base=base),
    )


def say_taken(line: str | None) -> None:
    """The line of with_run_settings on stderr, where the evaluation's messages go (eval_cli.run_eval)."""
    if line is not None:
        from rich.console import Console

        Console(stderr=True).print(line, soft_wrap=True, markup=False, highlight=False, emoji=False)
