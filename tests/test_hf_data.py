"""Data through Hugging Face `datasets`: hf:NAME offline from the caches, data:PATH in every format,
streaming, rows from code, GSM8K-style answers; all offline."""

import itertools
import json
import shutil
from pathlib import Path

import datasets
import pytest
from hf_cache import COLS, gsm8k_table, hub_snapshot, sha1_order
from tiny_args import TINY

from streamrl.cli import main
from streamrl.data import streamed
from streamrl.data.sources import DataTask, task_from_rows
from streamrl.data.streamed import StreamedDataTask
from streamrl.tasks import make_task


def _prepared_cache(cache: Path, tmp: Path, repo: str, config: str, splits: dict[str, datasets.Dataset]):
    """What an online `load_dataset(repo, config)` leaves in HF_DATASETS_CACHE: Arrow files prepared by
    the parquet builder under {org}___{name}/{config}/{version}/{hash}/."""
    from datasets.packaged_modules.parquet.parquet import Parquet

    files = {}
    for name, table in splits.items():
        files[name] = str(tmp / f"{name}.parquet")
        table.to_parquet(files[name])
    org, name = repo.split("/")
    builder = Parquet(
        cache_dir=str(cache), dataset_name=name, config_name=config, data_files=files, hash="0123abcd"
    )
    builder.download_and_prepare()
    shutil.move(Path(builder.cache_dir).parents[1], cache / f"{org}___{name}" / config)


def test_hub_name_offline_from_a_snapshot_in_the_hub_cache(offline_hub):
    hub, _ = offline_hub
    hub_snapshot(
        hub, "streamrl-test/tiny-math", {"train": gsm8k_table("train", 8), "test": gsm8k_table("test", 3)}
    )
    task = make_task("hf:streamrl-test/tiny-math", {}, "", "", "gsm8k", columns=COLS)
    assert isinstance(task, DataTask) and task.name == "hf:streamrl-test/tiny-math"
    held = task.heldout(5)  # the test split, in sha1 order; fewer rows than asked: all of them
    assert [p.meta["question"] for p in held] == sha1_order(
        [f"test {i}: what is {i} + {i}?" for i in range(3)]
    )
    assert {p.id for p in held} == {"test-0", "test-1", "test-2"}
    train = {p.id for p in itertools.islice(task.train_stream(0, set()), 16)}
    assert train == {f"train-{i}" for i in range(8)}
    p = held[0]
    assert p.answer == str(2000 * int(p.id[5:]))  # the part after '####', thousands commas dropped
    assert task.score(p, f"so #### {p.answer}").correct


def test_hub_name_offline_from_the_prepared_datasets_cache(offline_hub, tmp_path):
    _, cache = offline_hub
    splits = {"train": gsm8k_table("train", 6), "test": gsm8k_table("test", 2)}
    _prepared_cache(cache, tmp_path, "streamrl-test/cached-math", "main", splits)
    task = make_task(
        "hf:streamrl-test/cached-math:main", {}, "", "", "gsm8k", columns=COLS, eval_split="train"
    )
    assert len(task.rows) == 6 and task.eval_rows is None  # eval_split=train: held out from train itself
    assert [p.id for p in task.heldout(2)] == [r["id"] for r in task.rows[:2]]
    with pytest.raises(
        ValueError,
        match="^hf:streamrl-test/cached-math:main has no split 'dev': set "
        "task_config.eval_split to one of: train, test$",
    ):
        make_task("hf:streamrl-test/cached-math:main", {}, "", "", "gsm8k", columns=COLS, eval_split="dev")


