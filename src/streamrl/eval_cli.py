"""`streamrl eval model=NAME_OR_CHECKPOINT task=... n=16 k=1,4,16 run_dir=...`: evaluate a model on the
task's held-out problems and write eval.json (merged under the key "sampled" when the run directory
already has one, so a training run's evaluation is never overwritten). A trained run's checkpoint is
evaluated with the run's task settings unless given others (eval_settings.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console
from rich.table import Table

from streamrl.config import Config, config_yaml
from streamrl.data.task import default_task_args, prompt_key
from streamrl.eval.sampling_metrics import default_ks
from streamrl.eval_settings import SHORTHANDS, trained_run
from streamrl.files import update_json
from streamrl.run_dirs import holds_run


def expand_shorthands(overrides: list[str]) -> list[str]:
    """n=8 -> eval.n=8 (likewise k, temperature, size): the eval command's own short keys."""
    out = []
    for item in overrides:
        key, sep, value = item.partition("=")
        out.append(f"{SHORTHANDS[key]}={value}" if sep and key in SHORTHANDS else item)
    return out


TRAINING_KEYS = ("split", "args", "columns", "sources")  # what decides the training split's rows


def refuse_trained_problems(cfg: Config, task: Any) -> None:
    """Held-out problems taken from the training split that the model's own run did not keep out of its
    training (problems outside its own held-out set, or any when it held out rows of another file or
    split): one line before any weights load. Silent where the two read the training split differently."""
    found = trained_run(cfg.model)
    if found is None or not task.heldout_from_training():
        return
    run, trained = found
    ours = yaml.safe_load(config_yaml(cfg))["task_config"]  # as the run's config.yaml records it
    theirs = trained.get("task_config") or {}
    for side in (ours, theirs):  # a run records the default args it filled in; the eval's are empty
        side["args"] = side.get("args") or yaml.safe_load(yaml.safe_dump(default_task_args(cfg.task)))
    if trained.get("task") != cfg.task or any(k in theirs and theirs[k] != ours[k] for k in TRAINING_KEYS):
        return
    if held_keys := " ".join(
        f"task_config.{k}={theirs[k]}" for k in ("eval_data", "eval_split") if theirs.get(k)
    ):
        raise ValueError(  # its held-out rows were elsewhere: this evaluation takes what it trained on
            f"the run in {run} held out {held_keys} and trained on every problem of {cfg.task}'s training "
            f"split, which this evaluation takes: evaluate with {held_keys}"
        )
    theirs_streamed, ours_streamed = (str(bool(side.get("streaming"))).lower() for side in (theirs, ours))
    if theirs_streamed != ours_streamed:  # streamed: the first rows in file order; else the hashed order's
        raise ValueError(
            f"the run in {run} read {cfg.task} with task_config.streaming={theirs_streamed}, which holds out "
            f"other problems than task_config.streaming={ours_streamed} takes: evaluate with "
            f"task_config.streaming={theirs_streamed}"
        )
    held = (trained.get("eval") or {}).get("size")
    if not isinstance(held, int):
        return
    # by the problems, not the sizes: a mixture's smaller held-out set is not always inside a larger one
    kept = {prompt_key(p) for p in task.heldout(held)} if held else set()
    if open_to_training := sum(prompt_key(p) not in kept for p in task.heldout(cfg.eval.size)):
        fix = f"set size={held}, or evaluate" if held else "evaluate"
        raise ValueError(
            f"config key 'eval.size' is {cfg.eval.size}, but the run in {run} held out {held} problems of "
            f"{cfg.task}, and {open_to_training} of the {cfg.eval.size} this evaluation takes were open to "
            f"its training: {fix} on rows of your own (task_config.eval_data)"
        )


