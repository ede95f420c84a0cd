"""The checks that need more than the config: a resumed run changes no key its saved state fixes
(RUN_DIR/config.yaml: config.RESUME_FIXED, however the Config was made or changed), the model
resolves (a known name, a local directory or a Hugging Face Hub id, downloaded or found in the cache),
the reward functions import and score the first training problem in the format they read
(rewards/fn_probe.py), an LLM judge answers (reward.scorer=judge: rewards/judge_check.py), the
configured lengths fit the model's context and train.token_budget (data/prompt_limit.py) and the task
builds (its data read, its sandbox checked) with a training prompt short enough. They run before any
weights load and before a run directory is created (a Hub model's weights are downloaded last, once
they all passed); each failure is one line (ValueError), so a bad run costs seconds and leaves nothing
behind."""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.config import refuse_changes_a_resume_would_ignore
from streamrl.data.mixture import SOURCE_SEED_STEP
from streamrl.data.prompt_limit import PromptFilter, prompt_limit
from streamrl.data.prompts import check_template
from streamrl.data.samplers import check_curriculum
from streamrl.data.task import Task, default_task_args
from streamrl.files import in_use_message, run_dir_in_use
from streamrl.models.device import check_device
from streamrl.models.resolve import (
    chat_template_file,
    load_model_config,
    load_tokenizer,
    resolve_model_dir,
    resolve_model_files,
)
from streamrl.rewards.fn_probe import choose_formats
from streamrl.rewards.judge import judge_config
from streamrl.rewards.judge_check import check_judge
from streamrl.rewards.user_fns import check_arguments, configured_fns, load_fns, reward_columns
from streamrl.run_dirs import (
    has_saved_state,
    holds_run,
    no_state_message,
    not_a_run_message,
    unwritable_message,
)
from streamrl.tasks import prepare_split, task_from_config
from streamrl.types import Problem


@dataclass
class Checked:
    task: Task
    model_dir: Path
    split: tuple[list[Problem], set[str]]  # prepare_split's (held-out problems, prompts never trained on)
    tokenizer: Any  # load_tokenizer's, with the run's chat template: training loads it no second time


