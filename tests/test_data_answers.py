"""Answer cells: lists of accepted answers, refused shapes, integral floats of a table, and rows that
repeat a prompt (merged, kept or read once)."""

import itertools
import json
import logging

import pytest

from streamrl.config import load_config
from streamrl.data.answers import reference_text
from streamrl.data.sources import task_from_rows
from streamrl.rewards.user_fns import reward_columns
from streamrl.tasks import make_task, prepare_split, task_from_config


def _jsonl(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _problems(task):
    """Every training problem of a task held in memory, by question."""
    return {p.meta["question"]: p for p in itertools.islice(task.train_stream(0, set()), len(task.rows))}


def test_a_list_answer_holds_accepted_alternatives(tmp_path):
    f = _jsonl(
        tmp_path / "roots.jsonl",
        [
            {"prompt": "x^2 = 9, x = ?", "answer": ["3", "-3"]},
            {"prompt": "x^2 = 16, x = ?", "answer": ["4", "-4"]},
            {"prompt": "1 + 1 = ?", "answer": "2"},
        ],
    )
    task = make_task(f"data:{f}", {}, "", "", "answer_is")
    probs = _problems(task)
    p, plain = probs["x^2 = 9, x = ?"], probs["1 + 1 = ?"]
    assert (p.answer, p.meta["answers"]) == ("3", ["3", "-3"])
    assert (plain.answer, "answers" in plain.meta) == ("2", False)
    assert task.score(p, "The answer is -3.").correct and task.score(p, "The answer is 3.").correct
    assert not task.score(p, "The answer is 4.").correct
    assert task.same_answer("3", "-3", p) and not task.same_answer("3", "4", p)
    assert not task.same_answer("2", "-2", plain)
    assert reward_columns(p)["answer"] == ["3", "-3"] and reward_columns(plain)["answer"] == "2"
    assert (reference_text(p), reference_text(plain)) == ("3 (also accepted: -3)", "2")  # for a judge
    # few-shot examples show a row's first accepted answer
    held = _jsonl(tmp_path / "held.jsonl", [{"prompt": "2 + 2 = ?", "answer": "4"}])
    cfg = load_config(
        None, [f"task=data:{f}", f"task_config.eval_data={held}", "task_config.few_shot_n=3", "eval.size=1"]
    )
    task = task_from_config(cfg)
    prepare_split(task, cfg)
    assert sorted(task.few_shot) == [
        ("1 + 1 = ?", "The answer is 2."),
        ("x^2 = 16, x = ?", "The answer is 4."),
        ("x^2 = 9, x = ?", "The answer is 3."),
    ]


def test_an_answer_that_is_no_answer_or_list_of_them_is_skipped_naming_row_and_column(caplog):
    rows = [
        {"prompt": "a?", "answer": "1"},
        {"prompt": "b?", "answer": {"value": "2"}},
        {"prompt": "c?", "answer": [["3"]]},
        {"prompt": "d?", "answer": []},
        {"prompt": "e?", "answer": ["5", None]},
        {"prompt": "f?", "answer": [6.0, 6.5]},
    ]
    task = task_from_rows(rows)
    assert task.skipped == [
        "rows:row 2: column 'answer' holds a mapping: an answer is text, a number or a list of them (map a "
        "field inside it: task_config.columns.answer=answer.<field>)",
        "rows:row 3: column 'answer' holds a list inside its list: an answer is text, a number or a list of "
        "accepted answers",
        "rows:row 4: column 'answer' is an empty list: give at least one accepted answer",
        "rows:row 5: column 'answer' holds an empty answer",
    ]
    assert [
        (r["question"], r["answer"], r["answers"]) for r in sorted(task.rows, key=lambda r: r["question"])
    ] == [
        ("a?", "1", None),
        ("f?", "6", ["6", "6.5"]),
    ]
    with pytest.raises(
        ValueError, match=r"first problem: only:row 1: column 'answer' holds a mapping: an answer is text"
    ):
        task_from_rows([{"prompt": "b?", "answer": {"value": "2"}}], name="only")


def test_a_table_column_of_whole_numbers_read_as_floats_gives_integers(tmp_path):
    """A CSV column of numbers with an empty cell is read as floats: 42.0 reads as 42 (in scoring and
    in few-shot examples), 2.5 stays 2.5, and the empty cell's row is skipped."""
    f = tmp_path / "nums.csv"
    f.write_text("prompt,answer\nQ1?,1\nQ2?,42\nQ3?,\nQ4?,2.5\n")
    held = _jsonl(tmp_path / "held.jsonl", [{"prompt": "Q0?", "answer": "0"}])
    cfg = load_config(
        None, [f"task=data:{f}", f"task_config.eval_data={held}", "task_config.few_shot_n=3", "eval.size=1"]
    )
    task = task_from_config(cfg)
    assert {r["question"]: r["answer"] for r in task.rows} == {"Q1?": "1", "Q2?": "42", "Q4?": "2.5"}
    assert task.skipped == [f"{f}:row 3: column 'answer' is empty"]
    prepare_split(task, cfg)
    assert sorted(task.few_shot) == [
        ("Q1?", "The answer is 1."),
        ("Q2?", "The answer is 42."),
        ("Q4?", "The answer is 2.5."),
    ]


def test_a_repeated_prompt_merges_other_answers_and_reads_duplicates_once(tmp_path, caplog):
    f = tmp_path / "rep.csv"
    f.write_text("prompt,answer\nQ1?,1\nQ2?,2\nQ1?,5\nQ2?,2\nQ3?,3\nQ1?,1\n")
    with caplog.at_level(logging.WARNING, logger="streamrl.data"):
        task = make_task(f"data:{f}", {}, "", "", "answer_is")
    assert {r["question"]: (r["answer"], r["answers"]) for r in task.rows} == {
        "Q1?": ("1", ["1", "5"]),
        "Q2?": ("2", None),
        "Q3?": ("3", None),
    }
    assert caplog.messages == [
        f"{f}: 1 row(s) give the prompt of an earlier row another answer (row 3 (as row 1)): a prompt is "
        "read once, its answers merged as accepted alternatives"
    ]
    p = _problems(task)["Q1?"]
    assert task.score(p, "The answer is 5.").correct and task.score(p, "The answer is 1.").correct


def test_a_repeated_prompt_with_other_columns_keeps_the_first_row_and_says_so(tmp_path, caplog):
    f = _jsonl(
        tmp_path / "ids.jsonl",
        [
            {"uid": "a", "prompt": "Q1?", "answer": "1"},
            {"uid": "b", "prompt": "Q2?", "answer": "2"},
            {"uid": "c", "prompt": "Q1?", "answer": "1"},
        ],
    )
    with caplog.at_level(logging.WARNING, logger="streamrl.data"):
        task = make_task(f"data:{f}", {}, "", "", "answer_is", columns={"id": "uid"})
    assert sorted((r["question"], r["id"], r["answers"]) for r in task.rows) == [
        ("Q1?", "a", None),
        ("Q2?", "b", None),
    ]
    assert caplog.messages == [
        f"{f}: 1 row(s) repeat the prompt of an earlier row with other tests, kind or columns (row 3 (as "
        "row 1)): the earlier row is kept"
    ]


def test_a_streamed_source_warns_of_a_prompt_its_rows_answer_differently(tmp_path, caplog):
    f = tmp_path / "rep.csv"
    f.write_text("prompt,answer\nQ1?,1\nQ2?,2\nQ1?,5\nQ2?,2\nQ3?,3\n")
    with caplog.at_level(logging.WARNING, logger="streamrl.data"):
        task = make_task(f"data:{f}", {}, "", "", "answer_is", streaming=True)
    assert caplog.messages == [
        f"{f}: 1 row(s) read at set-up give the prompt of an earlier row other answers or tests (row 3 (as "
        "row 1)): a streamed source reads each row as a problem of its own, scored by its own answer; give "
        "a prompt one row (with a list of accepted answers), or read the source without streaming"
    ]
    assert [(p.meta["question"], p.answer) for p in task.heldout(5)] == [
        ("Q1?", "1"),
        ("Q2?", "2"),
        ("Q1?", "5"),
        ("Q2?", "2"),
        ("Q3?", "3"),
    ]
