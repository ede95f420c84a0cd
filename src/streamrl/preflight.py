"""The checks that need more than the config: the model resolves (a known name, a local directory or a
Hugging Face Hub id, downloaded or found in the cache), the reward functions import, an LLM judge
answers (reward.scorer=judge: rewards/judge_check.py), the configured lengths fit the model's context
and train.token_budget (data/prompt_limit.py) and the task builds (its data read, its sandbox checked)
with a training prompt short enough. They run before any weights load and before a run directory is
created; each failure is one line (ValueError), so a bad run costs seconds and leaves nothing behind."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.data.prompt_limit import PromptFilter, prompt_limit
from streamrl.data.task import Task, default_task_args
from streamrl.models.resolve import load_model_config, load_tokenizer, resolve_model_dir
from streamrl.rewards.judge import judge_config
from streamrl.rewards.judge_check import check_judge
from streamrl.rewards.user_fns import configured_fns, load_fns
from streamrl.tasks import prepare_split, task_from_config
from streamrl.types import Problem


@dataclass
class Checked:
    task: Task
    model_dir: Path
    split: tuple[list[Problem], set[str]]  # prepare_split's (held-out problems, prompts never trained on)


def preflight(cfg: Any) -> Checked:
    """Build the task and resolve the model of `cfg` (task_config.args filled with the task's defaults)."""
    if not cfg.task_config.args:
        cfg.task_config.args = default_task_args(cfg.task)  # recorded in config.yaml
    load_fns(configured_fns(cfg.reward.fn, cfg.reward.fns))  # your reward functions import
    if cfg.reward.scorer == "judge":  # reachable, serving the model, grading a probe
        check_judge(judge_config(cfg.reward))
    task = task_from_config(cfg)  # before the model: a typo in the data costs no weights download
    split = prepare_split(task, cfg)  # eval.size and the few-shot examples fit the data
    exclude = split[1]
    model_dir = resolve_model_dir(cfg.model, cfg.seed)
    limit = prompt_limit(cfg, load_model_config(model_dir))  # lengths that cannot fit: one line
    # something to train on: every row held out, or every prompt too long, is one line
    tc = cfg.task_config
    if tc.chat_template:  # recorded absolute: workers, resume and evaluation read the same file
        tc.chat_template = str(Path(tc.chat_template).expanduser().resolve())
    tokenizer = load_tokenizer(model_dir, tc.chat_template)  # a model without a template: one line
    prompts = PromptFilter(tokenizer, limit, f"task {cfg.task}", warn=False)
    next(prompts.apply(task.train_stream(cfg.seed, exclude)))
    return Checked(task, model_dir, split)
