"""An OpenAI-compatible chat endpoint served by the rollout side, recording every call for training.

An agent written against the `openai` client trains unchanged: the rollout opens an episode, points
the agent at `proxy.url` and gives it the episode's name as the API key,

    proxy.open_episode("episode-17")
    client = openai.OpenAI(base_url=proxy.url, api_key="episode-17")
    client.chat.completions.create(model="policy", messages=[...], tools=[...])
    calls = proxy.pop_episode("episode-17")  # once the agent returned: the episode ends

Each call is answered by the policy engine and recorded under its episode (the bearer token, or the
`X-Episode-Id` header) with the exact prompt token ids, completion token ids, per-token behaviour
log-probs and policy versions, one record per choice. Only episodes the rollout opened and has not
popped are served: a call naming any other (a typo, an agent of a group that ended, a name the agent
made up) is refused with a 401 `invalid_api_key` naming it, before the engine, and leaves nothing
behind (a kept record would be trained on nowhere, and would stay for the rest of the run).
`agent_trajectory.assemble` turns an episode's calls into trajectories. Request fields:
envs/chat_request.py; tool calls: envs/tool_calls.py; stop and streaming: envs/chat_completion.py.

Retries are safe: a call that carries an `Idempotency-Key` header (the agent runner's client sends
one per call and keeps it across its retries) is generated once; a retry of it, while it runs or
after it finished, gets the same answer, and the call is recorded once. Answers are remembered until
the episode is popped.

The proxy also clocks each episode's time inside its calls (`model_seconds`): the agent runner
subtracts it from the episode's age to get the agent's own time (its code and tools), which
`env.agent_timeout_s` bounds. An episode ended that way (`pop_episode(..., refuse_later=True)`) is
refused from then on (410: the client does not retry it). A call still running when its episode is
popped is not recorded, nor is its time.

The server is uvicorn (envs/http_server.py: deep listen backlog, keep-alive); handlers await the
engine's futures, so hundreds of concurrent calls cost no thread each. `engine` is anything with
`submit(GenRequest) -> concurrent.futures.Future[GenResult]`: a BatchingEngine (colocated) or the
rollout worker's DecoderFront (async).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
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
REFUSED_KEPT = 1 << 16  # ended episodes remembered (and refused): the latest this many
_PROBE_TOOL = {"type": "function", "function": {"name": "probe_tool_7f3a", "parameters": {"type": "object"}}}


class EpisodeEnded(Exception):
    """A call of an episode that pop_episode ended (refuse_later): the client gets a 410."""


class UnknownEpisode(Exception):
    """A call of an episode that is not open (never opened, or popped): the client gets a 401."""


@dataclass
class _Episode:
    """One episode's calls and clock. A call holds its episode's object from start to end, so a call still
    running when the episode is popped (an agent that gave up on it) writes into the popped object,
    which nothing reads: its answer and its time are dropped with it."""

    calls: list[CallRecord] = field(default_factory=list)
    answers: dict[str, asyncio.Future[Completion]] = field(default_factory=dict)  # call id -> answer
    running: int = 0  # calls in flight
    since: float = 0.0  # when `running` last changed
    model_s: float = 0.0  # seconds with a call in flight, up to `since`


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
        training: bool = False,
        max_context: int = 0,
    ) -> None:
        self.engine = engine
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.model_name = model_name
        self.default_temperature = default_temperature  # for requests that do not set one
        # training: every call samples at default_temperature with top_p 1, whatever it asks; the trainer
        # scores its tokens under that distribution (an evaluation honours a call's own)
        self.training = training
        # a call's prompt + completion tokens at most (0: unbounded): a longer prompt is refused as
        # OpenAI refuses one past the context, and max_tokens is cut to what is left
        self.max_context = max_context
        self.clock = clock  # model time is measured on it
        self._episodes: dict[str, _Episode] = {}
        self._refused: OrderedDict[str, None] = OrderedDict()  # ended episodes, the latest REFUSED_KEPT
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
            ep = self._episodes.get(episode)
            return list(ep.calls) if ep is not None else []

    def open_episode(self, episode: str) -> None:
        """Serve calls named `episode` from now until it is popped. A name is used once: one that is open
        or was ended (refuse_later) raises ValueError (a later episode of that name would be given the
        calls of the agent still running under it)."""
        with self._lock:
            if not episode or episode in self._episodes or episode in self._refused:
                raise ValueError(f"episode name '{episode}' is empty, open or ended: give each its own")
            self._episodes[episode] = _Episode()

    def pop_episode(self, episode: str, refuse_later: bool = False) -> list[CallRecord]:
        """The episode's calls in order, forgotten by the proxy (call once per finished episode); what its
        calls still running finish later is dropped, and a later call is refused as unknown (401).
        `refuse_later`: the episode was ended while its agent still runs, and its later calls get a 410."""
        with self._lock:
            if refuse_later:
                self._refused[episode] = None
                while len(self._refused) > REFUSED_KEPT:
                    self._refused.popitem(last=False)
            ep = self._episodes.pop(episode, None)
            return ep.calls if ep is not None else []

    def model_seconds(self, episode: str, now: float) -> float:
        """Seconds (on `clock`) the episode has had at least one call running, up to `now`."""
        with self._lock:
            ep = self._episodes.get(episode)
            if ep is None:
                return 0.0
            return ep.model_s + (now - ep.since if ep.running else 0.0)

    def refused(self, episode: str) -> bool:
        with self._lock:
            return episode in self._refused

    def _tick(self, ep: _Episode, delta: int) -> None:
        """A call of `ep` starts (+1) or ends (-1); time with any call in flight is model time."""
        now = self.clock()
        with self._lock:
            if ep.running:
                ep.model_s += now - ep.since
            ep.running += delta
            ep.since = now

    def parse(self, body: Any) -> ChatRequest:
        req = parse_request(body, self.max_tokens, self.default_temperature)
        if self.training:
            req = dataclasses.replace(req, temperature=self.default_temperature, top_p=1.0)
        return req

    async def complete(self, episode: str, call_id: str, req: ChatRequest) -> Completion:
        """The call's completion; a call id seen before gets the first answer, generated once.
        EpisodeEnded: the episode was ended (pop_episode with refuse_later); UnknownEpisode: it is not
        open. Both are checked under the lock that pop_episode takes, so no call of an episode that is
        over starts it again."""
        with self._lock:
            if episode in self._refused:
                raise EpisodeEnded(episode)
            ep = self._episodes.get(episode)
            if ep is None:
                raise UnknownEpisode(episode)
        self._tick(ep, +1)
        try:
            return await self._complete(ep, call_id, req)
        finally:
            self._tick(ep, -1)

    async def _complete(self, ep: _Episode, call_id: str, req: ChatRequest) -> Completion:
        if not call_id:
            return await self._generate(ep, req)
        with self._lock:
            answer = ep.answers.get(call_id)
            if answer is None:
                answer = ep.answers[call_id] = asyncio.ensure_future(self._generate(ep, req))
                answer.add_done_callback(functools.partial(self._forget_failed, ep, call_id))
            else:
                self.replayed += 1
        return await asyncio.shield(answer)

    def _forget_failed(self, ep: _Episode, call_id: str, answer: asyncio.Future[Completion]) -> None:
        if answer.cancelled() or answer.exception() is not None:  # a retry generates afresh
            with self._lock:
                if ep.answers.get(call_id) is answer:
                    del ep.answers[call_id]

    async def _generate(self, ep: _Episode, req: ChatRequest) -> Completion:
        prompt_ids = self._prompt_ids(req)
        room = self.max_context - len(prompt_ids) if self.max_context else req.max_new_tokens
        if room < 1:
            raise BadRequest(
                f"this chat is {len(prompt_ids)} tokens; a training call's context is {self.max_context} "
                "tokens (train.token_budget) for the prompt and the completion: shorten the history or end "
                "the episode",
                "context_length_exceeded",
            )
        gen = GenRequest(prompt_ids, min(req.max_new_tokens, room), req.temperature, req.top_p)
        futures = [asyncio.wrap_future(self.engine.submit(gen)) for _ in range(req.n)]
        results = await asyncio.gather(*futures)
        choices = [make_choice(self.tokenizer, prompt_ids, res, req) for res in results]
        with self._lock:
            ep.calls.extend(ch.record for ch in choices)  # into a popped episode: dropped with it
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


def _unknown(episode: str) -> str:
    return (
        f"no open episode '{episode}': the API key (or the X-Episode-Id header) must be the name of an "
        "episode the rollout started and has not ended, the api_key of the client given to the agent; "
        "a call after its episode ended is not recorded"
    )


def _error(status: int, message: str, code: str | None = None) -> JSONResponse:
    kind = "invalid_request_error" if status < 500 else "server_error"
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=status)


def _app(proxy: ChatProxy) -> Starlette:
    async def models(request: Request) -> Response:
        return JSONResponse({"object": "list", "data": [{"id": proxy.model_name, "object": "model"}]})

    async def chat(request: Request) -> Response:
        auth = request.headers.get("authorization", "")
        episode = request.headers.get("x-episode-id") or auth.removeprefix("Bearer ").strip()
        try:
            req = proxy.parse(json.loads(await request.body() or b"{}"))
        except Exception as e:  # not JSON, or a field of the wrong shape: the request's fault (no retry)
            return _error(
                400, str(e) if isinstance(e, BadRequest) else f"malformed request: {type(e).__name__}: {e}"
            )
        try:
            completion = await proxy.complete(episode, request.headers.get(CALL_ID_HEADER, ""), req)
        except EpisodeEnded:
            return _error(410, f"episode '{episode}' has ended (env.agent_timeout_s): stop calling")
        except UnknownEpisode:
            return _error(401, _unknown(episode), "invalid_api_key")
        except BadRequest as e:
            return _error(400, str(e), e.code)
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
