"""Which episodes the proxy serves: only those the rollout opened and has not popped. A call naming any
other is refused with a 401 naming it, before the engine, and leaves nothing behind."""

import dataclasses
import threading
import urllib.error
import urllib.request

import openai
import pytest
from scripted_chat import ScriptedEngine, scripted_proxy

from streamrl.config import load_config
from streamrl.rollout import agent_worker
from streamrl.rollout.agent import TIMEOUT_ERROR, AgentRun, rollout_agent_episodes
from streamrl.rollout.score import Scoring
from streamrl.rollout.trajectory import RolloutSettings
from streamrl.rollout.worker import GroupRequest
from streamrl.tasks import make_task

MSGS = [{"role": "user", "content": "2+2?"}]
FORMAT = ("", "", "answer_is")  # make_task's system prompt, instruction and answer extraction
SETTINGS = RolloutSettings(
    samples=1,
    max_new_tokens=16,
    temperature=1.0,
    top_p=1.0,
    max_batch=4,
    greedy_baseline=False,
    mask_truncated=False,
    format_weight=0.0,
)


@pytest.fixture()
def served(tiny):
    with scripted_proxy(tiny[1], lambda prompt: "The answer is 4.", max_tokens=16) as served:
        yield served


def _create(proxy, api_key, **kw):
    client = openai.OpenAI(base_url=proxy.url, api_key=api_key, max_retries=0, timeout=60)
    try:
        return client.chat.completions.create(model="policy", messages=MSGS, **kw)
    finally:
        client.close()


def _post(proxy, headers):
    """A call without the openai client (which always sends an API key): -> (status, body)."""
    body = b'{"messages": [{"role": "user", "content": "2+2?"}]}'
    req = urllib.request.Request(f"{proxy.url}/chat/completions", body, {"Content-Type": "application/json"})
    for name, value in headers.items():
        req.add_header(name, value)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_a_call_of_an_episode_never_opened_is_refused_and_leaves_nothing(served):
    proxy, scripted = served
    proxy.open_episode("g3-0")
    with pytest.raises(openai.AuthenticationError) as err:
        _create(proxy, "g3-O")  # a typo
    assert err.value.status_code == 401 and err.value.code == "invalid_api_key"
    assert "no open episode 'g3-O'" in err.value.message
    assert "must be the name of an episode the rollout started and has not ended" in err.value.message
    # the episode header names it the same way; no name at all is refused too
    code, text = _post(proxy, {"X-Episode-Id": "made-up"})
    assert code == 401 and "no open episode 'made-up'" in text
    code, text = _post(proxy, {})
    assert code == 401 and "no open episode ''" in text
    assert scripted.prompts == []  # refused before the engine
    assert set(proxy._episodes) == {"g3-0"}  # nothing kept for the unknown names
    # the open episode is served and recorded as before, also through the header
    _create(proxy, "g3-0")
    assert _post(proxy, {"X-Episode-Id": "g3-0"})[0] == 200
    assert [c.text for c in proxy.pop_episode("g3-0")] == ["The answer is 4."] * 2


def test_a_call_after_its_episode_was_popped_is_refused_and_the_others_go_on(served):
    proxy, scripted = served
    for name in ("g1-0", "g1-1"):
        proxy.open_episode(name)
    _create(proxy, "g1-0")
    assert len(proxy.pop_episode("g1-0")) == 1  # its agent returned: the episode is over
    with pytest.raises(openai.AuthenticationError) as err:
        _create(proxy, "g1-0")  # a thread the agent left behind calls again
    assert "no open episode 'g1-0'" in err.value.message
    assert proxy.calls("g1-0") == [] and "g1-0" not in proxy._episodes and len(scripted.prompts) == 1
    _create(proxy, "g1-1")  # the group's other episode is not disturbed
    assert len(proxy.pop_episode("g1-1")) == 1 and proxy._episodes == {}


def test_an_episode_name_is_opened_once(served):
    proxy, _ = served
    proxy.open_episode("g2-0")
    with pytest.raises(ValueError, match="'g2-0' is empty, open or ended"):
        proxy.open_episode("g2-0")
    proxy.pop_episode("g2-0", refuse_later=True)  # ended by its time limit: its agent still runs
    with pytest.raises(ValueError, match="'g2-0' is empty, open or ended"):
        proxy.open_episode("g2-0")
    with pytest.raises(ValueError):
        proxy.open_episode("")


def invents_a_name(client, messages):
    """One call as itself, then one under a name of its own making."""
    client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
    client.with_options(api_key="my-own-episode").chat.completions.create(
        model="policy", messages=messages, max_tokens=4
    )
    return "The answer is 4."