def check_run_dir(path: Path, may_hold_run: bool, training: bool = False, resume: bool = False) -> None:
    """The run directory, before any work: not a file, one that can be created and written into, and
    holding a run only where that is meant (may_hold_run: a resume, overwrite=true, an evaluation adding
    its results); `training` into it: no other process trains into it now, and a new run (not a
    `resume`) goes into no directory of files that are not a run (overwrite=true deletes only a run), and a
    resume continues a run with a saved state."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"run_dir {path} is a file: choose a directory (a new name, or a run's)")
    if (unwritable := unwritable_message(path)) is not None:
        raise ValueError(unwritable)
    if training and path.is_dir() and run_dir_in_use(path):
        raise ValueError(in_use_message(path))
    if training and not resume and (not_a_run := not_a_run_message(path)) is not None:
        raise ValueError(not_a_run)
    if training and resume and not has_saved_state(path):  # before the task is read or a model fetched
        raise ValueError(no_state_message(path))
    if not may_hold_run and holds_run(path):
        if not has_saved_state(path):  # stopped before its first save: nothing to resume
            raise ValueError(
                f"run_dir {path} already holds a run, with no saved state to resume: start it over with "
                "overwrite=true, or choose another run_dir"
            )
        raise ValueError(
            f"run_dir {path} already holds a run: continue it with resume={path}, start it over with "
            "overwrite=true, or choose another run_dir"
        )


# draws from a mixture's stream per source before a source not yet seen is read on its own
DRAWS_PER_SOURCE = 32


def one_row_per_source(
    task: Task,
    stream: Iterator[Problem],
    drawn: list[Problem],
    seed: int,
    exclude: set[str],
    alone: bool = True,
) -> list[Problem]:
    """The first problem of each of a mixture's sources (of the task itself otherwise), read off the
    task's own stream: `drawn` holds what was read of it so far and keeps what this reads, for the checks
    after. A source that has not come up in DRAWS_PER_SOURCE draws per source (a small weight) is read
    on its own, as the mixture seeds it (unless not `alone`: a streamed source would fill its buffer
    once more)."""
    sources = getattr(task, "tasks", None)
    if not sources:
        return drawn[:1]
    firsts: dict[int, Problem] = {}
    for problem in drawn:
        firsts.setdefault(problem.meta["source"], problem)
    draws = DRAWS_PER_SOURCE * len(sources)
    while len(firsts) < len(sources) and draws and (problem := next(stream, None)) is not None:
        draws -= 1
        drawn.append(problem)
        firsts.setdefault(problem.meta["source"], problem)
    held = exclude | task.held_split()  # as the mixture's stream: every source's held-out split
    for i, source in enumerate(sources):
        if i in firsts or not alone:
            continue
        try:
            first = next(source.train_stream(seed + SOURCE_SEED_STEP * i, held), None)
        except ValueError as e:
            raise ValueError(f"task_config.sources[{i}]: {e}") from None
        if first is not None:
            firsts[i] = first
    return [firsts[i] for i in sorted(firsts)]


def preflight(cfg: Any) -> Checked:
    """Build the task and resolve the model of `cfg` (task_config.args filled with the task's defaults)."""
    # a resume's fixed keys as saved, however cfg was made or changed: before anything is read or written
    refuse_changes_a_resume_would_ignore(cfg)
    check_device(cfg.device)
    if cfg.rollout.top_p < 1.0:
        raise ValueError(
            f"config key 'rollout.top_p' is {cfg.rollout.top_p}: training samples with top_p=1, since the "
            "trainer's log-probs are the whole distribution's and a nucleus's would put its mass into every "
            "ratio (PPO would clip whole classes of tokens); top_p < 1 is for `streamrl eval` sampling "
            "(a resumed run may pass rollout.top_p=1)"
        )
    if cfg.eval.n and not cfg.eval.every:
        raise ValueError(
            f"config key 'eval.n' is {cfg.eval.n}, but training samples the held-out set only at its "
            "periodic evaluations: set eval.every > 0 (or eval.n=0 eval.k=[]), or score the checkpoint "
            "after with `streamrl eval model=RUN/checkpoint eval.n=...`"
        )
    if cfg.run_dir:  # a run already there, before a model download
        resume = bool(cfg.resume)
        check_run_dir(Path(cfg.run_dir), resume or cfg.overwrite, training=True, resume=resume)
    elif unwritable_message(Path("runs") / "new") is not None:  # the default runs/<time>, made later
        raise ValueError(
            f"run_dir is not set, and its default runs/<date-time> cannot be created in {Path.cwd()}: set "
            "run_dir=... to a directory you can write"
        )
    if not cfg.task_config.args:
        cfg.task_config.args = default_task_args(cfg.task)  # recorded in config.yaml
    fns = configured_fns(cfg.reward.fn, cfg.reward.fns, cfg.reward.completions)
    loaded = load_fns(fns)  # your reward functions import
    if cfg.reward.scorer == "judge":  # reachable, serving the model, grading a probe
        check_judge(judge_config(cfg.reward))
    task = task_from_config(cfg)  # before the model: a typo in the data costs no weights download
    if cfg.rollout.sampler == "curriculum" and cfg.task.startswith("rg:"):
        check_curriculum(cfg.task.removeprefix("rg:"))
    split = prepare_split(task, cfg)  # eval.size and the few-shot examples fit the data
    exclude = split[1]
    stream = task.train_stream(cfg.seed, exclude)  # read once: a streamed dataset fills its buffer once
    drawn = list(itertools.islice(stream, 1))
    # a mixture's sources, as they come up in its first draws (every one with your functions), have
    # problems to train on: one whose rows are all held out fails here, not in training; and each of
    # your functions is passed what it needs on every source
    for problem in one_row_per_source(task, stream, drawn, cfg.seed, exclude, alone=bool(loaded)):
        if loaded:
            check_arguments(loaded, fns, reward_columns(problem))
    if loaded and drawn:  # each is called once, in the format it reads (auto: chosen and recorded)
        choose_formats(cfg.reward, loaded, fns, drawn[0])
    tc = cfg.task_config
    if tc.chat_template:  # recorded absolute: workers, resume and evaluation read the same file
        tc.chat_template = str(chat_template_file(tc.chat_template))  # before a model download
    model_files = resolve_model_files(cfg.model, cfg.seed)  # config and tokenizer: a Hub model's weights wait
    model_config = load_model_config(model_files)
    limit = prompt_limit(cfg, model_config)  # lengths that cannot fit: one line
    if cfg.train.lora_rank:  # the adapters' target layers exist (the layers built with no weights)
        from streamrl.models.lora import check_targets_on_meta

        resumed = Path(cfg.resume) if cfg.resume else None  # its targets are the saved ones
        check_targets_on_meta(model_config, cfg.train.lora_targets, resumed)
    tokenizer = load_tokenizer(model_files, tc.chat_template, cfg.model)  # no template: one line
    if drawn:  # a template that refuses the prompt (a system turn, say): one line
        check_template(tokenizer, drawn[0], tc.chat_template, cfg.model, cfg.task)
    # something to train on: every row held out, or every prompt too long, is one line
    prompts = PromptFilter(tokenizer, limit, f"task {cfg.task}", warn=False)
    next(prompts.apply(itertools.chain(drawn, stream)))
    model_dir = resolve_model_dir(cfg.model, cfg.seed)  # the weights, once every check above passed
    return Checked(task, model_dir, split, tokenizer)
