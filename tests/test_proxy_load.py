"""The chat proxy under load: hundreds of concurrent two-turn agents (the real `openai` client, no
retries) and a listen backlog deep enough that simultaneous connects are queued, never reset."""

import socket
import threading
from pathlib import Path

import openai
import pytest
from scripted_chat import ScriptedEngine

from streamrl.engine.serving import BatchingEngine
from streamrl.envs.agent_trajectory import assemble
from streamrl.envs.http_server import listening_socket
from streamrl.envs.proxy import ChatProxy

CLIENTS = 256


def test_concurrent_connects_queue_in_the_backlog_instead_of_failing():
    somaxconn = int(Path("/proc/sys/net/core/somaxconn").read_text())
    n = min(CLIENTS, somaxconn)
    server = listening_socket("127.0.0.1", 0)  # nobody accepts: every connection waits in the queue
    port = server.getsockname()[1]
    conns = []
    try:
        for _ in range(n):
            c = socket.socket()
            conns.append(c)
            c.settimeout(5)
            c.connect(("127.0.0.1", port))  # a full queue drops the SYN: the connect times out
    except OSError as e:
        pytest.fail(f"connection {len(conns)} of {n} failed while the earlier ones wait: {e!r}")
    finally:
        for c in conns:
            c.close()
        server.close()
    assert len(conns) == n


def test_256_concurrent_two_turn_agents_see_no_connection_error(tiny):
    _, tok = tiny
    scripted = ScriptedEngine(tok, lambda prompt: f"turn {prompt.count('<|im_start|>assistant')}")
    front = BatchingEngine(scripted, max_batch=64)
    proxy = ChatProxy(front, tok, max_tokens=16)
    for i in range(CLIENTS):
        proxy.open_episode(f"ep-{i}")
    errors: list[BaseException] = []
    start = threading.Barrier(CLIENTS)

    def agent(i: int) -> None:
        client = openai.OpenAI(base_url=proxy.url, api_key=f"ep-{i}", max_retries=0, timeout=120)
        try:
            msgs = [{"role": "user", "content": f"task {i}"}]
            start.wait(timeout=120)  # every client calls at the same moment
            first = client.chat.completions.create(model="policy", messages=msgs)
            msgs += [{"role": "assistant", "content": first.choices[0].message.content}]
            msgs += [{"role": "user", "content": "go on"}]
            client.chat.completions.create(model="policy", messages=msgs)
        except BaseException as e:  # counted below: any connection error fails the test
            errors.append(e)
        finally:
            client.close()

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(CLIENTS)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=300)
        assert [repr(e) for e in errors] == []
        episodes = [proxy.pop_episode(f"ep-{i}") for i in range(CLIENTS)]
    finally:
        proxy.close()
        front.close()
    assert [len(calls) for calls in episodes] == [2] * CLIENTS
    assert len(scripted.prompts) == 2 * CLIENTS
    assert [c.text for c in episodes[0]] == ["turn 1", "turn 2"]
    # each episode's second call extends its first: one trajectory holding both turns
    for i in (0, CLIENTS - 1):
        (traj,) = assemble(episodes[i], "p", "g", i, 1.0, True)
        assert traj.loss_mask.count(1) == len(episodes[i][0].completion_ids) + len(
            episodes[i][1].completion_ids
        )
