"""An OpenAI-compatible chat endpoint served by the rollout side, recording every call for training.

An agent written against the `openai` client trains unchanged: point it at `proxy.url` and use an
episode id as the API key,

    client = openai.OpenAI(base_url=proxy.url, api_key="episode-17")
    client.chat.completions.create(model="policy", messages=[...])

Each call is answered by the policy engine and recorded under its episode (the bearer token, or the
`X-Episode-Id` header) with the exact prompt token ids, completion token ids, per-token behaviour
log-probs and policy versions. `agent_trajectory.assemble` turns an episode's calls into trajectories.

Supported request fields: model (any name), messages, max_tokens / max_completion_tokens, temperature,
top_p, n = 1, logprobs. Unsupported ones that change sampling (stop, n > 1, tools, stream) are refused
with a 400 naming the field, rather than silently ignored.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from streamrl.data.prompts import render_prompt_ids
from streamrl.engine.base import GenRequest
from streamrl.engine.serving import BatchingEngine

_REFUSED = {"stop": "stop sequences", "tools": "tools", "stream": "streaming", "functions": "functions"}


@dataclass
class CallRecord:
    """One chat call as the policy saw it. prompt_ids: [P]; completion_ids, logprobs, versions: [C]."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: str
    text: str


class BadRequest(ValueError):
    pass


class ChatProxy:
    """Serve /v1/chat/completions and /v1/models on host:port (port 0 picks a free one) in a thread."""

    def __init__(
        self,
        engine: BatchingEngine,
        tokenizer: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        max_tokens: int = 256,
        model_name: str = "policy",
        default_temperature: float = 1.0,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.model_name = model_name
        self.default_temperature = default_temperature  # for requests that do not set one
        self._episodes: dict[str, list[CallRecord]] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer((host, port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="chat-proxy", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def calls(self, episode: str) -> list[CallRecord]:
        with self._lock:
            return list(self._episodes.get(episode, []))

    def pop_episode(self, episode: str) -> list[CallRecord]:
        """The episode's calls in order, forgotten by the proxy (call once per finished episode)."""
        with self._lock:
            return self._episodes.pop(episode, [])

    def complete(self, episode: str, body: dict[str, Any]) -> dict[str, Any]:
        """The chat.completion response for one request body; raises BadRequest on invalid input."""
        messages = _messages(body)
        for key, what in _REFUSED.items():
            if body.get(key):
                raise BadRequest(f"'{key}' is not supported by the streamrl proxy ({what} change sampling)")
        if int(body.get("n") or 1) != 1:
            raise BadRequest("'n' must be 1: sample several completions with several calls")
        cap = body.get("max_completion_tokens") or body.get("max_tokens") or self.max_tokens
        max_new = min(int(cap), self.max_tokens)
        temp = body.get("temperature")
        temperature = float(temp) if temp is not None else self.default_temperature
        top_p = float(body.get("top_p") if body.get("top_p") is not None else 1.0)
        if max_new <= 0 or temperature < 0 or not 0 < top_p <= 1:
            raise BadRequest("need max_tokens > 0, temperature >= 0 and 0 < top_p <= 1")
        prompt_ids = render_prompt_ids(self.tokenizer, messages)
        res = self.engine.generate_one(GenRequest(prompt_ids, max_new, temperature, top_p))
        text = self.tokenizer.decode(res.token_ids, skip_special_tokens=True)
        record = CallRecord(prompt_ids, res.token_ids, res.logprobs, res.versions, res.finish_reason, text)
        with self._lock:
            self._episodes.setdefault(episode, []).append(record)
        return self._response(body, record)

    def _response(self, body: dict[str, Any], rec: CallRecord) -> dict[str, Any]:
        choice: dict[str, Any] = {
            "index": 0,
            "message": {"role": "assistant", "content": rec.text},
            "finish_reason": "length" if rec.finish_reason == "length" else "stop",
            "logprobs": None,
        }
        if body.get("logprobs"):
            choice["logprobs"] = {
                "content": [
                    {"token": self.tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                    for t, lp in zip(rec.completion_ids, rec.logprobs)
                ]
            }
        p, c = len(rec.prompt_ids), len(rec.completion_ids)
        return {
            "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": str(body.get("model") or self.model_name),
            "choices": [choice],
            "usage": {"prompt_tokens": p, "completion_tokens": c, "total_tokens": p + c},
        }

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    msgs = body.get("messages")
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list of {role, content}")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or "role" not in m:
            raise BadRequest(f"messages[{i}] must be an object with 'role' and 'content'")
        content = m.get("content") or ""
        if isinstance(content, list):  # content parts: keep the text ones
            content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
        out.append({"role": str(m["role"]), "content": str(content)})
    return out


def _handler_for(proxy: ChatProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:  # no access log on stderr
            pass

        def _send(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _error(self, status: int, message: str) -> None:
            self._send(status, {"error": {"message": message, "type": "invalid_request_error"}})

        def do_GET(self) -> None:
            if self.path.rstrip("/").endswith("/models"):
                self._send(200, {"object": "list", "data": [{"id": proxy.model_name, "object": "model"}]})
            else:
                self._error(404, f"no route {self.path}")

        def do_POST(self) -> None:
            if not self.path.rstrip("/").endswith("/chat/completions"):
                self._error(404, f"no route {self.path}; use /v1/chat/completions")
                return
            auth = self.headers.get("Authorization", "")
            episode = self.headers.get("X-Episode-Id") or auth.removeprefix("Bearer ").strip() or "default"
            try:
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if not isinstance(body, dict):
                    raise BadRequest("the request body must be a JSON object")
                self._send(200, proxy.complete(episode, body))
            except (BadRequest, json.JSONDecodeError, ValueError, TypeError) as e:
                self._error(400, str(e))
            except Exception as e:  # an engine failure is the server's, not the agent's, fault
                self._error(500, f"{type(e).__name__}: {e}")

    return Handler
