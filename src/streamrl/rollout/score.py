"""Rollout-side scoring: every response goes through a RewardService, then shaping is applied.

`TaskScorer` is the picklable scorer the service runs: the task's verifier (reasoning-gym, math-verify,
the code sandbox) or an LLM judge, plus the format bonus. `Scoring` owns the service of one process
(the colocated trainer or one rollout worker): `submit` starts scoring a trajectory the moment it is
generated, `apply` writes the outcome into it (reward + overlong shaping, correctness, and the scoring
facts the step metrics count: error reason, latency, cache hit). A scorer that fails, hangs or crashes
costs that one reward (0.0 plus a counted reason), never the run.

`reward.step_budget_s` bounds how long a step waits for its scores once its responses are generated:
the colocated loop's scoring rounds of one step share it (`begin_step`, `score`); a rollout worker gives
each group that long after its last response (`deadline`, `outcome`). Scores still outstanding then
cost their reward (0.0, reason "step_budget"); requests still queued in the service are cancelled.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import json
import logging
import math
import threading
import time
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any

from streamrl.data.answers import reference_text
from streamrl.data.task import Task
from streamrl.observe.error_examples import fit_message, one_line
from streamrl.rewards.fn_formats import sample_args
from streamrl.rewards.service import RewardOutcome, RewardService
from streamrl.rewards.shaping import overlong_penalty
from streamrl.rewards.user_fns import TASK, RewardFn, call_fn, configured_fns, load_fns, reward_columns
from streamrl.rewards.workers import ScoreFailed, error_label, keep_on_failure
from streamrl.types import BUDGET_REASON, Problem, Trajectory

log = logging.getLogger(__name__)


def outcome_reward(
    task: Task, problem: Problem, text: str, format_weight: float
) -> tuple[float, bool, dict[str, Any]]:
    """-> (reward, correct, info). reward = value + format_weight * 1[format followed], where value =
    score.value when the task gives one, else 1[correct]."""
    s = task.score(problem, text)
    value = float(s.correct) if s.value is None else s.value
    reward = value + format_weight * float(s.formatted)
    return reward, s.correct, {"extracted": s.extracted, "formatted": s.formatted}


def error_message(reason: str, detail: Any, fn: Any = None, problem: Any = None) -> str:
    """One failure as the user reads it: `KeyError: 'answer_x' (reward function f, problem 12)`, a long
    detail cut so that the whole fits in MESSAGE_CHARS (fit_message)."""
    where = ", ".join(x for x in (fn and f"reward function {fn}", problem and f"problem {problem}") if x)
    text = one_line(str(detail or "")) or "(no message)"  # line breaks only: no message either
    return fit_message(f"{reason}: ", text, f" ({where})" if where else "")


class TaskScorer:
    """scorer(problem, text) -> (reward, info). Builds its task (or judge) lazily in whichever process
    runs it, so only the config travels to a worker process."""

    name = "task"

    def __init__(self, cfg_dict: dict[str, Any], task: Any = None) -> None:
        self.cfg_dict = cfg_dict
        self._task = task
        self._cfg: Any = None
        self._judge: Any = None
        self._fns: list[RewardFn] = []
        self._loaded: dict[str, Any] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"cfg_dict": self.cfg_dict}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["cfg_dict"])  # type: ignore[misc]

    def setup(self) -> None:
        """Build what scoring needs before the first score (the service's workers call it on start)."""
        self._setup()

    def _setup(self) -> tuple[Any, Any]:
        """Config, task and judge, built once per process (scoring threads share them)."""
        with self._lock:
            if self._cfg is None:
                from streamrl.config import from_dict
                from streamrl.tasks import task_from_config

                cfg = from_dict(self.cfg_dict)
                if self._task is None:
                    self._task = task_from_config(cfg)
                if cfg.reward.scorer == "judge":
                    from streamrl.rewards.judge import JudgeScorer, judge_config

                    self._judge = JudgeScorer(judge_config(cfg.reward))
                self._fns = configured_fns(cfg.reward.fn, cfg.reward.fns, cfg.reward.completions)
                self._loaded = load_fns(self._fns)
                self._cfg = cfg
            return self._cfg, self._task

    def _verdict(self, problem: Problem, text: str) -> tuple[float, dict[str, Any]]:
        """The task's own reward and verdict: (reward, info with "correct")."""
        cfg, task = self._setup()
        if self._judge is not None:
            score, info = self._judge(problem.meta.get("question", ""), reference_text(problem), text)
            return float(score), {**info, "correct": score >= cfg.reward.judge_pass_threshold}
        reward, correct, info = outcome_reward(task, problem, text, cfg.reward.format_weight)
        return reward, {**info, "correct": correct}

    def __call__(
        self, problem: Problem, text: str, ids: tuple[int, ...] = ()
    ) -> tuple[float, dict[str, Any]]:
        cfg, _ = self._setup()
        if not self._fns:
            return self._verdict(problem, text)
        # your own functions: reward = sum_i weight_i * value_i; "correct" stays the task's verdict, which
        # the accuracy, the curriculum sampler and the replay buffer read even when the reward does not
        try:
            reward, info = self._verdict(problem, text)
        except (Exception, SystemExit) as e:
            if any(f.spec == TASK for f in self._fns):  # the reward is made of it: the score fails
                raise
            # a reward of your functions alone: a verdict that fails costs its accuracy only
            label = error_label(e)
            detail = error_message(label, str(e), problem=problem.id)
            reward, info = 0.0, {"correct": False, "verdict_error": label, "verdict_error_detail": detail}
        columns = reward_columns(problem)
        total = 0.0
        for f in self._fns:
            try:
                if f.spec == TASK:
                    value = reward
                else:  # a function that hangs or kills its worker still costs its reward only, named
                    keep_on_failure({"correct": info["correct"], "reward_fn": f.name})
                    prompt, completion = sample_args(f.completions, problem, text)
                    fn = self._loaded[f.name]
                    value = call_fn(fn, prompt, completion, list(ids), columns, cfg.reward.timeout_s)
            except (Exception, SystemExit) as e:  # the sample's reward fails; its accuracy does not
                raise ScoreFailed(e, {"correct": info["correct"], "reward_fn": f.name}) from e
            info[f"reward/{f.name}"] = value
            total += 0.0 if value is None else f.weight * value
        return total, info


class Scoring:
    """The scoring of one process. cfg.reward.service picks thread (default), process or inline.
    first_failure_level: how the service logs the first failure of each kind (RewardService); DEBUG in
    a process whose step records show each kind's first message (observe/error_examples.py)."""

    def __init__(self, cfg: Any, task: Any = None, first_failure_level: int = logging.WARNING) -> None:
        from streamrl.config import to_dict

        rc = cfg.reward
        self.cfg, self.task = cfg, task  # task: None unless the caller built it (env tasks need it)
        scorer = TaskScorer(to_dict(cfg), task if rc.service != "process" else None)
        self.service = RewardService(
            scorer,
            workers=rc.workers,
            timeout_s=rc.timeout_s,
            cache_size=rc.cache_size,
            mode=rc.service,
            first_failure_level=first_failure_level,
        )
        self.budget_s = rc.step_budget_s  # 0: no limit
        self.budget_left = self.budget_s  # what the current step has not used yet (score)
        self.expired = 0  # scores this process gave up on at the budget, in all
        self.waited_s = 0.0  # seconds `outcomes` waited for scores, in all
        self.ids_in_key = bool(rc.fn or rc.fns)  # your reward functions read the token ids too
        self.columns_in_key = bool(rc.fn or rc.fns)  # ... and the data row's columns
        # id(problem) -> (problem, the reference part of its responses' cache keys), most recent last
        self._references: OrderedDict[int, tuple[Problem, Any]] = OrderedDict()
        self._references_lock = threading.Lock()

    def begin_step(self) -> None:
        """A new step: its scoring rounds (score calls) share a fresh reward.step_budget_s."""
        self.budget_left = self.budget_s

    def deadline(self) -> float:
        """When scores whose responses are all generated now run out of budget (inf: no budget)."""
        return time.monotonic() + self.budget_s if self.budget_s > 0 else math.inf

    def outcome(self, fut: Future[RewardOutcome]) -> RewardOutcome:
        """fut's outcome when it is done; else the budget's: reward 0, reason "step_budget" (a request
        still queued is cancelled, so the service does not score it for nobody)."""
        if fut.done() and not fut.cancelled():
            return fut.result()
        if not fut.cancel() and fut.done() and not fut.cancelled():  # scored in between: it counts
            return fut.result()
        self.expired += 1
        detail = f"no score within reward.step_budget_s={self.budget_s:g}"
        return RewardOutcome(0.0, {"error_detail": detail}, BUDGET_REASON, self.budget_s)

    def submit(self, problem: Problem, traj: Trajectory) -> Future[RewardOutcome]:
        return self.submit_text(problem, traj.text, tuple(traj.completion_ids))

    def submit_text(self, problem: Problem, text: str, ids: tuple[int, ...] = ()) -> Future[RewardOutcome]:
        """A response's score, from the service (an agent's final text has no token ids of its own)."""
        # identical (problem, response) pairs are scored once; the problem id pins the reference. Reward
        # functions read the token ids too, and one text has several tokenizations (a sample that ended
        # with another stop token, say): with them, the ids are part of the response
        key = (problem.id, self._reference(problem), text, ids if self.ids_in_key else None)
        return self.service.submit(problem, text, ids, cache_key=key)

    def _reference(self, problem: Problem) -> Any:
        """The reference part of the cache keys of `problem`'s responses (reference_key), computed once
        per problem: a group's samples share their problem, and its digests cost a JSON dump of its
        tests and columns each. The last _REFERENCES_KEPT problems are kept, by identity."""
        with self._references_lock:
            kept = self._references.get(id(problem))
            if kept is not None and kept[0] is problem:
                self._references.move_to_end(id(problem))
                return kept[1]
        ref = reference_key(problem, self.columns_in_key)
        with self._references_lock:
            self._references[id(problem)] = (problem, ref)  # held: its id is not reused while kept
            while len(self._references) > _REFERENCES_KEPT:
                self._references.popitem(last=False)
        return ref

    def apply(self, traj: Trajectory, outcome: RewardOutcome) -> None:
        """Reward = scorer reward (correctness + format_weight * format; 0 on failure) + DAPO overlong
        shaping - length_penalty * tokens; the scoring facts go into reward_info."""
        info = dict(outcome.info)
        # a failed score is wrong unless it kept the task's verdict (only your own function failed)
        correct = bool(info.pop("correct", False))
        detail, fn = info.pop("error_detail", None), info.pop("reward_fn", None)
        rc, cap = self.cfg.reward, self.cfg.rollout.max_new_tokens
        n = len(traj.completion_ids)
        shaping = overlong_penalty(n, cap, rc.overlong_buffer, rc.overlong_penalty) - rc.length_penalty * n
        traj.reward = outcome.reward + shaping
        traj.correct = correct
        traj.reward_info = {
            **info,
            "reward_error": outcome.error,
            "reward_latency_s": outcome.latency_s,
            "reward_cached": outcome.cached,
        }
        if outcome.error is not None:  # its message: the step record keeps the first of each reason
            msg = error_message(outcome.error, detail, fn=fn, problem=traj.problem_id)
            traj.reward_info["reward_error_detail"] = msg

    def score(self, pairs: list[tuple[Problem, Trajectory]]) -> None:
        """Score many trajectories concurrently (all submitted before any is awaited), waiting at most
        what is left of the step's budget."""
        outcomes = self.outcomes([self.submit(p, t) for p, t in pairs])
        for (_, traj), o in zip(pairs, outcomes):
            self.apply(traj, o)

    def outcomes(self, futures: list[Future[RewardOutcome]]) -> list[RewardOutcome]:
        """Each future's outcome, waiting at most what is left of the step's budget (`outcome`'s for
        those still outstanding then)."""
        t0 = time.monotonic()
        wait = self.budget_left if self.budget_s > 0 else None
        _, pending = concurrent.futures.wait(futures, timeout=wait)
        waited = time.monotonic() - t0
        self.waited_s += waited
        if self.budget_s > 0:  # scores still outstanding: the whole budget is spent
            self.budget_left = 0.0 if pending else max(0.0, self.budget_left - waited)
        return self.settled(futures)

    def settle(self, scored: list[tuple[Trajectory, Future[RewardOutcome]]]) -> None:
        """Write each future's outcome into its trajectory (the budget's for those not done: `outcome`)."""
        for (traj, _), o in zip(scored, self.settled([fut for _, fut in scored])):
            self.apply(traj, o)

    def settled(self, futures: list[Future[RewardOutcome]]) -> list[RewardOutcome]:
        """The futures' outcomes now (`outcome`); one warning line the first time some ran out of budget
        in this process (later ones at DEBUG)."""
        outcomes = [self.outcome(fut) for fut in futures]
        n = sum(o.error == BUDGET_REASON for o in outcomes)
        if n:
            log.log(
                logging.WARNING if self.expired == n else logging.DEBUG,
                "reward.step_budget_s=%g: %d of %d score(s) still outstanding count as reward 0 "
                "(reason %s); the scorer is slow or hanging",
                self.budget_s,
                n,
                len(outcomes),
                BUDGET_REASON,
            )
        return outcomes

    def close(self) -> None:
        self.service.close(wait=False)


class ScoreWait:
    """How long a rollout worker waits, after a decode step, for the scores of the groups whose last
    response that step generated. A score submitted after a step would otherwise be looked at only
    after the next one, so the group would reach the trainer a whole decode step late; a short wait lets
    it go at once. Waiting idles the engine, so it is bounded by an allowance that decoding earns:
    `share` of every second spent decoding, held at most `cap_s`. A fast scorer (a verifier, the score
    cache) costs a few milliseconds a step; a slow one (a sandbox, a judge) spends the allowance and
    the worker then waits no longer than `share` of its decode time for it."""

    def __init__(self, share: float = 0.1, cap_s: float = 0.05) -> None:
        self.share, self.cap_s = share, cap_s
        self.allowance = cap_s  # seconds the next wait may take

    def earn(self, decode_s: float) -> None:
        """Decoding took decode_s: the allowance grows by share * decode_s, up to cap_s."""
        self.allowance = min(self.cap_s, self.allowance + self.share * decode_s)

    def wait(self, futures: list[Future[RewardOutcome]]) -> float:
        """Wait until every future is done or the allowance is spent; the time taken is deducted and
        returned (seconds: the engine's idle time, not its generating time)."""
        pending = [f for f in futures if not f.done()]
        if not pending or self.allowance <= 0:
            return 0.0
        t0 = time.perf_counter()
        concurrent.futures.wait(pending, timeout=self.allowance)
        waited = time.perf_counter() - t0
        self.allowance -= waited
        return waited


# problems whose cache-key reference Scoring keeps: more than the groups a process has in flight at once
_REFERENCES_KEPT = 256


def reference_key(problem: Problem, columns: bool) -> Any:
    """What pins the reference in the cache key of a response to `problem`, beside its id: its answer; a
    code row's tests (a digest: the cache keeps thousands of keys) and a row's accepted answers, as two
    streamed rows of one prompt share an id and an answer; with `columns` (your reward functions read
    the row's columns) a digest of them, as two rows of one prompt may differ there."""
    tests, answers = problem.meta.get("tests"), problem.meta.get("answers")
    ref = (problem.answer, _digest(tests)) if tests else problem.answer
    if answers:
        ref = (ref, tuple(answers))
    if columns:
        ref = (ref, _digest(reward_columns(problem)))
    return ref


def _digest(value: Any) -> bytes:
    """16 bytes that tell one JSON-like value from another."""
    try:
        text = json.dumps(value, sort_keys=True, default=repr)
    except (TypeError, ValueError):  # keys of mixed types do not sort ({1: .., "a": ..}); a cycle
        text = repr(value)
    return hashlib.blake2b(text.encode(), digest_size=16).digest()
