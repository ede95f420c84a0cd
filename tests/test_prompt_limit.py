"""Prompts too long to train on: the limit (the model's context, train.token_budget,
task_config.max_prompt_tokens), lengths that cannot fit stopping the run at start, the filter on the
training stream (skipped before admission, counted, the first one named) and a run on tiny-random
(context 1024) with a ~5,000-token prompt among short ones."""

from __future__ import annotations

import itertools
import json
import logging
import os
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
from tiny_args import TINY

from streamrl.config import load_config
from streamrl.data.prompt_limit import PromptFilter, PromptLimit, prompt_limit
from streamrl.data.prompts import render_prompt_ids
from streamrl.types import Problem

LONG_QUESTION = "How many words are here? " + "word " * 1000  # ~5,000 tokens for tiny-random's tokenizer
SHOWN = "'How many words are here? word word word word word word wo...'"  # its first 57 characters
TINY_CONTEXT = SimpleNamespace(max_position_embeddings=1024)
AUTO = "set task_config.max_prompt_tokens to choose"


def _limit(keys: list[str], model_config=TINY_CONTEXT) -> PromptLimit:
    return prompt_limit(load_config(None, keys), model_config)


# ---- the limit --------------------------------------------------------------------------------------


def test_default_limit_is_what_fits_context_and_budget() -> None:
    assert _limit(["rollout.max_new_tokens=48"]) == PromptLimit(
        976,
        f"the model's context of 1024 tokens - rollout.max_new_tokens=48; {AUTO}",
    )
    big = SimpleNamespace(max_position_embeddings=8192)
    assert _limit(["rollout.max_new_tokens=48", "train.token_budget=4096"], big).tokens == 4048
    env = ["task=env:search", "env.max_total_tokens=256", "rollout.max_new_tokens=48"]
    assert _limit(env).tokens == 1024 - 256  # an episode's completion is env.max_total_tokens
    assert _limit(["train.token_budget=600"], SimpleNamespace()).tokens == 600 - 48  # no context known


def test_explicit_limit() -> None:
    assert _limit(["task_config.max_prompt_tokens=500"]) == PromptLimit(
        500, "task_config.max_prompt_tokens=500"
    )


@pytest.mark.parametrize(
    "keys, message",
    [
        (
            ["task_config.max_prompt_tokens=500", "train.token_budget=512"],
            "task_config.max_prompt_tokens=500 + rollout.max_new_tokens=48 = 548 tokens is longer than "
            "train.token_budget=512, so a sample would not fit one trainer micro-batch: raise "
            "train.token_budget or lower the other two",
        ),
        (
            ["task_config.max_prompt_tokens=1000"],
            "task_config.max_prompt_tokens=1000 + rollout.max_new_tokens=48 = 1048 tokens is longer than the "
            "model's context (1024 tokens, max_position_embeddings): lower them",
        ),
        (
            ["rollout.max_new_tokens=1024"],
            "rollout.max_new_tokens=1024 leaves no room for a prompt in the model's context of 1024 tokens: "
            "lower rollout.max_new_tokens",
        ),
        (
            ["rollout.max_new_tokens=512", "train.token_budget=512"],
            "rollout.max_new_tokens=512 leaves no room for a prompt in train.token_budget=512: lower "
            "rollout.max_new_tokens or raise train.token_budget",
        ),
    ],
)
def test_lengths_that_cannot_fit(keys: list[str], message: str) -> None:
    with pytest.raises(ValueError) as e:
        _limit(keys)
    assert str(e.value) == message


def test_negative_limit_is_a_config_error() -> None:
    from streamrl.config import ConfigError

    with pytest.raises(ConfigError) as e:
        load_config(None, ["task_config.max_prompt_tokens=-1"])
    assert str(e.value) == "config key 'task_config.max_prompt_tokens' must be >= 0, got -1"


# ---- the filter -------------------------------------------------------------------------------------


def _problem(pid: str, question: str) -> Problem:
    return Problem(pid, [{"role": "user", "content": question}], "1", {"question": question})


