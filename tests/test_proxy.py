"""The OpenAI-compatible proxy: a real `openai` client over HTTP against the tiny-random policy."""

import threading

import openai
import pytest

from streamrl.engine.hf import HFEngine
from streamrl.engine.serving import BatchingEngine
from streamrl.envs.agent_trajectory import assemble
from streamrl.envs.proxy import CallRecord, ChatProxy


@pytest.fixture()
def proxy(tiny):
    model, tok = tiny
    engine = BatchingEngine(HFEngine(model, tok, seed=0))
    engine.engine.version = 3
    p = ChatProxy(engine, tok, max_tokens=12)
    yield p, tok
    p.close()
    engine.close()


def _client(p, episode):
    """A client of a new episode (opened on the proxy, as the rollout opens each one)."""
    p.open_episode(episode)
    return openai.OpenAI(base_url=p.url, api_key=episode, max_retries=0, timeout=60)


def test_calls_are_recorded_with_token_ids_logprobs_and_versions(proxy):
    p, tok = proxy
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "2+2?"}]
    r = _client(p, "ep-1").chat.completions.create(model="policy", messages=msgs, max_tokens=8, logprobs=True)
    (call,) = p.calls("ep-1")
    prompt_text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert call.prompt_ids == tok(prompt_text, add_special_tokens=False).input_ids
    assert 1 <= len(call.completion_ids) <= 8 and call.versions == [3] * len(call.completion_ids)
    assert r.choices[0].message.content == tok.decode(call.completion_ids, skip_special_tokens=True)
    assert [c.logprob for c in r.choices[0].logprobs.content] == pytest.approx(call.logprobs)
    assert all(lp <= 0 for lp in call.logprobs)
    assert r.usage.prompt_tokens == len(call.prompt_ids)
    assert r.usage.completion_tokens == len(call.completion_ids)
    assert p.calls("ep-2") == []


def test_a_multi_call_episode_trains_exactly_on_the_policy_tokens(proxy):
    p, _ = proxy
    client = _client(p, "ep-agent")
    msgs = [{"role": "user", "content": "use the tool"}]
    first = client.chat.completions.create(model="policy", messages=msgs).choices[0].message.content
    msgs += [{"role": "assistant", "content": first}, {"role": "user", "content": "tool output: 4"}]
    client.chat.completions.create(model="policy", messages=msgs)
    calls = p.pop_episode("ep-agent")
    assert len(calls) == 2 and p.calls("ep-agent") == []
    trajs = assemble(calls, "p0", "g0", 0, reward=1.0, correct=True)
    # whichever way the history was re-rendered, the policy tokens are exactly the calls' completions
    policy = [t for tr in trajs for t, m in zip(tr.completion_ids, tr.loss_mask) if m]
    assert policy == calls[0].completion_ids + calls[1].completion_ids
    assert all(tr.reward == 1.0 for tr in trajs)


