import itertools
import json
import threading

import pytest
import torch

from streamrl.data.task import default_task_args
from streamrl.models import resolve_model_dir
from streamrl.models.tiny import build
from streamrl.tasks import make_task


def _chain_sum():
    return make_task("rg:chain_sum", default_task_args("rg:chain_sum"), "sys", "", "answer_is")


def test_heldout_is_distinct_and_never_in_training_stream():
    task = _chain_sum()
    held = task.heldout(300)
    questions = {p.meta["question"] for p in held}
    assert len(questions) == 300
    train = list(itertools.islice(task.train_stream(0, questions), 3000))
    assert not questions & {p.meta["question"] for p in train}
    assert [p.id for p in task.heldout(300)] == [p.id for p in held]  # deterministic


def test_the_training_stream_follows_the_run_seed():
    task = _chain_sum()

    def first(seed):
        return [(p.id, p.meta["question"]) for p in itertools.islice(task.train_stream(seed, set()), 20)]

    assert first(1) == first(1)  # a seed replays its problems
    assert [q for _, q in first(1)] != [q for _, q in first(2)]  # another seed draws others
    assert [i for i, _ in first(2)][:2] == ["train-2-0", "train-2-1"]


def test_bad_reasoning_gym_args_are_one_line_naming_the_task():
    with pytest.raises(
        ValueError, match=r"^bad task_config.args for rg:chain_sum: max_terms must be >= min_terms$"
    ):
        make_task("rg:chain_sum", {"min_terms": 3, "max_terms": 2}, "", "", "answer_is")
    with pytest.raises(
        ValueError, match=r"^bad task_config.args for rg:chain_sum: .*unexpected keyword argument 'nope'$"
    ):
        make_task("rg:chain_sum", {"nope": 1}, "", "", "answer_is")


def test_reasoning_gym_counts_only_full_score_as_correct():
    task = _chain_sum()
    p = task.heldout(1)[0]
    right = task.score(p, f"The answer is {p.answer}.")
    assert right.correct and right.formatted
    wrong = task.score(p, f"The answer is {int(p.answer) + 1}.")
    assert not wrong.correct and wrong.formatted
    # reasoning-gym gives partial credit to answers with extra text; such a score must not count
    assert 0 < task._scorer.score_answer(f"The answer is {p.answer}", p.meta["entry"]) < 1
    assert not task.is_correct(f"The answer is {p.answer}", p)
    assert not task.score(p, p.answer).formatted  # bare number: format not followed
    # the answer first, then text the format does not ask for: correct, without the format bonus
    rambling = task.score(p, f"The answer is {p.answer}.\n\nIn this example, the numbers add up.")
    assert rambling.correct and not rambling.formatted


def test_prompt_has_system_and_question():
    p = make_task("rg:chain_sum", {}, "Be brief.", "Say 'The answer is N'.", "answer_is").heldout(1)[0]
    assert p.messages[0] == {"role": "system", "content": "Be brief."}
    assert p.messages[1]["content"].endswith("\nSay 'The answer is N'.")


def test_jsonl_task_scores_with_math_verify(tmp_path):
    f = tmp_path / "t.jsonl"
    f.write_text(
        "\n".join(json.dumps({"prompt": f"half of {i}?", "answer": f"\\frac{{{i}}}{{2}}"}) for i in range(10))
    )
    task = make_task(str(f), {}, "", "", "boxed")
    held = task.heldout(3)
    train = list(itertools.islice(task.train_stream(0, {p.meta["question"] for p in held}), 14))
    assert {p.meta["question"] for p in train}.isdisjoint({p.meta["question"] for p in held})
    assert len({p.meta["question"] for p in train}) == 7
    p = held[0]
    n = int(p.answer[6:].split("}")[0])
    assert task.score(p, f"so \\boxed{{{n / 2}}}").correct
    assert not task.score(p, f"so \\boxed{{{n + 1}}}").correct


