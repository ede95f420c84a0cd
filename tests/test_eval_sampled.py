"""Sampled evaluation end to end: scripted responses give hand-computed pass@k / avg@n / maj@k."""

import json
from pathlib import Path

import pytest

from streamrl.cli import main
from streamrl.data.sources import task_from_rows
from streamrl.engine.base import GenResult
from streamrl.eval.sampled import evaluate_sampled
from streamrl.models.tiny import build_tokenizer

SCRIPT = {  # question -> (samples in order, greedy response)
    "alpha": (["The answer is 3.", "The answer is 4.", "The answer is 4.", "no idea"], "The answer is 3."),
    "beta": (["The answer is 5."] * 4, "maybe 5"),
}


class ScriptedEngine:
    def __init__(self, tok, script=SCRIPT):
        self.tok, self.script = tok, script

    def generate(self, requests):
        out = []
        for r in requests:
            prompt = self.tok.decode(r.prompt_ids)
            samples, greedy = next(v for q, v in self.script.items() if q in prompt)
            pi, j = r.tag
            text = greedy if j < 0 else samples[j]
            ids = self.tok(text, add_special_tokens=False).input_ids
            out.append(GenResult(r, ids, [-1.0] * len(ids), [0] * len(ids), "stop" if j != 1 else "length"))
        return out


def test_scripted_samples_give_hand_computed_metrics():
    rows = [
        {"prompt": "alpha", "answer": "3"},
        {"prompt": "beta", "answer": "5"},
        {"prompt": "c", "answer": "1"},
    ]
    task = task_from_rows(rows)
    problems = [task._make(r) for r in task.rows if r["question"] in SCRIPT]
    tok = build_tokenizer()
    res = evaluate_sampled(
        ScriptedEngine(tok),
        tok,
        task,
        problems,
        n=4,
        ks=[1, 2, 4],
        temperature=1.0,
        top_p=1.0,
        max_new_tokens=32,
    )
    s = res.summary()
    # alpha: c = 1 of 4, majority of first 2 is a 3-vs-4 tie -> "3" (first seen), of 4 -> "4"; beta: c = 4
    assert s["pass@1"] == pytest.approx((0.25 + 1) / 2)
    assert s["pass@2"] == pytest.approx((0.5 + 1) / 2)  # 1 - C(3,2)/C(4,2) = 0.5
    assert s["pass@4"] == 1.0 and s["avg@4"] == pytest.approx(0.625)
    assert (s["maj@1"], s["maj@2"], s["maj@4"]) == (1.0, 1.0, 0.5)
    assert s["greedy_accuracy"] == 0.5 and s["truncation_rate"] == pytest.approx(2 / 8)
    assert s["mean_length"] == pytest.approx(sum(len(t) for v in SCRIPT.values() for t in v[0]) / 8)


GOOD, BAD = "```python\nprint(int(input()) + 1)\n```", "```python\nprint(0)\n```"
VOTES = {
    # string equality: "8" has 2 votes and wins; by value the 7s (7.0, 7) tie it and came first
    "gamma": (["The answer is 7.0.", "The answer is 8.", "The answer is 8.", "The answer is 7."], "-"),
    # programs: a tie between the passing and the failing one, the passing one first
    "delta": ([GOOD, BAD, GOOD, BAD], "-"),
}


@pytest.mark.parametrize(
    ("row", "columns", "verdicts"),
    [
        ({"prompt": "gamma", "answer": "7"}, None, [True, False, False, True]),
        (
            {
                "prompt": "delta",
                "tests": [{"input": "1\n", "output": "2\n"}, {"input": "5\n", "output": "6\n"}],
            },
            {"tests": "tests"},
            [True, False, True, False],
        ),
    ],
    ids=["math", "code"],
)
def test_maj_at_k_groups_by_the_tasks_equivalence_and_takes_each_samples_verdict(row, columns, verdicts):
    task = task_from_rows([row], columns)
    tok = build_tokenizer()
    problems = [task._make(task.rows[0])]
    res = evaluate_sampled(ScriptedEngine(tok, VOTES), tok, task, problems, 4, [1, 4], 1.0, 1.0, 32)
    assert res.correct == [verdicts]
    assert (res.summary()["maj@1"], res.summary()["maj@4"]) == (1.0, 1.0)


def test_eval_command_writes_eval_json_and_keeps_a_training_record(tmp_path, capsys):
    args = [
        "eval",
        "model=tiny-random",
        "size=3",
        "n=4",
        "k=1,4",
        "eval.max_new_tokens=4",
        "reward.extract=last_number",
        f"run_dir={tmp_path}",
    ]
    (tmp_path / "eval.json").write_text(json.dumps({"base": {"accuracy": 0.1}}))
    assert main(args) == 0
    out = json.loads((tmp_path / "eval.json").read_text())
    assert out["base"] == {"accuracy": 0.1}  # the training run's record survives
    s = out["sampled"]
    assert (s["problems"], s["n"], s["ks"]) == (3, 4, [1, 4])
    assert s["pass@1"] == pytest.approx(s["avg@4"]) and s["pass@1"] <= s["pass@4"]
    assert {"maj@1", "maj@4", "greedy_accuracy", "mean_length", "truncation_rate"} <= set(s)


