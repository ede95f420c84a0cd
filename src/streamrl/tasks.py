"""The task factory: a task spec (`task=...`) -> a Task (data/task.py), and the held-out split.

- `rg:NAME` generates reasoning-gym problems (lazy, deterministic by index and seed) and scores with
  the dataset's own `score_answer`; a sample is correct only at full score (1.0), because reasoning-gym
  gives wrong answers small partial credit.
- `rg:composite` mixes reasoning-gym datasets: task_config.args.datasets=[{name, weight, config}, ...].
- `hf:NAME[:CONFIG]` (a Hugging Face dataset), `data:PATH` (.jsonl/.json/.parquet/.csv files, a directory
  of them or a save_to_disk directory), bare `PATH.jsonl` / `PATH.parquet`: rows read with `datasets`
  and mapped with task_config.columns, split by task_config.split / eval_split / eval_data, optionally
  streamed (data/sources.py).
- `mix`: weighted sources, task_config.sources=[{task, weight, ...}, ...] (data/mixture.py).
- `code` / `code:path/to/file.jsonl`: programs run against stdin/stdout tests (data/code_task.py).

The held-out set is drawn first (fixed seed) and every training problem whose prompt equals a held-out
one (its question text; for a chat row, every turn) is skipped, so the model is never trained on an
evaluation problem.
"""

from __future__ import annotations

import functools
import itertools
from pathlib import Path
from typing import Any

from streamrl.config_validate import is_data_source
from streamrl.data.prompts import SHOT_TEMPLATES, shot_response
from streamrl.data.reasoning_gym import ReasoningGymTask
from streamrl.data.task import Task, default_task_args, prompt_key
from streamrl.types import Problem


def make_task(
    spec: str,
    args: dict[str, Any],
    system_prompt: str,
    instruction: str,
    extract: str,
    *,
    code_partial_credit: bool = True,
    sandbox_min_isolation: str = "auto",
    sandbox_executor: str = "local",
    env: Any = None,
    columns: dict[str, Any] | None = None,
    eval_data: str = "",
    split: str = "train",
    eval_split: str = "",
    streaming: bool = False,
    shuffle_buffer: int = 10_000,
    sources: Any = (),
) -> Task:
    """`env`: the EnvConfig that multi-turn tasks (`env:NAME`) take their limits from; `columns`,
    `eval_data`, `split`, `eval_split`, `streaming`, `shuffle_buffer`: the tabular sources' settings
    (task_config keys of the same names); `sources`: the `mix` task's list; `sandbox_min_isolation`:
    tasks that run model code check their sandbox against it when built; `sandbox_executor`: that
    sandbox (reward.sandbox_executor)."""
    kw = {"system_prompt": system_prompt, "instruction": instruction, "extract": extract}
    data = {  # what a tabular source reads (data/sources.py)
        "columns": columns,
        "eval_data": eval_data,
        "split": split,
        "eval_split": eval_split,
        "streaming": streaming,
        "shuffle_buffer": shuffle_buffer,
        "code_partial_credit": code_partial_credit,
        "sandbox_min_isolation": sandbox_min_isolation,
        "sandbox_executor": sandbox_executor,
    }
    if spec.startswith("agent:"):  # its problems and scores come from a base task with these settings
        from streamrl.envs.agent_task import AgentTask

        return AgentTask(spec[6:], args, functools.partial(make_task, **data, sources=sources), **kw)
    if spec == "mix":
        from streamrl.data.mixture import MixtureTask

        return MixtureTask(
            sources,
            make_task,
            code_partial_credit=code_partial_credit,
            sandbox_min_isolation=sandbox_min_isolation,
            sandbox_executor=sandbox_executor,
            env=env,
            **kw,
        )
    if spec.startswith("env:"):
        from streamrl.config import EnvConfig
        from streamrl.envs.base import make_env_task

        env_cfg = env if env is not None else EnvConfig()
        sandbox = {"sandbox_min_isolation": sandbox_min_isolation, "sandbox_executor": sandbox_executor}
        return make_env_task(spec[4:], args, env_cfg=env_cfg, **sandbox, **kw)
    if spec == "code" or spec.startswith("code:"):
        from streamrl.config import TaskConfig
        from streamrl.data.code_task import CODE_SYSTEM_PROMPT, CodeTask

        if system_prompt == TaskConfig.system_prompt:  # the calculator default makes no sense here
            kw["system_prompt"] = CODE_SYSTEM_PROMPT
        sandbox = {"min_isolation": sandbox_min_isolation, "sandbox_executor": sandbox_executor}
        if spec == "code":
            return CodeTask(None, code_partial_credit, **sandbox, **kw)
        path = Path(spec[5:]).expanduser()
        if not path.is_file():
            raise ValueError(f"task file '{spec[5:]}' not found (task=code:<a .jsonl of {{prompt, tests}}>)")
        return CodeTask(path, code_partial_credit, **sandbox, **kw)
    if spec.startswith("rg:"):
        return ReasoningGymTask(spec[3:], args, **kw)
    if is_data_source(spec):
        from streamrl.data.sources import data_task

        return data_task(spec, **data, **kw)
    raise ValueError(
        f"unknown task '{spec}': use 'rg:<reasoning-gym dataset>', 'hf:<dataset>[:<config>]', "
        "'data:<.jsonl/.json/.parquet/.csv file or directory>', 'mix', 'code', 'code:<file.jsonl>', "
        "'env:python_tool' or 'env:search'"
    )


