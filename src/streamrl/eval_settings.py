"""The config of `streamrl eval`: evaluating a trained run's export (model=RUN/checkpoint or
RUN/checkpoints/step-N), it takes from RUN/config.yaml what decides what is evaluated and how it is
prompted and scored, under the config file and the key=value overrides given (a key given there wins).

Taken: `task`, the `task_config` section, the reward keys the evaluation's scoring reads (SCORING_KEYS),
`eval.size` and `eval.max_new_tokens`, `rollout.max_new_tokens` (what eval.max_new_tokens=0 follows),
and the `env` section (the limits of env: and agent: episodes). Not the run's model, run_dir, seed or
anything else. With a task given that is not the run's, of
task_config only the keys that shape the prompt (PROMPT_KEYS): the others describe the run's data.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from streamrl.config import Config, ConfigError, load_config
from streamrl.config_parse import parse_override, read_yaml

# the task_config keys that shape the prompt, whatever the task
PROMPT_KEYS = ("system_prompt", "instruction", "chat_template", "few_shot", "few_shot_n")
# the reward keys that score a held-out response (the task's verifier: tasks.task_from_config)
SCORING_KEYS = ("extract", "code_partial_credit", "sandbox_min_isolation", "sandbox_executor")
EVAL_KEYS = ("size", "max_new_tokens")
ROLLOUT_KEYS = ("max_new_tokens",)  # eval.max_new_tokens=0 is the run's reply length, not the default's


def trained_run(model: str) -> tuple[Path, dict[str, Any]] | None:
    """(run directory, its config.yaml) of the run that exported `model` (RUN/checkpoint or
    RUN/checkpoints/step-N); None for any other model."""
    path = Path(model)
    if not path.is_dir():
        return None
    for run in (path.parent, path.parent.parent):
        if (run / "config.yaml").is_file() and (run / "metrics.jsonl").is_file():  # a run's directory
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


def _given(key: str, path: str | None, overrides: list[str]) -> Any:
    """The value the overrides (the last one) or else the config file give the top-level `key`; None."""
    for k, v in reversed([parse_override(o) for o in overrides]):
        if k == key:
            return v
    data = read_yaml(path) if path is not None and Path(path).is_file() else None
    return data.get(key) if isinstance(data, dict) else None


def eval_config(path: str | None, overrides: list[str]) -> tuple[Config, str | None]:
    """(the evaluation's Config, the line that says which run's settings it took, None when none)."""
    model = _given("model", path, overrides)
    found = trained_run(str(model if model is not None else Config.model))
    if found is None:
        return load_config(path, overrides), None
    run, saved = found
    task = _given("task", path, overrides)
    taken = run_settings(saved, None if task is None else str(task))
    try:
        cfg = load_config(path, overrides, base=taken)
    except ConfigError as e:
        raise ConfigError(f"{e} (with the task settings of {run}, from its config.yaml)") from None
    if taken.get("task", cfg.task) == cfg.task:
        return cfg, f"taking the task settings of {run} (config.yaml); a key given here overrides them"
    return cfg, (
        f"taking the prompt and scoring settings of {run} (config.yaml), not its data keys: task={cfg.task} "
        f"is not its task, {taken['task']}; a key given here overrides them"
    )
