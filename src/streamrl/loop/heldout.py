"""Held-out evaluation inside a training run: the eval.json record of the base and final models (kept
across a resume) and the periodic evaluation of eval.every."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from streamrl.config import Config
from streamrl.data.task import Task
from streamrl.eval.heldout import EvalResult, evaluate
from streamrl.eval.sampled import evaluate_sampled
from streamrl.eval.sampling_metrics import default_ks
from streamrl.eval.stats import paired_difference_interval
from streamrl.types import EvalStopped, Problem


def _difference(base: list[bool], final: list[bool]) -> dict[str, Any]:
    """The paired difference final - base over the same problems, with its 95% interval."""
    mean, lo, hi = paired_difference_interval(base, final)
    return {"mean": mean, "ci95": [lo, hi]}


def eval_record(base: EvalResult | None, final: EvalResult | None) -> dict[str, Any]:
    """eval.json's record of a run's base and final evaluations (either may be None)."""
    out: dict[str, Any] = {
        "base": base.summary() if base else None,
        "final": final.summary() if final else None,
    }
    if base and final:
        out["difference"] = _difference(base.correct, final.correct)
    if base or final:  # a few responses of each model evaluated, to read
        out["samples"] = {k: r.samples for k, r in (("base", base), ("final", final)) if r is not None}
    out["per_problem_correct"] = {
        k: [int(c) for c in r.correct] for k, r in (("base", base), ("final", final)) if r is not None
    }
    return out


def without_final(record: dict[str, Any]) -> dict[str, Any]:
    """eval.json's record without its final evaluation: a resumed run that trains on ends with other
    weights (the report would plot the old final accuracy at its newest step)."""
    out = {k: v for k, v in record.items() if k not in ("final", "difference")}
    for part in ("per_problem_correct", "samples"):  # {"base": ..., "final": ...}
        if part in record:
            out[part] = {k: v for k, v in record[part].items() if k != "final"}
    return out


def run_eval_record(base: EvalResult | None, final: EvalResult | None, old: dict[str, Any]) -> dict[str, Any]:
    """The record at a run's end; `old`: eval.json as the run found it (a resumed run's base evaluation,
    measured by the first run, and a `streamrl eval` record of the directory are kept)."""
    evals = eval_record(base, final)
    old_base = old.get("per_problem_correct", {}).get("base")
    if base is None and old_base:  # resumed: the base model was evaluated by the first run
        evals["base"] = old["base"]
        evals["per_problem_correct"]["base"] = old_base
        if "base" in old.get("samples", {}):
            evals.setdefault("samples", {})["base"] = old["samples"]["base"]
        if final is not None and len(old_base) == len(final.correct):
            evals["difference"] = _difference([bool(c) for c in old_base], final.correct)
    if "sampled" in old:  # a `streamrl eval` of this run directory (it names the model it read)
        evals["sampled"] = old["sampled"]
    return evals


EVAL_SEED = 1_000_037  # periodic sampled evaluation draws from its own generator


def periodic_eval(
    engine: Any,
    tokenizer: Any,
    task: Task,
    heldout: list[Problem],
    cfg: Config,
    stop: Callable[[], bool] | None = None,
) -> dict[str, Any]:
    """Held-out metrics during training (eval.every): greedy accuracy, and pass@k etc. with eval.n > 0.
    The samples come from a generator of their own (the same stream at every evaluation), so the colocated
    engine's, which draws the training rollouts, is left where it was. stop: asked before each decode
    step; once True the evaluation ends there and measures nothing ({}): a Ctrl-C does not wait for it."""
    try:
        return _periodic_eval(engine, tokenizer, task, heldout, cfg, stop)
    except EvalStopped:
        return {}


def _periodic_eval(
    engine: Any,
    tokenizer: Any,
    task: Task,
    heldout: list[Problem],
    cfg: Config,
    stop: Callable[[], bool] | None,
) -> dict[str, Any]:
    if cfg.eval.n > 0:
        ks = sorted(set(cfg.eval.k)) or default_ks(cfg.eval.n)
        e = cfg.eval
        training_rng = getattr(engine, "generator", None)
        if training_rng is not None:
            engine.generator = torch.Generator().manual_seed(EVAL_SEED + cfg.seed)
        try:
            res = evaluate_sampled(
                engine,
                tokenizer,
                task,
                heldout,
                e.n,
                ks,
                e.temperature,
                cfg.rollout.top_p,
                e.max_new_tokens,
                stop,
            )
        finally:
            if training_rng is not None:
                engine.generator = training_rng
        s = res.summary()
        out = {f"heldout_{k}": v for k, v in s.items() if k.startswith(("pass@", "avg@", "maj@"))}
        return {"heldout_accuracy": s["greedy_accuracy"], "heldout_eval_time": res.seconds, **out}
    res_g = evaluate(
        engine, tokenizer, task, heldout, cfg.eval.max_new_tokens, cfg.env.agent_timeout_s, stop=stop
    )
    return {"heldout_accuracy": res_g.accuracy, "heldout_eval_time": res_g.seconds}
