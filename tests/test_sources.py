"""Data sources: JSONL / Parquet / HF directories with a column mapping, mixtures, composite, few-shot."""

import itertools
import json
from collections import Counter

import pytest

from streamrl.config import TaskConfig, load_config
from streamrl.data.mixture import split_by_weight
from streamrl.data.sources import task_from_rows
from streamrl.rewards.code import extract_program
from streamrl.tasks import make_task, prepare_split, task_from_config


def _parquet(path, rows):
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), path)


def test_parquet_with_column_mapping_nested_columns_and_ids(tmp_path):
    f = tmp_path / "q.parquet"
    rows = [{"uid": f"u{i}", "question": f"{i} + {i}?", "meta": {"final": str(2 * i)}} for i in range(8)]
    _parquet(f, rows)
    cols = {"prompt": "question", "answer": "meta.final", "id": "uid"}
    task = make_task(f"data:{f}", {}, "sys", "", "answer_is", columns=cols)
    held = task.heldout(2)
    train = list(itertools.islice(task.train_stream(0, {p.meta["question"] for p in held}), 12))
    assert len({p.id for p in train}) == 6 and not {p.id for p in train} & {p.id for p in held}
    p = held[0]
    assert p.id == f"u{p.meta['question'].split(' ')[0]}" and p.answer == str(2 * int(p.id[1:]))
    assert p.messages == [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": p.meta["question"]},
    ]
    assert task.score(p, f"The answer is {p.answer}.").correct
    assert make_task(str(f), {}, "", "", "answer_is", columns=cols).name == str(f)  # bare .parquet works


def test_parquet_malformed_rows_are_counted_with_file_and_row(tmp_path, caplog):
    f = tmp_path / "m.parquet"
    _parquet(f, [{"q": "a", "a": "1"}, {"q": None, "a": "2"}, {"q": "c", "a": None}, {"q": "d", "a": "4"}])
    task = make_task(f"data:{f}", {}, "", "", "answer_is", columns={"prompt": "q", "answer": "a"})
    assert len(task.rows) == 2
    assert task.skipped == [
        f"{f}:row 2: column 'q' must be a non-empty string",
        f"{f}:row 3: column 'a' is empty",
    ]
    assert "m.parquet: skipped 2 malformed row(s)" in caplog.text
    with pytest.raises(ValueError, match="task_config.columns: unknown key 'question'; valid keys: prompt"):
        make_task(f"data:{f}", {}, "", "", "answer_is", columns={"question": "q"})


def test_hf_saved_dataset_dir_with_messages_column(tmp_path):
    datasets = pytest.importorskip("datasets")
    rows = {
        "chat": [
            [{"role": "system", "content": "own system"}, {"role": "user", "content": f"what is {i}?"}]
            for i in range(6)
        ],
        "label": [str(i) for i in range(6)],
    }
    d = tmp_path / "hf"
    datasets.Dataset.from_dict(rows).save_to_disk(str(d))
    task = make_task(
        f"data:{d}",
        {},
        "default sys",
        "Be brief.",
        "answer_is",
        columns={"messages": "chat", "answer": "label"},
    )
    p = task.heldout(1)[0]
    i = p.answer
    assert p.meta["question"] == f"what is {i}?"
    assert p.messages == [
        {"role": "system", "content": "own system"},  # the row's own system turn wins
        {"role": "user", "content": f"what is {i}?\nBe brief."},
    ]
    dd = tmp_path / "dd"
    other = {"chat": [[{"role": "user", "content": "held?"}]], "label": ["7"]}
    datasets.DatasetDict(
        {"validation": datasets.Dataset.from_dict(rows), "dev": datasets.Dataset.from_dict(other)}
    ).save_to_disk(str(dd))
    cols = {"messages": "chat", "answer": "label"}
    with pytest.raises(
        ValueError, match=r"dd has no split 'train': set task_config.split to one of: validation, dev$"
    ):
        make_task(f"data:{dd}", {}, "", "", "answer_is", columns=cols)
    task = make_task(
        f"data:{dd}", {}, "", "", "answer_is", columns=cols, split="validation", eval_split="dev"
    )
    assert len(task.rows) == 6 and [p.answer for p in task.heldout(5)] == ["7"]
    assert len(make_task(f"data:{dd}/validation", {}, "", "", "answer_is", columns=cols).rows) == 6


