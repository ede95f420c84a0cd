"""Chat rows: a prompt column in TRL's conversational format is a chat, and a chat's system turn may only
be its first."""

import hashlib
import itertools
import json

import pytest

from streamrl.data.sources import task_from_rows
from streamrl.tasks import make_task


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize("streaming", [False, True])
def test_a_prompt_column_holding_messages_is_read_as_the_chat(tmp_path, streaming):
    chat = [{"role": "system", "content": "Be terse."}, {"role": "user", "content": "2 + 2?"}]
    f = _jsonl(
        tmp_path / "trl.jsonl", [{"prompt": chat, "answer": "4"}, {"prompt": [chat[1]], "answer": "4"}]
    )
    task = make_task(f"data:{f}", {}, "S", "I", "answer_is", streaming=streaming)
    problems = task.heldout(2) if streaming else list(itertools.islice(task.train_stream(0, set()), 2))
    by_turns = {len(p.meta["chat"]): p for p in problems}
    own, plain = by_turns[2], by_turns[1]
    key = json.dumps([["system", "Be terse."], ["user", "2 + 2?"]])
    assert (own.id, own.answer, own.meta["question"]) == (
        f"row-{hashlib.sha1(key.encode()).hexdigest()[:16]}",
        "4",
        "2 + 2?",
    )
    assert own.messages == [
        {"role": "system", "content": "Be terse."},
        {"role": "user", "content": "2 + 2?\nI"},
    ]
    assert plain.messages == [{"role": "system", "content": "S"}, {"role": "user", "content": "2 + 2?\nI"}]


def test_a_chat_with_a_system_turn_after_its_first_is_skipped_naming_the_turn(tmp_path):
    late = [
        {"role": "system", "content": "A"},
        {"role": "user", "content": "q1"},
        {"role": "system", "content": "B"},
        {"role": "user", "content": "q2"},
    ]
    f = _jsonl(
        tmp_path / "chats.jsonl",
        [
            {"messages": [{"role": "user", "content": "q0"}], "answer": "0"},
            {"messages": late, "answer": "2"},
            {"messages": late[1:], "answer": "3"},
        ],
    )
    task = make_task(f"data:{f}", {}, "", "", "answer_is", columns={"messages": "messages"})
    assert task.skipped == [
        f"{f}:row 2: column 'messages' has a system turn at turn 3: only a chat's first turn may be one "
        "(chat templates differ on others); merge it into the first, or drop it",
        f"{f}:row 3: column 'messages' has a system turn at turn 2: only a chat's first turn may be one "
        "(chat templates differ on others); merge it into the first, or drop it",
    ]


def test_a_prompt_that_is_neither_text_nor_a_chat_names_both_fixes(tmp_path):
    f = _jsonl(tmp_path / "odd.jsonl", [{"prompt": {"text": "q"}, "answer": "1"}])
    with pytest.raises(ValueError) as e:
        make_task(f"data:{f}", {}, "", "", "answer_is")
    assert str(e.value) == (
        f"{f}: no usable rows (its columns: prompt, answer; map columns with task_config.columns={{prompt: "
        "..., answer: ...}, a chat column with messages: ... instead of prompt; rows without reference "
        f"answers: answer: null, scored by your own reward.fn); first problem: {f}:row 1: column 'prompt' "
        "must be a non-empty string or a chat (a list of {role, content}), got dict"
    )
    assert task_from_rows([{"prompt": "a", "answer": "1"}, {"prompt": 7, "answer": "2"}]).skipped == [
        "rows:row 2: column 'prompt' must be a non-empty string or a chat (a list of {role, content}), "
        "got int"
    ]
