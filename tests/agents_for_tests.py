"""Agents used by the agent-task tests (importable as a module: tests/ is on sys.path)."""


def call_then_fail(client, messages):
    client.chat.completions.create(model="policy", messages=messages, max_tokens=3)
    raise RuntimeError("agent bug after one call")
