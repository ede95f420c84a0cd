"""Example agents for `task=agent:streamrl.envs.agents:NAME`, written against the plain `openai` client."""

from __future__ import annotations

from typing import Any


def one_call(client: Any, messages: list[dict[str, str]]) -> str:
    """The single-turn baseline: one chat call, its text is the answer."""
    reply = client.chat.completions.create(model="policy", messages=messages)
    return reply.choices[0].message.content or ""


def two_tries(client: Any, messages: list[dict[str, str]]) -> str:
    """Answer; if the reply does not state 'the answer is', ask once more for the final format."""
    first = one_call(client, messages)
    if "answer is" in first.lower():
        return first
    follow_up = {"role": "user", "content": "Finish with 'The answer is <number>.'"}
    return one_call(client, [*messages, {"role": "assistant", "content": first}, follow_up])
