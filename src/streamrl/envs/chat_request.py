"""One request to the chat proxy, parsed and checked: a 400 names the field and the fix.

Accepted fields: model (any name), messages (system / user / assistant with tool_calls / tool),
max_tokens / max_completion_tokens (capped by the proxy's limit), temperature, top_p, n, stop,
stream (+ stream_options.include_usage), logprobs, tools and tool_choice. Other fields are ignored;
the legacy `functions` / `function_call` are refused (use `tools`), as are values that would silently
change sampling in a way the proxy cannot honour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from streamrl.envs.tool_calls import template_messages

MAX_N = 16  # choices per call: each is a full completion the engine samples
MAX_STOP = 4  # stop sequences per call (the OpenAI API's limit)


class BadRequest(ValueError):
    """A request the proxy refuses with a 400; `code`: OpenAI's error code, if it has one."""

    def __init__(self, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.code = code


@dataclass
class ChatRequest:
    messages: list[dict[str, Any]]
    max_new_tokens: int
    temperature: float
    top_p: float
    model: str = ""
    n: int = 1
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False
    logprobs: bool = False
    tools: list[dict[str, Any]] | None = None  # the tools the template renders (after tool_choice)
    tool_choice: Any = None

    @property
    def parse_tools(self) -> bool:
        """Replies are searched for tool calls when tools were offered."""
        return bool(self.tools)


def parse_request(body: Any, max_tokens: int, default_temperature: float) -> ChatRequest:
    """The request body -> a ChatRequest; raises BadRequest with one line naming the field."""
    if not isinstance(body, dict):
        raise BadRequest("the request body must be a JSON object")
    for legacy in ("functions", "function_call"):
        if body.get(legacy) is not None:
            raise BadRequest(f"'{legacy}' is the legacy function API: send 'tools' and 'tool_choice' instead")
    try:
        messages = template_messages(body.get("messages"))
    except ValueError as e:
        raise BadRequest(str(e)) from None
    _refuse_unhonoured(body)
    cap = next(
        (body[k] for k in ("max_completion_tokens", "max_tokens") if body.get(k) is not None), max_tokens
    )
    temp = body.get("temperature")
    try:
        max_new = min(int(cap), max_tokens)
        temperature = float(temp) if temp is not None else default_temperature
        top_p = float(body.get("top_p") if body.get("top_p") is not None else 1.0)
        n = int(body["n"] if body.get("n") is not None else 1)
    except (TypeError, ValueError):
        raise BadRequest("max_tokens and n must be integers, temperature and top_p numbers") from None
    if max_new <= 0 or temperature < 0 or not 0 < top_p <= 1:
        raise BadRequest("need max_tokens > 0, temperature >= 0 and 0 < top_p <= 1")
    if not 1 <= n <= MAX_N:
        raise BadRequest(f"'n' must be between 1 and {MAX_N}, got {n}")
    tools, choice = _tools(body.get("tools"), body.get("tool_choice"))
    options = body.get("stream_options") or {}
    return ChatRequest(
        messages=messages,
        max_new_tokens=max_new,
        temperature=temperature,
        top_p=top_p,
        model=str(body.get("model") or ""),
        n=n,
        stop=_stop(body.get("stop")),
        stream=bool(body.get("stream")),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        logprobs=bool(body.get("logprobs")),
        tools=tools,
        tool_choice=choice,
    )


# what would change the tokens sampled or the answer's shape, which the proxy cannot honour: a value
# that asks for it is refused rather than silently ignored (the defaults pass)
UNHONOURED = {
    "response_format": lambda v: isinstance(v, dict) and v.get("type", "text") != "text",
    "logit_bias": bool,
    "presence_penalty": bool,
    "frequency_penalty": bool,
    "top_logprobs": bool,
}


def _refuse_unhonoured(body: dict[str, Any]) -> None:
    for key, asks in UNHONOURED.items():
        if body.get(key) is not None and asks(body[key]):
            raise BadRequest(
                f"'{key}' is not supported by this proxy (the policy samples plainly, so that the trainer "
                f"scores exactly the tokens drawn): leave it out, got {body[key]!r}"
            )


def _stop(stop: Any) -> list[str]:
    stops = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stops, list) or not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("'stop' must be a non-empty string or a list of them")
    if len(stops) > MAX_STOP:
        raise BadRequest(f"'stop' takes at most {MAX_STOP} sequences, got {len(stops)}")
    return stops


def _tools(tools: Any, choice: Any) -> tuple[list[dict[str, Any]] | None, Any]:
    """-> (the tools to render, tool_choice). tool_choice "none" renders no tools (no calls are parsed);
    a named function renders only that tool. Neither "required" nor a named choice is enforced by
    constrained decoding: forcing tokens would train on tokens the policy did not sample."""
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise BadRequest("'tool_choice' needs 'tools'")
        return None, choice
    if not isinstance(tools, list) or not all(_is_tool(t) for t in tools):
        raise BadRequest("'tools' must be a list of {type: function, function: {name, parameters}}")
    if choice in (None, "auto", "required"):
        return tools or None, choice
    if choice == "none":
        return None, choice
    name = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
    named = [t for t in tools if t["function"]["name"] == name]
    if not named:
        raise BadRequest(
            "'tool_choice' must be none, auto, required or {type: function, function: {name}} naming one "
            f"of the tools, got {choice!r}"
        )
    return named, choice


def _is_tool(t: Any) -> bool:
    fn = t.get("function") if isinstance(t, dict) else None
    return (
        t.get("type", "function") == "function" and isinstance(fn, dict) and isinstance(fn.get("name"), str)
    )
