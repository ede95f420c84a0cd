"""An engine whose replies are a function of the prompt text, for proxy and agent tests (no model).

`reply(prompt_text) -> str` is encoded with the tokenizer; the turn ends with the end-of-turn token
(finish "stop") when it fits in max_new_tokens, else it is cut there (finish "length"). Every token
has log-prob -0.25 and the engine's version. `prompts` records each request's prompt text.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from streamrl.engine.base import GenRequest, GenResult


class ScriptedEngine:
    def __init__(self, tokenizer: Any, reply: Callable[[str], str], version: int = 0) -> None:
        self.tokenizer, self.reply, self.version = tokenizer, reply, version
        self.prompts: list[str] = []
        self._lock = threading.Lock()

    def generate(self, requests: list[GenRequest]) -> list[GenResult]:
        return [self._one(r) for r in requests]

    def _one(self, req: GenRequest) -> GenResult:
        prompt = self.tokenizer.decode(req.prompt_ids)
        with self._lock:
            self.prompts.append(prompt)
        ids = list(self.tokenizer(self.reply(prompt), add_special_tokens=False).input_ids)
        ids.append(self.tokenizer.eos_token_id)
        finish = "stop" if len(ids) <= req.max_new_tokens else "length"
        ids = ids[: req.max_new_tokens]
        return GenResult(req, ids, [-0.25] * len(ids), [self.version] * len(ids), finish)


@contextmanager
def scripted_proxy(
    tokenizer: Any,
    reply: Callable[[str], str],
    max_tokens: int,
    episodes: Iterable[str] = (),
    version: int = 0,
    **proxy_kw: Any,
) -> Iterator[tuple[Any, ScriptedEngine]]:
    """A ChatProxy (replies of at most max_tokens) over a ScriptedEngine(tokenizer, reply, version)
    behind a BatchingEngine, `episodes` opened. Yields (proxy, engine); both are closed after."""
    from streamrl.engine.serving import BatchingEngine
    from streamrl.envs.proxy import ChatProxy

    scripted = ScriptedEngine(tokenizer, reply, version)
    front = BatchingEngine(scripted)
    proxy = ChatProxy(front, tokenizer, max_tokens=max_tokens, **proxy_kw)
    try:
        for episode in episodes:
            proxy.open_episode(episode)
        yield proxy, scripted
    finally:
        proxy.close()
        front.close()


@contextmanager
def gated_proxy(tokenizer: Any, **proxy_kw: Any) -> Iterator[tuple[Any, ScriptedEngine, threading.Event]]:
    """A ChatProxy over a ScriptedEngine whose every reply ("4") waits for `gate`: calls stay in flight
    until the test sets it. Yields (proxy, engine, gate); everything is closed after."""
    gate = threading.Event()
    reply = lambda prompt: "4" if gate.wait(60) else ""  # noqa: E731
    with scripted_proxy(tokenizer, reply, max_tokens=8, **proxy_kw) as (proxy, scripted):
        try:
            yield proxy, scripted, gate
        finally:
            gate.set()