def test_jsonl_bad_rows_are_skipped_counted_and_named(tmp_path, caplog):
    """A malformed row is skipped with a warning naming file and row; no usable rows is an error, and so
    is a line that is not JSON at all (datasets reads the file whole): one line naming file and line."""
    f = tmp_path / "bad.jsonl"
    f.write_text(
        '{"prompt": "a", "answer": "1"}\n{"prompt": "b"}\n{"prompt": "", "answer": "2"}\n'
        '{"prompt": "c", "answer": "3"}\n'
    )
    task = make_task(str(f), {}, "", "", "boxed")
    assert [r["question"] for r in task.rows] == sorted(
        ["a", "c"], key=lambda q: __import__("hashlib").sha1(q.encode()).hexdigest()
    )
    missing = "no 'answer' key (other rows have it): add it or drop the row"  # datasets reads it as null
    assert task.skipped == [f"{f}:row 2: {missing}", f"{f}:row 3: column 'prompt' must be a non-empty string"]
    assert f"bad.jsonl: skipped 2 malformed row(s): {f}:row 2: {missing}" in caplog.text
    # a tests cell that is not JSON is named by its column
    f.write_text('{"prompt": "a", "answer": "1"}\n{"prompt": "d", "answer": "2", "tests": "print(1"}\n')
    columns = {"prompt": "prompt", "answer": "answer", "tests": "tests"}
    assert make_task(str(f), {}, "", "", "boxed", columns=columns).skipped == [
        f"{f}:row 2: column 'tests' is not valid JSON (Expecting value: line 1 column 1 (char 0))"
    ]
    f.write_text('{"prompt": "b", "answer": null}\n')
    with pytest.raises(
        ValueError,
        match=r"bad.jsonl: no usable rows .*first problem: .*bad.jsonl:row 1: column 'answer' is empty",
    ):
        make_task(str(f), {}, "", "", "boxed")
    f.write_text('{"prompt": "a", "answer": "1"}\nnot json\n')
    with pytest.raises(
        ValueError, match=rf"^{f}:2: not valid JSON \(Expecting value\); fix or remove the line$"
    ):
        make_task(str(f), {}, "", "", "boxed")
    f.write_text('{"question": "a", "answer": "1"}\n')
    with pytest.raises(
        ValueError,
        match=r"bad.jsonl: no column 'prompt' for the prompt \(its columns: question, "
        r"answer\); map it with task_config.columns=\{prompt: <column>\}$",
    ):
        make_task(str(f), {}, "", "", "boxed")


def test_unknown_task_and_model_errors():
    with pytest.raises(ValueError, match="unknown reasoning-gym task 'nope'; choose from: .*chain_sum"):
        make_task("rg:nope", {}, "", "", "answer_is")
    with pytest.raises(ValueError, match="unknown task 'gsm8k'"):
        make_task("gsm8k", {}, "", "", "answer_is")
    with pytest.raises(
        ValueError,
        match=r"model './gpt5': not a model directory \(no config.json there\); use one of "
        "smollm2-135m-instruct, tiny-random, a local HF model directory or a Hugging Face Hub id",
    ):
        resolve_model_dir("./gpt5")


def test_a_run_directory_given_as_the_model_names_its_export(tmp_path):
    run = tmp_path / "run"
    (run / "checkpoint").mkdir(parents=True)
    (run / "checkpoint" / "config.json").write_text("{}")
    (run / "config.yaml").write_text("max_steps: 1\n")
    with pytest.raises(ValueError) as e:
        resolve_model_dir(str(run))
    said = f"model '{run}': a streamrl run directory; the model it exported is model={run}/checkpoint"
    assert str(e.value) == said


def test_tiny_random_is_deterministic_per_seed(tmp_path):
    from safetensors.torch import load_file

    a = load_file(build(tmp_path / "a", seed=1) / "model.safetensors")
    b = load_file(build(tmp_path / "b", seed=1) / "model.safetensors")
    c = load_file(build(tmp_path / "c", seed=2) / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


def test_a_chat_that_ends_with_its_reply_is_not_a_prompt(tmp_path):
    """An SFT-style `messages` row holds the answer as its last turn: as a prompt it would show the
    model the reference solution. Such a row is skipped, named, with the fix."""
    f = tmp_path / "chat.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "2+2?"}], "answer": "4"},
        {"messages": [{"role": "user", "content": "3+3?"}, {"role": "assistant", "content": "6"}]},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = make_task(str(f), {}, "", "", "boxed", columns={"messages": "messages"})
    assert [r["question"] for r in task.rows] == ["2+2?"]
    assert task.skipped == [
        f"{f}:row 2: column 'messages' ends with an assistant turn: a prompt ends with the user's turn "
        "(drop the reply from the column; map a reference with task_config.columns.answer)"
    ]


def test_column_mappings_that_cannot_be_meant_are_refused_or_skipped(tmp_path):
    """A prompt and a chat column both mapped (one would be ignored), a chat whose question is empty, a
    row id that is empty or shared by two prompts (the id keys the reward cache and the sampler)."""
    f = tmp_path / "rows.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "2+2?"}], "answer": "4", "uid": "a"},
        {"messages": [{"role": "user", "content": "  "}], "answer": "5", "uid": "b"},
        {"messages": [{"role": "user", "content": "3+3?"}], "answer": "6", "uid": None},
    ]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError, match=r"^task_config.columns: set prompt or messages, not both"):
        make_task(str(f), {}, "", "", "boxed", columns={"prompt": "q", "messages": "messages"})
    task = make_task(str(f), {}, "", "", "boxed", columns={"messages": "messages", "id": "uid"})
    assert [(r["question"], r["id"]) for r in task.rows] == [("2+2?", "a")]
    assert task.skipped == [
        f"{f}:row 2: column 'messages' has an empty last user turn",
        f"{f}:row 3: column 'uid' (the row id) is empty",
    ]
    rows[1]["messages"][0]["content"], rows[1]["uid"], rows[2]["uid"] = "4+4?", "b", "a"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(
        ValueError,
        match=rf"^task_config.columns.id: column 'uid' repeats 'a' \({f}: rows 1 and 3, different prompts\): "
        "map a column unique per row, or drop columns.id$",
    ):
        make_task(str(f), {}, "", "", "boxed", columns={"messages": "messages", "id": "uid"})
    rows[2]["messages"] = rows[0]["messages"]  # the same prompt again, with another answer: merged
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = make_task(str(f), {}, "", "", "boxed", columns={"messages": "messages", "id": "uid"})
    assert sorted(r["id"] for r in task.rows) == ["a", "b"]


