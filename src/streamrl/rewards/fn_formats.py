"""How your reward functions are passed `prompts` and `completions` (reward.completions).

TRL calls a reward function with the data's own form: plain text for a text dataset, and for a
conversational one each completion as a list of one assistant message and each prompt as its list of
messages. streamrl always prompts with a chat, so both forms are offered:

- text: `prompts=[question]`, `completions=[response text]` (the question as the row asked it);
- chat: `prompts=[[{"role": ..., "content": ...}, ...]]` (the chat the model was prompted with: system
  prompt, few-shot turns, the question with its instruction), `completions=[[{"role": "assistant",
  "content": response text}]]`, as TRL's own `trl.rewards` functions read them;
- auto: text if a probe call on the first training problem returns a valid result, else chat
  (rewards/fn_probe.py, before any model loads); the choice is recorded in the config.

reward.completions sets it for every function; a reward.fns entry's own `completions` for that one.
"""

from __future__ import annotations

from typing import Any

from streamrl.config_rewards import FN_FORMATS, reward_fn_name
from streamrl.types import Problem

AUTO, TEXT, CHAT = FN_FORMATS  # the format names, as config_rewards.py writes them
# how a format is named in messages
DESCRIBED = {TEXT: "text", CHAT: "chat messages"}


def sample_args(fmt: str, problem: Problem, text: str) -> tuple[Any, Any]:
    """(prompt, completion) of one sample in `fmt` (auto not resolved, as without the start-up probe:
    text)."""
    if fmt == CHAT:
        return [dict(m) for m in problem.messages], [{"role": "assistant", "content": text}]
    return problem.meta.get("question", ""), text


def format_key(rc: Any, index: int) -> str:
    """The config key that sets the format of reward.fns[index] (reward.fn: its only function)."""
    if rc.fn or "completions" not in rc.fns[index]:
        return "reward.completions"
    return f"reward.fns[{index}].completions"


def record_formats(rc: Any, chosen: dict[str, str]) -> None:
    """Write the formats auto chose (name -> text|chat) into the config, so every process that scores
    (a reward process, a rollout worker, a resumed run) calls each function as the probe did."""
    if not chosen:
        return
    if rc.fn:
        rc.completions = next(iter(chosen.values()))
        return
    entries = []
    for entry in rc.fns:
        name = reward_fn_name(entry)
        entries.append({**entry, "completions": chosen[name]} if name in chosen else entry)
    rc.fns = tuple(entries)
