"""What one proxy call produced: the recorded call per choice, and its OpenAI response shapes.

A choice is recorded exactly as sampled (CallRecord). With `stop`, the completion is cut after the
token that completes the first stop sequence: the text returned ends before the sequence, and the
tokens sampled after that token are discarded (neither returned nor trained). Responses are a
`chat.completion` JSON body, or with `stream` server-sent `chat.completion.chunk` events (generation
runs to the end first, then the chunks are sent: role, content, tool calls, finish reason, usage).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from streamrl.engine.base import GenResult
from streamrl.envs.chat_request import ChatRequest
from streamrl.envs.tool_calls import parse_tool_calls


@dataclass
class CallRecord:
    """One chat completion as the policy saw it. prompt_ids: [P]; completion_ids, logprobs, versions: [C]."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    text: str


@dataclass
class Choice:
    record: CallRecord
    message: dict[str, Any]  # {"role": "assistant", "content": ..., ["tool_calls": [...]]}
    finish_reason: str  # "stop" | "length" | "tool_calls"
    logprobs: dict[str, Any] | None  # {"content": [{token, logprob, bytes, top_logprobs}]} if asked


@dataclass
class Completion:
    id: str
    created: int
    prompt_tokens: int
    choices: list[Choice]

    def usage(self) -> dict[str, int]:
        c = sum(len(ch.record.completion_ids) for ch in self.choices)
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": c,
            "total_tokens": self.prompt_tokens + c,
        }


def cut_at_stop(tokenizer: Any, ids: list[int], stops: list[str]) -> tuple[int, str] | None:
    """-> (k, text before the stop) for the fewest tokens ids[:k] whose text holds a stop sequence, or
    None when no stop sequence occurs. A prefix that holds one is followed by longer ones that do (the
    text only grows at its end), so k is found by bisection: log2(len) decodes, not len."""

    def holds(k: int) -> bool:
        text = _decode(tokenizer, ids[:k])
        return any(s in text for s in stops)

    if not stops or not holds(len(ids)):
        return None
    lo, hi = 1, len(ids)  # holds(hi); the answer is in [lo, hi]
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if holds(mid) else (mid + 1, hi)
    text = _decode(tokenizer, ids[:hi])
    return hi, text[: min(text.find(s) for s in stops if s in text)]


def make_choice(tokenizer: Any, prompt_ids: list[int], res: GenResult, req: ChatRequest) -> Choice:
    """One engine result -> its recorded call and response message (stop cut, tool calls parsed)."""
    ids, lps, vs, finish = res.token_ids, res.logprobs, res.versions, res.finish_reason
    cut = cut_at_stop(tokenizer, ids, req.stop)
    if cut is None:
        text = _decode(tokenizer, ids)
    else:
        k, text = cut
        ids, lps, vs, finish = ids[:k], lps[:k], vs[:k], "stop"
    record = CallRecord(list(prompt_ids), list(ids), list(lps), list(vs), finish, text)
    content, calls = parse_tool_calls(text) if req.parse_tools else (text, [])
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = calls
    reason = "tool_calls" if calls else ("length" if finish == "length" else "stop")
    logprobs = None
    if req.logprobs:
        logprobs = {
            "content": [
                {"token": tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(ids, lps)
            ]
        }
    return Choice(record, message, reason, logprobs)


def response_body(c: Completion, model: str) -> dict[str, Any]:
    choices = [
        {"index": i, "message": ch.message, "finish_reason": ch.finish_reason, "logprobs": ch.logprobs}
        for i, ch in enumerate(c.choices)
    ]
    return {
        "id": c.id,
        "object": "chat.completion",
        "created": c.created,
        "model": model,
        "choices": choices,
        "usage": c.usage(),
    }


def sse_events(c: Completion, model: str, include_usage: bool) -> Iterator[bytes]:
    """The completion as `data: {chunk}` events, then `data: [DONE]`."""

    def event(choices: list[dict[str, Any]], **extra: Any) -> bytes:
        chunk = {"id": c.id, "object": "chat.completion.chunk", "created": c.created, "model": model}
        return f"data: {json.dumps({**chunk, 'choices': choices, **extra})}\n\n".encode()

    def delta(i: int, d: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> bytes:
        return event([{"index": i, "delta": d, "logprobs": logprobs, "finish_reason": finish}])

    for i, ch in enumerate(c.choices):
        yield delta(i, {"role": "assistant", "content": ""})
        if ch.message["content"]:
            yield delta(i, {"content": ch.message["content"]}, logprobs=ch.logprobs)
        for j, call in enumerate(ch.message.get("tool_calls", [])):
            yield delta(i, {"tool_calls": [{"index": j, **call}]})
        yield delta(i, {}, finish=ch.finish_reason)
    if include_usage:
        yield event([], usage=c.usage())
    yield b"data: [DONE]\n\n"


def _decode(tokenizer: Any, ids: list[int]) -> str:
    return str(tokenizer.decode(ids, skip_special_tokens=True))
