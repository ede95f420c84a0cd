"""An OpenAI-compatible chat endpoint served by the rollout side, recording every call for training.

An agent written against the `openai` client trains unchanged: point it at `proxy.url` and use an
episode id as the API key,

    client = openai.OpenAI(base_url=proxy.url, api_key="episode-17")
    client.chat.completions.create(model="policy", messages=[...], tools=[...])

Each call is answered by the policy engine and recorded under its episode (the bearer token, or the
`X-Episode-Id` header) with the exact prompt token ids, completion token ids, per-token behaviour
log-probs and policy versions, one record per choice. `agent_trajectory.assemble` turns an episode's
calls into trajectories. Request fields: envs/chat_request.py; tool calls: envs/tool_calls.py;
stop and streaming: envs/chat_completion.py.

Retries are safe: a call that carries an `Idempotency-Key` header (the agent runner's client sends
one per call and keeps it across its retries) is generated once; a retry of it, while it runs or
after it finished, gets the same answer, and the call is recorded once. Answers are remembered until
the episode is popped.

The proxy also clocks each episode's time inside its calls (`model_seconds`): the agent runner
subtracts it from the episode's age to get the agent's own time (its code and tools), which
`env.agent_timeout_s` bounds. An episode ended that way (`end_episode`) is refused from then on
(410: the client does not retry it), and whatever it still generates is not recorded.

The server is uvicorn (envs/http_server.py: deep listen backlog, keep-alive); handlers await the
engine's futures, so hundreds of concurrent calls cost no thread each. `engine` is anything with
`submit(GenRequest) -> concurrent.futures.Future[GenResult]`: a BatchingEngine (colocated) or the
rollout worker's DecoderFront (async).
"""

from __future__ import annotations

import asyncio
import functools
import json
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from streamrl.data.prompts import render_prompt_ids
from streamrl.engine.base import GenRequest
from streamrl.envs.chat_completion import CallRecord, Completion, make_choice, response_body, sse_events
from streamrl.envs.chat_request import BadRequest, ChatRequest, parse_request
from streamrl.envs.http_server import ThreadedServer

CALL_ID_HEADER = "Idempotency-Key"
_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_7f3a", "parameters": {"type": "object"}}}


