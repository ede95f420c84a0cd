"""JSON Lines files checked line by line, so a line that is not JSON is named by its file and line.

`datasets` reads a .jsonl file in blocks and stops at a line that does not parse, naming neither. A
source held in memory is read whole at set-up, and a failure is traced to its first bad line here. A
streamed source is read as training goes: its local .jsonl files are scanned at set-up when they hold
at most SCAN_BYTES in all (the scan parses every line, at some 8 MB/s on a busy shared core and a few
times that on an idle one); a larger set is not, and a bad line stops the run where training reaches
it, named the same way (data/streamed.py). While `datasets` reads (quiet_json_reader), its JSON reader
logs nothing of its own: a line it fails on is then named once, here. Silencing it costs nothing on a
good file, where checking every file first would parse each line twice on every run. The silence is a
filter on that logger dropping what a thread logs inside the block: other threads, and the block's end
in one thread while another is still inside, leave the others' records alone.

`datasets` fills a key a row leaves out with null; raw_rows reads the rows' own text again, for the
few rows a warning names, so a missing key is told from a null one (data/row_names.py).
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

SCAN_BYTES = 128 * 2**20
# the logger of datasets' JSON reader, which logs "Failed to load JSON from file ..." before it raises
JSON_READER_LOGGER = "datasets.packaged_modules.json.json"


class _InsideBlocks(logging.Filter):
    """Drops the records a thread logs while it is inside quiet_json_reader (at any depth)."""

    def __init__(self) -> None:
        super().__init__()
        self._depth = threading.local()  # per thread: how many quiet_json_reader blocks it is inside

    def enter(self) -> None:
        self._depth.n = getattr(self._depth, "n", 0) + 1

    def leave(self) -> None:
        self._depth.n -= 1

    def filter(self, record: logging.LogRecord) -> bool:
        return not getattr(self._depth, "n", 0)  # a logger's filters run in the thread that logs


_QUIET = _InsideBlocks()


@contextmanager
def quiet_json_reader() -> Iterator[None]:
    """datasets' JSON reader logs nothing from this thread while the block runs (its failure is raised,
    and named by first_bad_line); other threads' records pass."""
    logging.getLogger(JSON_READER_LOGGER).addFilter(_QUIET)  # once: a filter already there is kept
    _QUIET.enter()
    try:
        yield
    finally:
        _QUIET.leave()


def jsonl_files(path: Path) -> list[Path]:
    """The .jsonl files a `data:PATH` source reads: the file itself, or those inside the directory (not
    hidden ones, which `datasets` skips too)."""
    if path.is_file():
        return [path] if path.suffix == ".jsonl" else []
    if not path.is_dir():
        return []
    found = (p for p in path.rglob("*.jsonl") if p.is_file())
    return sorted(p for p in found if not any(part.startswith(".") for part in p.relative_to(path).parts))


def first_bad_line(files: Iterable[Path]) -> str | None:
    """`file:line: not valid JSON (why); fix or remove the line` for the first line of the files that
    does not parse (or is not UTF-8 text); None when every line does."""
    for path in files:
        with path.open("rb") as f:
            for lineno, raw in enumerate(f, 1):
                try:
                    line = raw.decode("utf-8")
                    if line.strip():
                        json.loads(line)
                except json.JSONDecodeError as e:
                    return f"{path}:{lineno}: not valid JSON ({e.msg}); fix or remove the line"
                except UnicodeDecodeError:
                    return f"{path}:{lineno}: not UTF-8 text; fix or remove the line"
    return None


def check_before_streaming(path: Path) -> None:
    """ValueError naming the first bad line of a streamed source's local .jsonl files, when they are
    small enough (SCAN_BYTES) to scan at set-up."""
    files = jsonl_files(path)
    if files and sum(f.stat().st_size for f in files) <= SCAN_BYTES and (bad := first_bad_line(files)):
        raise ValueError(bad)


def raw_rows(path: Path, wanted: set[int]) -> dict[int, Any]:
    """{row: its record as the line's own JSON} for the rows `wanted` (1-based, as `datasets` numbers a
    .jsonl file's rows: a blank line is none) that parse; read up to the last one wanted."""
    found: dict[int, Any] = {}
    if not wanted:
        return found
    last, row = max(wanted), 0
    with path.open("rb") as f:
        for raw in f:
            if not raw.strip():
                continue
            row += 1
            if row in wanted:
                try:
                    found[row] = json.loads(raw)
                except ValueError:  # not JSON or not UTF-8: datasets would have refused the file
                    pass
            if row >= last:
                break
    return found
