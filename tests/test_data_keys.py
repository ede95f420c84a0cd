"""Data-task keys a source would not read are refused in one line; eval_split names eval_data's split."""

import json

import pytest

from streamrl.config import ConfigError, load_config
from streamrl.tasks import make_task

ARGS_REFUSED = (
    "is not read by a data source (hf:NAME, data:PATH): drop it; a Hugging Face config goes in the name "
    "(hf:NAME:CONFIG), other files in a source of their own"
)


def _refusal(values: list[str]) -> str:
    with pytest.raises(ConfigError) as e:
        load_config(None, values)
    return str(e.value)


def test_args_of_a_data_task_are_refused():
    assert _refusal(["task=data:x.jsonl", "task_config.args={revision: v2, data_files: other.jsonl}"]) == (
        f"config key 'task_config.args' {ARGS_REFUSED}"
    )
    assert _refusal(["task=hf:org/name", "task_config.args={revision: v2}"]) == (
        f"config key 'task_config.args' {ARGS_REFUSED}"
    )
    source = "task_config.sources=[{task: rg:chain_sum}, {task: data:x.jsonl, args: {revision: v2}}]"
    assert _refusal(["task=mix", source]) == f"config key 'task_config.sources[1].args' {ARGS_REFUSED}"
    load_config(None, ["task=mix", "task_config.sources=[{task: rg:chain_sum, args: {min_terms: 2}}]"])


def test_a_shuffle_buffer_is_refused_unless_the_source_is_streamed():
    assert _refusal(["task=data:x.jsonl", "task_config.shuffle_buffer=5"]) == (
        "config key 'task_config.shuffle_buffer' is read only when streaming (rows held in memory are "
        "reshuffled whole each epoch): set task_config.streaming=true, or drop it"
    )
    assert load_config(
        None, ["task=data:x.jsonl", "task_config.shuffle_buffer=5", "task_config.streaming=true"]
    )
    source = "task_config.sources=[{task: data:x.jsonl, shuffle_buffer: 5}]"
    assert _refusal(["task=mix", source]) == (
        "config key 'task_config.sources[0].shuffle_buffer' is read only when streaming (rows held in memory "
        "are reshuffled whole each epoch): set task_config.sources[0].streaming=true, or drop it"
    )
    load_config(
        None, ["task=mix", "task_config.sources=[{task: data:x.jsonl, shuffle_buffer: 5, streaming: true}]"]
    )


def test_eval_split_names_the_held_out_split_of_eval_data(tmp_path):
    train, d = tmp_path / "train.jsonl", tmp_path / "other"
    d.mkdir()
    train.write_text("".join(json.dumps({"prompt": f"t{i}", "answer": str(i)}) + "\n" for i in range(6)))
    for split in ("train", "validation"):
        rows = [{"prompt": f"{split}{i}", "answer": str(i)} for i in range(3)]
        (d / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(ValueError) as e:
        make_task(f"data:{train}", {}, "", "", "answer_is", eval_data=f"data:{d}")
    assert str(e.value) == (
        f"task_config.eval_data: {d} has splits train, validation and no 'test': name the held-out one "
        "with task_config.eval_split=<split>"
    )
    for streaming in (False, True):
        task = make_task(
            f"data:{train}",
            {},
            "",
            "",
            "answer_is",
            eval_data=f"data:{d}",
            eval_split="validation",
            streaming=streaming,
        )
        assert sorted(p.meta["question"] for p in task.heldout(3)) == [
            "validation0",
            "validation1",
            "validation2",
        ]
    with pytest.raises(ValueError) as e:
        make_task(f"data:{train}", {}, "", "", "answer_is", eval_data=f"data:{d}", eval_split="dev")
    assert str(e.value) == f"{d} has no split 'dev': set task_config.eval_split to one of: train, validation"
    cfg = load_config(
        None, [f"task=data:{train}", f"task_config.eval_data=data:{d}", "task_config.eval_split=validation"]
    )
    assert (cfg.task_config.eval_data, cfg.task_config.eval_split) == (f"data:{d}", "validation")


def test_a_run_saved_with_keys_its_data_source_never_read_resumes_without_them(tmp_path, capsys):
    """Saved before these keys were refused: the resume drops them (the run never read them) with one
    line naming them; given again on the command line they are refused as in a new run."""
    from streamrl.config import Config, config_yaml

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Q{i}?", "answer": str(i)}) + "\n" for i in range(8)))
    saved = Config(task=f"data:{rows}", run_dir=str(tmp_path / "run"))
    saved.task_config.args = {"revision": "v2"}
    saved.task_config.shuffle_buffer = 5
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(config_yaml(saved))
    (tmp_path / "run" / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    cfg = load_config(None, [f"resume={tmp_path / 'run'}"])
    assert (
        cfg.task_config.args == {} and cfg.task_config.shuffle_buffer == Config().task_config.shuffle_buffer
    )
    assert capsys.readouterr().err == (
        f"streamrl: note: resume: {tmp_path / 'run'}/config.yaml sets task_config.args, "
        "task_config.shuffle_buffer, which the run's data sources never read: dropped (a new run refuses "
        "them)\n"
    )
    with pytest.raises(ConfigError, match="task_config.shuffle_buffer"):
        load_config(None, [f"resume={tmp_path / 'run'}", "task_config.shuffle_buffer=5"])


def test_a_mixture_saved_with_keys_its_data_sources_never_read_resumes_without_them(tmp_path, capsys):
    """The same per source of a mixture: a data source's args, and its shuffle buffer unless it is
    streamed, are dropped; a reasoning-gym source's args (which it reads) and a streamed source's buffer
    are kept; the sources given again on the command line are refused as in a new run."""
    from streamrl.config import Config, config_yaml

    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"Q{i}?", "answer": str(i)}) + "\n" for i in range(8)))
    sources = (
        {"task": "rg:chain_sum", "args": {"min_terms": 2}},
        {"task": f"data:{rows}", "weight": 2.0, "args": {"revision": "v2"}, "shuffle_buffer": 5},
        {"task": f"data:{rows}", "shuffle_buffer": 5, "streaming": True},
    )
    saved = Config(task="mix", run_dir=str(tmp_path / "run"))
    saved.task_config.sources = sources
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "config.yaml").write_text(config_yaml(saved))
    (tmp_path / "run" / "metrics.jsonl").touch()  # a run's, beside its config.yaml
    cfg = load_config(None, [f"resume={tmp_path / 'run'}"])
    assert cfg.task_config.sources == (sources[0], {"task": f"data:{rows}", "weight": 2.0}, sources[2])
    assert capsys.readouterr().err == (
        f"streamrl: note: resume: {tmp_path / 'run'}/config.yaml sets task_config.sources[1].args, "
        "task_config.sources[1].shuffle_buffer, which the run's data sources never read: dropped (a new "
        "run refuses them)\n"
    )
    given = "task_config.sources=" + json.dumps(list(sources))
    with pytest.raises(ConfigError, match=r"^config key 'task_config.sources\[1\].args' is not read by"):
        load_config(None, [f"resume={tmp_path / 'run'}", given])
    with pytest.raises(ConfigError, match=r"^config key 'task_config.sources\[1\].args' is not read by"):
        load_config(tmp_path / "run" / "config.yaml", [f"run_dir={tmp_path / 'again'}"])  # a new run of it
