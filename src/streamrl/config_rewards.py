"""Checks of the reward keys: the judge's endpoint, your reward functions' specs, the code sandbox's
executor, and the keys a multi-turn episode's reward never reads."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any, Literal, get_args

from streamrl.config_parse import ConfigError

# where reward.scorer=judge finds its endpoint when reward.judge_url / judge_model are empty
# (rewards/judge.py resolve_judge_config reads the same variables, in this order)
JUDGE_URL_ENV = ("STREAMRL_JUDGE_URL", "OPENAI_BASE_URL")
JUDGE_MODEL_ENV = ("STREAMRL_JUDGE_MODEL",)

JUDGE_API_KEY_ENV = "STREAMRL_JUDGE_API_KEY"  # the judge's API key (else OPENAI_API_KEY)

_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
# a URL's host and optional port number as written after its scheme, up to the first '/', '?' or '#'
_HOST_PORT = re.compile(r"(\[[^\]@]*\]|[^:\[\]@]*)(:\d*)?")


def redact_url(url: str) -> str:
    """`url` as a message may show it: everything up to its last '@' hidden (https://***@host/v1 for
    https://user:secret@host/v1; a password may hold an '@' or a '/' unescaped). A judge URL is refused
    with an '@' anywhere after its scheme (judge_url_problem), so only judge_url_problem's message for a
    URL whose scheme is not http(s) needs it."""
    head, at, rest = url.rpartition("@")
    if not at:
        return url
    scheme = _SCHEME.match(head)
    return f"{scheme[0] if scheme else ''}***@{rest}"


def judge_url_problem(url: str, name: str) -> str:
    """Why `url` cannot be the judge's endpoint, in one line naming it `name` ('' when it can): a scheme
    other than http(s), credentials (user:password@ before the host: urllib sends none, it takes them
    for the host, so the password would reach the resolver), an '@' after a host (a path's, or a
    password's that holds a '/': http://u:12/ab@host reads as host u, port 12 to urllib and as
    credentials to redact_url; an '@' of a path is written %40), a space or a control character, a port
    that is not a number. A URL it takes holds no '@', so it needs no redact_url."""
    if not url.startswith(("http://", "https://")):
        return f"{name} must start with http:// or https://, got {redact_url(url)!r}"
    authority = re.split(r"[/?#]", url.partition("://")[2], maxsplit=1)[0]
    host_port = _HOST_PORT.fullmatch(authority)
    if not host_port and "@" in url:  # user:pass@host, or a password whose '/' cut it short (u:ab/cd@host)
        return f"{name} carries credentials (user:...@): remove them and set {JUDGE_API_KEY_ENV}"
    if "@" in url:  # past a host[:port]: a path's '@', or a password's after a port-like user:password
        return (
            f"{name} holds an '@' after its host: write an '@' of its path or query as %40, or remove the "
            f"credentials (user:...@) and set {JUDGE_API_KEY_ENV}"
        )
    if m := re.search(r"[\x00-\x20\x7f]", url):
        return f"{name} holds a space or a control character ({m[0]!r}): {url!r}"
    if not host_port:
        return f"{name} has a port that is not a number: {authority!r} (write host:port, e.g. 127.0.0.1:8000)"
    return ""


def validate_rewards(cfg: Any, keep_saved_judge: bool = False) -> None:
    """The reward section against the rest of the config, before any work. keep_saved_judge: a resumed
    run's saved judge timeouts are kept even when a call's attempts do not fit (judge_kept_warning)."""
    if cfg.reward.scorer == "judge":
        _validate_judge(cfg.reward, keep_saved_judge)
    if cfg.task.startswith(("env:", "agent:")):
        _refuse_response_rewards(cfg)
    _validate_reward_fns(cfg.reward)
    _validate_sandbox_executor(cfg)


def _validate_judge(rc: Any, keep_saved: bool) -> None:
    """reward.scorer=judge: an endpoint and a model from the config or the environment, before any work
    (without them every response would score 0 and the run would train on nothing)."""
    url = rc.judge_url or next((os.environ[v] for v in JUDGE_URL_ENV if os.environ.get(v)), "")
    model = rc.judge_model or next((os.environ[v] for v in JUDGE_MODEL_ENV if os.environ.get(v)), "")
    if not url or not model:
        missing = [k for k, v in (("reward.judge_url", url), ("reward.judge_model", model)) if not v]
        raise ConfigError(
            f"reward.scorer=judge needs reward.judge_url (or {' / '.join(JUDGE_URL_ENV)}) and "
            f"reward.judge_model (or {' / '.join(JUDGE_MODEL_ENV)}); missing: {', '.join(missing)}"
        )
    name = "reward.judge_url" if rc.judge_url else next(v for v in JUDGE_URL_ENV if os.environ.get(v))
    if problem := judge_url_problem(url, name):
        raise ConfigError(problem)
    if (misfit := judge_misfit(rc)) and not keep_saved:
        raise ConfigError(misfit)


# a judge call's retries and the backoff between its attempts (rewards/judge.py JudgeConfig's defaults)
JUDGE_RETRIES = 2
JUDGE_BACKOFF_S = 0.5  # the first retry's delay; doubles per retry, capped at JUDGE_BACKOFF_MAX_S
JUDGE_BACKOFF_MAX_S = 8.0


def judge_backoff_s(retries: int, backoff_s: float, backoff_max_s: float) -> float:
    """The longest the backoff between one judge call's attempts adds up to."""
    return sum(min(backoff_max_s, backoff_s * 2**i) for i in range(retries))


def _judge_worst_s(rc: Any) -> tuple[int, float, float]:
    """(attempts, their backoff, the longest a judge call may take), in seconds."""
    attempts = JUDGE_RETRIES + 1
    backoff = judge_backoff_s(JUDGE_RETRIES, JUDGE_BACKOFF_S, JUDGE_BACKOFF_MAX_S)
    return attempts, backoff, attempts * rc.judge_timeout_s + backoff


def judge_misfit(rc: Any) -> str:
    """Why a judge call's every attempt and backoff do not fit in reward.timeout_s ('' when they do): past
    it the service gives up on the call, so its later attempts would never count and a judge slow to answer
    would fail as `timeout`."""
    attempts, backoff, worst = _judge_worst_s(rc)
    if rc.timeout_s >= worst:
        return ""
    fit = math.floor((rc.timeout_s - backoff) / attempts * 10) / 10  # the longest attempt that fits
    lower = f" or reward.judge_timeout_s<={fit:g}" if fit > 0 else ""
    return (
        f"config keys 'reward.timeout_s' and 'reward.judge_timeout_s': a judge call may take {worst:g} s "
        f"({attempts} attempts of reward.judge_timeout_s={rc.judge_timeout_s:g} s and {backoff:g} s of "
        f"backoff), longer than reward.timeout_s={rc.timeout_s:g} gives a response, so its last attempts "
        f"would count as timeouts: set reward.timeout_s>={worst:g}{lower}"
    )


# the keys that decide whether a judge call fits: one given on a resume is checked as in a new run
JUDGE_FIT_KEYS = ("scorer", "timeout_s", "judge_timeout_s")


def judge_kept_warning(rc: Any, saved: str) -> str:
    """The line that says a resumed run keeps its saved judge timeouts that do not fit ('' when they fit
    or no judge scores): the run scored with them so far (a timeout of 30 s each was the default), and
    shorter attempts would cut off, and so score differently, a judge's answers the run counted."""
    if rc.scorer != "judge" or not judge_misfit(rc):
        return ""
    attempts, backoff, worst = _judge_worst_s(rc)
    return (
        f"streamrl: warning: resume: reward.judge_timeout_s={rc.judge_timeout_s:g} in {saved} does not fit "
        f"in reward.timeout_s={rc.timeout_s:g} (a judge call may take {worst:g} s: {attempts} attempts and "
        f"{backoff:g} s of backoff), which a new run refuses; the resumed run keeps both as it ran, a call's "
        f"attempts past {rc.timeout_s:g} s counting as timeouts"
    )


# reward keys that score or shape one response: an env: or agent: episode's reward never reads them
RESPONSE_KEYS = ("fn", "fns", "scorer", "overlong_buffer", "length_penalty")


def _refuse_response_rewards(cfg: Any) -> None:
    """The reward keys that score or shape one response do not reach a multi-turn episode, whose reward
    is its environment's (env:) or the base task's score of the agent's final text (agent:)."""
    r = cfg.reward
    whose = "its environment" if cfg.task.startswith("env:") else "the base task's score of the final text"
    for key, given, default in (
        ("reward.fn", r.fn, "''"),
        ("reward.fns", r.fns, "[]"),
        ("reward.scorer", r.scorer == "judge", "task"),
        ("reward.overlong_buffer", r.overlong_buffer, "0"),
        ("reward.length_penalty", r.length_penalty, "0"),
    ):
        if given:
            raise ConfigError(
                f"config key '{key}' does not apply to task={cfg.task}: an episode's reward is {whose}; "
                f"set {key}={default}"
            )


def _validate_sandbox_executor(cfg: Any) -> None:
    spec = cfg.reward.sandbox_executor
    if spec == "local":
        return
    _check_spec("reward.sandbox_executor", spec, "local or ")
    why = _runs_no_code(cfg.task, cfg.task_config.args or {}, cfg.task_config.sources or ())
    if why:
        raise ConfigError(
            f"config key 'reward.sandbox_executor' does not apply to task={cfg.task}, {why} (code, "
            "code:FILE, data:/hf: rows with tests, env:python_tool, and mix and agent: tasks over them "
            "run theirs in it): set reward.sandbox_executor=local"
        )


CODE_ENVS = ("env:python_tool",)  # the environments whose tool runs model code


def _runs_no_code(task: str, args: dict[str, Any], sources: Any) -> str:
    """Why `task` never runs model code ('' when it may: data rows are read only when the task is)."""
    if task.startswith("agent:"):
        base = str(args.get("base", "rg:chain_sum"))
        return f"whose base task {base} runs no model code" if _runs_no_code(base, {}, sources) else ""
    if task == "mix" and isinstance(sources, (list, tuple)) and sources:
        specs = [str(s.get("task", "")) if isinstance(s, dict) else "" for s in sources]
        return (
            "whose sources are all rg: tasks, which run no model code"
            if all(s.startswith("rg:") for s in specs)
            else ""
        )
    if task.startswith("rg:"):
        return "which runs no model code"
    if task.startswith("env:") and task not in CODE_ENVS:
        return "whose environment runs no model code"
    return ""


def _check_spec(key: str, spec: str, alternatives: str = "") -> None:
    """A function named as package.module:function or path/to/file.py:function (imported later)."""
    where, _, attr = spec.rpartition(":")
    if not where or not attr.isidentifier():
        raise ConfigError(
            f"config key '{key}' must be {alternatives}package.module:function or path/to/file.py:function, "
            f"got {spec!r}"
        )


FN_KEYS = ("fn", "weight", "name", "completions")
# how your reward functions are passed `prompts` and `completions` (reward.completions, a reward.fns
# entry's completions; rewards/fn_formats.py): the one place the format names are written
FnFormat = Literal["auto", "text", "chat"]
FN_FORMATS: tuple[str, ...] = get_args(FnFormat)


def reward_fn_name(entry: Mapping[str, Any]) -> str:
    """The name of a reward.fns entry (reward.fn as {fn: SPEC}): its `name`, else its function's
    ('my_rewards.py:brevity' -> 'brevity', 'pkg.mod:length' -> 'length', 'task' -> 'task'). Its values are
    logged as reward/<name>, and the format reward.completions=auto chose is recorded under it."""
    return str(entry.get("name") or str(entry["fn"]).rpartition(":")[2])


def _validate_reward_fns(rc: Any) -> None:
    """reward.fn / reward.fns: their shape here; the functions are imported by preflight."""
    if rc.fn and rc.fns:
        raise ConfigError(
            "config keys 'reward.fn' and 'reward.fns' exclude each other: list every function in reward.fns"
        )
    specs = [("reward.fn", rc.fn)] if rc.fn else []
    names = []
    for i, entry in enumerate(rc.fns):
        key = f"reward.fns[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("fn"), str) or not entry["fn"]:
            raise ConfigError(
                f"config key '{key}' must be a mapping with fn (e.g. {{fn: my_rewards.py:brevity, "
                f"weight: 0.5}}), got {entry!r}"
            )
        if unknown := sorted(set(entry) - set(FN_KEYS)):
            raise ConfigError(
                f"config key '{key}': unknown field(s) {', '.join(unknown)}; valid: {', '.join(FN_KEYS)}"
            )
        weight = entry.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not math.isfinite(weight):
            raise ConfigError(f"config key '{key}.weight' must be a finite number, got {weight!r}")
        names.append(reward_fn_name(entry))
        if "completions" in entry and entry["fn"] == "task":
            raise ConfigError(
                f"config key '{key}.completions': fn: task is the task's own reward, which is not called "
                "with completions: drop completions from that entry"
            )
        if "completions" in entry and entry["completions"] not in FN_FORMATS:
            raise ConfigError(
                f"config key '{key}.completions' must be one of {', '.join(FN_FORMATS)}, got "
                f"{entry['completions']!r}"
            )
        if entry["fn"] != "task":
            specs.append((f"{key}.fn", entry["fn"]))
    for key, spec in specs:
        _check_spec(key, spec)
    if rc.completions != "auto" and not specs:
        raise ConfigError(
            f"config key 'reward.completions' is {rc.completions}, but no reward function of your own is set "
            "(reward.fn, or reward.fns beyond fn: task): drop it, or set reward.fn"
        )
    if dup := sorted({n for n in names if names.count(n) > 1}):
        raise ConfigError(
            f"config key 'reward.fns': two functions are named {dup[0]}: give one a name (name: ...)"
        )