def test_eval_file_overlap_is_reported_and_never_trained(tmp_path, caplog):
    train, held = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"p{i}", "answer": str(i)}) + "\n" for i in range(10)))
    held.write_text("".join(json.dumps({"prompt": f"p{i}", "answer": str(i)}) + "\n" for i in (1, 2, 20)))
    task = make_task(f"data:{train}", {}, "", "", "answer_is", eval_data=str(held))
    assert task.overlap == 2 and f"2 training prompt(s) are also held-out rows of {held}" in caplog.text
    hq = {p.meta["question"] for p in task.heldout(3)}
    assert hq == {"p1", "p2", "p20"}
    seen = {p.meta["question"] for p in itertools.islice(task.train_stream(0, hq), 40)}
    assert seen == {f"p{i}" for i in range(10)} - {"p1", "p2"}


@pytest.mark.parametrize("streaming", [False, True])
def test_chat_rows_are_one_prompt_by_every_turn_not_by_their_last_user_turn(tmp_path, streaming):
    f = tmp_path / "chats.jsonl"
    chats = [
        [
            {"role": "user", "content": f"Tom has {i} apples."},
            {"role": "assistant", "content": "Noted."},
            {"role": "user", "content": "How many apples does Tom have?"},
        ]
        for i in range(6)
    ]
    f.write_text("".join(json.dumps({"chat": c, "answer": str(i)}) + "\n" for i, c in enumerate(chats)))
    f.write_text(f.read_text() + json.dumps({"chat": chats[3], "answer": "3"}) + "\n")  # a true duplicate
    cfg = load_config(
        None,
        [
            f"task=data:{f}",
            "task_config.columns={messages: chat}",
            "eval.size=2",
            "task_config.few_shot_n=1",
            f"task_config.streaming={streaming}",
        ],
    )
    task = task_from_config(cfg)
    held, exclude = prepare_split(task, cfg)
    train = list(itertools.islice(task.train_stream(0, exclude), 40))
    held_answers, train_answers = {p.answer for p in held}, {p.answer for p in train}
    assert len(held) == 2 and len(held_answers) == 2  # two different chats, not one twice
    assert not held_answers & train_answers  # a held-out chat is never trained on
    shot = task.few_shot[0][1].removeprefix("The answer is ").rstrip(".")
    assert shot not in held_answers | train_answers  # nor is the chat drawn as the few-shot example
    if not streaming:  # in memory: the duplicate collapses, every other chat is its own problem
        assert len(task.rows) == 6 and held_answers | train_answers | {shot} == {str(i) for i in range(6)}
    ids = {p.answer: p.id for p in held + train}
    assert len(set(ids.values())) == len(ids)  # one id per chat
    assert all(p.messages[-3]["content"] == f"Tom has {p.answer} apples." for p in held + train)


def test_a_chat_asking_a_given_few_shot_question_is_not_trained_on(tmp_path):
    f = tmp_path / "chats.jsonl"
    chats = [[{"role": "user", "content": f"q{i}"}] for i in range(6)]
    f.write_text("".join(json.dumps({"chat": c, "answer": str(i)}) + "\n" for i, c in enumerate(chats)))
    overrides = ["task_config.columns={messages: chat}", "task_config.few_shot=[{question: q5, answer: 5}]"]
    cfg = load_config(None, [f"task=data:{f}", *overrides, "eval.size=1"])
    task = task_from_config(cfg)
    held, exclude = prepare_split(task, cfg)
    train = {p.meta["question"] for p in itertools.islice(task.train_stream(0, exclude), 40)}
    assert train == {f"q{i}" for i in range(5)} - {held[0].meta["question"]}


