"""The default system prompt by task kind: reasoning-gym tasks keep the calculator prompt; a dataset's
rows (which may ask anything) get one asking for the answer in the format reward.extract reads, the
format their few-shot replies show; a system prompt you set is used as written."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from streamrl.config import load_config
from streamrl.data.prompts import ANSWER_FORMAT_PROMPTS, SHOT_TEMPLATES
from streamrl.rewards.extract import EXTRACTORS, extract_answer
from streamrl.tasks import prepare_split, task_from_config
from streamrl.types import Problem

CALCULATOR = "You are a calculator. Reply in the form 'The answer is <number>.'"
FORMATS = {
    "answer_is": "End your reply with the final answer in the form 'The answer is <number>.'",
    "boxed": "End your reply with the final answer in the form '\\boxed{<answer>}'.",
    "last_number": "End your reply with the final answer as a number.",
    "gsm8k": "End your reply with the final answer in the form '#### <number>'.",
}
ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(8)]


def _rows(tmp_path: Path) -> Path:
    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return f


def _problems(overrides: list[str]) -> tuple[list[Problem], Problem]:
    """(held-out problems, the first training problem) of the config, few-shot turns set."""
    cfg = load_config(None, ["eval.size=2", *overrides])
    task = task_from_config(cfg)
    heldout, exclude = prepare_split(task, cfg)
    return heldout, next(task.train_stream(cfg.seed, exclude))


def _system(problem: Problem) -> str | None:
    first = problem.messages[0]
    return first["content"] if first["role"] == "system" else None


@pytest.mark.parametrize("streaming", [False, True], ids=["in-memory", "streamed"])
@pytest.mark.parametrize("extract", list(FORMATS))
def test_a_datasets_rows_are_asked_for_the_format_the_scorer_reads(
    tmp_path: Path, extract: str, streaming: bool
) -> None:
    args = [f"task=data:{_rows(tmp_path)}", f"reward.extract={extract}", f"task_config.streaming={streaming}"]
    heldout, train = _problems(args)
    assert [_system(p) for p in [*heldout, train]] == [FORMATS[extract]] * 3


@pytest.mark.parametrize("extract", list(FORMATS))
def test_the_format_asked_for_is_what_the_scorer_reads(extract: str) -> None:
    assert set(ANSWER_FORMAT_PROMPTS) == set(EXTRACTORS) == set(SHOT_TEMPLATES)
    prompt = ANSWER_FORMAT_PROMPTS[extract]
    assert "calculator" not in prompt
    quoted = re.search(r"'(.*)'", prompt)
    reply = quoted.group(1).replace("<number>", "42").replace("<answer>", "42") if quoted else "42"
    assert extract_answer(reply, extract) == "42"


def test_the_system_turn_and_the_few_shot_reply_ask_for_one_format(tmp_path: Path) -> None:
    """task=data:x.jsonl reward.extract=boxed task_config.few_shot_n=1: both show \\boxed{}."""
    args = [f"task=data:{_rows(tmp_path)}", "reward.extract=boxed", "task_config.few_shot_n=1"]
    heldout, _ = _problems(args)
    system, _, shot, _ = heldout[0].messages
    assert system == {"role": "system", "content": FORMATS["boxed"]}
    assert re.fullmatch(r"\\boxed\{\d+\}", shot["content"]), shot
    assert "answer is" not in json.dumps(heldout[0].messages)


@pytest.mark.parametrize("extract", ["answer_is", "boxed"])
def test_reasoning_gym_tasks_keep_the_calculator_prompt(extract: str) -> None:
    heldout, train = _problems(["task=rg:chain_sum", f"reward.extract={extract}"])
    assert [_system(p) for p in [*heldout, train]] == [CALCULATOR] * 3
    assert load_config(None, []).task_config.system_prompt == CALCULATOR  # the default job's prompt


def test_a_mixture_gives_each_source_its_own_default(tmp_path: Path) -> None:
    sources = f"task_config.sources=[{{task: rg:chain_sum}}, {{task: 'data:{_rows(tmp_path)}'}}]"
    heldout, _ = _problems(["task=mix", sources, "reward.extract=gsm8k", "eval.size=8"])
    by_source = {p.meta["source"]: _system(p) for p in heldout}
    assert by_source == {0: CALCULATOR, 1: FORMATS["gsm8k"]}


@pytest.mark.parametrize(("prompt", "expected"), [("Be brief.", "Be brief."), ("", None)])
def test_a_system_prompt_you_set_is_used_as_written(
    tmp_path: Path, prompt: str, expected: str | None
) -> None:
    args = [f"task=data:{_rows(tmp_path)}", "reward.extract=boxed", f"task_config.system_prompt={prompt}"]
    heldout, train = _problems(args)
    assert [_system(p) for p in [*heldout, train]] == [expected] * 3