def test_filter_skips_counts_and_names_the_first(tiny, caplog) -> None:
    tok = tiny[1]
    short = [_problem(f"s{i}", f"What is {i} + 1?") for i in range(3)]
    long_a, long_b = _problem("long-a", LONG_QUESTION), _problem("long-b", LONG_QUESTION + "!")
    n = len(render_prompt_ids(tok, long_a.messages))
    stream = iter([short[0], long_a, short[1], long_b, long_a, short[2]])
    f = PromptFilter(tok, PromptLimit(976, "why"), "task data:x.jsonl")
    with caplog.at_level(logging.WARNING, logger="streamrl.data"):
        assert [p.id for p in f.apply(stream)] == ["s0", "s1", "s2"]
    assert f.skipped == 3
    assert [r.getMessage() for r in caplog.records] == [
        f"task data:x.jsonl: skipped prompt long-a ({n} tokens: {SHOWN}): longer than 976 tokens (why); "
        "every prompt skipped is counted in prompts_too_long (metrics.jsonl, accounting.json)"
    ]


def test_every_prompt_too_long_names_the_first(tiny, monkeypatch) -> None:
    from streamrl.data import prompt_limit as prompt_limit_mod

    monkeypatch.setattr(prompt_limit_mod, "MAX_SKIPS", 50)  # the fallback for streams that never repeat
    tok = tiny[1]
    rows = [_problem("long-a", LONG_QUESTION), _problem("long-b", LONG_QUESTION + "!")]
    n = len(render_prompt_ids(tok, rows[0].messages))

    def epochs():
        while True:
            yield from rows

    f = PromptFilter(tok, PromptLimit(976, "why"), "task data:x.jsonl")
    with pytest.raises(ValueError) as e:
        next(f.apply(epochs()))
    assert str(e.value) == (
        "task data:x.jsonl: every training prompt is longer than 976 tokens (why); the first: long-a "
        f"({n} tokens: {SHOWN})"
    )
    assert f.skipped == 5  # every problem skipped came round a third time: the sixth ends it


def test_long_prompts_ending_one_epoch_and_starting_the_next_are_not_every_prompt(tiny) -> None:
    """Reshuffled epochs: long-a ends epoch 1 and starts epoch 2, before s0 fits again. Seen twice
    with nothing fitting in between is not a whole epoch of long prompts."""
    s0, long_a = _problem("s0", "What is 0 + 1?"), _problem("long-a", LONG_QUESTION)
    f = PromptFilter(tiny[1], PromptLimit(976, "why"), "task data:x.jsonl", warn=False)
    assert [p.id for p in f.apply(iter([s0, long_a, long_a, s0]))] == ["s0", "s0"]
    assert f.skipped == 2


def test_a_long_prompt_duplicated_back_to_back_is_not_every_prompt(tiny) -> None:
    """A streamed file without shuffling: three copies of one long prompt, then prompts that fit. The
    copies are one showing, not three epochs of long prompts."""
    from streamrl.data import prompt_limit as prompt_limit_mod

    s0, long_a = _problem("s0", "What is 0 + 1?"), _problem("long-a", LONG_QUESTION)
    f = PromptFilter(tiny[1], PromptLimit(976, "why"), "task data:x.jsonl", warn=False)
    assert [p.id for p in f.apply(iter([long_a, long_a, long_a, s0]))] == ["s0"]
    h = PromptFilter(tiny[1], PromptLimit(976, "why"), "task data:x.jsonl", warn=False)
    with pytest.raises(ValueError, match="every training prompt is longer"):  # one long row, endlessly
        next(h.apply(itertools.repeat(long_a)))
    assert h.skipped == prompt_limit_mod.REPEATS_MERGED + 1  # two more showings: the third ends it
    long_b = _problem("long-b", LONG_QUESTION + "!")  # two long ones, three times each: every prompt
    g = PromptFilter(tiny[1], PromptLimit(976, "why"), "task data:x.jsonl", warn=False)
    with pytest.raises(ValueError, match="every training prompt is longer"):
        next(g.apply(iter([long_a, long_a, long_b] * 3 + [s0])))


