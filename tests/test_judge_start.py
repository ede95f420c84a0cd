"""reward.scorer=judge: the judge checked before any work (reachable, serving the model, grading a probe),
and reward.step_budget_s cutting off the scores of a judge that hangs (counted as timeouts, reason
"step_budget"), in the colocated loop's scoring and in a rollout worker. Judges are real HTTP servers on
localhost (tests/openai_stub.py)."""

from __future__ import annotations

import json
import logging
import socket
import threading
from pathlib import Path

import pytest
from openai_stub import StubServer
from scripted_worker import one_group_in_a_thread
from tiny_args import TINY
from trajectories import make_traj

from streamrl.config import load_config
from streamrl.loop.step_metrics import step_record
from streamrl.rewards.judge import JudgeConfig
from streamrl.rewards.judge_check import check_judge
from streamrl.types import Group, Problem

MODEL = "judge-m"
HELD = 600.0  # a reply held this long: the server releases it when it closes, after the test


@pytest.fixture
def serve():
    servers: list[StubServer] = []

    def start(*replies: tuple[int, str, float], models: list[str] | None = None) -> StubServer:
        servers.append(StubServer(list(replies), models))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _check(url: str, model: str = MODEL, timeout_s: float = 5.0) -> None:
    check_judge(JudgeConfig(base_url=url, model=model, timeout_s=timeout_s))


# ---- the start-up check -----------------------------------------------------------------------------


def test_a_healthy_judge_passes_with_one_probe(serve) -> None:
    server = serve((200, "Both say 5.\nVERDICT: 1", 0), models=["other", MODEL])
    _check(server.base_url)
    (probe,) = server.requests  # the listing is a GET; one grading request follows
    assert probe["body"]["model"] == MODEL and "What is 2 + 3?" in probe["body"]["messages"][1]["content"]


def test_unreachable_judge() -> None:
    with socket.socket() as s:  # bound, not listening: connect is refused
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}/v1"
        with pytest.raises(ValueError) as e:
            _check(url)
    assert str(e.value) == (
        f"the judge at reward.judge_url={url} is not reachable ([Errno 111] Connection refused)"
    )


def test_a_judge_urls_credentials_stay_out_of_the_start_up_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrl.rewards import judge_check
    from streamrl.rewards.judge import LLMJudge

    with pytest.raises(ValueError) as e:  # refused before any request: urllib would send none of them
        _check("http://user:ab/cd@127.0.0.1/v1")
    assert str(e.value) == (
        "judge base_url carries credentials (user:...@): remove them and set STREAMRL_JUDGE_API_KEY"
    )

    def timed_out(self: LLMJudge, body: bytes) -> dict:
        raise TimeoutError("timed out")

    with pytest.raises(ValueError) as e:  # an '@' past the host: a path's, or a password's
        _check("https://judge.example/v1/user@secret")
    assert str(e.value) == (
        "judge base_url holds an '@' after its host: write an '@' of its path or query as %40, or remove the "
        "credentials (user:...@) and set STREAMRL_JUDGE_API_KEY"
    )
    monkeypatch.setattr(judge_check, "_served_models", lambda c, where: [MODEL])
    monkeypatch.setattr(LLMJudge, "_post", timed_out)
    with pytest.raises(ValueError) as e:  # a URL taken is shown whole: it holds no credentials
        _check("https://judge.example/v1/user%40x")
    assert str(e.value) == (
        f"the probe grading request to reward.judge_model={MODEL} at reward.judge_url="
        "https://judge.example/v1/user%40x failed: timeout: "
        "https://judge.example/v1/user%40x/chat/completions failed after 1 attempts: no reply within 5s "
        "(timed out)"
    )
    monkeypatch.setattr(judge_check, "_served_models", lambda c, where: ["other"])
    with pytest.raises(ValueError) as e:
        _check("https://judge.example/v1/user%40x")
    assert str(e.value) == (
        f"reward.judge_model={MODEL} is not served by the judge at reward.judge_url="
        "https://judge.example/v1/user%40x (it serves: other); set reward.judge_model to one of them"
    )