def test_an_eval_into_a_run_that_has_not_written_eval_json_yet_survives_the_runs_end(tmp_path):
    """`streamrl eval` into a run directory while the run trains (eval.before=false: no eval.json yet):
    its record goes under "sampled", which the run keeps when it writes its own at the end."""
    from streamrl.loop.heldout import run_eval_record

    (tmp_path / "config.yaml").write_text("model: tiny-random\n")
    (tmp_path / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    args = ["eval", "model=tiny-random", "size=3", "eval.max_new_tokens=4", f"run_dir={tmp_path}"]
    assert main([*args, "reward.extract=last_number"]) == 0
    found = json.loads((tmp_path / "eval.json").read_text())
    assert set(found) == {"sampled"} and found["sampled"]["problems"] == 3
    assert run_eval_record(None, None, found)["sampled"] == found["sampled"]


def test_eval_of_nothing_is_refused_before_the_task_is_read(monkeypatch, capsys):
    import streamrl.tasks

    def unread(*a, **k):
        raise AssertionError("the task was read")

    monkeypatch.setattr(streamrl.tasks, "task_from_config", unread)
    assert main(["eval", "model=tiny-random", "size=0"]) == 2
    assert "config key 'eval.size' is 0: nothing to evaluate (set size=N)" in capsys.readouterr().err


def test_a_greedy_only_eval_records_no_samples_and_no_temperature(tmp_path):
    args = ["eval", "model=tiny-random", "size=3", "eval.max_new_tokens=4", f"run_dir={tmp_path}"]
    assert main([*args, "reward.extract=last_number"]) == 0
    out = json.loads((tmp_path / "eval.json").read_text())
    assert (out["problems"], out["n"], out["ks"], out["temperature"]) == (3, 0, [], 0.0)


def test_eval_loads_the_tokenizer_once(tmp_path, monkeypatch):
    """The tokenizer the chat-template check loaded (before any weights) is the one the engine gets."""
    from transformers import AutoTokenizer

    from streamrl.models.resolve import resolve_model_files

    resolve_model_files("tiny-random")  # built (or found) before the count starts
    loads = []
    original = AutoTokenizer.from_pretrained
    monkeypatch.setattr(
        AutoTokenizer, "from_pretrained", lambda *a, **k: loads.append(a) or original(*a, **k)
    )
    args = ["eval", "model=tiny-random", "size=2", "eval.max_new_tokens=2", f"run_dir={tmp_path}"]
    assert main([*args, "reward.extract=last_number"]) == 0
    assert len(loads) == 1


def test_eval_of_a_checkpoint_refuses_problems_its_run_trained_on(tmp_path, capsys, monkeypatch):
    from tiny_args import TINY

    monkeypatch.chdir(tmp_path)
    rows = [{"prompt": f"What is {i}+1?", "answer": str(i + 1)} for i in range(17)]
    Path("rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:12]))
    Path("other.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[12:]))
    run = tmp_path / "run"
    trained = ["task=data:rows.jsonl", "max_steps=1", "checkpoint.save=true", "checkpoint.every=1"]
    assert main(["train", *TINY, *trained, "eval.size=2", f"run_dir={run}"]) == 0
    capsys.readouterr()
    ev = ["eval", "eval.max_new_tokens=4"]  # the run's task, extract and eval.size are taken
    taking = f"taking the task settings of {run} (config.yaml); a key given here overrides them"
    for model in (run / "checkpoint", run / "checkpoints" / "step-1"):
        assert main([*ev, f"model={model}", "size=3", f"run_dir={tmp_path / 'e'}"]) == 2
    assert capsys.readouterr().err.splitlines() == 2 * [
        taking,
        f"streamrl: error: config key 'eval.size' is 3, but the run in {run} held out 2 problems of "
        "data:rows.jsonl, and 1 of the 3 this evaluation takes were open to its training: set size=2, or "
        "evaluate on rows of your own (task_config.eval_data)",
    ]
    assert not (tmp_path / "e").exists()  # refused before anything ran or was written
    model = f"model={run / 'checkpoints' / 'step-1'}"
    assert main([*ev, model, f"run_dir={tmp_path / 'e2'}"]) == 0  # the run's 2 held-out problems
    assert json.loads((tmp_path / "e2" / "eval.json").read_text())["problems"] == 2
    capsys.readouterr()
    # streamed, the held-out problems are the first rows in file order: not the ones this run held out
    assert main([*ev, model, "size=2", "task_config.streaming=true", f"run_dir={tmp_path / 'e7'}"]) == 2
    assert capsys.readouterr().err == (
        f"{taking}\n"
        f"streamrl: error: the run in {run} read data:rows.jsonl with task_config.streaming=false, which "
        "holds out other problems than task_config.streaming=true takes: evaluate with "
        "task_config.streaming=false\n"
    )
    other = main([*ev, model, "size=5", "task_config.eval_data=other.jsonl", f"run_dir={tmp_path / 'e3'}"])
    assert other == 0  # rows of their own, apart from the training rows
    # a generated task: its run held out the first 2 problems of the held-out generator
    run3 = tmp_path / "run3"
    assert (
        main(["train", *TINY, "max_steps=1", "checkpoint.save=true", "eval.size=2", f"run_dir={run3}"]) == 0
    )
    capsys.readouterr()
    gen = ["eval", "eval.max_new_tokens=4", f"model={run3 / 'checkpoint'}"]
    assert main([*gen, "size=3", f"run_dir={tmp_path / 'e5'}"]) == 2
    assert "held out 2 problems of rg:chain_sum, and 1 of the 3 this evaluation" in capsys.readouterr().err
    # args given empty are the task's defaults, which the run filled in and recorded
    assert main([*gen, "task_config.args={}", "size=3", f"run_dir={tmp_path / 'e5'}"]) == 2
    assert "held out 2 problems of rg:chain_sum, and 1 of the 3 this evaluation" in capsys.readouterr().err
    assert main([*gen, "size=2", f"run_dir={tmp_path / 'e6'}"]) == 0
    # a run that held out another file trained on every row of the training split: none is held out
    run2 = tmp_path / "run2"
    assert main(["train", *TINY, *trained, "task_config.eval_data=other.jsonl", f"run_dir={run2}"]) == 0
    capsys.readouterr()
    model2 = f"model={run2 / 'checkpoint'}"
    assert main([*ev, model2, "size=1", f"run_dir={tmp_path / 'e8'}"]) == 0  # on its held-out file
    capsys.readouterr()
    training_split = "task_config.eval_data="  # held out of the training split instead: refused
    assert main([*ev, model2, training_split, "size=1", f"run_dir={tmp_path / 'e4'}"]) == 2
    err = capsys.readouterr().err
    assert f"the run in {run2} held out task_config.eval_data=" in err
    assert (
        "and trained on every problem of data:rows.jsonl's training split, which this evaluation takes" in err
    )


def test_eval_command_rejects_k_above_n(capsys):
    assert main(["eval", "model=tiny-random", "n=4", "k=8"]) == 2
    assert "config key 'eval.k' values must be <= eval.n (samples per problem), got k=[8] with eval.n=4" in (
        capsys.readouterr().err
    )


def test_training_evaluates_the_heldout_set_every_n_steps(tmp_path):
    run = tmp_path / "run"
    args = [
        "train",
        "model=tiny-random",
        "eval.size=3",
        "eval.before=false",
        "eval.after=false",
        "rollout.prompts_per_step=2",
        "rollout.samples_per_prompt=2",
        "rollout.max_new_tokens=4",
        "eval.max_new_tokens=4",
        "reward.extract=last_number",
        "checkpoint.save=false",
        "runtime.mode=colocated",
        "max_staleness=0",
        "max_steps=4",
        "eval.every=2",
        "eval.n=2",
    ]
    assert main([*args, f"run_dir={run}"]) == 0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert ["heldout_accuracy" in r for r in rows] == [False, True, False, True]
    assert all(0 <= rows[i]["heldout_pass@1"] <= rows[i]["heldout_pass@2"] <= 1 for i in (1, 3))
    # the evaluation's samples leave the training rollouts as they are without it
    assert main([*args, "eval.every=0", "eval.n=0", f"run_dir={tmp_path / 'plain'}"]) == 0
    assert (run / "groups.jsonl").read_text() == (tmp_path / "plain" / "groups.jsonl").read_text()


def test_a_mixtures_smaller_held_out_set_is_checked_by_its_problems(tmp_path, monkeypatch):
    """Largest-remainder shares are not nested: of a 1:3:3 mix, 11 held-out problems are 1 + 5 + 5 and 10
    are 2 + 4 + 4, so evaluating 10 would score a problem of the first file that the run trained on."""
    import yaml

    from streamrl import eval_cli
    from streamrl.config import config_yaml, load_config
    from streamrl.tasks import task_from_config

    monkeypatch.chdir(tmp_path)
    for name in "abc":
        rows = [{"prompt": f"{name}: what is {i}+1?", "answer": str(i + 1)} for i in range(20)]
        Path(f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    mix = [
        "task=mix",
        "task_config.sources=[{task: data:a.jsonl, weight: 1}, {task: data:b.jsonl, weight: 3}, "
        "{task: data:c.jsonl, weight: 3}]",
    ]
    trained = yaml.safe_load(config_yaml(load_config(None, [*mix, "eval.size=11"])))
    monkeypatch.setattr(eval_cli, "trained_run", lambda model: (tmp_path / "run", trained))
    for size in (11, 7, 1):  # 1 + 5 + 5, 1 + 3 + 3, 0 + 1 + 0 (or 1 + 0 + 0): inside the run's
        cfg = load_config(None, [*mix, f"eval.size={size}"])
        eval_cli.refuse_trained_problems(cfg, task_from_config(cfg))
    cfg = load_config(None, [*mix, "eval.size=10"])
    with pytest.raises(ValueError, match=r"held out 11 problems of mix, and 1 of the 10 this evaluation"):
        eval_cli.refuse_trained_problems(cfg, task_from_config(cfg))
