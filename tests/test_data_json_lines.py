"""A JSON Lines line that is not JSON is named by file and line: at set-up for a source held in memory
and for a streamed one's local files, and where a streamed read fails later."""

import json

import pytest

from streamrl.data import json_lines, streamed
from streamrl.data.sources import task_from_rows
from streamrl.tasks import make_task


def _lines(n: int) -> list[str]:
    return [json.dumps({"prompt": f"q{i}?", "answer": str(i)}) for i in range(n)]


def test_a_streamed_local_file_is_scanned_for_bad_lines_at_set_up(tmp_path):
    f = tmp_path / "big.jsonl"
    f.write_text("\n".join([*_lines(300), '{"prompt": "broken", "answer": ', *_lines(5)]) + "\n")
    with pytest.raises(ValueError) as e:
        make_task(f"data:{f}", {}, "", "", "answer_is", streaming=True)
    assert str(e.value) == f"{f}:301: not valid JSON (Expecting value); fix or remove the line"


def test_a_directory_names_the_file_and_line_that_is_not_json(tmp_path):
    d = tmp_path / "repo"
    d.mkdir()
    (d / "train.jsonl").write_text("\n".join(_lines(4)) + "\n")
    (d / "test.jsonl").write_text("\n".join([*_lines(1), "not json"]) + "\n")
    for streaming in (False, True):
        with pytest.raises(ValueError) as e:
            make_task(f"data:{d}", {}, "", "", "answer_is", streaming=streaming)
        assert (
            str(e.value) == f"{d / 'test.jsonl'}:2: not valid JSON (Expecting value); fix or remove the line"
        )


def test_a_streamed_read_that_fails_names_the_source_rows_and_line(tmp_path, monkeypatch):
    """Past the set-up scan (a set above SCAN_BYTES), a failed read stops with one line: the source, the
    rows this pass read, and the bad line of a local file, or the reader's own error."""
    monkeypatch.setattr(json_lines, "SCAN_BYTES", 0)
    f = tmp_path / "big.jsonl"
    f.write_text("\n".join([*_lines(3), "{oops", *_lines(3)]) + "\n")
    with pytest.raises(ValueError) as e:
        make_task(f"data:{f}", {}, "", "", "answer_is", streaming=True)
    assert str(e.value) == (
        f"{f}: reading failed after 0 row(s) of this pass: {f}:4: not valid JSON (Expecting property name "
        "enclosed in double quotes); fix or remove the line"
    )
    datasets = pytest.importorskip("datasets")

    def rows():
        for i in range(5):
            yield {"prompt": f"q{i}?", "answer": str(i)}
        raise OSError("connection reset")

    monkeypatch.setattr(streamed, "PEEK_ROWS", 3)
    task = task_from_rows(datasets.IterableDataset.from_generator(rows), name="gen")
    with pytest.raises(ValueError) as e:
        task.heldout(10)
    assert str(e.value) == "gen: reading failed after 5 row(s) of this pass: connection reset; fix the source"
    with pytest.raises(
        ValueError, match=r"^gen: reading failed after \d row\(s\) of this pass: connection reset"
    ):
        list(task.train_stream(0, set()))


def test_a_line_that_is_not_json_is_the_one_line_on_stderr(tmp_path, capsys, caplog):
    """datasets' JSON reader logs its own failure before it raises (to stderr, through its logger); the
    run says it once, by line."""
    from tiny_args import TINY

    from streamrl.cli import main

    f = tmp_path / "rows.jsonl"
    f.write_text("\n".join([*_lines(3), '{"prompt": "x", answer: 1}', *_lines(3)]) + "\n")
    run = tmp_path / "run"
    assert main(["train", *TINY, f"task=data:{f}", f"run_dir={run}"]) == 2
    assert capsys.readouterr().err == (
        f"streamrl: error: {f}:4: not valid JSON (Expecting property name enclosed in double quotes); fix or "
        "remove the line\n"
    )
    assert [r.getMessage() for r in caplog.records if r.name.startswith("datasets")] == []
    assert not run.exists()


def test_a_streamed_read_that_fails_later_logs_nothing_besides_its_error(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(json_lines, "SCAN_BYTES", 0)
    f = tmp_path / "big.jsonl"
    f.write_text("\n".join([*_lines(3), "{oops", *_lines(3)]) + "\n")
    with pytest.raises(ValueError, match="reading failed after 0 row"):
        make_task(f"data:{f}", {}, "", "", "answer_is", streaming=True)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("datasets")] == []