def test_concurrent_agents_get_their_own_episodes(proxy):
    p, _ = proxy
    errors = []

    def agent(i):
        try:
            _client(p, f"ep-{i}").chat.completions.create(
                model="policy", messages=[{"role": "user", "content": f"task {i}"}]
            )
        except Exception as e:  # surfaced below
            errors.append(e)

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors
    assert [len(p.calls(f"ep-{i}")) for i in range(4)] == [1, 1, 1, 1]
    assert 1 <= p.engine.batches <= 4


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ({"functions": [{"name": "f"}]}, "'functions' is the legacy function API: send 'tools'"),
        ({"n": 17}, "'n' must be between 1 and 16, got 17"),
        ({"top_p": 0}, "need max_tokens > 0, temperature >= 0 and 0 < top_p <= 1"),
        ({"stop": ["a", "b", "c", "d", "e"]}, "'stop' takes at most 4 sequences, got 5"),
        ({"tool_choice": "required"}, "'tool_choice' needs 'tools'"),
        ({"tools": [{"type": "function"}]}, "'tools' must be a list of {type: function"),
        ({"response_format": {"type": "json_object"}}, "'response_format' is not supported by this proxy"),
        ({"logit_bias": {"5": 10}}, "'logit_bias' is not supported by this proxy"),
        ({"presence_penalty": 0.5}, "'presence_penalty' is not supported by this proxy"),
        ({"frequency_penalty": -1.0}, "'frequency_penalty' is not supported by this proxy"),
        ({"logprobs": True, "top_logprobs": 3}, "'top_logprobs' is not supported by this proxy"),
        ({"max_completion_tokens": 0}, "need max_tokens > 0"),
        ({"n": 0}, "'n' must be between 1 and 16, got 0"),
    ],
)
def test_invalid_requests_are_refused_with_the_field_named(proxy, extra, fragment):
    p, _ = proxy
    with pytest.raises(openai.BadRequestError) as err:
        _client(p, "bad").chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}], **extra
        )
    assert err.value.body["message"] == fragment or err.value.body["message"].startswith(fragment)
    assert p.calls("bad") == []


def test_the_defaults_of_unsupported_options_are_accepted(proxy):
    p, _ = proxy
    defaults = {"response_format": {"type": "text"}, "presence_penalty": 0, "frequency_penalty": 0.0}
    r = _client(p, "ok").chat.completions.create(
        model="policy", messages=[{"role": "user", "content": "x"}], max_tokens=2, logit_bias={}, **defaults
    )
    assert len(p.calls("ok")) == 1 and r.choices[0].finish_reason in ("stop", "length")


def _call(prompt, completion, version, text=""):
    n = len(completion)
    return CallRecord(prompt, completion, [-0.5] * n, [version] * n, "stop", text)


def test_assemble_merges_calls_that_extend_the_context_and_splits_rewritten_ones():
    calls = [
        _call([1, 2], [10, 11], 0, "a"),
        _call([1, 2, 10, 11, 7, 8], [12], 1, "b"),  # extends: obs [7, 8], then policy [12]
        _call([1, 2, 99], [13, 14], 2, "c"),  # history rewritten: a new trajectory
    ]
    first, second = assemble(calls, "p", "g", 3, reward=0.5, correct=False)
    assert first.sample_id == "g-3" and second.sample_id == "g-3.1"
    assert first.prompt_ids == [1, 2] and first.completion_ids == [10, 11, 7, 8, 12]
    assert first.loss_mask == [1, 1, 0, 0, 1]
    assert first.behaviour_logprobs == [-0.5, -0.5, 0.0, 0.0, -0.5]
    assert first.versions == [0, 0, 0, 0, 1]  # observation tokens take the version before them
    assert first.text == "ab"
    assert second.prompt_ids == [1, 2, 99] and second.loss_mask == [1, 1] and second.versions == [2, 2]
    assert first.reward == second.reward == 0.5
    # loss.mask_truncated: the tokens of a call cut at its token limit are not trained on
    cut = [
        _call([1, 2], [10, 11], 0),
        CallRecord([1, 2, 10, 11, 7], [12, 13], [-0.5] * 2, [1] * 2, "length", ""),
    ]
    (kept,) = assemble(cut, "p", "g", 0, reward=1.0, correct=True)
    assert kept.loss_mask == [1, 1, 0, 1, 1]
    (masked,) = assemble(cut, "p", "g", 0, reward=1.0, correct=True, mask_truncated=True)
    assert masked.loss_mask == [1, 1, 0, 0, 0] and masked.completion_ids == [10, 11, 7, 12, 13]