def test_given_few_shot_examples_alone_are_shown_and_not_trained_on(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(6)))
    cfg = load_config(None, [f"task={f}", "task_config.few_shot=[{question: q5, answer: 5}]", "eval.size=1"])
    task = task_from_config(cfg)
    held, exclude = prepare_split(task, cfg)
    assert task.few_shot == [("q5", "The answer is 5.")]
    train = {p.meta["question"] for p in itertools.islice(task.train_stream(0, exclude), 40)}
    assert train == {f"q{i}" for i in range(5)} - {held[0].meta["question"]}


def test_code_rows_from_a_tests_column(tmp_path):
    f = tmp_path / "c.jsonl"
    tests = [{"input": "2\n", "output": "4\n"}, {"input": "5\n", "output": "10\n"}]
    f.write_text(json.dumps({"prompt": "double n", "cases": json.dumps(tests)}) + "\n")
    task = make_task(f"data:{f}", {}, "", "", "answer_is", columns={"tests": "cases"})
    p = task.rows[0]
    assert p["kind"] == "code"
    prob = task._make(p)
    assert task.score(prob, "```python\nprint(int(input()) * 2)\n```").correct
    assert task.score(prob, "```python\nprint(int(input()) + 2)\n```").value == 0.5


def test_a_file_of_math_and_code_rows_keeps_both_kinds(tmp_path):
    """Math rows carry an answer and no tests, code rows tests and no answer: each is its own kind, whether
    the other field is left out (rows from Python) or null (read with `datasets`: JSONL, Parquet)."""
    import datasets

    tests = [{"input": "2\n", "output": "4\n"}]
    rows = [
        {"prompt": "1+1?", "answer": "2"},
        {"prompt": "double n", "tests": json.dumps(tests)},
        {"prompt": "2+2?", "answer": "4"},
        {"prompt": "triple n", "tests": json.dumps(tests)},
    ]
    f = tmp_path / "mixed.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    table = tmp_path / "mixed.parquet"
    columns = {k: [r.get(k) for r in rows] for k in ("prompt", "answer", "tests")}  # absent: null
    datasets.Dataset.from_dict(columns).to_parquet(str(table))
    for path in (f, table, None):  # None: the rows as Python dicts, each without the other kind's field
        task = (
            task_from_rows(rows, {"tests": "tests"})
            if path is None
            else make_task(f"data:{path}", {}, "", "", "answer_is", columns={"tests": "tests"})
        )
        got = {r["question"]: (r["kind"], r["answer"], r["tests"]) for r in task.rows}
        assert got == {
            "1+1?": ("math", "2", None),
            "2+2?": ("math", "4", None),
            "double n": ("code", "", tests),
            "triple n": ("code", "", tests),
        }, path
        assert task.skipped == [], path
    bad = tmp_path / "bad.jsonl"  # a math row still needs its answer, a code row its tests
    bad.write_text(json.dumps({"prompt": "3+3?"}) + "\n" + json.dumps({"prompt": "p", "tests": "[]"}) + "\n")
    with pytest.raises(ValueError, match="no usable rows"):
        make_task(f"data:{bad}", {}, "", "", "answer_is", columns={"tests": "tests"})


