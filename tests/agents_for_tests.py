"""Agents used by the agent-task tests (importable as a module: tests/ is on sys.path)."""


def call_then_fail(client, messages):
    client.chat.completions.create(model="policy", messages=messages, max_tokens=3)
    raise RuntimeError("agent bug after one call")


def fail_at_once_on_odd(client, messages):
    """Raises before any call on problems whose question has an odd CRC: their groups hold nothing."""
    import zlib

    if zlib.crc32(messages[-1]["content"].encode()) % 2:
        raise ConnectionError("agent could not reach its own backend")
    return (
        client.chat.completions.create(model="policy", messages=messages, max_tokens=3)
        .choices[0]
        .message.content
    )


def call_then_hang(client, messages):
    """One call, then a tool that never returns (the episode's time limit must end it)."""
    import time

    client.chat.completions.create(model="policy", messages=messages, max_tokens=3)
    time.sleep(3600)
    return "never"


def call_then_exit(client, messages):
    """One call, then a tool that calls sys.exit (a thread would end on it silently)."""
    import sys

    client.chat.completions.create(model="policy", messages=messages, max_tokens=3)
    sys.exit(2)


def call_then_answer_seven(client, messages):
    """One greedy call, then the same final answer whatever the model said (an evaluation checks the
    agent's answer is what is scored, not the bare model's)."""
    client.chat.completions.create(model="policy", messages=messages, max_tokens=3)
    return "The answer is 7."


def grow_until_refused(client, messages):
    """Calls the model again and again, a long tool output appended each time (an agent retrying until
    a tool call parses), until the proxy refuses the context; at most 12 calls."""
    import openai

    msgs, text = list(messages), ""
    for _ in range(12):
        try:
            reply = client.chat.completions.create(model="policy", messages=msgs, max_tokens=6)
        except openai.BadRequestError as e:
            assert e.code == "context_length_exceeded", e
            return text
        text = reply.choices[0].message.content
        msgs += [{"role": "assistant", "content": text}, {"role": "user", "content": "no tool call"}]
    return text


RUNNING = {"now": 0, "peak": 0}  # count_running's agents at once


def count_running(client, messages):
    """One call, between counting itself in and out of RUNNING (how many agents run at once)."""
    import threading
    import time

    lock = RUNNING.setdefault("lock", threading.Lock())
    with lock:
        RUNNING["now"] += 1
        RUNNING["peak"] = max(RUNNING["peak"], RUNNING["now"])
    try:
        time.sleep(0.2)  # long enough for every agent started at once to be counted together
        client.chat.completions.create(model="policy", messages=messages, max_tokens=2)
        return "The answer is 7."
    finally:
        with lock:
            RUNNING["now"] -= 1


def call_then_answer_an_endless_program(client, messages):
    """One call, then a program that never ends: the code task's sandbox runs it to its own limit, past
    a short reward.timeout_s."""
    client.chat.completions.create(model="policy", messages=messages, max_tokens=3)
    return "```python\nwhile True:\n    pass\n```"