def test_tiny_random_template_renders_tools_and_tool_calls_exactly():
    """The test model's ChatML: a tools block opens the chat (the system prompt folded in), assistant tool
    calls render as <tool_call> JSON (arguments given as an object or as a string), tool results as
    `tool` turns; a chat without tools is plain ChatML."""
    from streamrl.models.tiny import build_tokenizer

    tok = build_tokenizer()
    chat = [{"role": "system", "content": "Be exact."}, {"role": "user", "content": "2+3?"}]
    assert tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True) == (
        "<|im_start|>system\nBe exact.<|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"
    )
    tool = {"type": "function", "function": {"name": "add", "parameters": {"type": "object"}}}
    calls = [
        {"function": {"name": "add", "arguments": {"a": 2}}},
        {"function": {"name": "add", "arguments": '{"a": 3}'}},
    ]
    turns = [
        *chat,
        {"role": "assistant", "content": "Adding.", "tool_calls": calls},
        {"role": "tool", "content": "5"},
        {"role": "assistant", "content": "", "tool_calls": calls[:1]},
    ]
    assert tok.apply_chat_template(turns, tools=[tool], tokenize=False) == (
        "<|im_start|>system\nBe exact.\n\n# Tools\n\nYou may call functions. Their signatures are in "
        '<tools></tools>:\n<tools>\n{"type": "function", "function": {"name": "add", "parameters": '
        '{"type": "object"}}}\n</tools>\n\nFor each call, reply with <tool_call>\n{"name": '
        '<function-name>, "arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
        "<|im_start|>user\n2+3?<|im_end|>\n"
        '<|im_start|>assistant\nAdding.\n<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call>'
        '\n<tool_call>\n{"name": "add", "arguments": {"a": 3}}\n</tool_call><|im_end|>\n'
        "<|im_start|>tool\n5<|im_end|>\n"
        '<|im_start|>assistant\n<tool_call>\n{"name": "add", "arguments": {"a": 2}}\n</tool_call><|im_end|>\n'
    )
    no_system = tok.apply_chat_template(chat[1:], tools=[tool], tokenize=False, add_generation_prompt=True)
    assert no_system.startswith("<|im_start|>system\n# Tools\n\n")
    assert no_system.endswith(
        "</tool_call><|im_end|>\n<|im_start|>user\n2+3?<|im_end|>\n<|im_start|>assistant\n"
    )


def test_a_generator_whose_every_problem_is_held_out_is_refused_not_looped_on(tmp_path, capsys):
    """rg:products with the small-model args has 100 distinct problems: holding out all of them left
    the training stream searching for another forever."""
    task = make_task("rg:products", default_task_args("rg:products"), "sys", "", "answer_is")
    held = {p.meta["question"] for p in task.heldout(100)}
    stream = task.train_stream(0, held)
    got: list = []

    def first() -> None:
        try:
            got.append(next(stream))
        except ValueError as e:
            got.append(e)

    searching = threading.Thread(target=first, daemon=True)  # a stream that never returns fails, not hangs
    searching.start()
    searching.join(120)
    assert got, "the training stream searched for a problem that is not held out for 120 s"
    assert str(got[0]).startswith("task rg:products: every problem it generates is held out or a ")
    assert next(task.train_stream(0, set(list(held)[:99]))).meta["question"] in held  # one is left

    from streamrl.cli import main

    run = tmp_path / "run"
    args = ["train", "model=tiny-random", "task=rg:products", "eval.size=100", f"run_dir={run}"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "is held out or a few-shot example (100 of them): lower eval.size" in err
    assert not run.exists()