def test_an_agent_calling_under_another_name_fails_its_episode_and_records_only_its_own_calls(tiny):
    _, tok = tiny
    task = make_task("agent:test_proxy_episodes:invents_a_name", {"base": "rg:chain_sum"}, *FORMAT)
    problem = next(task.train_stream(0, set()))
    engine = ScriptedEngine(tok, lambda prompt: "The answer is 4.")
    (ep,) = rollout_agent_episodes(engine, tok, task, SETTINGS, [(problem, "g0", 0)])
    assert ep.error == "AuthenticationError" and ep.reward == 0.0
    (traj,) = ep.trajectories
    assert traj.reward_info["calls"] == 1
    assert "no open episode 'my-own-episode'" in traj.reward_info["agent_error"]
    assert len(engine.prompts) == 1  # the call under the invented name never reached the engine


_LOCK = threading.Lock()
KEYS: list[str] = []  # the API keys hang_one's agents were given, in the order they started
HUNG: list[tuple[str, threading.Thread]] = []  # those that hang, with their threads
HANG = {"left": 0}  # how many more agents hang after their call
HOLD = threading.Event()  # what the hanging agents wait for


def hang_one(client, messages):
    """One call; then the first HANG["left"] agents hang in their own code until HOLD is set."""
    with _LOCK:
        KEYS.append(client.api_key)
    reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=8)
    with _LOCK:
        hang, HANG["left"] = HANG["left"] > 0, max(0, HANG["left"] - 1)
        if hang:
            HUNG.append((client.api_key, threading.current_thread()))
    if hang:
        HOLD.wait(60)
        return "The answer is 99."  # an answer no call of a later run gives: told apart by its score
    return reply.choices[0].message.content


def _pump(agents, engine, until, hold=None):
    """The worker loop's part: answer the agents' calls (or keep them in `hold`, unanswered) and collect
    the finished groups, until `until(finished)`."""
    out = []
    for _ in range(6000):
        for gen in agents.requests():
            if hold is not None:
                hold.append(gen)
            else:
                agents.resolve(engine._one(gen))
        out += agents.finished()
        if until(out):
            return out
        threading.Event().wait(0.01)
    raise AssertionError("the agents never got there")


def test_a_group_run_again_by_its_worker_does_not_take_the_earlier_runs_calls_or_returns(tiny, monkeypatch):
    """A group sent again to the worker that had just returned it (loop/stall.py) runs again there, on the
    same proxy. Its episodes get new names: a late call of the first run's agents is refused, not
    recorded into the second run, and what a first-run agent ended by its time limit returns later is
    not taken as the second run's episode."""
    _, tok = tiny
    ended: set[str] = set()  # episodes the (stubbed) time limit ends: no wall clock

    def overdue(proxy, name, *_):
        return AgentRun("", TIMEOUT_ERROR, "ended by the test") if name in ended else None

    monkeypatch.setattr(agent_worker, "overdue", overdue)
    task = make_task("agent:test_proxy_episodes:hang_one", {"base": "rg:chain_sum"}, *FORMAT)
    problem = next(task.train_stream(0, set()))
    engine = ScriptedEngine(tok, lambda prompt: "The answer is 4.")
    scoring = Scoring(load_config(None, []), task)
    agents = agent_worker.AgentGroups(task, tok, dataclasses.replace(SETTINGS, samples=2), scoring)
    req = GroupRequest("g7", problem, [], 2, 0)
    KEYS.clear(), HUNG.clear(), HOLD.clear()
    HANG["left"] = 1
    try:  # first run: one agent returns, the other hangs after its call and is ended by the time limit
        agents.start(req)
        _pump(agents, engine, lambda out: len(HUNG) == 1)
        ((hung, thread),) = HUNG
        ended.add(hung)
        ((_, first),) = _pump(agents, engine, lambda out: out)
        assert sorted(first.episode_errors) == ["", TIMEOUT_ERROR] and len(first.trajectories) == 2
        first_keys = KEYS[:2]
        (returned,) = set(first_keys) - {hung}
        # the copy: a second run, whose calls are held in the decoder meanwhile
        held = []
        agents.start(req)
        _pump(agents, engine, lambda out: len(held) == 2, hold=held)
        assert set(KEYS[2:]).isdisjoint(first_keys)  # names of its own
        with pytest.raises(openai.AuthenticationError):  # a thread the returned agent left behind
            _create(agents.proxy, returned)
        assert agents.requests() == []  # never reached the decoder
        HOLD.set()  # the hung first-run agent returns now: dropped, not taken as the second run's
        thread.join(60)
        assert not thread.is_alive() and agents.finished() == []
        for gen in held:
            agents.resolve(engine._one(gen))
        ((_, second),) = _pump(agents, engine, lambda out: out)
        assert second.episode_errors == ["", ""]
        assert [t.reward_info["calls"] for t in second.trajectories] == [1, 1]  # each its own call
        assert "99" not in [t.reward_info["extracted"] for t in second.trajectories]  # its own answers
        assert agents.open == {} and agents.proxy._episodes == {}
    finally:
        HOLD.set()
        agents.close()
        scoring.close()
