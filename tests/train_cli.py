"""`streamrl train` as the refusal tests run it (tests/ is on sys.path): the rows file of a data task,
and the command's exit code with a hang failing the test (a limit, not a speed check)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bounded import call_bounded


def rows_file(directory: Path, rows: list[dict[str, Any]]) -> Path:
    """`rows` as JSON lines in directory/rows.jsonl -> that file."""
    f = directory / "rows.jsonl"
    f.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return f


def train(args: list[str]) -> int:
    """cli.main(["train", *args]) in a thread, failing the test if it still runs after 120 s."""
    from streamrl.cli import main

    return call_bounded(lambda: main(["train", *args]), 120, "train hung")
