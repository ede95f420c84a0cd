"""Sampled evaluation: n responses per problem -> pass@k, avg@n, maj@k, greedy accuracy, lengths.

One engine call holds every request (n samples + 1 greedy per problem), so the engine batches them.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from streamrl.data.prompts import render_prompt_ids
from streamrl.data.task import Task
from streamrl.engine.base import GenRequest, generate
from streamrl.eval.sampling_metrics import maj_at_k, summarize
from streamrl.eval.stats import wilson_interval
from streamrl.types import EvalStopped, Problem


@dataclass
class SampledEval:
    """correct: [problems][n]; answers: [problems][n] extracted answers (None = not extracted)."""

    n: int
    ks: list[int]
    correct: list[list[bool]]
    answers: list[list[str | None]]
    greedy_correct: list[bool]
    lengths: list[int]  # every sampled response, in tokens
    truncated: int
    seconds: float
    metrics: dict[str, float] = field(default_factory=dict)
    examples: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        g = sum(self.greedy_correct)
        lo, hi = wilson_interval(g, len(self.greedy_correct))
        return {
            "problems": len(self.correct),
            "n": self.n,
            "ks": self.ks,
            **self.metrics,
            "greedy_accuracy": g / max(len(self.greedy_correct), 1),
            "greedy_ci95": [lo, hi],
            "mean_length": sum(self.lengths) / max(len(self.lengths), 1),
            "truncation_rate": self.truncated / max(len(self.lengths), 1),
            "seconds": self.seconds,
        }


def evaluate_sampled(
    engine: Any,
    tokenizer: Any,
    task: Task,
    problems: list[Problem],
    n: int,
    ks: list[int],
    temperature: float,
    top_p: float,
    max_new_tokens: int,
    stop: Callable[[], bool] | None = None,
) -> SampledEval:
    """Sample n responses per problem at `temperature` (plus one greedy) and score them all.
    stop: asked before each of the engine's decode steps; True raises EvalStopped."""
    if n < 1 or not ks or max(ks) > n or min(ks) < 1:
        raise ValueError(f"sampled eval needs n >= 1 and every k in 1..n, got n={n}, k={ks}")
    start = time.perf_counter()
    reqs = []
    for pi, p in enumerate(problems):
        ids = render_prompt_ids(tokenizer, p.messages)
        reqs += [GenRequest(ids, max_new_tokens, temperature, top_p, tag=(pi, j)) for j in range(n)]
        reqs.append(GenRequest(ids, max_new_tokens, 0.0, 1.0, tag=(pi, -1)))
    results = generate(engine, reqs, stop)
    if any(r.finish_reason == "abort" for r in results):
        done = sum(r.finish_reason != "abort" for r in results)
        raise EvalStopped(f"stopped with {done} of {len(reqs)} responses sampled")
    correct = [[False] * n for _ in problems]
    answers: list[list[str | None]] = [[None] * n for _ in problems]
    greedy = [False] * len(problems)
    lengths, truncated, examples = [], 0, []
    for res in results:
        pi, j = res.request.tag
        text = tokenizer.decode(res.token_ids, skip_special_tokens=True)
        s = task.score(problems[pi], text)
        if j < 0:
            greedy[pi] = s.correct
            continue
        correct[pi][j], answers[pi][j] = s.correct, s.extracted
        lengths.append(len(res.token_ids))
        truncated += res.finish_reason == "length"
        if j == 0 and len(examples) < 20:
            examples.append({"id": problems[pi].id, "answer": problems[pi].answer, "response": text})
    majority = [
        [maj_at_k(answers[pi], correct[pi], k, lambda a, b, p=p: task.same_answer(a, b, p)) for k in ks]
        for pi, p in enumerate(problems)
    ]
    out = SampledEval(n, list(ks), correct, answers, greedy, lengths, truncated, time.perf_counter() - start)
    out.metrics = summarize(correct, ks, majority)
    out.examples = examples
    return out
