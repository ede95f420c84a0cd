"""LLM judge: the verdict parser on many replies, config resolution, and the HTTP client against a real
OpenAI-compatible server on localhost (tests/openai_stub.py)."""

from __future__ import annotations

import pickle
import socket

import pytest
from bounded import call_bounded
from openai_stub import StubServer

from streamrl.rewards.judge import (
    JudgeConfig,
    JudgeError,
    LLMJudge,
    make_judge_scorer,
    parse_verdict,
    render_prompt,
    resolve_judge_config,
)


@pytest.mark.parametrize(
    "reply, score",
    [
        ("The final answers match.\nVERDICT: 1", 1.0),
        ("VERDICT: 0", 0.0),
        ("Verdict: 0.7", 0.7),
        ("**VERDICT:** CORRECT", 1.0),
        ("**Verdict**: incorrect.", 0.0),
        ("verdict: correct", 1.0),
        ("Reasoning...\n## VERDICT: INCORRECT", 0.0),  # INCORRECT must not match as CORRECT
        ("VERDICT: **0.25**", 0.25),
        ("`VERDICT: 1`", 1.0),
        ("VERDICT = .5", 0.5),
        ("VERDICT: 70%", 0.7),
        ("VERDICT: 7/10", 0.7),
        ("VERDICT:\n1", 1.0),
        ("VERDICT: [CORRECT]", 1.0),
        ("VERDICT: Correct! The response is right.", 1.0),
        ("I must end with VERDICT: <score>.\nVERDICT: 0", 0.0),  # echoed template is skipped
        ("VERDICT: 1\nWait, I misread the reference.\nVERDICT: 0", 0.0),  # the last verdict wins
        ("VERDICT: 0.4\nThat is my verdict: <final>", 0.4),  # a later unparseable marker is skipped
        ('```json\n{"score": 1}\n```', 1.0),
        ('{"verdict": "INCORRECT", "why": "sign error"}', 0.0),
        ('{"reason": "close", "Score": 0.5}', 0.5),
        ('{"score": 0.2} then {"score": 0.9}', 0.9),
        ('VERDICT: 0\n{"score": 1}', 0.0),  # the asked-for line beats JSON
    ],
)
def test_parse_verdict(reply: str, score: float) -> None:
    assert parse_verdict(reply) == pytest.approx(score, abs=1e-12)


@pytest.mark.parametrize(
    "reply",
    [
        "",
        "The response is correct.",  # free text is not guessed at
        "VERDICT: <score>",
        "VERDICT: maybe",
        "VERDICT: The response is correct",
        "score: 1",
        "Verdicts are hard: 1",  # 'verdicts' is not the marker
        '{"grade": 1}',
        '{"score": true}',
        "VERDICT: 1/0",
        "{not json: 1}",
    ],
)
def test_parse_verdict_unparseable(reply: str) -> None:
    with pytest.raises(JudgeError) as e:
        parse_verdict(reply)
    assert e.value.reason == "unparseable verdict"


@pytest.mark.parametrize(
    "reply", ["VERDICT: 8", "VERDICT: -0.5", "VERDICT: 1.5", "VERDICT: 150%", '{"score": 2}']
)
def test_parse_verdict_out_of_range_is_rejected_not_clipped(reply: str) -> None:
    with pytest.raises(JudgeError) as e:
        parse_verdict(reply)
    assert e.value.reason == "verdict out of range"


def test_render_prompt_single_pass() -> None:
    out = render_prompt("Q={question} R={reference} A={response}", "what is {response}?", "4", "{x}")
    assert out == "Q=what is {response}? R=4 A={x}"


def test_judge_error_pickles() -> None:
    e = pickle.loads(pickle.dumps(JudgeError("timeout", "no reply")))
    assert (e.reason, e.detail, str(e)) == ("timeout", "no reply", "timeout: no reply")


def test_resolve_config_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("STREAMRL_JUDGE_URL", "STREAMRL_JUDGE_MODEL", "STREAMRL_JUDGE_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", "http://openai.example/v1")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("STREAMRL_JUDGE_MODEL", "m1")
    c = resolve_judge_config()
    assert (c.base_url, c.model, c.api_key) == ("http://openai.example/v1", "m1", "sk-openai")
    monkeypatch.setenv("STREAMRL_JUDGE_URL", "http://judge.local/v1/")
    monkeypatch.setenv("STREAMRL_JUDGE_API_KEY", "sk-judge")
    c = resolve_judge_config(model="m2", timeout_s=3)
    assert (c.url, c.model, c.api_key, c.timeout_s) == (
        "http://judge.local/v1/chat/completions",
        "m2",
        "sk-judge",
        3,
    )
    assert "sk-judge" not in repr(c)  # keys stay out of logs


