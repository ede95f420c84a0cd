"""An LLM-judge reward: ask an OpenAI-compatible chat-completions endpoint to grade a response.

The judge POSTs ``{base_url}/chat/completions`` with a rubric prompt (question, reference answer,
response) and reads the verdict from the reply's final ``VERDICT: <score>`` line. A score is a number
in [0, 1] (``0.7``, ``70%``, ``7/10``) or CORRECT (1.0) / INCORRECT (0.0).

Every failure raises ``JudgeError`` with a short machine-readable ``reason`` ("timeout",
"connection error", "http 500", "unparseable verdict", "verdict out of range", ...). The judge itself
never swallows errors; ``RewardService`` turns them into reward 0 plus a counted reason, so a flaky
judge costs single rewards, never the run.

Usage as a RewardService scorer (process mode needs a picklable scorer: ``JudgeScorer`` is one)::

    from streamrl.rewards.judge import make_judge_scorer
    from streamrl.rewards.service import RewardService

    judge = make_judge_scorer(base_url="http://localhost:8000/v1", model="qwen2.5-7b-instruct",
                              timeout_s=20, retries=2)   # or set STREAMRL_JUDGE_URL / _MODEL / _API_KEY
    with RewardService(judge, workers=4, timeout_s=judge.config.worst_case_s() + 5,
                       mode="thread") as service:
        outcomes = service.score_many([(question, reference, response) for response in responses])
    rewards = [o.reward for o in outcomes]   # 0.0 where the judge failed; o.error says why
"""

from __future__ import annotations

import http.client
import json
import os
import random
import re
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from streamrl.brief import brief
from streamrl.config_rewards import (
    JUDGE_API_KEY_ENV,
    JUDGE_BACKOFF_MAX_S,
    JUDGE_BACKOFF_S,
    JUDGE_RETRIES,
    judge_backoff_s,
    judge_url_problem,
)

DEFAULT_SYSTEM_PROMPT = "You are a strict, fair grader. You compare a response with a reference answer."

DEFAULT_TEMPLATE = """Grade the response to the question below against the reference answer.

Question:
{question}

Reference answer:
{reference}

Response:
{response}

Judge only whether the response's final answer agrees with the reference answer; ignore style and
length. Reason briefly, then end with a final line of exactly this form:
VERDICT: <score>
where <score> is a number between 0 and 1 (1 = fully correct), or the word CORRECT or INCORRECT."""

_FIELDS = ("question", "reference", "response")
_PLACEHOLDER = re.compile(r"\{(question|reference|response)\}")


