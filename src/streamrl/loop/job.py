"""The train job: set up, evaluate the base model, run the RL loop, evaluate again, save, summarise."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
from rich.console import Console

from streamrl.config import Config, config_yaml
from streamrl.config_validate import resolved_weight_sync
from streamrl.data.prompt_limit import PromptFilter, prompt_limit
from streamrl.data.replay import make_replay, replay_kept_note
from streamrl.data.samplers import Sampler, make_sampler
from streamrl.data.task import Task, default_task_args
from streamrl.engine.hf import HFEngine
from streamrl.eval.heldout import EvalStopped, evaluate
from streamrl.files import hold_run_dir, update_json, write_text_atomic
from streamrl.loop.asynchronous import AsyncRunner
from streamrl.loop.colocated import ColocatedRunner
from streamrl.loop.export import CheckpointWriteError, export_checkpoint, export_stop, prune_exports
from streamrl.loop.heldout import eval_record, periodic_eval, run_eval_record, without_final
from streamrl.loop.ledger import Ledger
from streamrl.loop.restore import restore
from streamrl.loop.run_dir import (
    PeriodicSaver,
    StopSaver,
    claim_run_dir,
    reconcile_logs,
    stop_message,
    write_run_files,
)
from streamrl.loop.signals import StopFlag
from streamrl.loop.state import RunState, latest_state, save_state
from streamrl.loop.step import StepRecord
from streamrl.loop.train_clock import TrainClock
from streamrl.models.precision import precision_dtype, precision_record, precision_warning, run_precision_line
from streamrl.models.startup import start_model
from streamrl.observe.environment import collect_environment
from streamrl.observe.live import RunObserver
from streamrl.observe.metrics import GroupLog
from streamrl.observe.model_card import Accuracy
from streamrl.observe.progress import StepProgress
from streamrl.observe.summary import print_summary
from streamrl.placement.colocated import push_policy
from streamrl.placement.cores import elastic_enabled, thread_split
from streamrl.placement.forkserver import start_server_for
from streamrl.placement.leftovers import name_semaphores_after_this_process, remove_leftovers
from streamrl.placement.trainer_ranks import make_trainer
from streamrl.preflight import Checked, preflight
from streamrl.tasks import prepare_split, task_from_config
from streamrl.trainer.trainer import Trainer
from streamrl.types import Problem


@dataclass
class Components:
    model: Any
    tokenizer: Any
    task: Task
    heldout: list[Problem]
    stream: Sampler  # rollout.sampler over the training split; feedback through stream.observe
    engine: HFEngine
    trainer: Trainer
    resolve_seconds: float
    prompts: PromptFilter  # under the stream: skips (and counts) prompts too long to train on


def build_components(
    cfg: Config,
    task: Task | None = None,
    split: tuple[list[Problem], set[str]] | None = None,
    tokenizer: Any = None,
) -> Components:
    """Model, tokenizer, task (held-out list + training stream), engine and trainer for `cfg`; `task`, its
    `split` (prepare_split's result) and the `tokenizer` when preflight made them already."""
    if not cfg.task_config.args:
        cfg.task_config.args = default_task_args(cfg.task)
    if task is None:  # first: a bad task or a refused code sandbox fails before any download
        task = task_from_config(cfg)
    # fp32 master weights
    started = start_model(
        cfg.model, cfg.seed, cfg.device, chat_template=cfg.task_config.chat_template, tokenizer=tokenizer
    )
    model, tokenizer = started.model, started.tokenizer
    heldout, exclude = split if split is not None else prepare_split(task, cfg)
    prompts = PromptFilter(tokenizer, prompt_limit(cfg, model.config), f"task {cfg.task}")
    stream = make_sampler(cfg, task, cfg.seed, exclude, prompts)
    # fsdp2 shards the trainer's model in place: the engine generates with its own full copy
    engine_model = copy.deepcopy(model) if cfg.train.strategy == "fsdp2" else model
    dtype = precision_dtype(cfg.rollout.precision, cfg.device)
    engine = HFEngine(
        engine_model,
        tokenizer,
        cfg.rollout.max_batch,
        cfg.seed,
        cfg.device,
        dtype,
        prefix_cache=cfg.rollout.prefix_cache,
        branch_min=cfg.rollout.spec_branch_min,
    )
    # train.strategy=ddp|fsdp2: this process becomes rank 0 and starts the follower ranks (trainer.close)
    trainer = make_trainer(model, cfg, pad_id=int(tokenizer.pad_token_id))
    return Components(
        model, tokenizer, task, heldout, stream, engine, trainer, started.resolve_seconds, prompts
    )


def _accounting(ledger: Ledger, prompts: PromptFilter) -> dict[str, Any]:
    """accounting.json: the groups' ledger, and the problems skipped before admission (too long)."""
    return {**ledger.counts(), "prompts_too_long": prompts.skipped}


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)


