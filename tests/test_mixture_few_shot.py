"""Few-shot examples of a mixture: each source's prompts show examples drawn from that source (its own
format and answers), never another source's and never a held-out problem; given examples go to all."""

import itertools
import json
import re

import pytest

from streamrl.config import load_config
from streamrl.tasks import prepare_split, task_from_config


def _sources(tmp_path, streaming: bool, chats: int = 12) -> str:
    """Source 0: plain rows 'add i and i'; source 1: one-turn chats 'spell i' with word answers."""
    plain, chat = tmp_path / "plain.jsonl", tmp_path / "chat.jsonl"
    plain.write_text(
        "".join(json.dumps({"prompt": f"add {i} and {i}", "answer": str(2 * i)}) + "\n" for i in range(12))
    )
    chat.write_text(
        "".join(
            json.dumps({"turns": [{"role": "user", "content": f"spell {i}"}], "word": f"w{i}"}) + "\n"
            for i in range(chats)
        )
    )
    s = str(streaming).lower()
    return (
        f"[{{task: 'data:{plain}', streaming: {s}}}, "
        f"{{task: 'data:{chat}', columns: {{messages: turns, answer: word}}, streaming: {s}}}]"
    )


def _shown(problem) -> list[tuple[str, str]]:
    """The few-shot turns before a problem's own turn: (question, reply) pairs."""
    turns = [m["content"] for m in problem.messages if m["role"] != "system"][:-1]
    return list(zip(turns[::2], turns[1::2]))


OWN = {0: re.compile(r"add \d+ and \d+"), 1: re.compile(r"spell \d+")}  # each source's questions
REPLY = {0: re.compile(r"The answer is \d+\."), 1: re.compile(r"The answer is w\d+\.")}  # its answers


@pytest.mark.parametrize(
    ("streaming", "task"),
    [(False, "mix"), (True, "mix"), (False, "agent:streamrl.envs.agents:calculator")],
)
def test_each_source_shows_only_its_own_drawn_examples(tmp_path, streaming, task):
    """A mixture, or an agent over one (its base task renders the training problems)."""
    overrides = [
        f"task={task}",
        *(["task_config.args={base: mix}"] if task.startswith("agent:") else []),
        f"task_config.sources={_sources(tmp_path, streaming)}",
        "eval.size=4",
        "task_config.few_shot_n=2",
        "task_config.few_shot=[{question: 'given one', answer: 1}]",
    ]
    cfg = load_config(None, overrides)
    built = task_from_config(cfg)
    held, exclude = prepare_split(built, cfg)
    train = list(itertools.islice(built.train_stream(0, exclude), 200))
    shown: dict[int, set[str]] = {0: set(), 1: set()}
    for p in held + train:
        source = p.meta["source"]
        given, *drawn = _shown(p)
        assert given == ("given one", "The answer is 1.") and len(drawn) == 2, p.meta["question"]
        for question, reply in drawn:  # two of its own source, in its own answer style
            assert OWN[source].fullmatch(question) and REPLY[source].fullmatch(reply), (source, drawn)
        shown[source].update(q for q, _ in drawn)
    assert {s: len(qs) for s, qs in shown.items()} == {0: 2, 1: 2}  # the same two for every prompt
    examples = shown[0] | shown[1]
    assert not examples & {p.meta["question"] for p in held}  # never a held-out problem
    assert not examples & {p.meta["question"] for p in train}  # nor trained on


def test_a_source_with_too_few_rows_for_its_own_examples_is_named(tmp_path):
    cfg = load_config(
        None,
        [
            "task=mix",
            f"task_config.sources={_sources(tmp_path, False, chats=4)}",
            "eval.size=2",
            "task_config.few_shot_n=4",
        ],
    )
    with pytest.raises(ValueError) as e:
        prepare_split(task_from_config(cfg), cfg)
    assert str(e.value) == (
        "task_config.sources[1]: config key 'task_config.few_shot_n' is 4 but the training split has 3 "
        "distinct prompt(s) besides the held-out ones: lower it"
    )


@pytest.mark.parametrize("task", ["agent:streamrl.envs.agents:calculator", "env:python_tool"])
def test_a_task_over_a_base_task_shows_the_examples_in_training_as_in_evaluation(tmp_path, task):
    """An agent over a data file, the Python tool over reasoning-gym: the base task renders the training
    problems, so it gets the examples the held-out problems show."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"prompt": f"add {i} and {i}", "answer": str(2 * i)}) + "\n" for i in range(12))
    )
    overrides = [f"task={task}", "eval.size=4", "task_config.few_shot_n=1"]
    if task.startswith("agent:"):
        overrides.append(f"task_config.args={{base: 'data:{rows}'}}")
    cfg = load_config(None, overrides)
    task_obj = task_from_config(cfg)
    held, exclude = prepare_split(task_obj, cfg)
    train = list(itertools.islice(task_obj.train_stream(0, exclude), 8))
    shots = {tuple(_shown(p)) for p in held + train}
    assert len(shots) == 1 and len(next(iter(shots))) == 1  # one example, the same for every prompt
    ((question, _),) = next(iter(shots))
    assert question not in {p.meta["question"] for p in held + train}
