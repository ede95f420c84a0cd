"""Function calling through the proxy: request messages for the chat template, tool calls parsed back.

Parsed format (Hermes, also Qwen2.5 / Qwen3 and the tiny-random template): each call is a JSON object
with `name` and `arguments` (or `parameters`) between tags,

    <tool_call>
    {"name": "calculate", "arguments": {"expression": "2+3"}}
    </tool_call>

The text outside the tags becomes the message content (None when empty). A reply whose tagged JSON
does not parse, or lacks a string `name`, is returned as plain content with no tool calls (the model
is being trained: a malformed call is its mistake to be scored, not an error). An unclosed tag (a
reply cut by max_tokens) is plain content too. Other formats (Llama 3 JSON, Mistral `[TOOL_CALLS]`)
are not parsed.
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.S)


def parse_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """-> (content, tool calls in the OpenAI shape); ([text], []) when the text holds no valid call."""
    calls = []
    for m in _CALL.finditer(text):
        try:
            obj = json.loads(m.group(1))
        except json.JSONDecodeError:
            return text, []
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            return text, []
        args = obj.get("arguments", obj.get("parameters", {}))
        calls.append(
            {
                "id": f"call_{uuid.uuid4().hex[:24]}",
                "type": "function",
                "function": {
                    "name": obj["name"],
                    "arguments": args if isinstance(args, str) else json.dumps(args, ensure_ascii=False),
                },
            }
        )
    if not calls:
        return text, []
    content = _CALL.sub("", text).strip()
    return content or None, calls


def template_messages(messages: Any) -> list[dict[str, Any]]:
    """OpenAI request messages -> what chat templates expect: content as text (text parts joined), and
    tool-call arguments as objects (a JSON string is parsed, as templates serialise them themselves).
    Raises ValueError naming the bad message."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ValueError(f"messages[{i}] must be an object with 'role' and 'content'")
        content = m.get("content") or ""
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        msg: dict[str, Any] = {"role": m["role"], "content": str(content)}
        if m.get("tool_calls"):
            msg["tool_calls"] = [_call_for_template(i, c) for c in m["tool_calls"]]
        for key in ("tool_call_id", "name"):
            if isinstance(m.get(key), str):
                msg[key] = m[key]
        out.append(msg)
    return out


def _call_for_template(i: int, call: Any) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ValueError(f"messages[{i}].tool_calls: each call needs function.name and function.arguments")
    args = fn.get("arguments") or {}
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            pass  # not JSON: the template gets the string as it is
    out = {"type": "function", "function": {"name": fn["name"], "arguments": args}}
    if isinstance(call.get("id"), str):
        out["id"] = call["id"]
    return out