def task_from_config(cfg: Any) -> Task:
    """The task a Config describes (task_config.args default to the small-model settings when empty)."""
    tc = cfg.task_config
    return make_task(
        cfg.task,
        tc.args or default_task_args(cfg.task),
        tc.system_prompt,
        tc.instruction,
        cfg.reward.extract,
        code_partial_credit=cfg.reward.code_partial_credit,
        sandbox_min_isolation=cfg.reward.sandbox_min_isolation,
        sandbox_executor=cfg.reward.sandbox_executor,
        env=cfg.env,
        columns=tc.columns,
        eval_data=tc.eval_data,
        split=tc.split,
        eval_split=tc.eval_split,
        streaming=tc.streaming,
        shuffle_buffer=tc.shuffle_buffer,
        sources=tc.sources,
    )


FEW_SHOT_SEED = 1_000_033


def _shot(problem: Problem, template: str) -> str:
    """A drawn example's reply: a code problem's reference program in the block its scorer runs, else
    the reference answer in the answer statement of reward.extract."""
    if "tests" in problem.meta:
        return f"```python\n{problem.answer.strip()}\n```"
    return template.format(answer=problem.answer)


def _draw_shots(task: Task, n: int, exclude: set[str], template: str) -> dict[str, tuple[str, str]]:
    """n examples, {prompt key: (question, reply)}: the first distinct training problems of `task` at a
    fixed seed, none of them in `exclude`."""
    drawn: dict[str, tuple[str, str]] = {}
    for p in itertools.islice(task.train_stream(FEW_SHOT_SEED, exclude), 50 * n + 1000):
        if not p.answer.strip():  # an example would show "The answer is ." as its reply
            raise ValueError(
                f"config key 'task_config.few_shot_n' draws examples with their reference answers, but "
                f"problem {p.id} has none (task_config.columns.answer is null, or a row without one): "
                "give the examples as task_config.few_shot=[{question, response}] instead"
            )
        drawn.setdefault(prompt_key(p), (p.meta["question"], _shot(p, template)))
        if len(drawn) == n:
            return drawn
    raise ValueError(  # the stream repeats its prompts: there are fewer than n
        f"config key 'task_config.few_shot_n' is {n} but the training split has {len(drawn)} distinct "
        "prompt(s) besides the held-out ones: lower it"
    )


def prepare_split(task: Task, cfg: Any) -> tuple[list[Problem], set[str]]:
    """(held-out problems, prompts never to train on), with task_config.few_shot examples set on the task.

    Drawn few-shot examples (few_shot_n) are the first distinct training problems of a fixed seed, drawn
    by each of the task's few_shot_sources (a mixture's every source) from its own training problems;
    neither they nor the held-out problems are ever trained on. Given examples are shown by every source.
    """
    tc = cfg.task_config
    given = [
        shot_response(s, cfg.reward.extract, f"task_config.few_shot[{i}]") for i, s in enumerate(tc.few_shot)
    ]
    heldout = task.heldout(cfg.eval.size)
    exclude = {prompt_key(p) for p in heldout}
    seen: set[str] = set()  # the prompts of the drawn examples, of every source
    if given or tc.few_shot_n:
        template = SHOT_TEMPLATES.get(cfg.reward.extract, "{answer}")
        held = exclude | task.held_split()  # nor a row of any source's held-out split of its own
        for where, source in task.few_shot_sources():
            drawn: dict[str, tuple[str, str]] = {}
            if tc.few_shot_n:
                try:
                    drawn = _draw_shots(source, tc.few_shot_n, held, template)
                except ValueError as e:
                    if not where:
                        raise
                    raise ValueError(f"{where}: {e}") from None
            seen |= set(drawn)
            source.set_few_shot(given + list(drawn.values()))
        for p in heldout:
            p.messages = task.render(p)
        exclude |= seen | {q for q, _ in given}  # drawn ones by key, given by text
    return heldout, exclude