def test_unknown_hub_name_offline_fails_in_one_line_before_anything_is_written(offline_hub, tmp_path, capsys):
    run = tmp_path / "run"
    code = main(["train", *TINY, "task=hf:streamrl-test/nope:main", f"run_dir={run}"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and not run.exists()
    assert err == (
        "streamrl: error: hf:streamrl-test/nope:main: dataset 'streamrl-test/nope' is not in the local "
        "Hugging Face cache and the Hub is offline (HF_HUB_OFFLINE=1); load it once with network access, or "
        "pass local files with task=data:PATH (.jsonl, .json, .parquet, .csv or a save_to_disk directory)"
    )


@pytest.mark.parametrize(
    ("args", "key", "name"),
    [
        (["task=data:missing.jsonl"], "task", "missing.jsonl"),
        (["task=data:rows.jsonl", "task_config.eval_data=held.jsonl"], "task_config.eval_data", "held.jsonl"),
    ],
)
def test_a_missing_data_file_names_its_key(tmp_path, monkeypatch, capsys, args, key, name):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "rows.jsonl").write_text(
        '{"prompt": "1+1?", "answer": "2"}\n{"prompt": "2+2?", "answer": "4"}\n'
    )
    run = tmp_path / "run"
    assert main(["train", *TINY, *args, f"run_dir={run}"]) == 2
    err = capsys.readouterr().err
    assert (
        err == f"streamrl: error: config key '{key}': data file '{name}' not found (relative to {tmp_path})\n"
    )
    assert not run.exists()


def test_every_local_format_reads_the_same_rows(tmp_path):
    """save_to_disk, JSONL, Parquet and CSV give the same problems in the same held-out order."""
    table = gsm8k_table("train", 7)
    paths = {
        "disk": tmp_path / "saved",
        "jsonl": tmp_path / "t.jsonl",
        "parquet": tmp_path / "t.parquet",
        "csv": tmp_path / "t.csv",
    }
    table.save_to_disk(str(paths["disk"]))
    table.to_json(str(paths["jsonl"]))
    table.to_parquet(str(paths["parquet"]))
    table.to_csv(str(paths["csv"]), index=False)
    expected = sha1_order(table["question"])
    for kind, path in paths.items():
        task = make_task(f"data:{path}", {}, "", "", "gsm8k", columns=COLS)
        assert [r["question"] for r in task.rows] == expected, kind
        assert [r["answer"] for r in task.rows] == [str(2000 * int(q.split(":")[0][6:])) for q in expected], (
            kind
        )
        assert task.name == str(path)
    with pytest.raises(
        ValueError, match=r"t.txt: unsupported file type '.txt'; use .jsonl, .json, .parquet or .csv"
    ):
        (tmp_path / "t.txt").write_text("x")
        make_task(f"data:{tmp_path / 't.txt'}", {}, "", "", "gsm8k")


def test_a_directory_of_split_files_holds_out_its_test_split(tmp_path):
    d = tmp_path / "repo"
    d.mkdir()
    gsm8k_table("train", 5).to_json(str(d / "train.jsonl"))
    gsm8k_table("test", 2).to_json(str(d / "test.jsonl"))
    task = make_task(f"data:{d}", {}, "", "", "gsm8k", columns=COLS)
    assert {p.id for p in task.heldout(2)} == {"test-0", "test-1"} and len(task.rows) == 5
    whole = make_task(f"data:{d}", {}, "", "", "gsm8k", columns=COLS, split="test", eval_split="test")
    assert len(whole.rows) == 2 and whole.eval_rows is None


def test_streaming_holds_out_the_first_rows_and_reshuffles_each_epoch(tmp_path, caplog):
    f = tmp_path / "big.jsonl"
    rows = [{"question": f"q{i}", "answer": str(i)} for i in range(12)]
    rows.insert(3, {"question": "", "answer": "9"})  # malformed: skipped, named by row
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = make_task(
        f"data:{f}", {}, "", "", "answer_is", columns={"prompt": "question"}, streaming=True, shuffle_buffer=4
    )
    assert isinstance(task, StreamedDataTask)
    assert f"{f}:row 4: column 'question' must be a non-empty string" in caplog.text
    held = task.heldout(3)
    assert [p.meta["question"] for p in held] == ["q0", "q1", "q2"]  # the first rows, in file order
    exclude = {p.meta["question"] for p in held}
    stream = task.train_stream(5, exclude)
    epochs = [[p.meta["question"] for p in itertools.islice(stream, 9)] for _ in range(2)]
    assert sorted(epochs[0]) == sorted(epochs[1]) == sorted(f"q{i}" for i in range(3, 12))
    assert epochs[0] != epochs[1]  # reshuffled
    again = [p.meta["question"] for p in itertools.islice(task.train_stream(5, exclude), 9)]
    assert again == epochs[0]  # a seed replays its order (what a resume relies on)
    with pytest.raises(ValueError, match=r"every streamed row is held out; lower eval.size"):
        next(task.train_stream(0, {f"q{i}" for i in range(12)}))


def test_a_streamed_id_repeated_for_another_prompt_is_refused_first_and_skipped_later(
    tmp_path, monkeypatch, caplog
):
    """The mapped id keys the reward cache, the sampler's pool and the drafts: in the rows set-up reads
    a repeat for a different prompt is refused in one line; met later, that row is skipped and logged.
    The same row again (same id, same prompt) is no conflict."""
    monkeypatch.setattr(streamed, "PEEK_ROWS", 3)
    f = tmp_path / "rows.jsonl"

    def write(rows: list[tuple[str, str]]) -> None:
        f.write_text("".join(json.dumps({"uid": u, "question": q, "answer": "1"}) + "\n" for u, q in rows))

    cols = {"prompt": "question", "id": "uid"}
    write([("a", "q0"), ("b", "q1"), ("a", "q2")])
    with pytest.raises(ValueError) as e:
        make_task(f"data:{f}", {}, "", "", "answer_is", columns=cols, streaming=True)
    assert str(e.value) == (
        f"task_config.columns.id: column 'uid' repeats 'a' ({f}: rows 1 and 3, different prompts): map a "
        "column unique per row, or drop columns.id"
    )
    write([("a", "q0"), ("b", "q1"), ("a", "q0"), ("c", "q3"), ("b", "q4"), ("d", "q5")])
    task = make_task(f"data:{f}", {}, "", "", "answer_is", columns=cols, streaming=True, shuffle_buffer=1)
    held = task.heldout(6)
    assert [(p.id, p.meta["question"]) for p in held] == [
        ("a", "q0"),
        ("b", "q1"),
        ("a", "q0"),
        ("c", "q3"),
        ("d", "q5"),
    ]
    assert task.skipped == [
        f"{f}: task_config.columns.id: column 'uid' repeats 'b' of an earlier row with a different prompt"
    ]
    assert "skipped a malformed row: task_config.columns.id: column 'uid' repeats 'b'" in caplog.text
    stream = task.train_stream(0, set())
    assert sorted(p.meta["question"] for p in itertools.islice(stream, 5)) == ["q0", "q0", "q1", "q3", "q5"]


def test_streaming_a_hub_name_takes_held_out_rows_from_its_test_split(offline_hub, monkeypatch):
    hub, _ = offline_hub
    # datasets sleeps this long whenever a shuffled Parquet stream stops (an Arrow thread-shutdown
    # workaround): seconds per epoch of a 6-row test set, nothing here depends on it
    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0)
    hub_snapshot(
        hub, "streamrl-test/streamed", {"train": gsm8k_table("train", 6), "test": gsm8k_table("test", 4)}
    )
    task = make_task("hf:streamrl-test/streamed", {}, "", "", "gsm8k", columns=COLS, streaming=True)
    assert [p.id for p in task.heldout(2)] == ["test-0", "test-1"]
    assert {p.id for p in itertools.islice(task.train_stream(0, set()), 6)} == {
        f"train-{i}" for i in range(6)
    }
    with pytest.raises(
        ValueError, match=r"hf:streamrl-test/streamed\[train\]: no column 'prompt' for the prompt"
    ):
        make_task("hf:streamrl-test/streamed", {}, "", "", "gsm8k", streaming=True)


