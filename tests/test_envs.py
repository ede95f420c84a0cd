"""The environments: the Python tool's runner and protocol, BM25 search over the shipped corpus, scoring."""

import importlib.util
import json
from pathlib import Path

import pytest

from streamrl.config import ConfigError, EnvConfig, TaskConfig, load_config
from streamrl.envs.base import truncate_middle
from streamrl.envs.executor import SandboxRunner
from streamrl.envs.search import DATA, INVALID, SYSTEM_PROMPT, load_retriever, normalize_answer
from streamrl.tasks import make_task

ROOT = Path(__file__).parent.parent


def _task(spec, extract="answer_is", **env):
    return make_task(spec, {}, "", "", extract, env=EnvConfig(**env))


def test_sandbox_runner_output_error_and_timeout(monkeypatch):
    monkeypatch.setenv("SECRET", "hunter2")  # the program must not see the host's environment
    run = SandboxRunner(timeout=0.5)
    assert run("print(6 * 7)") == ("42\n", "ok")
    out, status = run("import os\nprint('SECRET' in os.environ)\nraise ValueError('bad')")
    assert status == "error" and out.startswith("False\n") and out.rstrip().endswith("ValueError: bad")
    out, status = run("while True:\n    pass")
    assert status == "timeout" and "longer than 0.5 s" in out
    # a program that would finish in 3 s is stopped: the 0.5 s limit (not a default) reached the sandbox
    out, status = run("import time\ntime.sleep(3)\nprint('finished')")
    assert status == "timeout" and "finished" not in out
    with pytest.raises(ValueError, match="timeout must be > 0"):
        SandboxRunner(timeout=0)


def test_python_tool_protocol_with_an_injected_executor():
    calls = []

    def fake(code):
        calls.append(code)
        return "7\n", "ok"

    task = _task("env:python_tool", max_observation_chars=20)
    task.run_code = fake
    p = task.heldout(1)[0]
    assert "```python" in p.messages[0]["content"] and p.messages[1]["content"] == p.meta["question"]
    env = task.new_env()
    env.reset(p)
    s = env.step("Let me compute.\n```python\nprint(3 + 4)\n```\n```py\nprint('The answer is 1.')\n```")
    assert (s.done, s.reward, s.observation) == (False, 0.0, "Output (ok):\n7")
    assert calls == ["print(3 + 4)\n\nprint('The answer is 1.')\n"]  # both blocks, one program
    s = env.step(f"The answer is {p.answer}.")
    assert (s.done, s.reward, s.info["correct"], s.info["formatted"]) == (True, 1.0, True, True)
    s = env.step(f"The answer is {int(p.answer) + 1}.")
    assert (s.done, s.reward, s.info["formatted"]) == (True, 0.0, True)
    s = env.step("I do not know")  # neither code nor an answer: the episode ends unanswered
    assert (s.done, s.reward, s.info["formatted"]) == (True, 0.0, False)


@pytest.mark.parametrize(
    "extract, how",
    [
        ("answer_is", "write 'The answer is <number>.'"),
        ("boxed", "write the final answer in \\boxed{}"),
        ("last_number", "end your reply with the final number"),
        ("gsm8k", "end your reply with '#### <number>'"),
    ],
)
def test_python_tool_prompt_asks_for_the_answer_as_the_few_shot_examples_write_it(extract, how):
    """The tool's system prompt is part of a run's prompts (a resumed run renders it again): its text per
    answer format is exact, and the answer it quotes is the few-shot examples' template."""
    from streamrl.data.prompts import SHOT_TEMPLATES

    prompt = _task("env:python_tool", extract).system_prompt
    assert prompt == (
        "You solve problems and may run Python. To run code, write one block\n```python\nprint(2 + 3)\n```\n"
        "and end your turn; the output comes back in the next message. Every block runs as a fresh "
        f"program, so print what you need. When you know the result, {how}."
    )
    if extract in ("answer_is", "gsm8k"):
        assert f"'{SHOT_TEMPLATES[extract].format(answer='<number>')}'." in prompt


def test_python_tool_runs_real_code_and_truncates_output():
    task = _task("env:python_tool", max_observation_chars=40, code_timeout=2.0)
    env = task.new_env()
    env.reset(task.heldout(1)[0])
    s = env.step("```python\nprint('x' * 100)\n```")
    assert not s.done and s.info["tool_status"] == "ok"
    assert s.observation == "Output (ok):\n" + "x" * 20 + "\n...[60 characters cut]...\n" + "x" * 20
    assert env.step("```python\nprint(1/0)\n```").observation.endswith("division by zero")


def test_search_retrieves_the_gold_passage_first():
    retriever = load_retriever()
    rows = [json.loads(x) for x in (DATA / "search_questions.jsonl").read_text().splitlines()]
    assert len(retriever.docs) == 200 and len(rows) == 100
    top1 = sum(retriever.search(r["question"], 1)[0]["id"] == r["doc_id"] for r in rows) / len(rows)
    assert top1 >= 0.95  # measured 1.00 on the shipped corpus
    assert retriever.search("the of a", 3) == [] and retriever.search("qqqq", 3) == []


