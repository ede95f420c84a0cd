"""Multi-turn episodes are token-in-token-out: exact layout, masks, log-probs, versions and limits."""

import copy

import pytest
import torch

from streamrl.engine.base import GenResult
from streamrl.engine.hf import HFEngine
from streamrl.envs.base import EnvStep
from streamrl.envs.episode import Episode, EpisodeLimits, run_episodes
from streamrl.envs.render import TurnRenderer

SMOLLM2_TEMPLATE = (  # SmolLM2-Instruct's chat template
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)
LLAMA3_STYLE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n'"
    " + m['content'] + '<|eot_id|>' }}{% endfor %}{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)
LAST_ONLY = "{{ messages[-1]['content'] }}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"


class ScriptedEnv:
    """Observation 'obs<i>' for the first `turns - 1` steps, then done with reward 1."""

    def __init__(self, turns=99):
        self.turns, self.seen = turns, []

    def reset(self, problem):
        self.seen = []

    def step(self, text):
        self.seen.append(text)
        if len(self.seen) >= self.turns:
            return EnvStep("", 1.0, True, {"correct": True, "formatted": True})
        return EnvStep(f"obs{len(self.seen)}", 0.0, False, {})


class ScriptedEngine:
    """Answers each request with the next scripted turn: (token ids, finish_reason, version)."""

    def __init__(self, turns):
        self.turns, self.requests = list(turns), []

    def generate(self, requests):
        out = []
        for r in requests:
            self.requests.append(r)
            ids, reason, v = self.turns.pop(0)
            ids = ids[: r.max_new_tokens]
            lps = [-0.5 - i for i in range(len(ids))]
            out.append(GenResult(r, list(ids), lps, [v] * len(ids), reason))
        return out


@pytest.fixture(scope="module")
def tok(tiny):
    return tiny[1]


def _text(tok, ids):
    return tok.decode(ids, skip_special_tokens=False)


def test_bridge_on_tiny_chatml(tok):
    r = TurnRenderer(tok)
    assert r.bridge_text("OBS", "<|im_end|>") == "\n<|im_start|>user\nOBS<|im_end|>\n<|im_start|>assistant\n"
    # a turn cut by the token cap is closed by the bridge (untrained), so the context stays well formed
    assert (
        r.bridge_text("OBS", None) == "<|im_end|>\n<|im_start|>user\nOBS<|im_end|>\n<|im_start|>assistant\n"
    )
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    assert r.bridge_ids("OBS", im_end)[:2] == tok("\n<|im_start|>", add_special_tokens=False).input_ids


def test_bridge_on_real_templates(tok):
    smol = copy.deepcopy(tok)
    smol.chat_template = SMOLLM2_TEMPLATE
    want = "\n<|im_start|>tool\nout: 5<|im_end|>\n<|im_start|>assistant\n"
    assert TurnRenderer(smol, role="tool").bridge_text("out: 5", "<|im_end|>") == want
    llama = copy.deepcopy(tok)
    llama.chat_template = LLAMA3_STYLE
    assert TurnRenderer(llama).bridge_text("R", "<|eot_id|>") == (
        "<|start_header_id|>user<|end_header_id|>\n\nR<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
    )
    bad = copy.deepcopy(tok)
    bad.chat_template = LAST_ONLY
    with pytest.raises(ValueError, match="chat template"):
        TurnRenderer(bad)


REWRITES_SYSTEM = (  # ChatML, but the system turn changes once a conversation has four messages
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if loop.first and messages|length > 3 %} (long){% endif %}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_rewrites_earlier_turns_is_refused_when_an_observation_comes(tok):
    rewrites = copy.deepcopy(tok)
    rewrites.chat_template = REWRITES_SYSTEM
    r = TurnRenderer(rewrites)  # an assistant turn still extends the generation prompt
    with pytest.raises(ValueError, match="rewrites earlier turns when a message is added"):
        r.bridge_text("OBS", "<|im_end|>")


class AddsBos:
    """A tokenizer that puts a BOS id before any text unless told not to (as Llama's do)."""

    BOS = 3

    def __init__(self, tok) -> None:
        self.tok = tok

    def __getattr__(self, name: str):
        return getattr(self.tok, name)

    def __call__(self, text: str, add_special_tokens: bool = True):
        ids = self.tok(text, add_special_tokens=False).input_ids
        return type("Encoded", (), {"input_ids": [self.BOS] * add_special_tokens + list(ids)})()


def test_the_bridge_is_tokenised_without_special_tokens(tok):
    r = TurnRenderer(AddsBos(tok))
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    text = r.bridge_text("OBS", "<|im_end|>")
    assert r.bridge_ids("OBS", im_end) == list(tok(text, add_special_tokens=False).input_ids)


def test_episode_layout_masks_logprobs_versions(tok):
    r = TurnRenderer(tok)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    t1, t2, t3 = [65, 66, eot], [67, 68, 69, eot], [70, eot]
    engine = ScriptedEngine([(t1, "stop", 3), (t2, "stop", 4), (t3, "stop", 5)])
    ep = Episode(ScriptedEnv(turns=3), r, [10, 11], EpisodeLimits(5, 1000, 16), tag="a")
    run_episodes(engine, [ep])
    o1, o2 = r.bridge_ids("obs1", eot), r.bridge_ids("obs2", eot)
    assert ep.completion_ids == t1 + o1 + t2 + o2 + t3
    assert ep.loss_mask == [1] * 3 + [0] * len(o1) + [1] * 4 + [0] * len(o2) + [1] * 2
    lp = lambda n: [-0.5 - i for i in range(n)]  # noqa: E731 (the scripted engine's log-probs)
    assert ep.logprobs == lp(3) + [0.0] * len(o1) + lp(4) + [0.0] * len(o2) + lp(2)
    # observation tokens carry the version of the model token before them
    assert ep.versions == [3] * 3 + [3] * len(o1) + [4] * 4 + [4] * len(o2) + [5] * 2
    assert (ep.finish_reason, ep.turns, ep.reward, ep.info["correct"]) == ("stop", 3, 1.0, True)
    # each turn's request is the whole context so far, never re-tokenised
    assert [q.prompt_ids for q in engine.requests] == [
        [10, 11],
        [10, 11] + t1 + o1,
        [10, 11] + t1 + o1 + t2 + o2,
    ]
    assert all(q.tag == "a" for q in engine.requests)
    assert _text(tok, ep.completion_ids).count("<|im_start|>assistant\n") == 2