@pytest.mark.parametrize("streaming", [False, True])
def test_a_row_without_a_key_other_rows_have_is_named_as_missing_it(tmp_path, caplog, streaming):
    """datasets reads a left-out key as null: the row's own line tells it from an explicit null or empty
    value (a blank line is no row)."""
    f = tmp_path / "rows.jsonl"
    rows = [{"prompt": "a?", "answer": "1"}, {"prompt": "b?"}, {"prompt": "c?", "answer": None}]
    rows += [{"prompt": "d?", "answer": ""}, {"prompt": "e?", "answer": "5", "meta": {"n": 1}}]
    f.write_text("\n".join([json.dumps(rows[0]), "", *map(json.dumps, rows[1:])]) + "\n")
    make_task(f"data:{f}", {}, "", "", "answer_is", streaming=streaming)
    assert (
        f"{f}: skipped 3 malformed row(s): {f}:row 2: no 'answer' key (other rows have it): add it or drop "
        f"the row; {f}:row 3: column 'answer' is empty; {f}:row 4: column 'answer' is empty"
    ) in caplog.text
    f.write_text(json.dumps({"prompt": "a?", "level": None}) + "\n")
    with pytest.raises(ValueError) as e:  # no row has it: the column mapping is what to fix
        make_task(f"data:{f}", {}, "", "", "answer_is", streaming=streaming)
    assert str(e.value).endswith(f"first problem: {f}:row 1: missing column 'answer'")


def test_the_json_reader_is_quiet_only_in_the_threads_inside_the_block(caplog):
    """Two overlapping blocks in two threads, and a block nested in another: a record is dropped while
    its own thread is inside a block, and only then."""
    import logging
    import threading

    logger = logging.getLogger(json_lines.JSON_READER_LOGGER)
    a_in, b_in, a_out, b_done, main_said = (threading.Event() for _ in range(5))

    def a() -> None:
        with json_lines.quiet_json_reader():
            a_in.set()
            main_said.wait(10)  # this thread is inside its block while the main thread logs
            b_in.wait(10)
            logger.warning("a inside")
        a_out.set()
        b_done.wait(10)
        logger.warning("a after")

    def b() -> None:
        a_in.wait(10)
        with json_lines.quiet_json_reader():
            b_in.set()
            a_out.wait(10)  # the other thread has left its block: this one is still inside
            logger.warning("b inside")
        b_done.set()

    with caplog.at_level(logging.WARNING, logger=json_lines.JSON_READER_LOGGER):
        threads = [threading.Thread(target=a), threading.Thread(target=b)]
        for t in threads:
            t.start()
        a_in.wait(10)
        logger.warning("main while a is inside")
        main_said.set()
        for t in threads:
            t.join(10)
        with json_lines.quiet_json_reader():
            with json_lines.quiet_json_reader():
                logger.warning("nested, inner")
            logger.warning("nested, outer")
        logger.warning("main after")
    assert [r.getMessage() for r in caplog.records] == ["main while a is inside", "a after", "main after"]


@pytest.mark.parametrize("streaming", [False, True])
def test_only_the_rows_the_warning_shows_are_read_again(tmp_path, caplog, monkeypatch, streaming):
    """Of many rows refused with a null, only those the warning shows (the first five) have their lines
    read again; the rest keep their record's message, and what is kept of a refused row is no record."""
    from streamrl.data import row_names

    read, real = [], row_names.raw_rows
    monkeypatch.setattr(
        row_names, "raw_rows", lambda path, wanted: read.append(sorted(wanted)) or real(path, wanted)
    )
    f = tmp_path / "rows.jsonl"
    rows = [{"prompt": "a?", "answer": "1"}, {"prompt": "b?", "answer": ""}]
    rows += [{"prompt": f"q{i}?"} for i in range(7)]
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    task = make_task(f"data:{f}", {}, "", "", "answer_is", streaming=streaming)
    assert read == [[3, 4, 5, 6]]  # row 2's answer is "": its line need not be read
    missing = "no 'answer' key (other rows have it): add it or drop the row"
    assert (
        f"{f}: skipped 8 malformed row(s): {f}:row 2: column 'answer' is empty; {f}:row 3: {missing}; "
        f"{f}:row 4: {missing}; {f}:row 5: {missing}; {f}:row 6: {missing} (and 3 more)"
    ) in caplog.text
    if not streaming:
        assert task.skipped[5:] == [f"{f}:row {i}: column 'answer' is empty" for i in (7, 8, 9)]
    refused = ValueError("column 'answer' is empty")
    record = {"prompt": "q?", "answer": None}
    assert row_names.failure(row_names.Label(str(f), jsonl=f), 4, record, refused) == (4, str(refused), True)
    assert row_names.failure(row_names.Label("hf:x"), 4, record, refused) == (4, str(refused), False)