def test_answer_normalisation():
    assert normalize_answer("The  Bran River.") == "bran river"
    assert normalize_answer(" An otter!") == "otter"
    assert normalize_answer("1,193") == "1193"


def test_search_env_protocol():
    task = _task("env:search", top_k=2, max_observation_chars=1000)
    p = next(
        x for x in task.heldout(25) if x.meta["aliases"]
    )  # a river question: answer "X", alias "X River"
    env = task.new_env()
    env.reset(p)
    s = env.step(f"I will look. <search>{p.meta['question']}</search>")
    assert not s.done and s.observation.startswith("[1] Geography of ") and s.observation.count("\n[") == 1
    assert f"The {p.answer} River flows" in s.observation.split("\n[2]")[0]
    assert env.step("hmm") == type(s)(INVALID, 0.0, False, {"formatted": False})
    for said, reward in ((p.answer.upper(), 1.0), (f"the {p.answer} River.", 1.0), ("Nowhere", 0.0)):
        s = env.step(f"<answer>{said}</answer>")
        assert (s.done, s.reward, s.info["formatted"]) == (True, reward, True)


def test_a_search_turn_acts_on_its_last_query_and_is_scored_on_its_last_answer():
    task = _task("env:search", top_k=1, max_observation_chars=41)
    p = task.heldout(1)[0]
    env = task.new_env()
    env.reset(p)
    gold = load_retriever().search(p.meta["question"], 1)[0]
    body = f"[1] {gold['title']}: {gold['text']}"
    s = env.step(f"<search>qqqq</search> Better: <search>{p.meta['question']}</search>")
    # 41 characters: the first and the last 20 are kept
    assert s.observation == f"{body[:20]}\n...[{len(body) - 40} characters cut]...\n{body[-20:]}"
    s = env.step(f"<answer>Nowhere</answer> No, it is <answer>{p.answer}</answer>")
    assert (s.done, s.reward, s.info["extracted"]) == (True, 1.0, p.answer)
    s = env.step(f"<answer>{p.answer}</answer> No, it is <answer>Nowhere</answer>")
    assert (s.done, s.reward, s.info["extracted"]) == (True, 0.0, "Nowhere")


def test_search_prompt_tells_the_protocol_unless_a_system_prompt_is_configured():
    for system in ("", TaskConfig().system_prompt):  # the single-turn default knows no search tool
        p = make_task("env:search", {}, system, "Be brief.", "answer_is", env=EnvConfig()).heldout(1)[0]
        assert p.messages == [
            {"role": "system", "content": SYSTEM_PROMPT},
            {"role": "user", "content": f"{p.meta['question']}\nBe brief."},
        ]
    p = make_task("env:search", {}, "Search well.", "", "answer_is", env=EnvConfig()).heldout(1)[0]
    assert p.messages[0] == {"role": "system", "content": "Search well."}


def test_an_env_stepped_before_reset_names_the_missing_reset():
    env = _task("env:search").new_env()
    with pytest.raises(RuntimeError, match=r"^SearchEnv.step before reset\(problem\)$"):
        env.step("<search>river</search>")


def test_truncate_middle_keeps_the_head_and_the_tail():
    assert truncate_middle("abcdef", 6) == "abcdef"  # at the limit: whole
    assert truncate_middle("abcdefg", 6) == "abc\n...[1 characters cut]...\nefg"
    assert truncate_middle("abcdefg", 5) == "ab\n...[3 characters cut]...\nfg"  # odd: 2 + 2 kept


def test_search_task_split_and_errors():
    task = _task("env:search")
    held = task.heldout(400)  # capped at a quarter of the 100 questions
    assert len(held) == 25
    stream = task.train_stream(0, {p.meta["question"] for p in held})
    train = [next(stream) for _ in range(75)]
    assert len({p.id for p in train}) == 75 and not {p.id for p in train} & {p.id for p in held}
    with pytest.raises(ValueError, match="takes no task_config.args"):
        make_task("env:search", {"x": 1}, "", "", "answer_is", env=EnvConfig())
    with pytest.raises(
        ValueError, match="unknown environment 'env:nope'; choose from: env:python_tool, env:search"
    ):
        _task("env:nope")
    with pytest.raises(ConfigError, match="config key 'env.max_turns' must be > 0, got 0"):
        load_config(None, ["env.max_turns=0"])


def test_shipped_corpus_is_what_the_script_makes():
    spec = importlib.util.spec_from_file_location("make_corpus", ROOT / "scripts/make_search_corpus.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    docs, questions = mod.build()
    assert (DATA / "search_corpus.jsonl").read_text() == "".join(json.dumps(r) + "\n" for r in docs)
    assert (DATA / "search_questions.jsonl").read_text() == "".join(json.dumps(r) + "\n" for r in questions)