def test_streamed_splits_of_their_own_may_number_their_rows_alike(offline_hub, monkeypatch):
    """A held-out split of its own has its own ids: a training row numbered like a held-out row is
    trained on, streamed as in memory (only repeats within one split conflict)."""
    hub, _ = offline_hub
    monkeypatch.setattr(datasets.config, "SLEEP_TIME_ON_THREADS_SHUTDOWN", 0)

    def numbered(split: str, n: int) -> datasets.Dataset:  # uid 0, 1, ... in each split
        return gsm8k_table(split, n).map(lambda row, i: {"uid": str(i)}, with_indices=True)

    hub_snapshot(hub, "streamrl-test/numbered", {"train": numbered("train", 6), "test": numbered("test", 3)})
    for streaming in (True, False):
        task = make_task(
            "hf:streamrl-test/numbered",
            {},
            "",
            "",
            "gsm8k",
            columns=COLS,
            streaming=streaming,
            shuffle_buffer=1,
        )
        held = {p.meta["question"] for p in task.heldout(2)}
        assert len(held) == 2 and held <= {f"test {i}: what is {i} + {i}?" for i in range(3)}, streaming
        trained = {p.meta["question"] for p in itertools.islice(task.train_stream(0, set()), 12)}
        assert trained == {f"train {i}: what is {i} + {i}?" for i in range(6)}, streaming
        assert task.skipped == [], streaming


