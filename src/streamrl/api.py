"""The Python API: `streamrl.train(...)` and `streamrl.evaluate(...)`, the same jobs as the CLI.

    import streamrl

    def brevity(prompts, completions, **columns):  # TRL's convention: a batch in, one float each out
        return [1.0 / (1 + len(c)) for c in completions]

    run = streamrl.train(
        model="HuggingFaceTB/SmolLM2-135M-Instruct",
        reward_fn=brevity,
        train_data=[{"prompt": "What is 3+4?", "answer": "7"}, ...],
        max_steps=20, train={"lr": 1e-5},
    )
    print(run.run_dir, run.metrics[-1]["reward/brevity"], run.checkpoint, run.final_accuracy)

Settings are the config's keys: a YAML file or a dict as `config`, then keyword overrides (a section as
a dict, `train={"lr": 1e-5}`, or a dotted key through `**{"train.lr": 1e-5}`). Rows from code (a list of
dicts or a `datasets.Dataset`) are written once to a JSONL file named after the argument and their
content in streamrl's cache and the run's task points at it, so rollout workers, config.yaml and
`resume=` see the same data; warnings name its rows as passed, `train_data[2]` (api_rows.py).
A reward function must be importable by name (a module's or a script's top-level function): rollout
workers run in their own processes and import it there.
"""

from __future__ import annotations

import copy
import inspect
import math
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from numbers import Real
from pathlib import Path
from typing import Any

from streamrl.api_rows import (
    data_source,
    refuse_a_second_task,
    resume_on_saved_rows,
    source_path,
    task_spec,
    write_rows,
)
from streamrl.config import (
    Config,
    ConfigError,
    given_key,
    given_value,
    load_config,
    n_from_k,
    refuse_changes_a_resume_would_ignore,
)
from streamrl.config_parse import apply_key, read_yaml
from streamrl.config_rewards import JUDGE_FIT_KEYS, reward_fn_name
from streamrl.config_validate import validate


@dataclass
class Run:
    """A finished (or stopped) training run: where it is and what it did."""

    run_dir: Path
    summary: dict[str, Any]
    metrics: list[dict[str, Any]] = field(default_factory=list)  # metrics.jsonl, one dict per step

    @property
    def checkpoint(self) -> Path | None:
        """The exported model (AutoModelForCausalLM.from_pretrained loads it), or None."""
        path = self.summary.get("checkpoint")
        return Path(path) if path else None

    @property
    def steps(self) -> int:
        return int(self.summary.get("steps", 0))

    @property
    def evaluation(self) -> dict[str, Any]:
        """Held-out evaluation before and after training (eval.json)."""
        return dict(self.summary.get("eval", {}))

    @property
    def final_accuracy(self) -> float | None:
        final = self.evaluation.get("final")
        return None if not final else float(final["accuracy"])


def _spec(fn: Callable[..., Any] | str, key: str) -> str:
    """A function -> the spec worker processes import it by (module:name or file.py:name)."""
    if isinstance(fn, str):
        return fn
    if not callable(fn):
        raise ConfigError(f"{key}: expected a function or (function, weight), got {type(fn).__name__}")
    name = getattr(fn, "__qualname__", "")
    if not callable(fn) or not name.isidentifier():  # a lambda, a nested function, a bound method
        raise ConfigError(
            f"{key}: {fn!r} is not a top-level function; define it at the top level of a module or script "
            "(rollout workers import it by name in their own processes)"
        )
    module = getattr(fn, "__module__", "")
    if module in ("__main__", "__mp_main__") or not module:
        source = inspect.getsourcefile(fn)
        if source is None or not os.path.isfile(source):  # interactive (a notebook cell): no file to import
            raise ConfigError(
                f"{key}: {name} is defined interactively; put it in a .py file and pass it from there "
                "(rollout workers import it by name)"
            )
        return f"{source}:{name}"
    return f"{module}:{name}"


def _reward_settings(reward_fn: Any) -> dict[str, Any]:
    """reward_fn: a function or spec; or a list of them, each optionally a (function, weight) pair."""
    if reward_fn is None:
        return {}
    if callable(reward_fn) or isinstance(reward_fn, str):
        return {"reward.fn": _spec(reward_fn, "reward_fn")}
    if not isinstance(reward_fn, (list, tuple)):
        raise ConfigError(
            "reward_fn: expected a function, a (function, weight) pair or a list of them, got "
            f"{type(reward_fn).__name__}"
        )
    if _is_pair(reward_fn):  # reward_fn=(fn, 0.5): one weighted function
        reward_fn = [reward_fn]
    entries = []
    for i, item in enumerate(reward_fn):
        fn, weight = _fn_and_weight(item, f"reward_fn[{i}]")
        entries.append({"fn": _spec(fn, f"reward_fn[{i}]"), "weight": weight})
    names = [reward_fn_name(e) for e in entries]
    for e, name in zip(entries, names):
        if names.count(name) > 1:  # a.score and b.score: each logged as reward/<module>.<name>
            where = e["fn"].rpartition(":")[0]
            e["name"] = f"{Path(where).stem if where.endswith('.py') else where}.{name}"
    return {"reward.fns": entries}


