"""What the data cannot give (a held-out set as large as the rows, more few-shot examples than distinct
prompts) is one line before the model loads and before the run directory exists."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest
from tiny_args import TINY

from streamrl.cli import main

ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(5)]


def _data(tmp_path: Path) -> Path:
    f = tmp_path / "rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    return f


def _train(args: list[str]) -> int:
    """main() in a thread, joined with a limit against a hang (not a speed check)."""
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(main(["train", *args])), daemon=True)
    t.start()
    t.join(timeout=120)
    assert not t.is_alive(), "train hung"
    return out[0]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["eval.size=400"],
            "rows.jsonl: eval.size=400 leaves no training rows (5 rows): lower eval.size, or give the "
            "held-out rows their own file (task_config.eval_data)",
        ),
        (
            ["eval.size=2", "task_config.few_shot_n=4"],
            "config key 'task_config.few_shot_n' is 4 but the training split has 3 distinct prompt(s) "
            "besides the held-out ones: lower it",
        ),
        (
            ["eval.size=2", "task_config.few_shot_n=3"],
            "rows.jsonl: every row is held out or a few-shot example; lower eval.size or "
            "task_config.few_shot_n",
        ),
    ],
    ids=["eval-size", "few-shot-n-above-the-prompts", "few-shot-n-takes-the-rest"],
)
def test_what_the_rows_cannot_give_is_one_line_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    run = tmp_path / "run"
    rc = _train([*TINY, f"task=data:{_data(tmp_path)}", *args, f"run_dir={run}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("streamrl: error: "), err
    assert err.rstrip("\n").endswith(message), err
    assert not run.exists()


def test_a_data_typo_fails_before_the_model_is_resolved(tmp_path, monkeypatch, capsys):
    """A Hub id resolves by downloading the weights (GBs): a missing data file must fail first."""
    import streamrl.preflight as preflight

    resolved: list[str] = []
    monkeypatch.setattr(preflight, "resolve_model_dir", lambda name, seed=0: resolved.append(name))
    args = [*TINY, "model=Qwen/Qwen2.5-7B-Instruct", f"task=data:{tmp_path / 'typo.jsonl'}"]
    assert _train([*args, f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamrl: error: ") and "typo.jsonl" in err and err.count("\n") == 1, err
    assert resolved == []
