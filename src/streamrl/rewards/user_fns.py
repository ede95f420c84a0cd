"""Reward functions of your own, in TRL's calling convention.

`reward.fn=my_rewards.py:brevity` (or `package.module:function`) names one function; `reward.fns` names
several with weights: `[{fn: my_rewards.py:brevity, weight: 0.5}, {fn: task, weight: 1.0}]`, where
`task` is the task's own reward (its verifier, or the judge, plus the format bonus). A function is called
as TRL calls one, on a batch:

    fn(prompts=[question, ...], completions=[response text, ...], completion_ids=[[token ids], ...],
       **columns) -> [float | None, ...]

with `prompts` and `completions` as text or, as TRL passes a conversational dataset's, as chat messages
(reward.completions, rewards/fn_formats.py).

`columns` are the data row's own fields as lists (a `data:`/`hf:` row's columns; `answer` always, the
reference answer, or the list of accepted answers of a row that gives several). None means "not
applicable to this sample": it adds nothing to the reward and is left out of that function's mean. The
reward is sum_i weight_i * value_i; each function's value is also logged on its own as `reward/<name>`
(name: the function's name, or the entry's `name`).

Functions run inside the RewardService, so a function that raises, hangs past `reward.timeout_s` or
returns something malformed costs that sample's reward (0.0 and a counted reason), never the run. They
are imported before any model loads (preflight), so a wrong path or a broken module is one line at start,
and each is called once there on the first training problem (rewards/fn_probe.py).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import math
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from streamrl.brief import brief
from streamrl.config_rewards import reward_fn_name
from streamrl.rewards.math_verify_threads import allow_in_threads
from streamrl.user_code import load_object

TASK = "task"  # the task's own reward, as an entry of reward.fns
# as TRL: the prompt column is passed as `prompts`, and no column may shadow the batch arguments
RESERVED = ("prompt", "completion", "prompts", "completions", "completion_ids")


@dataclass(frozen=True)
class RewardFn:
    name: str
    spec: str  # package.module:function, path/file.py:function, or "task"
    weight: float = 1.0
    completions: str = "auto"  # how `prompts` and `completions` are passed: auto, text or chat
    key: str = "reward.fn"  # the config key that set it, as messages name it: reward.fn or reward.fns[i]


def configured_fns(fn: str, fns: Any, completions: str = "auto") -> list[RewardFn]:
    """reward.fn / reward.fns as RewardFn entries; [] when neither is set (the task's reward alone).
    `completions`: reward.completions, the format of an entry without its own."""
    if fn:
        return [RewardFn(reward_fn_name({"fn": fn}), fn, 1.0, completions)]
    out = []
    for i, entry in enumerate(fns):
        weight, fmt = float(entry.get("weight", 1.0)), entry.get("completions", completions)
        out.append(RewardFn(reward_fn_name(entry), str(entry["fn"]), weight, fmt, f"reward.fns[{i}]"))
    return out


def load_fns(fns: list[RewardFn]) -> dict[str, Callable[..., Any]]:
    """name -> the imported function (the task entry excluded); ValueError of one line naming the key,
    also for a function that cannot take the batch's keyword arguments. With any, math-verify is made
    callable from the scoring threads they run on (rewards/math_verify_threads.py)."""
    loaded = {}
    for f in fns:
        if f.spec != TASK:
            loaded[f.name] = load_object(f.spec, f.key)
            _check_signature(loaded[f.name], f.spec, f.key)
    if loaded:
        allow_in_threads()
    return loaded


def _check_signature(fn: Callable[..., Any], spec: str, key: str) -> None:
    """Every call passes prompts, completions, completion_ids and the row's columns by keyword."""
    params = _parameters(fn)
    if params is not None and not any(p.kind is p.VAR_KEYWORD for p in params):
        raise ValueError(
            f"config key '{key}': {spec} takes no **kwargs; it is called as fn(prompts=..., completions=..., "
            "completion_ids=..., **columns), as in TRL: add **kwargs to its parameters"
        )


def _parameters(fn: Callable[..., Any]) -> list[inspect.Parameter] | None:
    """fn's parameters; None for a builtin or C callable, whose signature cannot be read (nothing to
    check)."""
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def reward_columns(problem: Any) -> dict[str, Any]:
    """The data row's columns a function is passed for `problem`, with `answer` the parsed reference, or
    the list of accepted answers of a row that gives several (data/answers.py; with columns.answer=null,
    none: a row's own `answer` column stays)."""
    row = problem.meta.get("columns", {})
    if not problem.answer:
        return {"answer": "", **row}
    answers = problem.meta.get("answers")
    return {**row, "answer": list(answers) if answers is not None else problem.answer}


def check_arguments(loaded: Mapping[str, Callable[..., Any]], fns: list[RewardFn], columns: Mapping) -> None:
    """Each function's parameters without a default are among the keywords every call passes (the
    batch's and the columns of `columns`, a first training problem's): ValueError of one line otherwise,
    before any work, rather than a reward of 0 on every sample."""
    passed = {"prompts", "completions", "completion_ids", *(k for k in columns if k not in RESERVED)}
    for f in fns:
        if f.spec == TASK:
            continue
        for p in _parameters(loaded[f.name]) or []:
            if p.default is not p.empty or p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            if p.kind is p.POSITIONAL_ONLY or p.name not in passed:
                raise ValueError(
                    f"config key '{f.key}': {f.spec} needs '{p.name}', which no call passes (it is called "
                    f"with {', '.join(sorted(passed))}): use one of those names or give '{p.name}' a default"
                )


def call_fn(
    fn: Callable[..., Any],
    prompt: Any,
    completion: Any,
    ids: list[int],
    columns: dict,
    timeout_s: float | None = None,
) -> float | None:
    """One sample through `fn` in TRL's batch convention -> its value (None: not applicable). `prompt`
    and `completion` are text or chat messages (fn_formats.sample_args).
    TypeError (counted by the service as that sample's failure) when the result is malformed;
    TimeoutError when an async function has no result within timeout_s (its coroutine is cancelled).
    Their messages do not name `fn`: the caller's message around them does (reward function f, or the
    config key that set it)."""
    out = fn(
        prompts=[prompt],
        completions=[completion],
        completion_ids=[ids],
        **{k: [v] for k, v in columns.items() if k not in RESERVED},
    )
    if inspect.isawaitable(out):  # an async def function (TRL accepts them)
        pending = asyncio.run_coroutine_threadsafe(_awaited(out), _reward_loop())
        try:
            out = pending.result(timeout=timeout_s)
        except concurrent.futures.TimeoutError:  # the builtin TimeoutError from Python 3.11 on
            pending.cancel()  # cancelled in the shared loop, not left running there for good
            raise TimeoutError(f"the function gave no result within {timeout_s:g} s") from None
    try:  # a string or a mapping iterates as characters or keys: never a list of rewards
        values = None if isinstance(out, (str, bytes, Mapping)) else list(out)
    except TypeError:
        values = None
    if values is None or len(values) != 1:
        raise TypeError(
            f"the function returned {type(out).__name__} {brief(str(out), 60)}; expected a list "
            "with one float (or None) per completion"
        )
    value = values[0]
    if value is None:
        return None
    try:  # numbers (Python, numpy, a 0-d tensor); a text that reads as one ("8") is not a reward
        if isinstance(value, (str, bytes, bytearray)):
            raise TypeError
        value = float(value)
    except (TypeError, ValueError):
        raise TypeError(
            f"the function returned {value!r} for a completion; expected a float or None"
        ) from None
    if not math.isfinite(value):
        raise TypeError(f"the function returned {value} for a completion; expected a finite float")
    return value


async def _awaited(awaitable: Any) -> Any:
    return await awaitable


_loop: asyncio.AbstractEventLoop | None = None
_loop_pid = 0
_loop_lock = threading.Lock()


def _reward_loop() -> asyncio.AbstractEventLoop:
    """One event loop per process, running on a daemon thread, for every async reward function (as TRL
    runs them): a client a function keeps between calls (an async HTTP session, a judge) stays bound
    to a loop that lives on, and a caller inside a running loop (a notebook) is not refused."""
    global _loop, _loop_pid
    with _loop_lock:
        if _loop is None or _loop_pid != os.getpid():  # none yet, or a forked child's copy of none
            _loop, _loop_pid = asyncio.new_event_loop(), os.getpid()
            threading.Thread(target=_loop.run_forever, name="streamrl-async-rewards", daemon=True).start()
        return _loop
