"""The two sides of benchmarks/vs_trl.py, each run in its own fresh process: train, evaluate, write a JSON.

Both sides report the same quantities, measured over the training loop only (after setup and the base
evaluation, before the final evaluation):
  steps, train_s, samples (trained), gen_tokens (completion tokens of the trained samples),
  trained_tokens (prompt + completion tokens trained), accuracy before/after on the same held-out set,
  evaluated greedily by streamrl's eval/heldout.py on each side's final weights.
train_s is the training clock (loop/train_clock.py): the loop's wall time minus periodic state saves,
checkpoint exports and periodic evaluation (streamrl) or the saves below (TRL); paused_s is what it left out.

With eval_every = K > 0 each side also saves its policy every K optimizer steps (streamrl
checkpoint.every, TRL trainer.save_model from a callback), with the clock paused, and after training
evaluates each saved policy the same way, then deletes it: `curve` holds the evaluation points (the base
model at 0 s, every K-th step, the final weights) with the training seconds of each
(benchmarks/time_to_accuracy.py).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from itertools import islice
from pathlib import Path
from typing import Any

from run_state import drop_resume_state

from streamrl.config import Config, load_config
from streamrl.models.precision import resolve_precision


def job_config(overrides: list[str], steps: int, budget_s: float, eval_size: int | None) -> Config:
    """The streamrl Config of the compared job (defaults <- overrides <- the benchmark's own keys)."""
    from streamrl.data.task import default_task_args

    extra = [f"max_steps={steps}", f"max_time={budget_s}", "eval.before=true", "eval.after=true"]
    extra.append("eval.every=0")
    if eval_size is not None:
        extra.append(f"eval.size={eval_size}")
    cfg = load_config(None, [*overrides, *extra])
    if not cfg.task_config.args:
        cfg.task_config.args = default_task_args(cfg.task)
    return cfg


def _accuracy(summary: dict[str, Any] | None) -> dict[str, Any] | None:
    if not summary:
        return None
    return {k: summary[k] for k in ("accuracy", "n", "correct", "ci95", "format_rate")}


def heldout_eval(cfg: Config, model: Any, tokenizer: Any, task: Any, heldout: list[Any]) -> Any:
    """Greedy held-out evaluation as streamrl's job does it: its evaluator on an engine in
    rollout.precision (auto by default: a bf16 weight copy where the device has bf16 units): the sides
    compare like for like."""
    from streamrl.engine.hf import HFEngine
    from streamrl.eval.heldout import evaluate
    from streamrl.models.precision import precision_dtype

    dtype = precision_dtype(cfg.rollout.precision, cfg.device)
    engine = HFEngine(model, tokenizer, cfg.rollout.max_batch, cfg.seed, cfg.device, dtype)
    return evaluate(engine, tokenizer, task, heldout, cfg.eval.max_new_tokens)


def evaluate_saved(cfg: Config, path: Path, tokenizer: Any, task: Any, heldout: list[Any]) -> Any:
    """heldout_eval of the weights saved in `path`, loaded as a user would load them."""
    from streamrl.models import load_model

    return heldout_eval(cfg, load_model(path, cfg.device), tokenizer, task, heldout)


def saved_points(cfg: Config, saved: dict[int, Path], seconds: dict[int, float], final_step: int) -> list:
    """The evaluation points of the policies saved before the final step, in step order; then deletes
    every saved policy (the final one is evaluated by the side itself)."""
    from time_to_accuracy import point

    from streamrl.models import load_tokenizer, resolve_model_dir
    from streamrl.tasks import prepare_split, task_from_config

    tokenizer = load_tokenizer(resolve_model_dir(cfg.model, cfg.seed))
    task = task_from_config(cfg)
    heldout, _ = prepare_split(task, cfg)
    out = []
    for step in sorted(s for s in saved if s < final_step):
        print(f"[vs_trl] evaluating step {step}'s policy on {len(heldout)} held-out problems", flush=True)
        res = evaluate_saved(cfg, saved[step], tokenizer, task, heldout)
        out.append(point(step, seconds[step], res.correct))
    for path in saved.values():
        shutil.rmtree(path)
    return out


def run_streamrl(cfg: Config, work: Path, eval_every: int = 0) -> dict[str, Any]:
    """streamrl's own entry point, run_train, as `streamrl train` runs it."""
    from time_to_accuracy import point

    from streamrl.loop.job import run_train

    cfg.run_dir = str(work / "streamrl-run")
    cfg.checkpoint.save = False
    if eval_every:
        cfg.checkpoint.every = eval_every
        # the evaluation engine's rollout.precision copy of a bf16 export equals that of the fp32 weights
        cfg.checkpoint.dtype = resolve_precision(cfg.rollout.precision, cfg.device)
    summary = run_train(cfg)
    run_dir = Path(cfg.run_dir)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    drop_resume_state(run_dir)
    samples_per_step = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    timings = summary["timings"]
    curve = None
    if eval_every and rows:
        seconds = {int(r["step"]): float(r["train_elapsed"]) for r in rows}
        ckpts = run_dir / "checkpoints"
        saved = {int(d.name.split("-")[1]): d for d in ckpts.iterdir()} if ckpts.is_dir() else {}
        verdicts = summary["eval"]["per_problem_correct"]
        last = int(rows[-1]["step"])
        curve = [
            point(0, 0.0, verdicts["base"]),
            *saved_points(cfg, saved, seconds, last),
            point(last, seconds[last], verdicts["final"]),
        ]
        # the loop's wall time at each step, pauses counted: a step's record precedes its own pauses
        offset = float(rows[0]["time"]) - float(rows[0]["train_elapsed"])
        walls = {int(r["step"]): float(r["time"]) - offset for r in rows}
        for p in curve:
            p["wall_seconds"] = walls.get(p["step"], 0.0)
    return {
        "steps": len(rows),
        "train_s": timings["train_clock"],
        "paused_s": timings["train"] - timings["train_clock"],
        "setup_s": summary["timings"]["setup"],
        "eval_s": summary["timings"]["eval"],
        "samples": len(rows) * samples_per_step,
        # every sample generated, incl. groups dropped by dynamic sampling or carried over at the end
        "rollout_samples": summary["accounting"]["generated"] * cfg.rollout.samples_per_prompt,
        "gen_tokens": sum(r["tokens_generated"] for r in rows),
        "trained_tokens": sum(r["tokens_trained"] for r in rows),
        "reward_first": rows[0]["reward_mean"] if rows else None,
        "reward_last": rows[-1]["reward_mean"] if rows else None,
        "train_accuracy_last": rows[-1]["accuracy"] if rows else None,
        "groups": summary["accounting"],
        "before": _accuracy(summary["eval"].get("base")),
        "after": _accuracy(summary["eval"].get("final")),
        "curve": curve,
        "run_dir": str(run_dir),
    }


class RewardFromTask:
    """A TRL reward function that scores with streamrl's task and reward config (rollout/score.py and
    the shaping of rollout/score.py), and counts what it scored."""

    __name__ = "streamrl_task_reward"

    def __init__(self, cfg: Config, task: Any, problems: list[Any]) -> None:
        self.cfg, self.task, self.problems = cfg, task, problems
        self.gen_tokens = 0
        self.samples = 0
        self.correct = 0
        self.last_accuracy: float | None = None  # of the latest generation batch (one optimizer step)

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]],
        problem_index: list[int],
        **_: Any,
    ) -> list[float]:
        from streamrl.rewards.shaping import overlong_penalty
        from streamrl.rollout.score import outcome_reward

        rc, cap = self.cfg.reward, self.cfg.rollout.max_new_tokens
        out, batch_correct = [], 0
        for completion, ids, idx in zip(completions, completion_ids, problem_index):
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            reward, correct, _ = outcome_reward(self.task, self.problems[idx], text, rc.format_weight)
            n = len(ids)
            reward += overlong_penalty(n, cap, rc.overlong_buffer, rc.overlong_penalty)
            reward -= rc.length_penalty * n
            out.append(float(reward))
            self.gen_tokens += n
            self.samples += 1
            batch_correct += int(correct)
        self.correct += batch_correct
        self.last_accuracy = batch_correct / max(len(out), 1)
        return out