def _refuse_a_second_reward(config: Any, overrides: dict[str, Any]) -> None:
    """One line when a reward.fns or reward.fn keyword, a config dict's or a config file's is given beside
    reward_fn (which sets the reward functions: it would replace the other silently, or clash with it)."""
    for given, where in ((overrides, "{}= "), (config, "the config dict's '{}' ")):
        if isinstance(given, dict) and (key := _reward_fn_key(given)):
            raise ConfigError(f"{where.format(key)}and reward_fn both name reward functions: pass one")
    if isinstance(config, (str, Path)) and Path(config).is_file():  # else load_config names the problem
        data = read_yaml(config)
        if isinstance(data, dict) and (key := _reward_fn_key(data)):
            raise ConfigError(
                f"config file '{config}' sets {key}, and reward_fn names reward functions too: remove {key} "
                "from the file, or pass no reward_fn"
            )


def _reward_fn_key(settings: dict[str, Any]) -> str:
    """The key of `settings` naming reward functions, reward.fns or reward.fn (dotted or in a reward
    section), set to some (a run's config.yaml holds both, empty); "" if none."""
    return next((k for k in ("reward.fns", "reward.fn") if given_value(k, settings)), "")


def _is_pair(value: Any) -> bool:
    """(function, weight): a tuple of two whose second is neither a function nor a spec."""
    return (
        isinstance(value, tuple) and len(value) == 2 and not (callable(value[1]) or isinstance(value[1], str))
    )


def _fn_and_weight(item: Any, key: str) -> tuple[Any, float]:
    """A reward_fn entry -> (function or spec, weight); a tuple must be (function, finite weight)."""
    if not isinstance(item, tuple):
        return item, 1.0
    if len(item) != 2:
        raise ConfigError(f"{key}: expected a function or (function, weight), got a tuple of {len(item)}")
    fn, weight = item
    if isinstance(weight, bool) or not isinstance(weight, Real) or not math.isfinite(weight):
        raise ConfigError(f"{key}: weight must be a finite number, got {weight!r}")
    return fn, float(weight)


def _refuse_in_a_worker_bootstrap(what: str) -> None:
    """A spawned worker imports the user's script as __mp_main__: an unguarded call would train again."""
    import multiprocessing

    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise RuntimeError(
            f"streamrl.{what}() ran while a worker process imported your script: put the call under "
            '`if __name__ == "__main__":`'
        )


def make_config(
    config: str | Path | dict[str, Any] | Config | None = None,
    *,
    reward_fn: Any = None,
    train_data: Any = None,
    eval_data: Any = None,
    **overrides: Any,
) -> Config:
    """The validated Config of a train/evaluate call (nothing is written but the cache's data files); a
    resumed run's (resume=, or a Config made with it) refuses a change of a key its state fixes at once."""
    settings: dict[str, Any] = {**_reward_settings(reward_fn)}
    if reward_fn is not None:
        _refuse_a_second_reward(config, overrides)
    if train_data is not None:
        refuse_a_second_task(config, overrides)
    train = None if train_data is None else data_source(train_data, "train_data")
    held = None if eval_data is None else data_source(eval_data, "eval_data")
    resume_on_saved_rows(config, overrides, train, held)
    if train is not None:
        settings["task"] = task_spec(source_path(train))
    if held is not None:
        settings["task_config.eval_data"] = source_path(held)
    cfg = _layered(config, settings, overrides)
    if isinstance(config, Config):  # one made with resume=: its fixed keys (load_config checks the others)
        refuse_changes_a_resume_would_ignore(cfg)
    write_rows(cfg, train, held)
    return cfg


def _layered(
    config: str | Path | dict[str, Any] | Config | None,
    settings: dict[str, Any],
    overrides: dict[str, Any],
    base: dict[str, Any] | None = None,
) -> Config:
    """make_config's Config; `base`: settings under the config's and the keywords' (a trained run's, for
    its evaluation: eval_settings.py), never under a Config made before (it sets every key)."""
    if isinstance(config, Config):  # a Config made before: the overrides go on a copy
        if layered := [k for k in ("algo", "resume") if k in overrides]:
            raise ConfigError(
                f"{layered[0]}= cannot go on a Config made before (its settings would not be layered on "
                f"it): pass {layered[0]}= to make_config/train with the other settings, or a dict"
            )
        cfg = copy.deepcopy(config)
        for k, v in {**overrides, **settings}.items():
            apply_key(cfg, k, v)
        if given_key("eval.k", overrides):  # the Config's own k and n stay as they were made
            n_from_k(cfg, overrides)
        judge = (f"reward.{k}" for k in JUDGE_FIT_KEYS)  # a resumed run keeps its judge timeouts
        validate(cfg, keep_saved_judge=bool(cfg.resume) and not any(k in overrides for k in judge))
        return cfg
    if isinstance(config, dict):  # its section dicts and the keywords' set only their own keys
        return load_config(None, values=[*config.items(), *overrides.items(), *settings.items()], base=base)
    return load_config(config, values={**overrides, **settings}, base=base)