def test_code_rows_of_a_data_source_are_prompted_and_shown_as_code(tmp_path):
    """Under the default (calculator) system prompt a code row gets the code task's, as task=code does;
    a math row keeps the calculator's; a drawn example of a code row shows its program in the block
    the scorer runs; a math row whose tests are an empty list is a math row."""
    from streamrl.data.code_task import CODE_SYSTEM_PROMPT

    tests = json.dumps([{"input": "2\n", "output": "4\n"}])
    rows = [{"prompt": f"{i}+1?", "answer": str(i + 1), "tests": "[]"} for i in range(3)]
    rows += [
        {"prompt": f"print {i} times n", "answer": f"print(int(input()) * {i})", "tests": tests}
        for i in range(4)
    ]
    f = tmp_path / "mixed.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [f"task=data:{f}", "task_config.columns.tests=tests", "eval.size=1"])
    task = task_from_config(cfg)
    kinds = {r["question"]: r["kind"] for r in task.rows}
    assert kinds == {
        **{f"{i}+1?": "math" for i in range(3)},
        **{f"print {i} times n": "code" for i in range(4)},
    }
    system = {
        p.meta["question"]: p.messages[0]["content"]
        for p in itertools.islice(task.train_stream(0, set()), 60)
    }
    assert system["0+1?"] == TaskConfig.system_prompt and system["print 0 times n"] == CODE_SYSTEM_PROMPT
    code = make_task("code", {}, TaskConfig.system_prompt, "", "answer_is")
    cfg = load_config(None, ["task=code", "task_config.few_shot_n=1", "eval.size=2"])
    prepare_split(code, cfg)
    [(question, response)] = code.few_shot
    assert response.startswith("```python\n") and response.endswith("\n```")
    solution = next(r["solution"] for r in code.rows if r["prompt"] == question)
    assert extract_program(response).strip() == solution.strip()


def test_a_row_that_is_not_valid_unicode_is_skipped_and_named():
    rows = [{"prompt": "bad \ud83d", "answer": "1"}, {"prompt": "1+1?", "answer": "2"}]
    task = task_from_rows(rows, {})
    assert [r["question"] for r in task.rows] == ["1+1?"]
    assert "column 'prompt' is not valid Unicode text (a lone surrogate)" in str(task.skipped)


def test_an_empty_file_is_refused_as_empty(tmp_path):
    f = tmp_path / "none.jsonl"
    f.write_text("\n")
    with pytest.raises(ValueError, match=rf"^{f}: the file is empty \(no rows\)$"):
        make_task(f"data:{f}", {}, "", "", "answer_is")


def test_split_by_weight_is_exact():
    assert split_by_weight(10, [2, 1]) == [7, 3]
    assert split_by_weight(7, [1, 1, 1]) == [3, 2, 2]
    assert sum(split_by_weight(401, [0.3, 0.3, 0.4])) == 401


def test_mixture_draws_sources_by_weight_and_scores_with_each(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text(
        "".join(json.dumps({"prompt": f"half of {2 * i}?", "answer": str(i)}) + "\n" for i in range(50))
    )
    cfg = load_config(
        None,
        [
            "task=mix",
            f"task_config.sources=[{{task: 'rg:chain_sum', weight: 2}}, {{task: 'data:{f}', weight: 1}}]",
            "eval.size=9",
        ],
    )
    task = task_from_config(cfg)
    held, exclude = prepare_split(task, cfg)
    assert Counter(p.meta["source"] for p in held) == {0: 6, 1: 3}
    draws = list(itertools.islice(task.train_stream(0, exclude), 3000))
    share = sum(p.meta["source"] == 0 for p in draws) / len(draws)
    assert abs(share - 2 / 3) < 0.03  # binomial sd ~0.009
    assert not exclude & {p.meta["question"] for p in draws}
    rg, data = (
        next(p for p in draws if p.meta["source"] == 0),
        next(p for p in draws if p.meta["source"] == 1),
    )
    assert rg.id.startswith("m0-") and data.id.startswith("m1-")
    assert task.score(rg, f"The answer is {rg.answer}.").correct  # reasoning-gym's scorer
    assert task.score(data, f"The answer is {float(data.answer)}.").correct  # math-verify: 3.0 == 3
    for weight in (0, float("nan")):  # the same check as at config load, for a mixture built without one
        with pytest.raises(
            ValueError, match=r"'task_config.sources\[0\].weight' must be a finite number > 0, got (0|nan)$"
        ):
            make_task("mix", {}, "", "", "answer_is", sources=[{"task": "rg:chain_sum", "weight": weight}])
    with pytest.raises(ValueError, match=r"task=mix needs task_config.sources="):
        make_task("mix", {}, "", "", "answer_is")


def test_a_held_out_question_is_not_trained_on_as_a_chat_of_one_turn_in_another_source(tmp_path):
    """A chat of one user turn asks what a plain row with its question asks: a mixture holding out
    either form never trains on the other, whichever source holds it."""
    chats, plain = tmp_path / "chats.jsonl", tmp_path / "plain.jsonl"
    one_turn = [{"chat": [{"role": "user", "content": f"q{i}"}], "answer": str(i)} for i in range(8)]
    chats.write_text("".join(json.dumps(r) + "\n" for r in one_turn))
    plain.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(8)))
    sources = f"[{{task: 'data:{chats}', columns: {{messages: chat}}}}, {{task: 'data:{plain}'}}]"
    cfg = load_config(None, ["task=mix", f"task_config.sources={sources}", "eval.size=4"])
    task = task_from_config(cfg)
    held, exclude = prepare_split(task, cfg)
    assert Counter(p.meta["source"] for p in held) == {0: 2, 1: 2}
    held_q = {p.meta["question"] for p in held}
    draws = list(itertools.islice(task.train_stream(0, exclude), 400))
    assert {p.meta["source"] for p in draws} == {0, 1}
    assert not held_q & {p.meta["question"] for p in draws}
    assert {p.meta["question"] for p in draws} == {f"q{i}" for i in range(8)} - held_q