class JudgeError(Exception):
    """A judge call that produced no score. ``reason`` is short and stable (used as a metric label)."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(reason, detail)  # both in args: the exception survives pickling
        self.reason = reason
        self.detail = detail

    def __str__(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


# ---------------------------------------------------------------------------------------------------
# Verdict parsing (pure)

# "VERDICT:", "**VERDICT:**", "## Verdict =", "`verdict: `" ... then the value up to the end of the line.
# The value may sit on the next line ("VERDICT:\n1"), hence \s in the skip class.
_VERDICT = re.compile(r"\bverdict\b[\s*_`#>]*[:=][\s*_`\"'\[(<]*([^\n]*)", re.IGNORECASE)
_VALUE = re.compile(
    r"""^(?:
        (?P<word>incorrect|correct)\b
      | (?P<num>[-+]?(?:\d+(?:\.\d*)?|\.\d+))
        (?:\s*/\s*(?P<den>\d+(?:\.\d*)?))?
        (?P<pct>\s*%)?
    )""",
    re.IGNORECASE | re.VERBOSE,
)
_JSON_OBJECT = re.compile(r"\{[^{}]*\}")
_WORDS = {"correct": 1.0, "incorrect": 0.0}


def _parse_value(value: str) -> float | None:
    """'0.7' -> 0.7, '70%' -> 0.7, '7/10' -> 0.7, 'CORRECT' -> 1.0; None if it does not start with one.

    Range is not checked here (parse_verdict does that, so that 1.5 is reported as out of range).
    """
    m = _VALUE.match(value.strip().strip("*_`\"'[](){}<> "))
    if m is None:
        return None
    if m["word"]:
        return _WORDS[m["word"].lower()]
    x = float(m["num"])
    if m["den"] is not None:
        den = float(m["den"])
        if den == 0:
            return None
        x /= den
    if m["pct"]:
        x /= 100
    return x


def _json_scores(text: str) -> list[float]:
    """Scores from flat JSON objects with a "score" or "verdict" key, in order of appearance."""
    out: list[float] = []
    for m in _JSON_OBJECT.finditer(text):
        try:
            obj = json.loads(m.group(0))
        except json.JSONDecodeError:
            continue
        if not isinstance(obj, dict):
            continue
        for k, v in obj.items():
            if k.lower() in ("score", "verdict"):
                x = float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None
                x = _parse_value(v) if isinstance(v, str) else x
                if x is not None:
                    out.append(x)
                    break
    return out


def parse_verdict(text: str) -> float:
    """The judge's score in [0, 1] from its reply. Pure; raises JudgeError on failure.

    Rules, in order:
    1. the last ``VERDICT`` marker (any case, markdown around it, ``:`` or ``=``) whose value parses:
       a number (``0.7``, ``.5``, ``70%``, ``7/10``) or CORRECT -> 1.0 / INCORRECT -> 0.0. Earlier
       markers lose, so a judge that echoes the template ("VERDICT: <score>") or corrects itself is
       read right.
    2. else the last flat JSON object with a "score" or "verdict" key (``{"score": 1}``).
    3. else JudgeError("unparseable verdict"). Free text such as "the response is correct" is not
       guessed at: a rubric violation should be visible, not silently scored.

    Out-of-range numbers (``1.5``, ``-1``, ``8`` from a judge that used a 0-10 scale) raise
    JudgeError("verdict out of range") rather than being clipped: clipping 8 to 1.0 would hand out
    full reward for a judge that misread the rubric.
    """
    found = [x for m in _VERDICT.finditer(text) if (x := _parse_value(m.group(1))) is not None]
    if not found:
        found = _json_scores(text)
    if not found:
        tail = text.strip()[-80:].replace("\n", " ")
        raise JudgeError("unparseable verdict", f"no 'VERDICT: <score>' line in reply ending {tail!r}")
    score = found[-1]
    if not 0.0 <= score <= 1.0:
        raise JudgeError("verdict out of range", f"score {score:g} is outside [0, 1]")
    return score


def render_prompt(template: str, question: str, reference: str, response: str) -> str:
    """Fill {question}, {reference}, {response} in one pass (values containing braces stay literal)."""
    values = {"question": question, "reference": reference, "response": response}
    return _PLACEHOLDER.sub(lambda m: values[m.group(1)], template)


# ---------------------------------------------------------------------------------------------------
# Configuration and the HTTP client


@dataclass(frozen=True)
class JudgeConfig:
    """Where and how to ask the judge. Build with ``resolve_judge_config`` to get env fallbacks.

    timeout_s is per HTTP attempt (socket-level: connect and each read); retries counts extra
    attempts after the first on timeouts, connection errors, 5xx and 429.
    """

    base_url: str
    model: str
    api_key: str | None = field(default=None, repr=False)
    timeout_s: float = 30.0
    retries: int = JUDGE_RETRIES
    backoff_s: float = JUDGE_BACKOFF_S  # first retry delay; doubles per retry, capped at backoff_max_s
    backoff_max_s: float = JUDGE_BACKOFF_MAX_S
    temperature: float = 0.0
    max_tokens: int = 512
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    template: str = DEFAULT_TEMPLATE

    def __post_init__(self) -> None:
        if problem := judge_url_problem(self.base_url, "judge base_url"):  # so no repr shows a password
            raise ValueError(problem)
        if not self.model:
            raise ValueError("judge model is empty: pass model= or set STREAMRL_JUDGE_MODEL")
        if self.timeout_s <= 0:
            raise ValueError(f"judge timeout_s must be > 0, got {self.timeout_s}")
        if self.retries < 0:
            raise ValueError(f"judge retries must be >= 0, got {self.retries}")
        if "{response}" not in self.template:
            raise ValueError("judge template must contain {response} (and usually {question}, {reference})")

    @property
    def url(self) -> str:
        return self.base_url.rstrip("/") + "/chat/completions"

    def backoff_total_s(self) -> float:
        """The longest the backoff between one call's attempts adds up to."""
        return judge_backoff_s(self.retries, self.backoff_s, self.backoff_max_s)

    def worst_case_s(self) -> float:
        """Upper bound on one judge call (all attempts time out, full backoff): size service timeouts."""
        return (self.retries + 1) * self.timeout_s + self.backoff_total_s()


def resolve_judge_config(
    base_url: str | None = None, model: str | None = None, api_key: str | None = None, **kw: Any
) -> JudgeConfig:
    """Arguments win; then STREAMRL_JUDGE_URL / _MODEL / _API_KEY; then OPENAI_BASE_URL / OPENAI_API_KEY."""
    env = os.environ
    base_url = base_url or env.get("STREAMRL_JUDGE_URL") or env.get("OPENAI_BASE_URL")
    model = model or env.get("STREAMRL_JUDGE_MODEL")
    api_key = api_key or env.get(JUDGE_API_KEY_ENV) or env.get("OPENAI_API_KEY")
    if not base_url:
        raise ValueError("judge URL missing: pass base_url= or set STREAMRL_JUDGE_URL (or OPENAI_BASE_URL)")
    if not model:
        raise ValueError("judge model missing: pass model= or set STREAMRL_JUDGE_MODEL")
    return JudgeConfig(base_url=base_url, model=model, api_key=api_key or None, **kw)