def test_model_not_served(serve) -> None:
    server = serve((200, "VERDICT: 1", 0), models=["llama-3", "qwen-2"])
    with pytest.raises(ValueError) as e:
        _check(server.base_url)
    assert str(e.value) == (
        f"reward.judge_model={MODEL} is not served by the judge at reward.judge_url={server.base_url} "
        "(it serves: llama-3, qwen-2); set reward.judge_model to one of them"
    )
    assert server.count == 0  # no grading request was sent


def test_without_a_model_listing_the_probe_decides(serve) -> None:
    server = serve((404, '{"error": "model judge-m not found"}', 0), models=None)
    with pytest.raises(ValueError) as e:
        _check(server.base_url)
    assert str(e.value) == (
        f"the probe grading request to reward.judge_model={MODEL} at reward.judge_url={server.base_url} "
        f'failed: http 404: {{"error": "model judge-m not found"}}'
    )


def test_a_judge_url_without_v1_gets_the_fix(serve, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's root instead of its /v1: neither the listing nor the chat endpoint is there. A URL
    whose listing answered is the server's base: its 404 is the probe's own (an unknown model, say)."""
    from streamrl.rewards import judge_check

    server = serve((200, "VERDICT: 1", 0), models=[MODEL])
    root = server.base_url.removesuffix("/v1")
    for given, fixed in ((root, root + "/v1"), (root + "/", root + "/v1"), (root + "?x=1", root + "/v1?x=1")):
        with pytest.raises(ValueError) as e:
            _check(given)
        assert str(e.value) == (
            f"the probe grading request to reward.judge_model={MODEL} at reward.judge_url={given} "
            f"failed: http 404: not found; OpenAI-compatible servers answer under /v1: try "
            f"reward.judge_url={fixed}"
        )
    _check(root + "/v1")  # the fix works
    assert server.requests[-1]["path"] == "/v1/chat/completions"
    with pytest.raises(ValueError) as e:  # a version of its own: /v1 is not the fix
        _check(root + "/V1beta/openai")
    assert str(e.value).endswith(f"reward.judge_url={root}/V1beta/openai failed: http 404: not found")
    monkeypatch.setattr(judge_check, "_served_models", lambda c, where: [MODEL])
    with pytest.raises(ValueError) as e:
        _check(root)
    assert str(e.value).endswith(f"reward.judge_url={root} failed: http 404: not found")


def test_probe_without_a_verdict(serve) -> None:
    server = serve((200, "Looks right to me.", 0), models=[MODEL])
    with pytest.raises(ValueError) as e:
        _check(server.base_url)
    assert str(e.value) == (
        f"the probe grading request to reward.judge_model={MODEL} at reward.judge_url={server.base_url} "
        "failed: unparseable verdict: no 'VERDICT: <score>' line in reply ending 'Looks right to me.'"
    )


def test_hanging_judge_fails_the_probe_once(serve) -> None:
    server = serve((200, "VERDICT: 1", HELD), models=[MODEL])
    with pytest.raises(ValueError) as e:
        _check(server.base_url, timeout_s=0.3)
    msg = str(e.value)
    assert msg.startswith(
        f"the probe grading request to reward.judge_model={MODEL} at reward.judge_url={server.base_url} "
        f"failed: timeout: {server.base_url}/chat/completions failed after 1 attempts: no reply within 0.3s"
    )
    assert server.count == 1  # no retries at start-up


def test_train_stops_before_anything_is_written(serve, tmp_path: Path, capsys) -> None:
    from streamrl.cli import main

    server = serve((200, "VERDICT: 1", 0), models=["someone-else"])
    run = tmp_path / "run"
    keys = [
        f"reward.judge_url={server.base_url}",
        f"reward.judge_model={MODEL}",
        f"run_dir={run}",
        "max_steps=1",
    ]
    assert main(["train", *TINY, "reward.scorer=judge", *keys]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        f"streamrl: error: reward.judge_model={MODEL} is not served by the judge at "
        f"reward.judge_url={server.base_url} (it serves: someone-else); set reward.judge_model to one of them"
    )
    assert not run.exists()


# ---- reward.step_budget_s ---------------------------------------------------------------------------


def _judge_keys(server: StubServer, budget: float) -> list[str]:
    return [
        "reward.scorer=judge",
        f"reward.judge_url={server.base_url}",
        f"reward.judge_model={MODEL}",
        "reward.judge_timeout_s=15",
        "reward.timeout_s=60",
        f"reward.step_budget_s={budget}",
        "reward.format_weight=0",
        "rollout.max_new_tokens=8",
    ]


def test_scores_past_the_step_budget_count_as_timeouts(serve, caplog) -> None:
    from streamrl.rollout.score import Scoring

    server = serve((200, "VERDICT: 1", HELD))  # a judge that never answers in time
    scoring = Scoring(load_config(None, _judge_keys(server, 0.5)))
    problem = Problem("p", [], "5", {"question": "2 + 3?"})
    trajs = [make_traj(i, [1], [2, 3]) for i in range(4)]
    for i, t in enumerate(trajs):
        t.text = f"answer {i}"
    caplog.set_level(logging.DEBUG, logger="streamrl.rollout.score")
    try:
        scoring.begin_step()
        scoring.score([(problem, t) for t in trajs])
        assert scoring.budget_left == 0.0  # the step's rounds share one budget: nothing left
        again = [make_traj(9, [1], [2, 3])]
        again[0].text = "answer 9"
        scoring.score([(problem, again[0])])  # a second round of the step: cut off at once
        scoring.begin_step()
        assert scoring.budget_left == 0.5  # a new step, a new budget
    finally:
        scoring.close()
    assert [t.reward for t in trajs] == [0.0] * 4 and not any(t.correct for t in trajs)
    assert [t.reward_info["reward_error"] for t in trajs + again] == ["step_budget"] * 5
    rec = step_record(1, [Group(problem, trajs)], {}, 0)
    assert (rec["reward_timeouts"], rec["reward_step_budget_expired"], rec["reward_errors"]) == (4, 4, 4)
    assert rec["reward_error_reasons"] == {"step_budget": 4}
    lines = [(r.levelno, r.getMessage()) for r in caplog.records if r.name == "streamrl.rollout.score"]
    assert lines == [
        (
            logging.WARNING,
            "reward.step_budget_s=0.5: 4 of 4 score(s) still outstanding count as reward 0 (reason "
            "step_budget); the scorer is slow or hanging",
        ),
        (
            logging.DEBUG,
            "reward.step_budget_s=0.5: 1 of 1 score(s) still outstanding count as reward 0 (reason "
            "step_budget); the scorer is slow or hanging",
        ),
    ]


def test_an_outstanding_request_is_cancelled_at_the_budget(serve) -> None:
    from concurrent.futures import Future

    from streamrl.rollout.score import Scoring

    server = serve((200, "VERDICT: 1", 0))
    scoring = Scoring(load_config(None, _judge_keys(server, 2.5)))
    try:
        queued: Future = Future()  # not taken by a worker yet
        out = scoring.outcome(queued)
    finally:
        scoring.close()
    assert queued.cancelled()  # the service skips it instead of scoring it for nobody
    assert (out.reward, out.error, out.info, out.latency_s) == (
        0.0,
        "step_budget",
        {"error_detail": "no score within reward.step_budget_s=2.5"},
        2.5,
    )


def test_a_fast_judge_is_not_cut_off(serve) -> None:
    from streamrl.rollout.score import Scoring

    server = serve((200, "VERDICT: 1", 0))
    scoring = Scoring(load_config(None, _judge_keys(server, 30)))
    problem = Problem("p", [], "5", {"question": "2 + 3?"})
    trajs = [make_traj(i, [1], [2, 3]) for i in range(3)]
    for i, t in enumerate(trajs):
        t.text = f"answer {i}"
    try:
        scoring.begin_step()
        scoring.score([(problem, t) for t in trajs])
    finally:
        scoring.close()
    assert [(t.reward, t.reward_info["reward_error"]) for t in trajs] == [(1.0, None)] * 3


def test_rollout_worker_sends_a_group_cut_off_by_the_budget(serve, tiny) -> None:
    from streamrl.data.prompts import render_prompt_ids
    from streamrl.rollout.worker import GroupRequest

    class Weights:  # the worker's own copy of tiny-random, never updated
        version = 0

        def load_into(self, model) -> int:
            return 0

    server = serve((200, "VERDICT: 1", HELD))
    cfg = load_config(None, [*TINY, *_judge_keys(server, 1.0)])
    problem = Problem("p0", [{"role": "user", "content": "2 + 3 = ?"}], "5", {"question": "2 + 3 = ?"})
    request = GroupRequest("g0", problem, render_prompt_ids(tiny[1], problem.messages), 3, 0)
    res = one_group_in_a_thread(cfg, request, Weights())
    assert not res.error
    trajs = res.group.trajectories
    assert [t.reward_info["reward_error"] for t in trajs] == ["step_budget"] * 3
    assert [t.reward_info["reward_latency_s"] for t in trajs] == [1.0] * 3  # the budget, not a measurement


def test_colocated_run_counts_and_warns(serve, tmp_path: Path, capsys) -> None:
    from streamrl.cli import main

    # the start-up probe is answered; every later request hangs
    server = serve((200, "VERDICT: 1", 0), (200, "VERDICT: 1", HELD), models=[MODEL])
    run = tmp_path / "run"
    keys = [*TINY, *_judge_keys(server, 1.0), "runtime.mode=colocated", "max_staleness=0", "max_steps=1"]
    assert main(["train", *keys, "rollout.dynamic_sampling=false", "eval.after=false", f"run_dir={run}"]) == 0
    (rec,) = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert (rec["reward_step_budget_expired"], rec["reward_timeouts"], rec["reward_error_reasons"]) == (
        8,
        8,
        {"step_budget": 8},
    )
    err = " ".join(capsys.readouterr().err.split())
    assert (
        "warning [scoring_budget] step 1: 8 score(s) were still outstanding when reward.step_budget_s "
        "ran out and count as reward 0: the scorer (an LLM judge, the sandbox, your reward functions) is "
        "slow or hanging" in err
    )


class FirstTwoCallsHang:
    """A scorer whose first two calls hang (until the test ends); every later call scores 1.0."""

    name = "first-two-hang"
    gate = threading.Event()
    calls = 0
    lock = threading.Lock()

    def __init__(self, cfg_dict, task=None):
        pass

    def __call__(self, problem, text, ids=()):
        with FirstTwoCallsHang.lock:
            FirstTwoCallsHang.calls += 1
            n = FirstTwoCallsHang.calls
        if n <= 2:
            FirstTwoCallsHang.gate.wait(120)
        return 1.0, {"correct": True}


def test_each_colocated_step_gets_its_own_budget(tmp_path: Path, monkeypatch) -> None:
    from streamrl.cli import main
    from streamrl.rollout import score as scoring_mod

    monkeypatch.setattr(scoring_mod, "TaskScorer", FirstTwoCallsHang)
    FirstTwoCallsHang.calls = 0
    run = tmp_path / "run"
    # step 1: both workers hang, the step's 8 scores are cut at its budget; the hung calls are abandoned
    # at reward.timeout_s; step 2 has a budget of its own and scores normally
    keys = ["reward.timeout_s=2", "reward.step_budget_s=1.5", "runtime.mode=colocated", "max_staleness=0"]
    keys += ["max_steps=2", "rollout.dynamic_sampling=false", "eval.after=false", f"run_dir={run}"]
    try:
        assert main(["train", *TINY, *keys]) == 0
    finally:
        FirstTwoCallsHang.gate.set()
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["reward_step_budget_expired"] for r in recs] == [8, 0]
    assert [r["reward_mean"] for r in recs] == [0.0, 1.0]