def test_max_turns_cuts_with_length_and_no_trailing_observation(tok):
    r = TurnRenderer(tok)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    engine = ScriptedEngine([([65, eot], "stop", 0), ([66, eot], "stop", 0)])
    ep = Episode(ScriptedEnv(), r, [10], EpisodeLimits(2, 1000, 16))
    run_episodes(engine, [ep])
    o1 = r.bridge_ids("obs1", eot)
    assert (ep.finish_reason, ep.turns, ep.reward) == ("length", 2, 0.0)
    assert ep.completion_ids == [65, eot] + o1 + [66, eot]
    assert len(engine.requests) == 2


def test_token_budget_caps_turns_and_cuts_with_length(tok):
    r = TurnRenderer(tok)
    o1 = r.bridge_ids("obs1", None)  # turn 1 is cut by the per-turn cap: no end-of-turn token
    budget = 4 + len(o1) + 3
    engine = ScriptedEngine([([65] * 9, "length", 1), ([66] * 9, "length", 2)])
    ep = Episode(ScriptedEnv(), r, [10], EpisodeLimits(10, budget, 4))
    run_episodes(engine, [ep])
    assert [q.max_new_tokens for q in engine.requests] == [4, 3]  # min(per-turn cap, tokens left)
    assert ep.completion_ids == [65] * 4 + o1 + [66] * 3
    assert _text(tok, o1).startswith("<|im_end|>\n<|im_start|>user\nobs1")
    assert ep.loss_mask == [1] * 4 + [0] * len(o1) + [1] * 3
    assert ep.versions == [1] * (4 + len(o1)) + [2] * 3
    assert (ep.finish_reason, len(ep.completion_ids)) == ("length", budget)


def test_observation_that_leaves_no_room_is_dropped(tok):
    r = TurnRenderer(tok)
    eot = tok.convert_tokens_to_ids("<|im_end|>")
    o1 = r.bridge_ids("obs1", eot)
    engine = ScriptedEngine([([65, eot], "stop", 0)])
    ep = Episode(ScriptedEnv(), r, [10], EpisodeLimits(10, 2 + len(o1), 8))
    run_episodes(engine, [ep])
    assert (ep.finish_reason, ep.completion_ids, ep.loss_mask) == ("length", [65, eot], [1, 1])
    with pytest.raises(RuntimeError, match="finished"):
        ep.request()


def test_abort_ends_the_episode(tok):
    ep = Episode(ScriptedEnv(), TurnRenderer(tok), [10], EpisodeLimits(4, 100, 8))
    assert ep.advance(GenResult(ep.request(), [], [], [], "abort")) is None
    assert (ep.finish_reason, ep.completion_ids) == ("abort", [])


def test_tiny_random_episodes_match_a_teacher_forced_forward(tiny):
    """With the real engine: behaviour log-probs on model tokens equal a full forward over the final
    sequence, so the context each turn was generated from is exactly the trajectory's tokens."""
    model, tok = tiny
    engine = HFEngine(model, tok, max_batch=4, seed=1)
    engine.update_weights(None, version=7)
    r = TurnRenderer(tok)
    prompt = tok(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    ).input_ids
    eps = [Episode(ScriptedEnv(turns=3), r, list(prompt), EpisodeLimits(3, 400, 6), tag=i) for i in range(3)]
    run_episodes(engine, eps)
    for ep in eps:
        assert ep.finish_reason == "stop" and ep.turns == 3
        mask = torch.tensor(ep.loss_mask, dtype=torch.bool)
        assert (
            int(mask.sum()) <= 18 and ep.completion_ids.count(tok.convert_tokens_to_ids("<|im_start|>")) == 4
        )
        lp = torch.tensor(ep.logprobs)
        assert (lp[~mask] == 0).all() and (lp[mask] < 0).all()
        assert set(ep.versions) == {7}
        ids = torch.tensor([ep.prompt_ids + ep.completion_ids])
        with torch.no_grad():
            logits = model(ids).logits[0, len(prompt) - 1 : -1].float()
        ref = torch.log_softmax(logits, -1).gather(-1, ids[0, len(prompt) :, None]).squeeze(-1)
        torch.testing.assert_close(ref[mask], lp[mask], atol=2e-4, rtol=0)


def test_a_stop_ends_the_episodes_at_the_engines_next_decode_step(tiny):
    from streamrl.types import EvalStopped

    model, tok = tiny
    r = TurnRenderer(tok)
    prompt = tok(
        "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False
    ).input_ids
    eps = [Episode(ScriptedEnv(turns=3), r, list(prompt), EpisodeLimits(3, 400, 6), tag=i) for i in range(3)]
    asked: list[int] = []
    with pytest.raises(EvalStopped, match="stopped with 0 of 3 episodes over"):
        run_episodes(
            HFEngine(model, tok, max_batch=4, seed=1), eps, stop=lambda: asked.append(1) or len(asked) > 2
        )
    assert len(asked) == 3  # two decode steps of the first turn, then the stop
    assert not any(ep.done for ep in eps)