def run_train(cfg: Config, console: Console | None = None, checked: Checked | None = None) -> dict[str, Any]:
    """Run the whole job; returns the summary dict (also written to the run directory). `checked`: the
    result of preflight(cfg) when the caller ran it already."""
    # what must stop however the job ends (the rollout workers, the trainer's follower ranks of
    # train.strategy=ddp|fsdp2): last registered first, each even if another raised
    with contextlib.ExitStack() as closers:
        return _run_train(cfg, console, closers, checked)


def _run_train(
    cfg: Config, console: Console | None, closers: contextlib.ExitStack, checked: Checked | None
) -> dict[str, Any]:
    console = console or Console(stderr=True)
    t_start = time.perf_counter()
    train_threads, rollout_threads = thread_split(cfg)
    torch.set_num_threads(train_threads)
    _seed_everything(cfg.seed)
    # a bad task, a refused sandbox or a model that does not resolve fails before anything is written
    # (a Ctrl-C meanwhile, during a model download say, stops it at once: nothing is written yet)
    checked = checked or preflight(cfg)
    stop = StopFlag()  # from here on, Ctrl-C and SIGTERM stop the run at a safe point, state saved
    stop.install()
    closers.callback(stop.uninstall)  # the caller's handlers return when the run is over
    run_dir = claim_run_dir(cfg.run_dir, bool(cfg.resume), cfg.overwrite)
    closers.enter_context(hold_run_dir(run_dir))  # a second `streamrl train` into it is refused
    cfg.run_dir = str(run_dir)
    name_semaphores_after_this_process()  # a later run can remove them if this one is killed
    if (removed := remove_leftovers()) > 0:
        console.print(f"removed {removed} semaphore(s) and lock file(s) left by killed runs")
    split = (
        f"{train_threads} threads (colocated: generate and train in turn)"
        if cfg.runtime.mode == "colocated"
        else f"trainer {train_threads} thread(s) + {cfg.runtime.rollout_workers} rollout worker(s) x "
        f"{rollout_threads} thread(s){', lent while waiting' if elastic_enabled(cfg) else ''}, "
        f"eta={cfg.max_staleness}, weights {cfg.runtime.weight_update}, "
        f"backend {cfg.runtime.backend} (weight sync {resolved_weight_sync(cfg)})"
    )
    console.print(f"[bold]streamrl[/] run dir {run_dir} | model {cfg.model} | task {cfg.task}")
    console.print(f"cores {os.cpu_count()}: {split}")
    console.print(run_precision_line(cfg))
    for key, name in (("rollout.precision", cfg.rollout.precision), ("train.precision", cfg.train.precision)):
        if (warning := precision_warning(name, key, cfg.device)) is not None:
            console.print(f"[yellow]warning[/]: {warning}")

    start_server_for(cfg)  # the workers' fork server imports torch on another core while we load the model
    t0 = time.perf_counter()
    parts = build_components(cfg, checked.task, checked.split, checked.tokenizer)
    closers.callback(parts.trainer.close)
    tokenizer, task, heldout, engine, trainer = (
        parts.tokenizer,
        parts.task,
        parts.heldout,
        parts.engine,
        parts.trainer,
    )
    timings = {
        "resolve_model": parts.resolve_seconds,
        "setup": time.perf_counter() - t0,
        "eval": 0.0,
        "train": 0.0,
    }
    state = (
        restore(run_dir, parts.model, parts.trainer, parts.engine, parts.stream) if cfg.resume else RunState()
    )
    workers = 0 if cfg.runtime.mode == "colocated" else cfg.runtime.rollout_workers
    env = collect_environment(cfg.model, train_threads, rollout_threads, workers)
    env.update(precision_record(cfg))
    # after the restore: a resume it refuses leaves the run's files as they were
    write_run_files(run_dir, config_yaml(cfg), env)
    moved: dict[str, int] = {}
    if cfg.resume:
        moved = reconcile_logs(run_dir, state.step)  # and W&B rewound first if it logged steps past it
        console.print(
            f"resumed at step {state.step} (policy version {state.version}), "
            f"{len(state.finished)} finished + {len(state.unfinished)} unfinished groups carried over"
            + "".join(
                f"; {n} {name} line(s) past it moved to {name}.orphaned" for name, n in moved.items() if n
            )
        )

    sampler = parts.stream
    replay, saved_replay = make_replay(cfg), state.replay  # replay off: the saved buffer is kept as saved
    if replay is not None and state.replay:
        replay.load(state.replay)
    elif saved_replay and saved_replay[1]:  # its successes: [capacity, entries, rng, count]
        print(replay_kept_note(saved_replay), file=sys.stderr, flush=True)
    hooks = {"on_group_scored": sampler.observe, "replay": replay}
    if cfg.runtime.mode == "colocated":
        runner: Any = ColocatedRunner(cfg, trainer, engine, tokenizer, task, sampler, state, stop, **hooks)
    else:
        runner = AsyncRunner(cfg, trainer, tokenizer, sampler, state, stop, **hooks)
    closers.callback(runner.close)
    if state.step < cfg.max_steps:
        runner.start()  # rollout workers load their model while the base model is evaluated

    base = final = None
    eval_limits = (cfg.eval.max_new_tokens, cfg.env.agent_timeout_s)
    eval_file = run_dir / "eval.json"  # `streamrl eval` may add its record at any time: update_json
    old_eval = json.loads(eval_file.read_text()) if eval_file.is_file() else {}
    if cfg.resume and state.step < cfg.max_steps:  # the run trains on: its earlier end's summary and
        (run_dir / "summary.json").unlink(missing_ok=True)  # final evaluation are of other weights
        if old_eval.get("final"):
            old_eval = update_json(eval_file, without_final)
    if cfg.resume:  # exports a killed run made past the state restored are of weights this run discards
        prune_exports(run_dir / "checkpoints", cfg.checkpoint.keep, state.step)
    # a resume evaluates the base model only if the first run was stopped before it was measured
    base_due = not cfg.resume or (state.step == 0 and not old_eval.get("base"))
    if cfg.eval.before and heldout and base_due:
        console.print(f"evaluating the base model on {len(heldout)} held-out problems (greedy)...")
        torch.set_num_threads(os.cpu_count() or 1)  # the workers only load meanwhile: every core
        try:
            base = evaluate(engine, tokenizer, task, heldout, *eval_limits, stop=lambda: bool(stop))
        except EvalStopped:  # the loop saves step 0 and stops; its resume measures the base model
            console.print(f"[yellow]the base model's evaluation was stopped by {stop.reason}[/]")
        torch.set_num_threads(train_threads)
    if base is not None:
        timings["eval"] += base.seconds
        console.print(f"base accuracy {base.accuracy:.3f} ({sum(base.correct)}/{len(base.correct)})")
        # on disk now: a run that crashes or is killed keeps it, and its resume reads it back (with the
        # record `streamrl eval` may have written while the base model was evaluated)
        old_eval = update_json(eval_file, lambda now: {**old_eval, **now, **eval_record(base, None)})
    before = Accuracy.from_summary(base.summary() if base else old_eval.get("base"))  # for model cards
    timings["setup"] += runner.wait_ready()  # what is left of the workers' start: not training time
    observer = RunObserver(cfg, run_dir, console, state.step + 1 if cfg.resume else None)
    groups_log = GroupLog(run_dir / "groups.jsonl")

    clock_at = {"time": 0.0, "train_elapsed": 0.0, **state.clock}  # as of the last logged step

    def save(snapshot: RunState) -> RunState:
        """weights, optimizer, position, carried groups, RNGs; accounting.json as of the same moment"""
        snapshot.replay = replay.state() if replay is not None else saved_replay
        snapshot.clock = dict(clock_at)
        observer.sync()  # the logs up to this state are on disk before the state says they are
        groups_log.sync()
        save_state(run_dir, snapshot, trainer, tokenizer, engine.generator.get_state(), cfg.train.keep_states)
        counts = _accounting(Ledger.from_state_dict(snapshot.ledger), parts.prompts)
        write_text_atomic(run_dir / "accounting.json", json.dumps(counts, indent=2))
        return snapshot

    saver = PeriodicSaver(
        cfg.train.save_every, cfg.train.save_every_s, lambda: save(runner.snapshot()), lambda: bool(stop)
    )
    export_failed = False
    t_train = time.perf_counter()
    clock = TrainClock()  # train_elapsed: the loop's time minus periodic evaluation, saves and exports

    def save_paused(snapshot: RunState) -> RunState:
        with clock.pause():
            return save(snapshot)

    on_stop = StopSaver(save_paused, saver)  # a stop's state, saved before the workers are stopped
    resumed_at = dict(clock_at)  # a resumed run's clocks continue the saved ones
    try:
        with StepProgress(cfg.max_steps, console, done=state.step, max_time=cfg.max_time) as progress:

            def on_step(rec: StepRecord) -> None:
                record = rec.metrics
                after = None  # this step's weights on the held-out set, for a checkpoint's card
                try:
                    if cfg.eval.every and heldout and rec.step % cfg.eval.every == 0:
                        with clock.pause():
                            push_policy(engine, trainer)
                            held = periodic_eval(engine, tokenizer, task, heldout, cfg, lambda: bool(stop))
                        record.update(held)
                        if held:  # {}: a stop ended it early, the step is logged without it
                            acc, n = held["heldout_accuracy"], len(heldout)
                            after = Accuracy(
                                acc, round(acc * n), n, f"periodic evaluation at step {rec.step}"
                            )
                    record.update(
                        sampler.metrics(),
                        prompts_too_long=parts.prompts.skipped,
                        prompt_shared_tokens=parts.prompts.shared_tokens,
                    )
                finally:  # the step is trained and counted: it is logged even if its evaluation failed
                    record["time"] = resumed_at["time"] + time.perf_counter() - t_start
                    record["train_elapsed"] = resumed_at["train_elapsed"] + clock.elapsed
                    clock_at.update(time=record["time"], train_elapsed=record["train_elapsed"], **rec.clock)
                    try:
                        groups_log.write(rec.groups, rec.step, rec.advantages)
                    except BaseException:  # the step's metrics line even so; the log's error is the one
                        try:  # raised (a full disk fails both: the first cause is the one to read)
                            observer.on_step(record)
                        except Exception as e:
                            said = f"step {rec.step}'s metrics failed too: {e!r}"
                            console.print(said, style="yellow", markup=False)
                        raise
                    observer.on_step(record)
                progress.update(record)
                # the export before the state: a kill between the two leaves an export past the newest
                # state, which the resume removes and writes again when it trains the step again
                if cfg.checkpoint.every and rec.step % cfg.checkpoint.every == 0:
                    path = run_dir / "checkpoints" / f"step-{rec.step}"
                    with clock.pause():
                        export_checkpoint(trainer, tokenizer, path, cfg, rec.step, before, after)
                        prune_exports(path.parent, cfg.checkpoint.keep, rec.step)
                # the last step's state (max_steps, max_time, a stop: with what arrives meanwhile) is
                # saved when the loop ends: saving it here too would write it twice
                if not (rec.last or stop):
                    with clock.pause():
                        saver.after_step(rec.step)

            runner.run(on_step, on_stop)
    except CheckpointWriteError as e:  # a periodic export: the step's state is not saved either
        export_failed = True
        raise CheckpointWriteError(export_stop(run_dir, state.step, e.__cause__ or e)) from e.__cause__
    finally:
        # the loop, periodic saves included; the final save and a stop's (as the loop ended) are timed apart
        timings["train"] = time.perf_counter() - t_train - on_stop.seconds
        timings["periodic_saves"] = saver.seconds
        timings["train_clock"] = clock.elapsed  # the loop minus periodic evaluation, saves and exports
        t_save = time.perf_counter()
        # the state first, the sinks after: closing one may fail or take long (an online W&B run
        # uploading while a SIGKILL follows a SIGTERM), and each sink closes whatever the others do
        with contextlib.ExitStack() as closing:
            closing.callback(observer.close)
            closing.callback(groups_log.close)
            if runner.in_step:  # failed inside a step: its half-applied update is not step `state.step`
                newest = latest_state(run_dir)
                kept = f"its newest saved state, {newest.name}, is kept" if newest else "no state was saved"
                console.print(f"[yellow]the run failed inside step {state.step + 1}: {kept}[/]")
            # a failed export leaves the state before its step the newest; a failure's groups are
            # recorded; a stop's state saved as the loop ended (or by the periodic save it came during)
            # is saved again only if the workers' stop changed it (groups that came back meanwhile)
            elif not export_failed:
                try:  # the carry-over first (once: the loop's end ran it unless it failed before)
                    runner.close()
                finally:  # the admission thread drew its last: the state holds what it drew
                    state.sampler = runner.stream_position()  # colocated: before a failed step's draws
                    if on_stop.needed(state):
                        save(state)
            timings["save"] = time.perf_counter() - t_save + on_stop.seconds
    interrupted, final_eval_stopped = bool(stop), False
    if interrupted:
        console.print(stop_message(stop.reason, state.step, run_dir), style="yellow", markup=False)

    torch.set_num_threads(os.cpu_count() or 1)
    if cfg.eval.after and heldout and not interrupted:
        console.print("evaluating the trained model on the same held-out problems...")
        push_policy(engine, trainer)
        try:
            final = evaluate(engine, tokenizer, task, heldout, *eval_limits, stop=lambda: bool(stop))
            timings["eval"] += final.seconds
        except EvalStopped:  # the state is saved: its resume evaluates it (and exports it again)
            interrupted = final_eval_stopped = True
            said = f"stopped by {stop.reason} during the final evaluation; step {state.step} is saved: "
            said += f"evaluate it with `streamrl train resume={run_dir}`"
            console.print(said, style="yellow", markup=False)
    # with what eval.json holds now: `streamrl eval` may have scored a checkpoint meanwhile
    evals = update_json(eval_file, lambda now: run_eval_record(base, final, {**old_eval, **now}))

    ckpt = run_dir / "checkpoint"
    if cfg.checkpoint.save:
        before, after = Accuracy.from_summary(evals["base"]), Accuracy.from_summary(evals["final"])
        export_checkpoint(trainer, tokenizer, ckpt, cfg, state.step, before, after)
    timings["total"] = time.perf_counter() - t_start
    counts = _accounting(runner.ledger, parts.prompts)
    summary = {
        "run_dir": str(run_dir),
        "steps": state.step,
        "interrupted": interrupted,
        "final_eval_stopped": final_eval_stopped,
        "timings": timings,
        "accounting": counts,
        "eval": {k: v for k, v in evals.items() if k != "samples"},
        "checkpoint": str(ckpt) if cfg.checkpoint.save else None,
    }
    write_text_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))
    print_summary(summary, console)
    report = observer.report()
    if report is not None:
        console.print(f"report: {report}  (regenerate or compare: streamrl report RUN_DIR [RUN_DIR ...])")
    return summary