def judge_config(rc: Any) -> JudgeConfig:
    """The judge a RewardConfig describes: reward.judge_url / judge_model (else the environment, as in
    resolve_judge_config) with reward.judge_timeout_s per attempt."""
    return resolve_judge_config(rc.judge_url or None, rc.judge_model or None, timeout_s=rc.judge_timeout_s)


@dataclass
class JudgeResult:
    score: float
    reply: str  # the judge's full reply text
    attempts: int  # HTTP attempts made (1 = no retry)
    latency_s: float


def _retry_after(err: urllib.error.HTTPError) -> float | None:
    value = err.headers.get("Retry-After") if err.headers else None
    try:
        return float(value) if value is not None else None
    except ValueError:  # an HTTP date: fall back to our own backoff
        return None


class LLMJudge:
    """Grades responses through one OpenAI-compatible endpoint. Thread-safe (no shared mutable state)."""

    def __init__(self, config: JudgeConfig) -> None:
        self.config = config

    def messages(self, question: str, reference: str, response: str) -> list[dict[str, str]]:
        c = self.config
        return [
            {"role": "system", "content": c.system_prompt},
            {"role": "user", "content": render_prompt(c.template, question, reference, response)},
        ]

    def _post(self, body: bytes) -> dict[str, Any]:
        headers = {"Content-Type": "application/json"}
        if self.config.api_key:
            headers["Authorization"] = f"Bearer {self.config.api_key}"
        req = urllib.request.Request(self.config.url, data=body, headers=headers, method="POST")
        with urllib.request.urlopen(req, timeout=self.config.timeout_s) as resp:
            return json.loads(resp.read())

    def complete(self, messages: list[dict[str, str]]) -> tuple[str, int]:
        """-> (reply text, attempts). Retries timeouts, connection errors, 5xx and 429 with backoff."""
        c = self.config
        body = json.dumps(
            {"model": c.model, "messages": messages, "temperature": c.temperature, "max_tokens": c.max_tokens}
        ).encode()
        for attempt in range(c.retries + 1):
            wait = min(c.backoff_max_s, c.backoff_s * 2**attempt)
            try:
                data = self._post(body)
                break
            except urllib.error.HTTPError as e:
                detail = e.read(300).decode("utf-8", "replace")
                err = JudgeError(f"http {e.code}", detail.strip())
                if not (e.code == 429 or e.code >= 500):
                    raise err from None  # 400/401/404: retrying will not help; say so at once
                wait = min(c.backoff_max_s, _retry_after(e) or wait)
            except TimeoutError as e:
                err = JudgeError("timeout", f"no reply within {c.timeout_s:g}s ({e})")
            except urllib.error.URLError as e:
                if isinstance(e.reason, TimeoutError):
                    err = JudgeError("timeout", f"no connection within {c.timeout_s:g}s")
                else:
                    err = JudgeError("connection error", str(e.reason))
            except (OSError, http.client.HTTPException) as e:  # reset / disconnected mid-response
                err = JudgeError("connection error", f"{type(e).__name__}: {e}")
            except json.JSONDecodeError as e:
                raise JudgeError("malformed response", f"reply is not JSON ({e})") from None
            if attempt == c.retries:
                # c.url holds no credentials: JudgeConfig refuses a base_url with an '@' (judge_url_problem)
                raise JudgeError(err.reason, f"{c.url} failed after {attempt + 1} attempts: {err.detail}")
            time.sleep(wait * (0.75 + 0.25 * random.random()))  # jitter: retries from many callers spread
        try:
            content = data["choices"][0]["message"]["content"]
        except (KeyError, IndexError, TypeError):
            raise JudgeError(
                "malformed response", f"no choices[0].message.content in {brief(str(data), 200)}"
            ) from None
        if not isinstance(content, str) or not content.strip():
            raise JudgeError("empty reply", "the judge returned no text")
        return content, attempt + 1

    def judge(self, question: str, reference: str, response: str) -> JudgeResult:
        """Grade one response. Raises JudgeError (never returns a guessed score)."""
        t0 = time.perf_counter()
        reply, attempts = self.complete(self.messages(question, reference, response))
        return JudgeResult(parse_verdict(reply), reply, attempts, time.perf_counter() - t0)


@dataclass(frozen=True)
class JudgeScorer:
    """A picklable RewardService scorer: ``scorer(question, reference, response) -> (score, info)``."""

    config: JudgeConfig
    name: str = "llm_judge"

    def __call__(self, question: str, reference: str, response: str) -> tuple[float, dict[str, Any]]:
        r = LLMJudge(self.config).judge(question, reference, response)
        return r.score, {"judge_attempts": r.attempts, "judge_latency_s": r.latency_s}


def make_judge_scorer(
    base_url: str | None = None, model: str | None = None, api_key: str | None = None, **kw: Any
) -> JudgeScorer:
    """A RewardService scorer for the judge. Config is resolved here (in the parent), so a missing URL
    or model fails at start-up, not inside a worker. kw: any JudgeConfig field."""
    return JudgeScorer(resolve_judge_config(base_url, model, api_key, **kw))
