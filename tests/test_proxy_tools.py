"""Function calling, n, stop and stream through the proxy, with the real `openai` client and the
tiny-random tokenizer's tools-aware chat template (replies scripted, so every value is exact)."""

import json

import openai
import pytest
from scripted_chat import scripted_proxy

from streamrl.data.prompts import render_prompt_ids
from streamrl.envs.agent_trajectory import assemble
from streamrl.envs.tool_calls import parse_tool_calls, template_messages

ADD = {
    "type": "function",
    "function": {
        "name": "add",
        "description": "Add two integers",
        "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    },
}
MUL = {"type": "function", "function": {"name": "mul", "parameters": {"type": "object"}}}
CALL_TEXT = '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
MSGS = [{"role": "system", "content": "S"}, {"role": "user", "content": "2+3?"}]


def _reply(prompt: str) -> str:
    if prompt.endswith("<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"):
        return "The answer is 5."
    if "<tools>" in prompt:
        return CALL_TEXT
    return "alpha beta gamma delta"


@pytest.fixture()
def served(tiny):
    _, tok = tiny
    with scripted_proxy(tok, _reply, max_tokens=128, episodes=("ep",), version=7) as (proxy, scripted):
        client = openai.OpenAI(base_url=proxy.url, api_key="ep", max_retries=0, timeout=60)
        yield proxy, scripted, client, tok
        client.close()


def test_tools_are_rendered_by_the_template_and_calls_come_back_in_the_openai_shape(served):
    proxy, scripted, client, tok = served
    r = client.chat.completions.create(model="policy", messages=MSGS, tools=[ADD])
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"a": 2, "b": 3}
    (rec,) = proxy.calls("ep")
    assert rec.prompt_ids == render_prompt_ids(tok, MSGS, [ADD])
    assert json.dumps(ADD) in scripted.prompts[0]  # the schema reached the policy, as the template writes it
    assert rec.text == CALL_TEXT and rec.completion_ids[-1] == tok.eos_token_id

    # the agent runs the tool and calls again: the tool result is an observation in the same trajectory
    msgs = [*MSGS, choice.message.model_dump(exclude_none=True)]
    msgs.append({"role": "tool", "tool_call_id": call.id, "content": "5"})
    final = client.chat.completions.create(model="policy", messages=msgs, tools=[ADD])
    assert final.choices[0].message.content == "The answer is 5." and final.choices[0].finish_reason == "stop"
    first, second = proxy.pop_episode("ep")
    (traj,) = assemble([first, second], "p", "g", 0, reward=1.0, correct=True)
    obs = second.prompt_ids[len(first.prompt_ids) + len(first.completion_ids) :]
    assert tok.decode(obs) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"
    n1, n2 = len(first.completion_ids), len(second.completion_ids)
    assert traj.loss_mask == [1] * n1 + [0] * len(obs) + [1] * n2
    assert traj.completion_ids == first.completion_ids + obs + second.completion_ids
    assert traj.versions == [7] * (n1 + len(obs) + n2)


def test_tool_choice_none_renders_no_tools_and_a_named_choice_only_that_tool(served):
    proxy, scripted, client, tok = served
    r = client.chat.completions.create(model="policy", messages=MSGS, tools=[ADD, MUL], tool_choice="none")
    assert r.choices[0].message.tool_calls is None and "<tools>" not in scripted.prompts[-1]
    named = {"type": "function", "function": {"name": "mul"}}
    r = client.chat.completions.create(model="policy", messages=MSGS, tools=[ADD, MUL], tool_choice=named)
    assert proxy.calls("ep")[-1].prompt_ids == render_prompt_ids(tok, MSGS, [MUL])
    assert r.choices[0].message.tool_calls[0].function.name == "add"  # parsed, not enforced (on-policy)
    with pytest.raises(openai.BadRequestError, match="naming one of the tools"):
        client.chat.completions.create(
            model="policy",
            messages=MSGS,
            tools=[ADD],
            tool_choice={"type": "function", "function": {"name": "x"}},
        )


def test_tools_are_refused_when_the_chat_template_ignores_them(tiny):
    _, tok = tiny
    plain = tok.__class__.from_pretrained(tok.name_or_path)
    plain.chat_template = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\\n' }}{% endfor %}"
    with scripted_proxy(plain, _reply, max_tokens=8, episodes=("ep",)) as (proxy, _):
        client = openai.OpenAI(base_url=proxy.url, api_key="ep", max_retries=0, timeout=60)
        try:
            with pytest.raises(openai.BadRequestError, match="this model's chat template ignores tools"):
                client.chat.completions.create(model="policy", messages=MSGS, tools=[ADD])
            assert proxy.calls("ep") == []
        finally:
            client.close()


