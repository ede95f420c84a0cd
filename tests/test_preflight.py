"""What the data cannot give (a held-out set as large as the rows, more few-shot examples than distinct
prompts) is one line before the model loads and before the run directory exists."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from tiny_args import TINY
from train_cli import rows_file, train

from streamrl.types import Problem

ROWS = [{"prompt": f"What is {i} + {i}?", "answer": str(2 * i)} for i in range(5)]


@pytest.fixture
def resolved(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The models preflight resolves, recorded instead (config and tokenizer, then the weights: a Hub id
    downloads them)."""
    import streamrl.preflight as preflight

    names: list[str] = []
    for step in ("resolve_model_files", "resolve_model_dir"):
        monkeypatch.setattr(preflight, step, lambda name, seed=0: names.append(name))
    return names


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
    rc = train([*TINY, f"task=data:{rows_file(tmp_path, ROWS)}", *args, f"run_dir={run}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and err.startswith("streamrl: error: "), err
    assert err.rstrip("\n").endswith(message), err
    assert not run.exists()


def test_a_data_typo_fails_before_the_model_is_resolved(tmp_path, resolved, capsys):
    """A Hub id resolves by downloading the weights (GBs): a missing data file must fail first."""
    args = [*TINY, "model=Qwen/Qwen2.5-7B-Instruct", f"task=data:{tmp_path / 'typo.jsonl'}"]
    assert train([*args, f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamrl: error: ") and "typo.jsonl" in err and err.count("\n") == 1, err
    assert resolved == []


def test_a_source_with_nothing_to_train_on_fails_before_the_model_is_resolved(tmp_path, resolved, capsys):
    """A mixture's source whose every row is held out (its own eval_data): one line naming the source at
    set-up, not an error from the admission thread once the source first comes up in training."""
    rows = tmp_path / "b.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(4)))
    sources = f"[{{task: rg:chain_sum, weight: 9}}, {{task: 'data:{rows}', weight: 1, eval_data: '{rows}'}}]"
    args = [*TINY, "task=mix", f"task_config.sources={sources}", "eval.size=4"]
    assert train([*args, f"run_dir={tmp_path / 'run'}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamrl: error: task_config.sources[1]: ") and err.count("\n") == 1, err
    assert "every training row is also a held-out row" in err
    assert resolved == [] and not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    "device, message",
    [
        ("gpu", "config key 'device': 'gpu' is not a torch device: use cpu, cuda, cuda:N, mps or xpu"),
        (
            "cuda",
            "config key 'device': this machine has no cuda device (this torch is a CPU build): "
            "use device=cpu",
        ),
        ("meta", "config key 'device': streamrl does not run on 'meta': use cpu, cuda, cuda:N, mps or xpu"),
    ],
)
def test_a_device_this_machine_lacks_is_one_line_before_anything_is_written(
    tmp_path, capsys, device, message
):
    import torch

    if device == "cuda" and (torch.cuda.is_available() or torch.version.cuda is not None):
        message = message.replace(" (this torch is a CPU build)", "")
        if torch.cuda.is_available():
            device, message = "cuda:99", "config key 'device': cuda:99, but this machine has"
    run = tmp_path / "run"
    assert train([*TINY, f"device={device}", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"streamrl: error: {message}") and err.count("\n") == 1, err
    assert not run.exists()


def test_a_run_dir_that_is_taken_fails_before_the_model_is_resolved(tmp_path, resolved, capsys):
    """A Hub id resolves by downloading the weights (GBs): a run_dir that cannot be used fails first."""
    (tmp_path / "notes.txt").write_text("mine")
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "config.yaml").write_text("model: tiny\n")
    (tmp_path / "old" / "metrics.jsonl").write_text("")  # a run's: config.yaml alone is no run
    (tmp_path / "old" / "state" / "step-000001").mkdir(parents=True)  # its saved state
    for run_dir, message in [
        ("notes.txt", "is a file: choose a directory (a new name, or a run's)"),
        ("old", "already holds a run: continue it with resume="),
    ]:
        assert train([*TINY, "model=Qwen/Qwen2.5-7B-Instruct", f"run_dir={tmp_path / run_dir}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"streamrl: error: run_dir {tmp_path / run_dir} ") and message in err, err
        assert err.count("\n") == 1
    assert resolved == [] and (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in (tmp_path / "old").iterdir()) == ["config.yaml", "metrics.jsonl", "state"]
    typo = ["model=Qwen/Qwen2.5-7B-Instruct", "task_config.chat_template=typo.jinja"]  # a template too
    assert train([*TINY, *typo, f"run_dir={tmp_path / 'new'}"]) == 2
    assert capsys.readouterr().err == (
        "streamrl: error: config key 'task_config.chat_template': no file 'typo.jinja' "
        "(a Jinja chat template)\n"
    )
    assert resolved == [] and not (tmp_path / "new").exists()


def test_drawn_few_shot_examples_need_reference_answers(tmp_path: Path) -> None:
    """columns.answer=null (your own reward function scores the rows): a drawn example would have no
    answer to show, so few_shot_n is refused with the fix; given examples (few_shot) are accepted."""
    from streamrl.config import load_config
    from streamrl.tasks import prepare_split, task_from_config

    args = [
        f"task=data:{rows_file(tmp_path, ROWS)}",
        "task_config.columns={answer: null}",
        "reward.fn=f.py:r",
        "eval.size=2",
    ]
    cfg = load_config(None, [*args, "task_config.few_shot_n=1"])
    with pytest.raises(ValueError, match=r"^config key 'task_config.few_shot_n' draws examples with their "):
        prepare_split(task_from_config(cfg), cfg)
    cfg = load_config(
        None, [*args, "task_config.few_shot=[{question: '1+1?', response: 'The answer is 2.'}]"]
    )
    heldout, _ = prepare_split(task_from_config(cfg), cfg)
    assert len(heldout) == 2


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ["task=rg:acre", "rollout.sampler=curriculum"],
            "rollout.sampler=curriculum: reasoning-gym has no curriculum for 'acre': choose another rg: task "
            "or another rollout.sampler",
        ),
        (
            ["train.lora_rank=2", "train.lora_targets=[q_projj]"],
            "config key 'train.lora_targets': no linear layer named ['q_projj'] in this model; its linear "
            "layers are ['down_proj', 'gate_proj', 'k_proj', 'lm_head', 'o_proj', 'q_proj', 'up_proj', "
            "'v_proj']",
        ),
    ],
    ids=["curriculum", "lora-targets"],
)
def test_settings_the_task_or_model_cannot_take_are_one_line_before_anything_is_written(
    tmp_path: Path,
    weight_loads: list[int],
    capsys: pytest.CaptureFixture,
    args: list[str],
    message: str,
) -> None:
    run = tmp_path / "run"
    assert train([*TINY, *args, f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert err == f"streamrl: error: {message}\n"
    assert not run.exists() and weight_loads == []  # no weights read


class _Source:
    """A mixture's source whose own stream is counted: each problem is ('alone', seed)."""

    def __init__(self) -> None:
        self.opened: list[int] = []

    def train_stream(self, seed: int, exclude: set[str]):
        self.opened.append(seed)
        yield Problem(id=f"alone-{seed}", messages=[], answer="a", meta={"columns": {"seed": seed}})


class _Mixture:
    def __init__(self, n: int) -> None:
        self.tasks = [_Source() for _ in range(n)]

    def held_split(self) -> set[str]:
        return set()


def _tagged(sources: list[int]):
    return iter(
        Problem(id=f"m{s}-{k}", messages=[], answer="a", meta={"source": s}) for k, s in enumerate(sources)
    )


def test_each_sources_row_is_read_off_the_mixtures_own_stream() -> None:
    """The reward-argument check sees one problem per source, from the stream preflight already reads
    (a streamed source's buffer filled once), and keeps every problem it drew for the checks after."""
    from streamrl.preflight import one_row_per_source

    task = _Mixture(3)
    stream = _tagged([1, 1, 0, 1, 2, 0, 2])
    drawn = [next(stream)]
    firsts = one_row_per_source(task, stream, drawn, 5, set())
    assert [p.id for p in firsts] == ["m0-2", "m1-0", "m2-4"]
    assert [p.id for p in drawn] == ["m1-0", "m1-1", "m0-2", "m1-3", "m2-4"]  # stops at the last source
    assert [s.opened for s in task.tasks] == [[], [], []]
    assert [p.id for p in stream] == ["m0-5", "m2-6"]


def test_a_source_the_mixture_stream_does_not_reach_is_read_alone_as_the_mixture_seeds_it() -> None:
    from streamrl.data.mixture import SOURCE_SEED_STEP
    from streamrl.preflight import DRAWS_PER_SOURCE, one_row_per_source

    task = _Mixture(2)
    stream = _tagged([0] * (2 * DRAWS_PER_SOURCE + 5))
    drawn: list[Problem] = []
    firsts = one_row_per_source(task, stream, drawn, 5, set())
    assert len(drawn) == 2 * DRAWS_PER_SOURCE  # the draws are bounded
    assert [p.id for p in firsts] == ["m0-0", f"alone-{5 + SOURCE_SEED_STEP}"]
    assert [s.opened for s in task.tasks] == [[], [5 + SOURCE_SEED_STEP]]
    # without your functions to check on every source, no source's own stream is opened (a streamed
    # one would fill its buffer again): the sources the mixture's draws reached are checked
    task, drawn = _Mixture(2), []
    firsts = one_row_per_source(task, _tagged([0] * (2 * DRAWS_PER_SOURCE + 5)), drawn, 5, set(), alone=False)
    assert [p.id for p in firsts] == ["m0-0"] and [s.opened for s in task.tasks] == [[], []]


def test_a_plain_task_gives_its_first_problem() -> None:
    from streamrl.preflight import one_row_per_source

    first = Problem(id="a", messages=[], answer="1")
    assert one_row_per_source(object(), iter([]), [first], 0, set()) == [first]  # type: ignore[arg-type]
    assert one_row_per_source(object(), iter([]), [], 0, set()) == []  # type: ignore[arg-type]


def test_training_with_a_nucleus_is_refused_before_anything_is_written(tmp_path, capsys):
    run = tmp_path / "run"
    assert train([*TINY, "rollout.top_p=0.9", f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("streamrl: error: config key 'rollout.top_p' is 0.9: training samples with top_p=1")
    assert "`streamrl eval` sampling" in err and err.count("\n") == 1 and not run.exists()


def test_a_source_read_alone_that_has_nothing_to_train_on_is_named() -> None:
    from streamrl.preflight import DRAWS_PER_SOURCE, one_row_per_source

    class Empty(_Source):
        def train_stream(self, seed: int, exclude: set[str]):
            raise ValueError("b.jsonl: every training row is also a held-out row")
            yield  # a generator, as the data tasks' streams are

    task = _Mixture(2)
    task.tasks[1] = Empty()
    stream = _tagged([0] * (2 * DRAWS_PER_SOURCE + 5))
    with pytest.raises(ValueError, match=r"^task_config.sources\[1\]: b.jsonl: every training row is also"):
        one_row_per_source(task, stream, [], 5, set())


def test_a_sources_error_in_the_mixtures_stream_names_the_source(tmp_path: Path) -> None:
    from streamrl.tasks import make_task

    rows = tmp_path / "b.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n" for i in range(4)))
    sources = [{"task": "rg:chain_sum", "weight": 1}, {"task": f"data:{rows}", "eval_data": str(rows)}]
    task = make_task("mix", {}, "", "", "answer_is", sources=sources)
    task.heldout(2)
    stream = task.train_stream(0, set())
    with pytest.raises(
        ValueError, match=r"^task_config.sources\[1\]: .*every training row is also a held-out"
    ):
        for _ in range(200):  # source 1 comes up within a few draws (weights 1:1)
            next(stream)
