"""Prompts too long to train on: the limit, checked before any work, and the filter on the training stream.

A trained sample is its prompt plus up to rollout.max_new_tokens (env tasks: env.max_total_tokens)
completion tokens; it must fit the model's context (max_position_embeddings) and one trainer micro-batch
(train.token_budget). So the longest prompt admitted is

- task_config.max_prompt_tokens when set (> 0); set together with the completion cap past the context
  or the token budget it is a config error (one line naming the keys);
- else (0, the default) min(max_position_embeddings, train.token_budget) - the completion cap.

`PromptFilter.apply` wraps the task's training stream under the sampler: a problem whose chat-templated
prompt is longer is skipped before it is admitted (so it never becomes a group and the ledger stays
exact), counted in `skipped` (`prompts_too_long` in metrics.jsonl and accounting.json), and the first
one is named in a warning. If the stream offers only prompts that are too long (every problem skipped
since the last that fitted has come round a third time, or MAX_SKIPS in a row), ValueError names the
first of them. Twice is not enough: the last problems of one epoch can come first in the next,
reshuffled, before the prompts that fit; a third showing of them all means a whole epoch went by without
one. A row repeated back to back (a file of duplicates, streamed unshuffled) counts as one showing.
Preflight draws one problem through the filter, so that happens before any weights load.

The filter also keeps the leading tokens every admitted prompt has had in common (`shared_tokens`,
`prompt_shared_tokens` in metrics.jsonl): what the engine's prefix cache can keep, and what the
pipeline simulator (sim/fit.py) charges once per policy version instead of once per group.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from streamrl.brief import brief
from streamrl.data.prompts import render_prompt_ids
from streamrl.types import Problem

log = logging.getLogger("streamrl.data")
REPEATS_MERGED = 100  # back-to-back repeats counted as one showing (a stream of one long prompt: no more)
MAX_SKIPS = 10_000  # too-long prompts in a row from a stream that never repeats (generated problems)


def completion_cap(cfg: Any) -> tuple[int, str]:
    """(completion tokens a sample may take, the key that sets it)."""
    if cfg.task.startswith("env:"):
        return cfg.env.max_total_tokens, "env.max_total_tokens"
    return cfg.rollout.max_new_tokens, "rollout.max_new_tokens"


@dataclass(frozen=True)
class PromptLimit:
    tokens: int  # the longest prompt admitted
    why: str  # where the number comes from, for messages


def prompt_limit(cfg: Any, model_config: Any) -> PromptLimit:
    """The longest prompt `cfg` trains on with a model of `model_config` (a transformers config).
    ValueError (one line naming the keys) when the configured lengths cannot fit."""
    cap, cap_key = completion_cap(cfg)
    budget = cfg.train.token_budget
    context = getattr(model_config, "max_position_embeddings", None)
    context = context if isinstance(context, int) and context > 0 else None
    explicit = cfg.task_config.max_prompt_tokens
    if explicit:
        total = f"task_config.max_prompt_tokens={explicit} + {cap_key}={cap} = {explicit + cap} tokens"
        if explicit + cap > budget:
            raise ValueError(
                f"{total} is longer than train.token_budget={budget}, so a sample would not fit one trainer "
                "micro-batch: raise train.token_budget or lower the other two"
            )
        if context is not None and explicit + cap > context:
            raise ValueError(
                f"{total} is longer than the model's context ({context} tokens, max_position_embeddings): "
                "lower them"
            )
        return PromptLimit(explicit, f"task_config.max_prompt_tokens={explicit}")
    room, where = budget, f"train.token_budget={budget}"
    if context is not None and context < budget:
        room, where = context, f"the model's context of {context} tokens"
    if cap >= room:
        raise ValueError(
            f"{cap_key}={cap} leaves no room for a prompt in {where}: lower {cap_key}"
            + (" or raise train.token_budget" if room == budget else "")
        )
    return PromptLimit(room - cap, f"{where} - {cap_key}={cap}; set task_config.max_prompt_tokens to choose")


def _named(problem: Problem, n: int) -> str:
    shown = brief(problem.meta.get("question", ""), 60)
    return f"{problem.id} ({n} tokens: {shown!r})"


class PromptFilter:
    """Skips the problems whose prompt is longer than `limit` (see the module docstring)."""

    def __init__(self, tokenizer: Any, limit: PromptLimit, source: str, warn: bool = True) -> None:
        self.tokenizer, self.limit, self.source, self.warn = tokenizer, limit, source, warn
        self.skipped = 0  # problems skipped so far, in all
        self._common: list[int] | None = None  # the token prefix of every prompt admitted so far

    @property
    def shared_tokens(self) -> int:
        """How many leading tokens every prompt admitted so far has in common (0 before the first)."""
        return len(self._common or [])

    def apply(self, stream: Iterator[Problem]) -> Iterator[Problem]:
        run: dict[tuple[str, str], int] = {}  # (id, question) -> showings skipped since the last that fit
        first = ""  # the first of them
        last: tuple[str, str] | None = None  # the previous problem skipped
        streak = 0  # how many in a row (at most MAX_SKIPS)
        for problem in stream:
            ids = render_prompt_ids(self.tokenizer, problem.messages)
            n = len(ids)
            if n <= self.limit.tokens:
                # a new list: commonprefix slices one of its arguments
                self._common = os.path.commonprefix([ids if self._common is None else self._common, ids])
                run.clear()
                streak, last = 0, None
                yield problem
                continue
            key = (problem.id, str(problem.meta.get("question", "")))
            if not run:
                first = _named(problem, n)
            if key != last or streak >= REPEATS_MERGED:  # a duplicate right after its twin: one showing
                run[key] = run.get(key, 0) + 1
            last = key
            if min(run.values()) >= 3 or streak >= MAX_SKIPS:
                raise ValueError(
                    f"{self.source}: every training prompt is longer than {self.limit.tokens} tokens "
                    f"({self.limit.why}); the first: {first}"
                )
            streak += 1
            self.skipped += 1
            if self.skipped == 1 and self.warn:
                log.warning(
                    "%s: skipped prompt %s: longer than %d tokens (%s); every prompt skipped is counted in "
                    "prompts_too_long (metrics.jsonl, accounting.json)",
                    self.source,
                    _named(problem, n),
                    self.limit.tokens,
                    self.limit.why,
                )
