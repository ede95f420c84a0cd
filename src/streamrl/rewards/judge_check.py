"""The LLM judge checked at start-up (reward.scorer=judge): before any model loads and before anything is
written, so a judge that is down, serves another model or cannot grade fails the run in seconds with
one line instead of costing reward.timeout_s per response for the whole run.

Three checks, each one HTTP request without retries, bounded by reward.judge_timeout_s:
1. the endpoint answers: ``GET {judge_url}/models`` (a connection error or a timeout stops here);
2. the model is served: reward.judge_model is among the ids it lists (a server without a listing, 404
   or an empty one, goes on to the probe, whose error then names a missing model);
3. one probe: a grading request of a known right answer whose reply must hold a verdict.
A URL without a version segment (/v1, ...) that finds neither the listing nor the chat endpoint gets the
/v1 fix in its line.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.error
import urllib.parse
import urllib.request

from streamrl.brief import brief
from streamrl.rewards.judge import JudgeConfig, JudgeError, LLMJudge

PROBE = ("What is 2 + 3?", "5", "2 + 3 = 5. The answer is 5.")  # question, reference, response


def _served_models(c: JudgeConfig, where: str) -> list[str] | None:
    """The model ids the endpoint lists; None when it has no listing (404 or an unexpected body)."""
    headers = {"Authorization": f"Bearer {c.api_key}"} if c.api_key else {}
    req = urllib.request.Request(c.base_url.rstrip("/") + "/models", headers=headers)
    slow = f"{where} did not answer within reward.judge_timeout_s={c.timeout_s:g}"
    try:
        with urllib.request.urlopen(req, timeout=c.timeout_s) as resp:
            body = json.loads(resp.read())
    except urllib.error.HTTPError as e:
        if e.code == 404:
            return None
        if e.code in (401, 403):
            why = "rejected the API key (STREAMRL_JUDGE_API_KEY / OPENAI_API_KEY)"
        else:
            why = brief(e.read(200).decode("utf-8", "replace"), 200)
        raise ValueError(f"{where} answered GET /models with http {e.code}: {why}") from None
    except urllib.error.URLError as e:
        if isinstance(e.reason, TimeoutError):
            raise ValueError(slow) from None
        raise ValueError(f"{where} is not reachable ({brief(str(e.reason), 200)})") from None
    except TimeoutError:
        raise ValueError(slow) from None
    except (OSError, ValueError) as e:  # reset mid-reply, or not JSON
        raise ValueError(f"{where} sent no usable reply to GET /models ({brief(str(e), 200)})") from None
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return None
    return [str(m["id"]) for m in data if isinstance(m, dict) and "id" in m]


def check_judge(c: JudgeConfig) -> None:
    """Raise ValueError (one line naming reward.judge_url / reward.judge_model and what failed) unless
    the judge answers, serves the model and grades one probe."""
    url = f"reward.judge_url={c.base_url}"  # no credentials: JudgeConfig refuses an '@' in it
    where = f"the judge at {url}"
    served = _served_models(c, where)
    if served and c.model not in served:  # an empty listing says nothing: the probe decides
        listed = ", ".join(served[:10]) + (", ..." if len(served) > 10 else "")
        raise ValueError(
            f"reward.judge_model={c.model} is not served by {where} (it serves: {listed}); "
            "set reward.judge_model to one of them"
        )
    probe = LLMJudge(dataclasses.replace(c, retries=0))
    try:
        probe.judge(*PROBE)
    except JudgeError as e:
        raise ValueError(
            f"the probe grading request to reward.judge_model={c.model} at {url} failed: {brief(str(e), 200)}"
            + _v1_hint(c.base_url, served, e.reason)
        ) from None


def _v1_hint(base_url: str, served: list[str] | None, reason: str) -> str:
    """The fix when neither the listing nor the probe was found (404) at a URL without a version segment
    (/v1, /v1beta, ...): OpenAI-compatible servers (vLLM, SGLang, Ollama, llama.cpp) answer under /v1;
    "" otherwise."""
    url = urllib.parse.urlsplit(base_url)
    versioned = any(re.fullmatch(r"v\d+\w*", seg, re.IGNORECASE) for seg in url.path.split("/"))
    if served is not None or reason != "http 404" or versioned:
        return ""
    fixed = url._replace(path=url.path.rstrip("/") + "/v1").geturl()
    return f"; OpenAI-compatible servers answer under /v1: try reward.judge_url={fixed}"