def prompt_ids_identical(tokenizer: Any, chats: list[list[dict[str, str]]]) -> int:
    """How many chats tokenize to the same ids in streamrl (render the text, then tokenize) and in TRL
    (apply_chat_template with tokenize=True, as GRPOTrainer does for conversational prompts)."""
    from streamrl.data.prompts import render_prompt_ids

    same = 0
    for chat in chats:
        trl_ids = tokenizer.apply_chat_template(
            chat, tokenize=True, add_generation_prompt=True, return_dict=True
        )
        same += int(list(trl_ids["input_ids"]) == render_prompt_ids(tokenizer, chat))
    return same


def progress_callback(
    budget_s: float,
    steps: int,
    reward: RewardFromTask | None,
    every: int = 0,
    save: Any = None,
    now: Any = time.perf_counter,
) -> Any:
    from transformers import TrainerCallback

    from streamrl.loop.train_clock import TrainClock

    class Progress(TrainerCallback):
        """One line per optimizer step; stops training once the wall-clock budget is spent (saves
        included, as streamrl's max_time); the training clock at each step (`seconds`); with every > 0,
        save(step, model) every `every` steps before the last, with the clock paused."""

        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            self.t0 = now()
            self.clock = TrainClock(now)
            self.seconds: dict[int, float] = {}

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kw: Any) -> None:
            if logs and "reward" in logs and reward is not None:
                el = now() - self.t0
                print(
                    f"[trl] step {state.global_step}/{steps}  reward {logs['reward']:.3f}  "
                    f"train acc {reward.last_accuracy or 0.0:.3f}  {el:.0f} s "
                    f"({el / max(state.global_step, 1):.1f} s/step)",
                    flush=True,
                )

        def on_step_end(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            step = int(state.global_step)
            self.seconds[step] = self.clock.elapsed
            if budget_s > 0 and now() - self.t0 >= budget_s:
                control.should_training_stop = True
            if every and step % every == 0 and step < steps and not control.should_training_stop:
                with self.clock.pause():
                    save(step, kw.get("model"))

    return Progress()


def run_trl(cfg: Config, work: Path, eval_every: int = 0) -> dict[str, Any]:
    """TRL's GRPOTrainer on the same model, prompts, reward and hyper-parameters (trl_settings.py)."""
    import torch
    from datasets import Dataset
    from time_to_accuracy import point
    from transformers.trainer_callback import PrinterCallback, ProgressCallback
    from trl import GRPOConfig, GRPOTrainer
    from trl_settings import grpo_config_kwargs, micro_batch_size

    from streamrl.data.prompts import render_prompt_ids
    from streamrl.models import load_model, load_tokenizer, resolve_model_dir
    from streamrl.tasks import prepare_split, task_from_config

    torch.set_num_threads(os.cpu_count() or 1)
    torch.manual_seed(cfg.seed)
    t_setup = time.perf_counter()
    model_dir = resolve_model_dir(cfg.model, cfg.seed)
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir, cfg.device)
    task = task_from_config(cfg)
    heldout, exclude = prepare_split(task, cfg)
    r = cfg.rollout
    # the training stream streamrl's uniform sampler draws, in its order (dynamic sampling aside)
    problems = list(islice(task.train_stream(cfg.seed, exclude), cfg.max_steps * r.prompts_per_step))
    dataset = Dataset.from_dict(
        {"prompt": [p.messages for p in problems], "problem_index": list(range(len(problems)))}
    )
    prompt_tokens = max(len(render_prompt_ids(tokenizer, p.messages)) for p in problems)
    identical = prompt_ids_identical(tokenizer, [p.messages for p in problems[:64]])
    print(f"[trl] prompt token ids identical to streamrl's: {identical}/{min(len(problems), 64)}", flush=True)
    samples = r.prompts_per_step * r.samples_per_prompt
    micro = micro_batch_size(samples, cfg.train.token_budget, prompt_tokens + r.max_new_tokens)
    kwargs = grpo_config_kwargs(cfg, cfg.max_steps, micro, str(work / "trl-out"))
    if "activation_checkpointing" not in {f.name for f in dataclasses.fields(GRPOConfig)}:
        kwargs.pop("activation_checkpointing")  # transformers < 5: only gradient_checkpointing exists
    shown = {k: v for k, v in kwargs.items() if k != "output_dir"}
    print(f"[trl] GRPOConfig: {json.dumps(shown)}", flush=True)
    setup_s = time.perf_counter() - t_setup

    print(f"[trl] evaluating the base model on {len(heldout)} held-out problems (greedy)...", flush=True)
    base = heldout_eval(cfg, model, tokenizer, task, heldout)
    print(f"[trl] base accuracy {base.accuracy:.3f}", flush=True)

    reward = RewardFromTask(cfg, task, problems)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[reward],
        args=GRPOConfig(**kwargs),
        train_dataset=dataset,
        processing_class=tokenizer,
    )
    for cb in (PrinterCallback, ProgressCallback):
        trainer.remove_callback(cb)
    saved: dict[int, Path] = {}

    def save(step: int, trained: Any) -> None:  # the weights alone: what load_model reads
        saved[step] = work / "trl-steps" / f"step-{step}"
        trained.save_pretrained(str(saved[step]))

    progress = progress_callback(cfg.max_time, cfg.max_steps, reward, eval_every, save)
    trainer.add_callback(progress)
    t0 = time.perf_counter()
    trainer.train()
    paused_s = progress.clock.paused
    train_s = time.perf_counter() - t0 - paused_s
    steps = int(trainer.state.global_step)
    trained_tokens = int(trainer.state.num_input_tokens_seen)
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    final_dir = work / "trl-final"
    trainer.save_model(str(final_dir))
    tokenizer.save_pretrained(str(final_dir))
    del trainer, model  # the final evaluation runs on the saved weights, as a user would load them

    final = evaluate_saved(cfg, final_dir, tokenizer, task, heldout)
    print(f"[trl] final accuracy {final.accuracy:.3f}", flush=True)
    curve = None
    if eval_every and steps:
        seconds = progress.seconds
        curve = [
            point(0, 0.0, base.correct),
            *saved_points(cfg, saved, seconds, steps),
            point(steps, seconds[steps], final.correct),
        ]
    return {
        "steps": steps,
        "train_s": train_s,
        "paused_s": paused_s,
        "setup_s": setup_s,
        "eval_s": base.seconds + final.seconds,
        "samples": reward.samples,
        "rollout_samples": reward.samples,  # synchronous: every generated sample is trained
        "gen_tokens": reward.gen_tokens,
        "trained_tokens": trained_tokens,
        "reward_first": rewards[0] if rewards else None,
        "reward_last": rewards[-1] if rewards else None,
        "train_accuracy_last": reward.last_accuracy,
        "micro_batch": micro,
        "prompt_ids_identical": [identical, min(len(problems), 64)],
        "before": _accuracy(base.summary()),
        "after": _accuracy(final.summary()),
        "curve": curve,
        "run_dir": str(final_dir),
    }