def test_reasoning_gym_composite():
    spec = {
        "datasets": [{"name": "chain_sum", "weight": 3, "config": {"max_terms": 2}}, {"name": "products"}]
    }
    task = make_task("rg:composite", spec, "", "", "answer_is")
    probs = list(itertools.islice(task.train_stream(0, set()), 400))
    share = Counter(p.meta["entry"]["metadata"]["source_dataset"] for p in probs)["chain_sum"] / 400
    assert abs(share - 0.75) < 0.07
    assert all(task.score(p, f"The answer is {p.answer}.").correct for p in probs[:20])
    with pytest.raises(ValueError, match="rg:composite needs task_config.args.datasets"):
        make_task("rg:composite", {}, "", "", "answer_is")


def test_few_shot_turns_render_exactly_and_drawn_shots_are_not_trained(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(20)))
    cfg = load_config(
        None,
        [
            f"task={f}",
            "task_config.system_prompt=S",
            "task_config.instruction=I",
            "task_config.few_shot=[{question: 'one plus one', answer: 2},"
            " {question: 'hi', response: 'verbatim'}]",
            "task_config.few_shot_n=2",
            "eval.size=3",
        ],
    )
    task = task_from_config(cfg)
    held, exclude = prepare_split(task, cfg)
    drawn = [q for q, _ in task.few_shot[2:]]
    assert len(drawn) == 2 and not set(drawn) & {p.meta["question"] for p in held}
    assert task.few_shot[2][1] == f"The answer is {drawn[0][1:]}."
    p = held[0]
    assert p.messages == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "one plus one\nI"},
        {"role": "assistant", "content": "The answer is 2."},
        {"role": "user", "content": "hi\nI"},
        {"role": "assistant", "content": "verbatim"},
        {"role": "user", "content": f"{drawn[0]}\nI"},
        {"role": "assistant", "content": task.few_shot[2][1]},
        {"role": "user", "content": f"{drawn[1]}\nI"},
        {"role": "assistant", "content": task.few_shot[3][1]},
        {"role": "user", "content": f"{p.meta['question']}\nI"},
    ]
    train = {p.meta["question"] for p in itertools.islice(task.train_stream(0, exclude), 60)}
    assert len(train) == 15 and not train & set(drawn)  # 20 - 3 held out - 2 shots
    again, _ = prepare_split(task_from_config(cfg), cfg)
    assert [x.messages for x in again] == [x.messages for x in held]  # deterministic