def test_n_choices_are_sampled_and_recorded_separately(served):
    proxy, scripted, client, _ = served
    r = client.chat.completions.create(model="policy", messages=MSGS, n=3)
    assert [c.index for c in r.choices] == [0, 1, 2]
    assert {c.message.content for c in r.choices} == {"alpha beta gamma delta"}
    calls = proxy.pop_episode("ep")
    assert len(calls) == 3 and len(scripted.prompts) == 3
    assert r.usage.completion_tokens == sum(len(c.completion_ids) for c in calls)
    assert [t.sample_id for t in assemble(calls, "p", "g", 4, 0.0, False)] == ["g-4", "g-4.1", "g-4.2"]


def test_stop_cuts_the_reply_and_the_recorded_tokens(served):
    proxy, _, client, tok = served
    r = client.chat.completions.create(model="policy", messages=MSGS, stop=[" gamma", "zzz"], logprobs=True)
    assert r.choices[0].message.content == "alpha beta" and r.choices[0].finish_reason == "stop"
    (rec,) = proxy.calls("ep")
    # byte tokens up to the one completing " gamma"; the tokens sampled after it are dropped
    assert tok.decode(rec.completion_ids) == "alpha beta gamma"
    assert len(rec.logprobs) == len(rec.versions) == 16 and rec.finish_reason == "stop"
    assert len(r.choices[0].logprobs.content) == 16 and r.usage.completion_tokens == 16


def test_stream_sends_the_reply_as_chunks(served):
    proxy, _, client, _ = served
    chunks = list(
        client.chat.completions.create(
            model="policy", messages=MSGS, stream=True, stream_options={"include_usage": True}
        )
    )
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert content == "alpha beta gamma delta"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "stop"
    (rec,) = proxy.calls("ep")
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(rec.completion_ids) == 23
    # a tool call streams as a tool_calls delta
    tool_chunks = list(
        client.chat.completions.create(model="policy", messages=MSGS, tools=[ADD], stream=True)
    )
    deltas = [d for c in tool_chunks for d in c.choices[0].delta.tool_calls or []]
    assert [(d.function.name, json.loads(d.function.arguments)) for d in deltas] == [
        ("add", {"a": 2, "b": 3})
    ]
    assert tool_chunks[-1].choices[0].finish_reason == "tool_calls"


@pytest.mark.parametrize(
    "text, content, calls",
    [
        ("plain", "plain", []),
        (
            'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>',
            "Let me add.",
            [("add", '{"a": 1}')],
        ),
        (
            '<tool_call>{"name": "f", "parameters": {"x": 1}}</tool_call>'
            '<tool_call>{"name": "g"}</tool_call>',
            None,
            [("f", '{"x": 1}'), ("g", "{}")],
        ),
        ("<tool_call>\n{not json}\n</tool_call>", "<tool_call>\n{not json}\n</tool_call>", []),
        ('<tool_call>\n{"arguments": {}}\n</tool_call>', '<tool_call>\n{"arguments": {}}\n</tool_call>', []),
        ('<tool_call>\n{"name": "add", "argu', '<tool_call>\n{"name": "add", "argu', []),  # cut by max_tokens
        (  # one malformed call makes the whole reply plain content, the valid calls too
            '<tool_call>{"name": "f"}</tool_call><tool_call>{bad}</tool_call>',
            '<tool_call>{"name": "f"}</tool_call><tool_call>{bad}</tool_call>',
            [],
        ),
    ],
)
def test_hermes_tool_calls_are_parsed_and_anything_else_stays_content(text, content, calls):
    got_content, got_calls = parse_tool_calls(text)
    assert got_content == content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in got_calls] == calls


def test_tool_call_arguments_reach_the_template_as_objects():
    """An assistant turn's tool-call arguments arrive as a JSON string (the OpenAI shape); templates
    serialise them themselves, so they get the object, and a string that is not JSON as it is."""

    def call(args: str) -> dict:
        return {"id": "c1", "type": "function", "function": {"name": "add", "arguments": args}}

    msgs = [
        {"role": "user", "content": "2+3?"},
        {"role": "assistant", "content": None, "tool_calls": [call('{"a": 2}')]},
    ]
    out = template_messages(msgs)
    assert out[1] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "function": {"name": "add", "arguments": {"a": 2}}, "id": "c1"}],
    }
    raw = template_messages([{"role": "assistant", "content": "", "tool_calls": [call("a=2")]}])
    assert raw[0]["tool_calls"][0]["function"]["arguments"] == "a=2"
