"""Retried calls are idempotent: a call id (Idempotency-Key) is generated and recorded once."""

import socket
import struct
import threading

import openai
import pytest
from scripted_chat import gated_proxy, scripted_proxy

from streamrl.rollout.agent import agent_client

MSGS = [{"role": "user", "content": "2+2?"}]


@pytest.fixture()
def served(tiny):
    reply = "The answer is 4."
    with scripted_proxy(tiny[1], lambda prompt: reply, max_tokens=32, episodes=("ep", "ep-retry")) as served:
        yield served


def _plain_client(url, episode="ep"):
    return openai.OpenAI(base_url=url, api_key=episode, max_retries=0, timeout=60)


def test_a_repeated_call_id_is_answered_from_memory(served):
    proxy, scripted = served
    client = _plain_client(proxy.url)
    key = {"Idempotency-Key": "call-1"}
    first = client.chat.completions.create(model="policy", messages=MSGS, extra_headers=key)
    again = client.chat.completions.create(model="policy", messages=MSGS, extra_headers=key)
    other = client.chat.completions.create(
        model="policy", messages=MSGS, extra_headers={"Idempotency-Key": "c2"}
    )
    assert again.id == first.id and again.choices[0].message.content == "The answer is 4."
    assert other.id != first.id
    assert len(scripted.prompts) == 2 and proxy.replayed == 1
    assert len(proxy.pop_episode("ep")) == 2  # call-1 once, c2 once
    # popping the episode forgets its answers: the same id in a new episode of that name is a new call
    proxy.open_episode("ep")
    client.chat.completions.create(model="policy", messages=MSGS, extra_headers=key)
    assert len(scripted.prompts) == 3 and len(proxy.calls("ep")) == 1


def test_a_retry_while_the_call_runs_waits_for_the_same_generation(tiny):
    with gated_proxy(tiny[1]) as (proxy, scripted, gate):
        proxy.open_episode("ep")
        answers = []

        def call():
            r = _plain_client(proxy.url).chat.completions.create(
                model="policy", messages=MSGS, extra_headers={"Idempotency-Key": "same"}
            )
            answers.append(r.id)

        threads = [threading.Thread(target=call) for _ in range(3)]
        for t in threads:
            t.start()
        while proxy.replayed < 2:  # both duplicates arrived while the first is still generating
            threading.Event().wait(0.01)
        gate.set()
        for t in threads:
            t.join(timeout=60)
        assert len(answers) == 3 and len(set(answers)) == 1
        assert len(scripted.prompts) == 1 and len(proxy.calls("ep")) == 1


class DropFirstResponse:
    """A TCP relay to the proxy that resets the client's first connection once the proxy has begun to
    answer on it: the call was generated and recorded, but its response is lost on the way."""

    def __init__(self, upstream: str) -> None:
        host, port = upstream.removeprefix("http://").split("/")[0].split(":")
        self.upstream = (host, int(port))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}/v1"
        self.dropped = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.sock.accept()
            except OSError:
                return
            up = socket.create_connection(self.upstream)
            if self.dropped == 0:
                threading.Thread(target=self._drop, args=(client, up), daemon=True).start()
            else:
                threading.Thread(target=_pipe, args=(client, up), daemon=True).start()
                threading.Thread(target=_pipe, args=(up, client), daemon=True).start()

    def _drop(self, client: socket.socket, up: socket.socket) -> None:
        request = b""
        while b"\r\n\r\n" not in request:  # headers, then as many body bytes as they announce
            request += client.recv(65536)
        head, _, body = request.partition(b"\r\n\r\n")
        length = next(
            int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length")
        )
        while len(body) < length:
            body += client.recv(65536)
        up.sendall(head + b"\r\n\r\n" + body)
        up.recv(65536)  # the response has begun: the call was generated and recorded
        self.dropped += 1
        client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        client.close()  # a reset, not a clean close
        up.close()

    def close(self) -> None:
        self.sock.close()


def _pipe(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(65536):
            dst.sendall(data)
    except OSError:
        pass
    for s in (src, dst):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass


def test_the_agent_client_retries_a_lost_response_without_a_second_generation(served):
    proxy, scripted = served
    relay = DropFirstResponse(proxy.url)
    client = agent_client(relay.url, "ep-retry")
    try:
        reply = client.chat.completions.create(model="policy", messages=MSGS)
    finally:
        client.close()
        relay.close()
    assert relay.dropped == 1  # the first response really was lost
    assert reply.choices[0].message.content == "The answer is 4."
    assert len(scripted.prompts) == 1 and proxy.replayed == 1
    (call,) = proxy.pop_episode("ep-retry")  # one call recorded, not two
    assert call.text == "The answer is 4."


def test_a_failed_generation_is_generated_afresh_by_the_retry(tiny):
    _, tok = tiny
    failures = [RuntimeError("engine hiccup")]

    def reply(prompt):
        if failures:
            raise failures.pop()
        return "ok"

    with scripted_proxy(tok, reply, max_tokens=8, episodes=("ep-500",)) as (proxy, scripted):
        client = agent_client(proxy.url, "ep-500")
        try:
            reply_ = client.chat.completions.create(model="policy", messages=MSGS)
        finally:
            client.close()
    assert reply_.choices[0].message.content == "ok"
    assert len(scripted.prompts) == 2 and proxy.replayed == 0  # the 500 was not remembered
    assert [c.text for c in proxy.calls("ep-500")] == ["ok"]
