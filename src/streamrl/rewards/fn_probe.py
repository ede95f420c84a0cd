"""The start-up call of your reward functions (preflight, before any model loads).

Each function is called once on the first training problem with a short made-up response, on the kind
of thread the reward service will call it on (a thread of its own with reward.service=thread, else the
calling thread, as a reward process's worker and inline scoring are), bounded by reward.timeout_s
there. The call picks reward.completions=auto's format, text if that call returns a valid result, else
chat messages, and refuses in one line a function that fails in every format it may be given: such a
function would score 0 on every sample, seen only as a reward_errors warning while training on zeros.

One call per format tried (at most two per function, on one sample): the functions are your code,
and these calls are their only ones outside the reward service (their values are not used).
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from streamrl.brief import brief_error
from streamrl.rewards.fn_formats import AUTO, CHAT, DESCRIBED, TEXT, format_key, record_formats, sample_args
from streamrl.rewards.user_fns import TASK, RewardFn, call_fn, reward_columns
from streamrl.types import Problem

PROBE_TEXT = "The answer is 0."  # the made-up response
PROBE_IDS = [0]  # its token ids


def choose_formats(
    rc: Any, loaded: Mapping[str, Callable[..., Any]], fns: list[RewardFn], problem: Problem
) -> None:
    """Call each of your functions on `problem` (probe_formats); the formats auto chose are printed,
    one line each, and recorded in `rc` (fn_formats.record_formats)."""
    formats = probe_formats(rc, loaded, fns, problem)
    chosen = {f.name: formats[f.name] for f in fns if f.spec != TASK and f.completions == AUTO}
    for f in fns:
        if f.name in chosen:
            print(
                f"streamrl: reward function {f.spec} takes completions as {DESCRIBED[chosen[f.name]]} "
                "(reward.completions=auto)",
                file=sys.stderr,
            )
    record_formats(rc, chosen)


def probe_formats(
    rc: Any, loaded: Mapping[str, Callable[..., Any]], fns: list[RewardFn], problem: Problem
) -> dict[str, str]:
    """name -> the format (text or chat) each of your functions is called with: its configured one, or
    for auto the first of text and chat whose call returns a valid result. ValueError of one line naming
    the function, each call's exception and the fix when none does."""
    columns = reward_columns(problem)
    out: dict[str, str] = {}
    for i, f in enumerate(fns):
        if f.spec == TASK:
            continue
        failures: list[tuple[str, str]] = []
        for fmt in (TEXT, CHAT) if f.completions == AUTO else (f.completions,):
            error = _probe(rc, loaded[f.name], fmt, problem, columns)
            if error is None:
                out[f.name] = fmt
                break
            failures.append((fmt, error))
            if error.startswith("TimeoutError"):  # a hang is no format's fault: the other would hang too
                break
        if f.name not in out:
            raise ValueError(_refusal(rc, i, f, problem, failures))
    return out


def _refusal(rc: Any, index: int, f: RewardFn, problem: Problem, failures: list[tuple[str, str]]) -> str:
    """The one line that refuses `f` (named by the key that set it: reward.fn, or reward.fns[index]):
    where it failed, with what, and the fix."""
    tried = " and ".join(f"with completions as {DESCRIBED[fmt]} ({error})" for fmt, error in failures)
    head = f"config key '{f.key}': {f.spec} fails on the first training problem (id {problem.id}) {tried}"
    if rc.service == "thread" and any("main thread" in error for _, error in failures):
        fix = "set reward.service=process, whose workers call it there"
        return f"{head}: it needs the main thread (signals): {fix}"
    if failures[-1][1].startswith("TimeoutError"):
        return f"{head}: make it return sooner, or raise reward.timeout_s"
    if f.completions == AUTO:
        return f"{head}: fix it so that it returns a float or None per completion in one of them"
    other = CHAT if f.completions == TEXT else TEXT
    fkey = format_key(rc, index)
    return (
        f"{head}, as {fkey}={f.completions} passes them: fix it, or set {fkey}=auto (text, else chat "
        f"messages) or {fkey}={other}"
    )


def _probe(
    rc: Any, fn: Callable[..., Any], fmt: str, problem: Problem, columns: dict[str, Any]
) -> str | None:
    """One call of `fn` in `fmt` -> None when it returned a valid result, else its error in one line."""
    prompt, completion = sample_args(fmt, problem, PROBE_TEXT)

    def call() -> None:
        call_fn(fn, prompt, completion, list(PROBE_IDS), columns, rc.timeout_s)

    try:
        if rc.service != "thread":  # a reward process's worker, or inline: the calling thread
            call()
        else:
            _on_a_thread(call, rc.timeout_s)
    except (Exception, SystemExit) as e:  # as the service counts a score's failure
        return brief_error(e, 200, typed=True)
    return None


def _on_a_thread(call: Callable[[], None], timeout_s: float) -> None:
    """call() on a daemon thread of its own (as the service's scoring threads are), waiting at most
    timeout_s; TimeoutError past it (the thread is left to end on its own), else what call() raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            call()
        except BaseException as e:  # handed to the caller
            errors.append(e)

    thread = threading.Thread(target=run, name="reward-fn-probe", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(f"no result within reward.timeout_s={timeout_s:g} s")
    if errors:
        raise errors[0]