def test_resolve_config_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("STREAMRL_JUDGE_URL", "OPENAI_BASE_URL", "STREAMRL_JUDGE_MODEL"):
        monkeypatch.delenv(k, raising=False)
    with pytest.raises(ValueError, match="STREAMRL_JUDGE_URL"):
        resolve_judge_config(model="m")
    with pytest.raises(ValueError, match="STREAMRL_JUDGE_MODEL"):
        resolve_judge_config(base_url="http://x/v1")
    with pytest.raises(ValueError, match="http://"):
        JudgeConfig(base_url="localhost:8000", model="m")
    with pytest.raises(ValueError, match=r"\{response\}"):
        JudgeConfig(base_url="http://x", model="m", template="grade {question}")


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://user:secret@judge.example/v1", "https://***@judge.example/v1"),
        ("http://sk-token@127.0.0.1:8000/v1", "http://***@127.0.0.1:8000/v1"),  # a user name alone
        ("https://u:p@ss@judge.example/v1?k=1", "https://***@judge.example/v1?k=1"),  # an unescaped @
        ("https://u:ab/cd+ef@judge.example/v1", "https://***@judge.example/v1"),  # ... and a '/'
        ("user:secret@judge.example/v1", "***@judge.example/v1"),  # no scheme (refused, but shown)
        ("http://judge.example/v1/a@b", "http://***@b"),  # an @ in the path: hidden too, harmlessly
        ("http://127.0.0.1:8000/v1", "http://127.0.0.1:8000/v1"),
    ],
)
def test_a_urls_credentials_are_redacted(url: str, shown: str) -> None:
    from streamrl.config_rewards import redact_url

    assert redact_url(url) == shown


CREDENTIALS = "judge base_url carries credentials (user:...@): remove them and set STREAMRL_JUDGE_API_KEY"


@pytest.mark.parametrize(
    "url",
    [
        "http://user:secret@127.0.0.1:8000/v1",  # urllib would ask the resolver for "user:secret@127.0.0.1"
        "https://u:ab/cd+ef@judge.example/v1",  # a '/' in the password: urllib would read port "ab"
        "https://u:ab?cd#ef@judge.example/v1",
        "https://sk-token@judge.example/v1",  # a user name alone
    ],
)
def test_a_judge_url_with_credentials_is_refused_before_any_request(url: str) -> None:
    """No JudgeConfig holds credentials in its URL, so neither its repr nor a request shows them."""
    with pytest.raises(ValueError) as e:
        JudgeConfig(url, "m", api_key="k")
    assert str(e.value) == CREDENTIALS


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        (
            "ftp://user:secret@judge.example/v1",
            "must start with http:// or https://, got 'ftp://***@judge.example/v1'",
        ),
        (
            "http://judge.example:abc/v1",
            "has a port that is not a number: 'judge.example:abc' (write host:port, e.g. 127.0.0.1:8000)",
        ),
        (
            "http://judge.example/v1\n",
            "holds a space or a control character ('\\n'): 'http://judge.example/v1\\n'",
        ),
    ],
)
def test_a_judge_url_urllib_cannot_open_is_refused_in_one_line(url: str, problem: str) -> None:
    with pytest.raises(ValueError) as e:
        JudgeConfig(url, "m")
    assert str(e.value) == f"judge base_url {problem}"


AT_PAST_HOST = (
    "judge base_url holds an '@' after its host: write an '@' of its path or query as %40, or remove the "
    "credentials (user:...@) and set STREAMRL_JUDGE_API_KEY"
)


@pytest.mark.parametrize(
    "url",
    [
        "http://u:12/ab@h",  # urllib: host u, port 12, path /ab@h; redact_url: credentials before '@h'
        "http://judge.example:8000/v1/a@b",  # an '@' of the path
        "https://judge.example/v1?key=a@b",
        "https://judge.example/v1#a@b",
    ],
)
def test_a_judge_url_with_an_at_sign_past_its_host_is_refused(url: str) -> None:
    """Which part of such a URL is the host depends on who reads it (urllib or redact_url): it is
    refused in one line, before any request, naming both ways out."""
    with pytest.raises(ValueError) as e:
        JudgeConfig(url, "m", api_key="k")
    assert str(e.value) == AT_PAST_HOST


def test_a_judge_url_with_a_percent_encoded_at_sign_is_taken() -> None:
    c = JudgeConfig("http://judge.example:8000/v1/a%40b", "m", api_key="secret")
    assert c.url == "http://judge.example:8000/v1/a%40b/chat/completions"
    assert "secret" not in repr(c)