def test_task_from_rows_takes_lists_datasets_and_iterable_datasets():
    rows = [{"q": f"q{i}", "a": f"#### {i}"} for i in range(6)]
    cols = {"prompt": "q", "answer": "a"}
    from_list = task_from_rows(rows, cols, extract="gsm8k")
    from_ds = task_from_rows(datasets.Dataset.from_list(rows), cols, extract="gsm8k")
    assert isinstance(from_list, DataTask) and from_list.name == "rows"
    assert from_list.rows == from_ds.rows and [r["question"] for r in from_list.rows] == sha1_order(
        [r["q"] for r in rows]
    )
    assert [p.answer for p in from_list.heldout(6 - 1)] == [r["question"][1:] for r in from_list.rows[:5]]
    held = task_from_rows(rows, cols, eval_rows=[{"q": "extra", "a": "7"}], name="mine")
    assert [(p.meta["question"], p.answer) for p in held.heldout(3)] == [("extra", "7")]
    streamed = task_from_rows(datasets.Dataset.from_list(rows).to_iterable_dataset(), cols, name="it")
    assert isinstance(streamed, StreamedDataTask)
    assert [p.meta["question"] for p in streamed.heldout(2)] == ["q0", "q1"]
    with pytest.raises(
        ValueError, match=r"^rows: no usable rows .*first problem: rows:row 1: column 'a' is empty"
    ):
        task_from_rows([{"q": "x", "a": ""}], cols)
    with pytest.raises(
        ValueError, match="rows must be a list of dicts, a datasets.Dataset or IterableDataset"
    ):
        task_from_rows("q0", cols)


def test_gsm8k_answers_score_and_few_shot_with_the_gsm8k_extractor(tmp_path):
    from streamrl.config import load_config
    from streamrl.tasks import prepare_split, task_from_config

    f = tmp_path / "gsm.parquet"
    gsm8k_table("train", 6).to_parquet(str(f))
    cfg = load_config(
        None,
        [
            f"task=data:{f}",
            "task_config.columns={prompt: question}",
            "reward.extract=gsm8k",
            "task_config.few_shot_n=1",
            "eval.size=2",
        ],
    )
    task = task_from_config(cfg)
    held, _ = prepare_split(task, cfg)
    shot_q, shot_r = task.few_shot[0]
    i = int(shot_q.split(":")[0][6:])
    assert shot_r == f"#### {2000 * i}"  # the reference after '####', commas dropped, in the gsm8k format
    p = held[0]
    assert task.score(p, f"It is {p.answer} apples.\n#### {p.answer}").correct
    assert not task.score(p, f"#### {int(p.answer) + 1}").correct
    assert not task.score(p, f"The answer is {p.answer}.").formatted  # no '####'


def test_mix_sources_take_the_split_keys_and_bad_settings_fail_in_one_line(tmp_path):
    from streamrl.config import ConfigError, load_config

    d = tmp_path / "repo"
    d.mkdir()
    gsm8k_table("train", 6).to_json(str(d / "train.jsonl"))
    gsm8k_table("test", 4).to_json(str(d / "test.jsonl"))
    src = {"task": f"data:{d}", "columns": COLS, "streaming": True, "shuffle_buffer": 2}
    task = make_task("mix", {}, "", "", "gsm8k", sources=[src, {"task": "rg:chain_sum"}])
    assert isinstance(task.tasks[0], StreamedDataTask) and task.tasks[0].shuffle_buffer == 2
    assert [p.id for p in task.heldout(4)[:2]] == ["m0-test-0", "m0-test-1"]
    with pytest.raises(
        ValueError, match=r"^task_config.sources\[0\]: .*repo has no split 'dev': set task_config"
    ):
        make_task("mix", {}, "", "", "gsm8k", sources=[{**src, "split": "dev"}])
    with pytest.raises(ConfigError, match="'task_config.shuffle_buffer' must be > 0, got 0"):
        load_config(None, ["task_config.shuffle_buffer=0"])