class ChatProxy:
    """Serve /v1/chat/completions and /v1/models on host:port (port 0 picks a free one)."""

    def __init__(
        self,
        engine: Any,
        tokenizer: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        max_tokens: int = 256,
        model_name: str = "policy",
        default_temperature: float = 1.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.model_name = model_name
        self.default_temperature = default_temperature  # for requests that do not set one
        self._episodes: dict[str, list[CallRecord]] = {}
        self._answers: dict[tuple[str, str], asyncio.Future[Completion]] = {}  # (episode, call id)
        self._in_call: dict[str, tuple[int, float]] = {}  # episode -> (calls running, since when)
        self._model_s: dict[str, float] = {}  # episode -> seconds with a call running, up to `since`
        self._ended: set[str] = set()
        self.clock = (
            clock  # model time is measured on it  # episodes ended by their runner: later calls are refused
        )
        self._lock = threading.Lock()
        self._renders_tools: bool | None = None
        self.replayed = 0  # retried calls answered from memory
        self._server = ThreadedServer(_app(self), host, port, name="chat-proxy")

    @property
    def url(self) -> str:
        host, port = self._server.address
        return f"http://{host}:{port}/v1"

    def calls(self, episode: str) -> list[CallRecord]:
        with self._lock:
            return list(self._episodes.get(episode, []))

    def pop_episode(self, episode: str, refuse_later: bool = False) -> list[CallRecord]:
        """The episode's calls in order, forgotten by the proxy (call once per finished episode).
        `refuse_later`: the episode was ended while its agent still runs; its later calls get a 410."""
        with self._lock:
            for key in [k for k in self._answers if k[0] == episode]:
                del self._answers[key]
            self._model_s.pop(episode, None)
            if refuse_later:
                self._ended.add(episode)
            return self._episodes.pop(episode, [])

    def model_seconds(self, episode: str, now: float) -> float:
        """Seconds (on `clock`) the episode has had at least one call running, up to `now`."""
        with self._lock:
            running, since = self._in_call.get(episode, (0, now))
            return self._model_s.get(episode, 0.0) + (now - since if running else 0.0)

    def ended(self, episode: str) -> bool:
        with self._lock:
            return episode in self._ended

    def _clock(self, episode: str, delta: int) -> None:
        """A call of the episode starts (+1) or ends (-1): time with any call running is model time."""
        now = self.clock()
        with self._lock:
            running, since = self._in_call.get(episode, (0, now))
            if running and episode not in self._ended:
                self._model_s[episode] = self._model_s.get(episode, 0.0) + now - since
            if running + delta:
                self._in_call[episode] = (running + delta, now)
            else:
                self._in_call.pop(episode, None)

    def parse(self, body: Any) -> ChatRequest:
        return parse_request(body, self.max_tokens, self.default_temperature)

    async def complete(self, episode: str, call_id: str, req: ChatRequest) -> Completion:
        """The call's completion; a call id seen before gets the first answer, generated once."""
        self._clock(episode, +1)
        try:
            return await self._complete(episode, call_id, req)
        finally:
            self._clock(episode, -1)

    async def _complete(self, episode: str, call_id: str, req: ChatRequest) -> Completion:
        if not call_id:
            return await self._generate(episode, req)
        key = (episode, call_id)
        with self._lock:
            answer = self._answers.get(key)
            if answer is None:
                answer = self._answers[key] = asyncio.ensure_future(self._generate(episode, req))
                answer.add_done_callback(functools.partial(self._forget_failed, key))
            else:
                self.replayed += 1
        return await asyncio.shield(answer)

    def _forget_failed(self, key: tuple[str, str], answer: asyncio.Future[Completion]) -> None:
        if answer.cancelled() or answer.exception() is not None:  # a retry generates afresh
            with self._lock:
                if self._answers.get(key) is answer:
                    del self._answers[key]

    async def _generate(self, episode: str, req: ChatRequest) -> Completion:
        prompt_ids = self._prompt_ids(req)
        gen = GenRequest(prompt_ids, req.max_new_tokens, req.temperature, req.top_p)
        futures = [asyncio.wrap_future(self.engine.submit(gen)) for _ in range(req.n)]
        results = await asyncio.gather(*futures)
        choices = [make_choice(self.tokenizer, prompt_ids, res, req) for res in results]
        with self._lock:
            if episode not in self._ended:  # an ended episode's calls were taken: nothing more is kept
                self._episodes.setdefault(episode, []).extend(ch.record for ch in choices)
        return Completion(f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time()), len(prompt_ids), choices)

    def _prompt_ids(self, req: ChatRequest) -> list[int]:
        if req.tools and not self._template_renders_tools():
            raise BadRequest(
                "'tools': this model's chat template ignores tools; use a model whose template renders "
                "them (e.g. Qwen2.5) or describe the tools in the messages"
            )
        try:
            return render_prompt_ids(self.tokenizer, req.messages, req.tools)
        except Exception as e:  # jinja raises on chats the template refuses (roles, shapes)
            raise BadRequest(
                f"the chat template cannot render these messages: {type(e).__name__}: {e}"
            ) from None

    def _template_renders_tools(self) -> bool:
        if self._renders_tools is None:
            chat = [{"role": "user", "content": "x"}]
            plain = render_prompt_ids(self.tokenizer, chat)
            self._renders_tools = render_prompt_ids(self.tokenizer, chat, [_PROBE_TOOL]) != plain
        return self._renders_tools

    def close(self) -> None:
        self._server.close()


def _error(status: int, message: str) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind}}, status_code=status)


def _app(proxy: ChatProxy) -> Starlette:
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": proxy.model_name, "object": "model"}]})

    async def chat(request: Request) -> Response:
        auth = request.headers.get("authorization", "")
        episode = request.headers.get("x-episode-id") or auth.removeprefix("Bearer ").strip() or "default"
        if proxy.ended(episode):
            return _error(410, f"episode '{episode}' has ended (env.agent_timeout_s): stop calling")
        try:
            req = proxy.parse(json.loads(await request.body() or b"{}"))
            completion = await proxy.complete(episode, request.headers.get(CALL_ID_HEADER, ""), req)
        except (BadRequest, json.JSONDecodeError) as e:
            return _error(400, str(e))
        except Exception as e:  # an engine failure is the server's, not the agent's, fault
            return _error(500, f"{type(e).__name__}: {e}")
        model = req.model or proxy.model_name
        if req.stream:
            events = sse_events(completion, model, req.include_usage)
            return StreamingResponse(events, media_type="text/event-stream")
        return JSONResponse(response_body(completion, model))

    async def not_found(request: Request) -> Response:
        return _error(404, f"no route {request.url.path}; use /v1/chat/completions")

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/chat/completions", chat, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/models", models, methods=["GET"]),
        Route("/{path:path}", not_found, methods=["GET", "POST"]),
    ]
    return Starlette(routes=routes)