def train(
    config: str | Path | dict[str, Any] | Config | None = None,
    *,
    reward_fn: Any = None,
    train_data: Any = None,
    eval_data: Any = None,
    **overrides: Any,
) -> Run:
    """Train as `streamrl train` does; returns the Run. Bad settings raise ValueError (ConfigError) of
    one line before anything is written. reward_fn: a function, a spec ('my_rewards.py:fn'), or a list
    of them or of (function, weight) pairs. train_data / eval_data: a list of dicts, a datasets.Dataset,
    a path or 'hf:NAME[:CONFIG]' (columns mapped with task_config={'columns': {...}})."""
    _refuse_in_a_worker_bootstrap("train")
    cfg = make_config(config, reward_fn=reward_fn, train_data=train_data, eval_data=eval_data, **overrides)
    from streamrl.loop.job import run_train
    from streamrl.observe.run_data import read_metrics

    summary = run_train(cfg)  # its preflight checks model, data and functions before anything is written
    run_dir = Path(summary["run_dir"])
    path = run_dir / "metrics.jsonl"
    return Run(run_dir, summary, read_metrics(path) if path.is_file() else [])


def evaluate(
    model: str | Path | None = None,
    config: str | Path | dict[str, Any] | Config | None = None,
    *,
    eval_data: Any = None,
    **overrides: Any,
) -> dict[str, Any]:
    """Evaluate as `streamrl eval` does (greedy accuracy; pass@k, avg@n, maj@k with eval={'n': N}; n, k,
    temperature and size are short for the eval.* keys there and here) on the task's held-out problems,
    or on eval_data rows (all of them when given from code, unless eval.size says how many); returns
    the result dict. A trained run's export (RUN/checkpoint) is evaluated with the run's task settings
    under those given, as `streamrl eval` does (eval_settings.py), unless
    `config` is a Config made before (it sets every key)."""
    from streamrl.eval_settings import (
        expand_short_keys,
        given,
        refuse_a_run_as_config,
        say_taken,
        with_run_settings,
    )

    if "reward_fn" in overrides:
        raise ConfigError(
            "evaluate() has no reward_fn: held-out problems are scored by the task's own verifier (pass "
            "reward_fn to train())"
        )
    overrides = expand_short_keys(overrides)
    if model is not None:
        overrides["model"] = str(model)
    source = rows = None
    if eval_data is not None:  # the rows are the held-out set itself (the task: their scoring)
        source = data_source(eval_data, "eval_data")
        rows = source_path(source)
        overrides.setdefault("task", task_spec(rows))
        overrides["task_config.eval_data"] = rows
    if isinstance(config, Config):  # an evaluation continues no run: a resume's fixed keys bind none
        cfg, taken = _layered(config, {}, overrides), None
    else:
        path = None if config is None or isinstance(config, dict) else config
        refuse_a_run_as_config(path)
        overrides.setdefault("resume", "")  # a config file's resume (a resumed run's records it): not ours
        pairs = [*(config.items() if isinstance(config, dict) else []), *overrides.items()]
        cfg, taken = with_run_settings(
            given("model", path, pairs),
            given("task", path, pairs),
            lambda base: _layered(config, {}, overrides, base),
        )
    write_rows(cfg, source)
    if rows is not None and not isinstance(eval_data, (str, Path)) and not _size_given(config, overrides):
        cfg.eval.size = len(Path(rows).read_text().splitlines())  # one JSONL line per row
    say_taken(taken)
    from streamrl.eval_cli import run_eval

    return run_eval(cfg)


def _size_given(config: str | Path | dict[str, Any] | Config | None, overrides: dict[str, Any]) -> bool:
    """Whether the caller says how many problems to evaluate: eval.size by a keyword or in the config (a
    Config made before: anything but the default), not the run's whose export is evaluated."""
    if isinstance(config, Config):
        if config.eval.size != type(config.eval)().size:
            return True
        data: Any = {}
    else:
        data = config if isinstance(config, dict) else read_yaml(config) if config is not None else {}
    items = [*(data.items() if isinstance(data, dict) else []), *overrides.items()]
    return any(k == "eval.size" or (k == "eval" and isinstance(v, dict) and "size" in v) for k, v in items)


__all__ = ["ConfigError", "Run", "evaluate", "make_config", "train"]