def test_the_llm_judge_talks_to_streamrls_own_proxy(proxy):
    from streamrl.rewards.judge import JudgeError, LLMJudge, resolve_judge_config

    p, _ = proxy
    p.open_episode("judge-episode")
    judge = LLMJudge(resolve_judge_config(p.url, "policy", "judge-episode", retries=0, timeout_s=60))
    with pytest.raises(JudgeError, match="unparseable verdict|empty reply"):  # a random policy: no verdict
        judge.judge("2+2?", "4", "The answer is 4.")
    (call,) = p.calls("judge-episode")  # the rubric prompt reached the policy as a chat call
    assert len(call.completion_ids) >= 1


def test_a_call_continues_the_choice_the_agent_kept():
    # an n=2 call made two choices; the agent went on from the first one, not the most recent
    calls = [_call([1, 2], [10], 0, "a"), _call([1, 2], [20], 0, "b"), _call([1, 2, 10, 5], [11], 1, "c")]
    kept, other = assemble(calls, "p", "g", 0, reward=1.0, correct=True)
    assert kept.completion_ids == [10, 5, 11] and kept.loss_mask == [1, 0, 1] and kept.versions == [0, 0, 1]
    assert other.sample_id == "g-0.1" and other.completion_ids == [20]


def test_training_samples_every_call_at_the_runs_temperature_and_top_p_1(tiny):
    """The trainer scores an agent's tokens at rollout.temperature over the whole distribution: in
    training a call's own temperature and top_p would make its recorded log-probs another policy's.
    An evaluation honours them."""
    model, tok = tiny
    seen: list[tuple[float, float]] = []

    class Recording(HFEngine):
        def generate(self, requests):
            seen.extend((r.temperature, r.top_p) for r in requests)
            return super().generate(requests)

    for training in (True, False):
        engine = BatchingEngine(Recording(model, tok, seed=0))
        p = ChatProxy(engine, tok, max_tokens=4, default_temperature=0.7, training=training)
        try:
            msgs = [{"role": "user", "content": "2+2?"}]
            asked = {"temperature": 0.2, "top_p": 0.5}
            _client(p, "ep").chat.completions.create(model="policy", messages=msgs, **asked)
        finally:
            p.close()
            engine.close()
    assert seen == [(0.7, 1.0), (0.2, 0.5)]


def test_a_call_is_bounded_by_the_context_it_is_given(tiny):
    """max_context bounds a call's prompt + completion: max_tokens is cut to what is left, and a prompt
    that leaves nothing is refused as OpenAI refuses one past the context (400 context_length_exceeded)."""
    model, tok = tiny
    msgs = [{"role": "user", "content": "2+2?"}]
    prompt = len(tok(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)).input_ids)
    engine = BatchingEngine(HFEngine(model, tok, seed=0))
    try:
        for room in (3, 0):
            p = ChatProxy(engine, tok, max_tokens=12, max_context=prompt + room)
            try:
                client = _client(p, f"ep-{room}")
                if room:
                    client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
                    (call,) = p.calls(f"ep-{room}")
                    assert len(call.prompt_ids) == prompt and 1 <= len(call.completion_ids) <= room
                    continue
                with pytest.raises(openai.BadRequestError) as err:
                    client.chat.completions.create(model="policy", messages=msgs, max_tokens=8)
                assert err.value.code == "context_length_exceeded" and p.calls("ep-0") == []
                message = err.value.body["message"]
                assert message.startswith(f"this chat is {prompt} tokens; a training call's")
            finally:
                p.close()
    finally:
        engine.close()


@pytest.mark.parametrize(
    "body",
    [
        b'{"messages": [{"role": "user", "content": "x"}], "tools": ["a"]}',
        b'{"messages": [{"role": "user", "content": [{"type": "text", "text": null}]}]}',
        b"\xff\xfe not utf-8",
    ],
)
def test_a_malformed_body_is_a_400_the_client_does_not_retry(proxy, body):
    import urllib.error
    import urllib.request

    p, _ = proxy
    req = urllib.request.Request(f"{p.url}/chat/completions", body, {"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as err:
        urllib.request.urlopen(req, timeout=60)
    assert err.value.code == 400