def test_a_stream_that_never_repeats_gives_up_after_max_skips(tiny, monkeypatch) -> None:
    from streamrl.data import prompt_limit as prompt_limit_mod

    monkeypatch.setattr(prompt_limit_mod, "MAX_SKIPS", 5)
    generated = (_problem(f"gen-{i}", LONG_QUESTION + str(i)) for i in range(1000))  # every one new
    f = PromptFilter(tiny[1], PromptLimit(976, "why"), "task rg:x")
    with pytest.raises(
        ValueError, match=r"^task rg:x: every training prompt is longer than 976 tokens \(why\); "
    ):
        next(f.apply(generated))
    assert f.skipped == 5


# ---- runs -------------------------------------------------------------------------------------------


def test_a_resume_that_would_draw_from_another_position_is_refused(tiny) -> None:
    """A saved position counts the problems the filter let through: under another limit the same count
    ends elsewhere in the stream (some problems trained twice, others never). The resume names it."""
    from streamrl.data.samplers import MoPPSSampler, Sampler

    tok = tiny[1]
    rows = [_problem("s0", "What is 0 + 1?"), _problem("long-a", LONG_QUESTION)]
    rows += [_problem(f"s{i}", f"What is {i} + 1?") for i in (1, 2, 3)]
    n = len(render_prompt_ids(tok, rows[1].messages))

    def sampler(kind: str, limit: int) -> Sampler:
        stream = PromptFilter(tok, PromptLimit(limit, "why"), "task x", warn=False).apply(
            itertools.cycle(rows)
        )
        return Sampler(stream) if kind == "uniform" else MoPPSSampler(stream, pool=2, seed=0)

    for kind in ("uniform", "mopps"):
        s = sampler(kind, 976)  # long-a is skipped
        for _ in range(3):
            next(s)
        state = json.loads(json.dumps(s.state_dict()))
        drawn = state["base_drawn"]
        assert state["last_id"] == [r.id for r in rows if r.id != "long-a"][drawn - 1]
        again = sampler(kind, 976)
        again.load_state_dict(state)  # the same limit: the same position
        assert (again.base_drawn, again.last_id) == (drawn, state["last_id"])
        with pytest.raises(ValueError) as e:
            sampler(kind, n).load_state_dict(state)  # long-a fits now
        assert str(e.value) == (
            f"resume: the training stream's problem {drawn} is '{rows[drawn - 1].id}', the run drew "
            f"'{state['last_id']}' there: its data changed, or a setting that decides which prompts are too "
            "long (task_config.max_prompt_tokens, rollout.max_new_tokens, train.token_budget, the system "
            "prompt or chat template); resume with the run's own data and settings, or start a new run from "
            "its checkpoint"
        ), kind
        sampler(kind, n).load_state_dict({k: v for k, v in state.items() if k != "last_id"})  # saved without


def _rows(path: Path, questions: list[str]) -> Path:
    path.write_text("".join(json.dumps({"prompt": q, "answer": "7"}) + "\n" for q in questions))
    return path