def run_eval(cfg: Config, console: Console | None = None) -> dict[str, Any]:
    import torch

    from streamrl.data.prompts import check_template
    from streamrl.engine.hf import HFEngine
    from streamrl.eval.heldout import evaluate
    from streamrl.eval.sampled import evaluate_sampled
    from streamrl.models.device import check_device
    from streamrl.models.precision import precision_dtype
    from streamrl.models.resolve import load_tokenizer, resolve_model_files
    from streamrl.models.startup import start_model
    from streamrl.preflight import check_run_dir
    from streamrl.tasks import prepare_split, task_from_config

    console = console or Console(stderr=True)
    if cfg.eval.size == 0:  # before the task's data is read
        raise ValueError("config key 'eval.size' is 0: nothing to evaluate (set size=N)")
    check_device(cfg.device)
    run_dir = Path(cfg.run_dir) if cfg.run_dir else Path("runs") / f"eval-{time.strftime('%Y%m%d-%H%M%S')}"
    check_run_dir(run_dir, may_hold_run=True)  # before the evaluation, not after it
    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(cfg.seed)
    task = task_from_config(cfg)
    refuse_trained_problems(cfg, task)
    problems, _ = prepare_split(task, cfg)  # the same held-out set and few-shot turns as training
    if not problems:
        raise ValueError("config key 'eval.size' is 0: nothing to evaluate (set size=N)")
    tc = cfg.task_config  # a template that refuses the prompt (a system turn, say): one line, no weights
    tokenizer = load_tokenizer(resolve_model_files(cfg.model, cfg.seed), tc.chat_template, cfg.model)
    check_template(tokenizer, problems[0], tc.chat_template, cfg.model, cfg.task)
    dtype = precision_dtype(cfg.rollout.precision, cfg.device)
    started = start_model(cfg.model, cfg.seed, cfg.device, dtype, tc.chat_template, tokenizer)
    engine = HFEngine(
        started.model,
        tokenizer,
        cfg.rollout.max_batch,
        cfg.seed,
        cfg.device,
        prefix_cache=cfg.rollout.prefix_cache,
    )
    e = cfg.eval
    console.print(f"evaluating {cfg.model} on {len(problems)} held-out problems of {cfg.task} (n={e.n})...")
    start = time.perf_counter()
    if e.n > 0:
        ks = sorted(set(e.k)) or default_ks(e.n)
        res = evaluate_sampled(
            engine, tokenizer, task, problems, e.n, ks, e.temperature, cfg.rollout.top_p, e.max_new_tokens
        )
        result = {**res.summary(), "examples": res.examples}
    else:
        greedy = evaluate(engine, tokenizer, task, problems, e.max_new_tokens, cfg.env.agent_timeout_s)
        s = greedy.summary()
        result = {**s, "problems": s["n"], "n": 0, "ks": [], "greedy_accuracy": s["accuracy"]}
    temperature = e.temperature if e.n > 0 else 0.0  # greedy alone: no sampling temperature
    result.update(
        model=cfg.model, task=cfg.task, temperature=temperature, seconds=time.perf_counter() - start
    )
    print_eval_table(result, console)
    run_dir.mkdir(parents=True, exist_ok=True)
    path = run_dir / "eval.json"

    def merge(old: dict[str, Any]) -> dict[str, Any]:
        # a training run's directory (it may still be training, its eval.json not yet written): the run's
        # own record stays and this one goes under "sampled", which the run keeps when it writes eval.json
        in_run = holds_run(run_dir) or (old and "greedy_accuracy" not in old)
        return {**old, "sampled": result} if in_run else result

    update_json(path, merge)  # under the lock the run takes for its own updates of eval.json
    console.print(f"written {path}")
    return result


def print_eval_table(r: dict[str, Any], console: Console) -> None:
    table = Table(title=f"streamrl eval: {r['model']} on {r['task']}", show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    lo, hi = r.get("greedy_ci95", r.get("ci95", [0.0, 1.0]))
    table.add_row("problems", str(r["problems"]))
    table.add_row("greedy accuracy", f"{r['greedy_accuracy']:.1%} (95% CI {lo:.1%}-{hi:.1%})")
    for key in [k for k in r if k.startswith(("pass@", "avg@", "maj@"))]:
        table.add_row(key, f"{r[key]:.1%}")
    table.add_row("mean length (tokens)", f"{r['mean_length']:.1f}")
    if "truncation_rate" in r:
        table.add_row("truncation rate", f"{r['truncation_rate']:.1%}")
    table.add_row("time", f"{r['seconds']:.1f} s")
    console.print(table)