def test_judge_errors_show_the_url_called(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whole: a URL JudgeConfig takes holds no '@', so no credentials."""

    def timed_out(self: LLMJudge, body: bytes) -> dict:
        raise TimeoutError("timed out")

    monkeypatch.setattr(LLMJudge, "_post", timed_out)
    with pytest.raises(JudgeError) as e:
        LLMJudge(JudgeConfig("http://judge.example/v1/a%40b", "m", retries=0)).judge("q", "a", "r")
    assert str(e.value) == (
        "timeout: http://judge.example/v1/a%40b/chat/completions failed after 1 attempts: no reply within "
        "30s (timed out)"
    )


def test_worst_case_bound() -> None:
    c = JudgeConfig("http://x", "m", timeout_s=2, retries=3, backoff_s=0.5, backoff_max_s=1.5)
    assert c.worst_case_s() == 4 * 2 + 0.5 + 1.0 + 1.5


# --------------------------------------------------------------------------------------------------
# against a real HTTP server


@pytest.fixture
def serve():
    servers: list[StubServer] = []

    def start(*replies: tuple[int, str, float]) -> StubServer:
        servers.append(StubServer(list(replies)))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _judge(server: StubServer, **kw) -> LLMJudge:
    kw = {"api_key": "sk-test", "timeout_s": 5.0, "retries": 2, "backoff_s": 0.01, **kw}
    return LLMJudge(JudgeConfig(base_url=server.base_url, model="judge-model", **kw))


def test_correct_verdict_and_request_shape(serve) -> None:
    server = serve((200, "The response gives 12, as does the reference.\n**VERDICT:** CORRECT", 0))
    r = _judge(server).judge("What is 3*4?", "12", "3*4 = 12")
    assert (r.score, r.attempts) == (1.0, 1)
    assert r.reply.endswith("CORRECT")
    (req,) = server.requests
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == "Bearer sk-test"
    body = req["body"]
    assert body["model"] == "judge-model"
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    user = body["messages"][1]["content"]
    assert "What is 3*4?" in user and "\n12\n" in user and "3*4 = 12" in user and "VERDICT: <score>" in user


def test_no_api_key_sends_no_authorization(serve) -> None:
    server = serve((200, "VERDICT: 0.5", 0))
    assert _judge(server, api_key=None).judge("q", "a", "r").score == 0.5
    assert "Authorization" not in server.requests[0]["headers"]


def test_malformed_verdict_is_not_retried(serve) -> None:
    server = serve((200, "Looks fine to me.", 0))
    with pytest.raises(JudgeError) as e:
        _judge(server).judge("q", "a", "r")
    assert e.value.reason == "unparseable verdict"
    assert server.count == 1


def test_timeout_retries_then_clear_error(serve) -> None:
    # the server holds every reply until it closes, after the test: only the client's timeout ends a call
    server = serve((200, "VERDICT: 1", 600.0))
    judge = _judge(server, timeout_s=0.3, retries=1)
    with pytest.raises(JudgeError) as e:
        call_bounded(lambda: judge.judge("q", "a", "r"), 60, "the judge waited for the held reply")
    assert e.value.reason == "timeout"
    assert "failed after 2 attempts" in str(e.value)
    assert server.count == 2  # two 0.3 s attempts
    assert server.answered == 0  # both gave up before the server replied


def test_500_twice_then_success(serve) -> None:
    server = serve((500, "boom", 0), (500, "boom", 0), (200, "VERDICT: 0.5", 0))
    r = _judge(server, retries=2).judge("q", "a", "r")
    assert (r.score, r.attempts, server.count) == (0.5, 3, 3)


def test_500_past_the_last_retry(serve) -> None:
    server = serve((500, "upstream exploded", 0), (500, "upstream exploded", 0), (200, "VERDICT: 1", 0))
    with pytest.raises(JudgeError) as e:
        _judge(server, retries=1).judge("q", "a", "r")
    assert e.value.reason == "http 500"
    assert "failed after 2 attempts" in str(e.value) and "upstream exploded" in str(e.value)
    assert server.count == 2


def test_429_is_retried_401_is_not(serve) -> None:
    server = serve((429, "slow down", 0), (200, "VERDICT: INCORRECT", 0))
    r = _judge(server).judge("q", "a", "r")
    assert (r.score, r.attempts) == (0.0, 2)
    server = serve((401, "bad key", 0), (200, "VERDICT: 1", 0))
    with pytest.raises(JudgeError) as e:
        _judge(server).judge("q", "a", "r")
    assert e.value.reason == "http 401" and server.count == 1


def test_connection_refused() -> None:
    with socket.socket() as s:  # bound but not listening while the judge runs: connect is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
        judge = LLMJudge(JudgeConfig(f"http://127.0.0.1:{port}/v1", "m", retries=1, backoff_s=0.01))
        with pytest.raises(JudgeError) as e:
            judge.judge("q", "a", "r")
    assert e.value.reason == "connection error"
    assert "failed after 2 attempts" in str(e.value)


def test_scorer_pickles_and_scores(serve) -> None:
    server = serve((200, "VERDICT: 7/10", 0))
    scorer = make_judge_scorer(base_url=server.base_url, model="judge-model", retries=0)
    scorer = pickle.loads(pickle.dumps(scorer))
    score, info = scorer("q", "a", "r")
    assert score == pytest.approx(0.7) and info["judge_attempts"] == 1