def test_run_skips_the_long_prompt_and_counts_it(tiny, tmp_path: Path, caplog, capsys) -> None:
    from streamrl.cli import main
    from streamrl.tasks import prepare_split, task_from_config

    data = _rows(tmp_path / "train.jsonl", [LONG_QUESTION, "What is 3 + 4?", "What is 5 + 2?"])
    held = _rows(tmp_path / "test.jsonl", ["What is 1 + 6?"])
    run = tmp_path / "run"
    keys = [*TINY, f"task=data:{data}", f"task_config.eval_data=data:{held}", "eval.after=false"]
    keys += ["runtime.mode=colocated", "max_staleness=0", "max_steps=2", "rollout.dynamic_sampling=false"]
    with caplog.at_level(logging.WARNING, logger="streamrl.data"):
        assert main(["train", *keys, f"run_dir={run}"]) == 0
    # what the run must have skipped: the long row each time the stream passed it before the 4th short
    cfg = load_config(None, keys)
    task = task_from_config(cfg)
    _, exclude = prepare_split(task, cfg)
    expected, drawn = 0, 0
    for p in task.train_stream(cfg.seed, exclude):
        if p.meta["question"] == LONG_QUESTION:
            expected += 1
        else:
            drawn += 1
            if drawn == 4:  # 2 steps x 2 prompts
                break
    assert expected >= 1
    recs = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert recs[-1]["prompts_too_long"] == expected
    assert json.loads((run / "accounting.json").read_text())["prompts_too_long"] == expected
    trained = {json.loads(x)["problem_id"] for x in (run / "groups.jsonl").read_text().splitlines()}
    long_problem = next(p for p in task.train_stream(0, set()) if p.meta["question"] == LONG_QUESTION)
    # the opening every admitted prompt shared ("...What is "), the skipped one not counted
    rows = [render_prompt_ids(tiny[1], p.messages) for p in itertools.islice(task.train_stream(0, set()), 3)]
    short = [ids for ids in rows if len(ids) <= 1016]  # the limit named below
    assert len(short) == 2
    shared = len(os.path.commonprefix(short))
    assert 0 < shared < min(map(len, short)) and recs[-1]["prompt_shared_tokens"] == shared
    assert len(os.path.commonprefix([*short, render_prompt_ids(tiny[1], long_problem.messages)])) < shared
    assert long_problem.id not in trained and len(trained) == 2  # the two short rows
    n = len(render_prompt_ids(tiny[1], long_problem.messages))
    assert [r.getMessage() for r in caplog.records if r.name == "streamrl.data"] == [
        f"task data:{data}: skipped prompt {long_problem.id} ({n} tokens: {SHOWN}): longer than 1016 "
        f"tokens (the model's context of 1024 tokens - rollout.max_new_tokens=8; {AUTO}); every prompt "
        "skipped is counted in prompts_too_long (metrics.jsonl, accounting.json)"
    ]
    # the data changed under the run: its resume would not reach the saved position, and says so before
    # it writes anything
    _rows(data, ["What is 2 + 5?", LONG_QUESTION, "What is 3 + 4?", "What is 5 + 2?"])
    before = {f: f.read_bytes() for f in run.rglob("*") if f.is_file()}
    capsys.readouterr()
    assert main(["train", f"resume={run}", "max_steps=3"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert re.fullmatch(
        r"streamrl: error: resume: the training stream's problem \d+ is 'row-\w+', the run drew 'row-\w+' "
        r"there: its data changed, or a setting .*start a new run from its checkpoint",
        err,
    ), err
    assert {f: f.read_bytes() for f in run.rglob("*") if f.is_file()} == before


def test_every_prompt_too_long_stops_the_run_before_anything_is_written(tmp_path: Path, capsys) -> None:
    from streamrl.cli import main

    data = _rows(tmp_path / "train.jsonl", [LONG_QUESTION, LONG_QUESTION + " And more words."])
    run = tmp_path / "run"
    keys = [*TINY, f"task=data:{data}", "eval.size=0", "task_config.max_prompt_tokens=900", f"run_dir={run}"]
    assert main(["train", *keys]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the datasets progress bar
    assert err.startswith(
        f"streamrl: error: task data:{data}: every training prompt is longer than 900 tokens "
        "(task_config.max_prompt_tokens=900); the first: row-"
    )
    assert err.endswith(f" tokens: {SHOWN})")
    assert not run.exists()


def test_lengths_that_cannot_fit_stop_the_run_before_anything_is_written(tmp_path: Path, capsys) -> None:
    from streamrl.cli import main

    run = tmp_path / "run"
    assert main(["train", *TINY, "rollout.max_new_tokens=1100", f"run_dir={run}"]) == 2
    assert capsys.readouterr().err.strip() == (
        "streamrl: error: rollout.max_new_tokens=1100 leaves no room for a prompt in the model's context of "
        "1024 tokens: lower rollout.max_new_tokens"
    )
    assert not run.exists()
