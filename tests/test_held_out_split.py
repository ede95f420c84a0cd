"""A held-out split of its own (a source's `test` split, task_config.eval_split or eval_data): no row of it
is ever trained on, streamed or held in memory, by its source or by another source of a mixture; and no
other training row is dropped."""

import itertools
import json

import pytest

from streamrl.config import load_config
from streamrl.tasks import prepare_split, task_from_config


def _jsonl(path, questions):
    path.write_text(
        "".join(json.dumps({"prompt": q, "answer": str(i)}) + "\n" for i, q in enumerate(questions))
    )
    return path


def _trained(overrides, draws=200):
    """(held-out problems, the questions of the first `draws` training problems) of a config."""
    cfg = load_config(None, overrides)
    task = task_from_config(cfg)
    held, exclude = prepare_split(task, cfg)
    return held, {p.meta["question"] for p in itertools.islice(task.train_stream(0, exclude), draws)}


TRAIN = [f"p{i}" for i in range(10)]
HELD = ["p1", "p2", "p3", "p4", "p20"]  # four of them training rows too: more than eval.size


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize("where", ["test_split", "eval_split", "eval_data"])
def test_no_row_of_a_held_out_split_is_trained_on_beyond_the_ones_evaluated(tmp_path, streaming, where):
    d = tmp_path / "repo"
    d.mkdir()
    _jsonl(d / "train.jsonl", TRAIN)
    overrides = [f"task=data:{d}", "eval.size=2", f"task_config.streaming={streaming}"]
    if where == "test_split":
        _jsonl(d / "test.jsonl", HELD)
    elif where == "eval_split":
        _jsonl(d / "validation.jsonl", HELD)
        overrides.append("task_config.eval_split=validation")
    else:
        overrides.append(f"task_config.eval_data={_jsonl(tmp_path / 'held.jsonl', HELD)}")
    held, trained = _trained(overrides)
    assert len(held) == 2 and {p.meta["question"] for p in held} <= set(HELD)
    assert trained == set(TRAIN) - set(HELD)  # every held-out row kept out, every other one trained


def _mixture(tmp_path, streaming: bool) -> str:
    """task_config.sources: source 0 holds out a test split of its own (b0..b4); source 1's one-turn
    chats ask b0..b9 and hold out of their own rows."""
    d = tmp_path / "repo"
    d.mkdir()
    _jsonl(d / "train.jsonl", [f"a{i}" for i in range(6)])
    _jsonl(d / "test.jsonl", [f"b{i}" for i in range(5)])
    chats = tmp_path / "chats.jsonl"
    chats.write_text(
        "".join(
            json.dumps({"chat": [{"role": "user", "content": f"b{i}"}], "answer": str(i)}) + "\n"
            for i in range(10)
        )
    )
    s = str(streaming).lower()
    chat_source = f"{{task: 'data:{chats}', columns: {{messages: chat}}, streaming: {s}}}"
    return f"[{{task: 'data:{d}', streaming: {s}}}, {chat_source}]"


@pytest.mark.parametrize("streaming", [False, True])
def test_a_mixture_trains_no_source_on_another_sources_held_out_split(tmp_path, streaming):
    """Source 1 asks questions of source 0's held-out split: those are kept out of source 1's training
    too, not only the ones the held-out set takes."""
    sources = _mixture(tmp_path, streaming)
    held, trained = _trained(["task=mix", f"task_config.sources={sources}", "eval.size=2"], 400)
    chat_held = {p.meta["question"] for p in held if p.meta["source"] == 1}  # held out of its own rows
    assert len(chat_held) == 1 and {p.meta["question"] for p in held if p.meta["source"] == 0} <= {
        f"b{i}" for i in range(5)
    }
    assert trained == {f"a{i}" for i in range(6)} | {f"b{i}" for i in range(5, 10)} - chat_held


@pytest.mark.parametrize("streaming", [False, True])
def test_a_mixture_draws_no_few_shot_example_from_another_sources_held_out_split(tmp_path, streaming):
    sources = _mixture(tmp_path, streaming)
    overrides = ["task=mix", f"task_config.sources={sources}", "eval.size=2", "task_config.few_shot_n=3"]
    held, trained = _trained(overrides, 400)
    chat = next(p for p in held if p.meta["source"] == 1)
    shots = [m["content"] for m in chat.messages if m["role"] == "user"][:-1]
    assert len(set(shots)) == 3 and set(shots) <= {f"b{i}" for i in range(5, 10)} - {chat.meta["question"]}
    assert not set(shots) & trained and trained & {f"b{i}" for i in range(5, 10)}
