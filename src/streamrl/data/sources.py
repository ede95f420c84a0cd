"""Tabular problem sources: JSONL, Parquet and local HF `datasets` directories, with a column mapping.

`task=data:PATH` (or a bare `PATH.jsonl` / `PATH.parquet`) reads rows and maps columns with
`task_config.columns` (defaults in brackets):

    prompt [prompt]      the question text (a string), or
    messages [-]         a chat: a list of {role, content}; the last user turn is the question
    answer [answer]      the reference answer (scored with math-verify)
    id [-]               a stable row id (default: a hash of the prompt)
    task [-]             the row's scorer: "math" or "code" (default: "code" when it has tests)
    tests [-]            stdin/stdout tests [{input, output}, ...] run in the sandbox

A column name may be a dotted path into nested objects (`answer: meta.final`). A malformed row is
skipped and counted; one warning names the file and line of each of the first few. Only a source
with no usable rows is an error.

Split: distinct prompts are ordered by sha1(prompt); the first eval.size are held out, the rest train
(reshuffled each epoch). With `task_config.eval_data=PATH` the held-out rows come from that file
instead, and training rows whose prompt equals a held-out one are dropped and reported.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from streamrl.data.task import Score, Task
from streamrl.rewards.sandbox import LocalSandbox
from streamrl.types import Problem

log = logging.getLogger("streamrl.data")

DEFAULT_COLUMNS = {"prompt": "prompt", "answer": "answer"}
COLUMN_KEYS = ("prompt", "messages", "answer", "id", "task", "tests")
SHOWN_WARNINGS = 5  # per file: the first few bad rows by line, then a count


def read_records(path: Path) -> Iterator[tuple[str, Any]]:
    """(where, record) for every row of a .jsonl, .parquet or HF `save_to_disk` directory.

    `where` is `file:line` (JSONL) or `file:row N` (1-based); a record that failed to parse is an
    Exception instance, so the caller can count it instead of stopping.
    """
    if path.is_dir():
        yield from _read_hf_dir(path)
    elif path.suffix == ".parquet":
        import pyarrow.parquet as pq

        for i, rec in enumerate(pq.read_table(path).to_pylist(), 1):
            yield f"{path}:row {i}", rec
    else:
        with path.open(encoding="utf-8") as f:
            for lineno, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    yield f"{path}:{lineno}", json.loads(line)
                except json.JSONDecodeError as e:
                    yield f"{path}:{lineno}", ValueError(f"not valid JSON ({e.msg})")


def _read_hf_dir(path: Path) -> Iterator[tuple[str, Any]]:
    """A directory written by `datasets.Dataset.save_to_disk`: state.json lists Arrow stream files."""
    import pyarrow as pa

    if (path / "dataset_dict.json").is_file():
        splits = json.loads((path / "dataset_dict.json").read_text())["splits"]
        raise ValueError(
            f"{path} is a DatasetDict: point the task at one split, e.g. data:{path / splits[0]} "
            f"(splits: {', '.join(splits)})"
        )
    state = path / "state.json"
    if not state.is_file():
        raise ValueError(f"{path}: not a saved HF dataset (no state.json); use Dataset.save_to_disk(dir)")
    row = 0
    for entry in json.loads(state.read_text())["_data_files"]:
        with pa.memory_map(str(path / entry["filename"])) as src:
            table = pa.ipc.open_stream(src).read_all()
        for rec in table.to_pylist():
            row += 1
            yield f"{path}:row {row}", rec


def _get(rec: dict[str, Any], column: str) -> Any:
    """rec[column], following dots into nested objects; KeyError names the missing column."""
    cur: Any = rec
    for part in column.split("."):
        if not isinstance(cur, dict) or part not in cur:
            raise KeyError(f"missing column '{column}'")
        cur = cur[part]
    return cur


def parse_row(rec: Any, columns: dict[str, str]) -> dict[str, Any]:
    """One record -> {question, messages, answer, id, kind, tests}; ValueError says what is wrong."""
    from streamrl.rewards.code import validate_tests

    if isinstance(rec, Exception):
        raise ValueError(str(rec))
    if not isinstance(rec, dict):
        raise ValueError(f"expected an object, got {type(rec).__name__}")
    try:
        messages = None
        if "messages" in columns:
            messages = _get(rec, columns["messages"])
            if not isinstance(messages, list) or not all(
                isinstance(m, dict) and isinstance(m.get("content"), str) and m.get("role") for m in messages
            ):
                raise ValueError(f"column '{columns['messages']}' must be a list of {{role, content}}")
            users = [m["content"] for m in messages if m["role"] == "user"]
            if not users:
                raise ValueError(f"column '{columns['messages']}' has no user turn")
            question = users[-1]
            messages = [{"role": str(m["role"]), "content": m["content"]} for m in messages]
        else:
            question = _get(rec, columns["prompt"])
            if not isinstance(question, str) or not question.strip():
                raise ValueError(f"column '{columns['prompt']}' must be a non-empty string")
        tests = None
        if "tests" in columns:
            raw = _get(rec, columns["tests"])
            tests = validate_tests(json.loads(raw) if isinstance(raw, str) else raw, "tests")
        kind = str(_get(rec, columns["task"])) if "task" in columns else ("code" if tests else "math")
        if kind not in ("math", "code"):
            raise ValueError(f"column '{columns['task']}' must be 'math' or 'code', got {kind!r}")
        if kind == "code" and not tests:
            raise ValueError("a code row needs tests (map them with task_config.columns.tests)")
        answer = _get(rec, columns["answer"]) if kind == "math" else rec.get(columns.get("answer", ""), "")
        if answer is None or (kind == "math" and str(answer).strip() == ""):
            raise ValueError(f"column '{columns['answer']}' is empty")
        rid = str(_get(rec, columns["id"])) if "id" in columns else None
    except KeyError as e:
        raise ValueError(e.args[0]) from None
    return {
        "question": question,
        "messages": messages,
        "answer": str(answer),
        "id": rid,
        "kind": kind,
        "tests": tests,
    }


def resolve_columns(columns: dict[str, Any] | None) -> dict[str, str]:
    """The column mapping with defaults; an unknown key is a one-line error naming the valid ones."""
    out = dict(DEFAULT_COLUMNS)
    for k, v in (columns or {}).items():
        if k not in COLUMN_KEYS:
            raise ValueError(f"task_config.columns: unknown key '{k}'; valid keys: {', '.join(COLUMN_KEYS)}")
        if not isinstance(v, str) or not v:
            raise ValueError(f"task_config.columns.{k} must be a column name, got {v!r}")
        out[k] = v
    if "messages" in out and "prompt" not in (columns or {}):
        del out["prompt"]  # a chat column replaces the default prompt column
    return out


def load_rows(path: Path, columns: dict[str, str]) -> tuple[list[dict[str, Any]], list[str]]:
    """Distinct-prompt rows in sha1(prompt) order, and one message per skipped row (`file:line: why`)."""
    if not path.exists():
        raise ValueError(f"data file '{path}' not found")
    rows: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    for where, rec in read_records(path):
        try:
            row = parse_row(rec, columns)
        except ValueError as e:
            skipped.append(f"{where}: {e}")
            continue
        rows.setdefault(row["question"], row)  # exact duplicates: the first one wins
    if skipped:
        shown = "; ".join(skipped[:SHOWN_WARNINGS])
        more = f" (and {len(skipped) - SHOWN_WARNINGS} more)" if len(skipped) > SHOWN_WARNINGS else ""
        log.warning("%s: skipped %d malformed row(s): %s%s", path, len(skipped), shown, more)
    if not rows:
        first = f"; first problem: {skipped[0]}" if skipped else ""
        raise ValueError(
            f"{path}: no usable rows (map columns with task_config.columns={{prompt: ..., answer: ...}})"
            f"{first}"
        )
    ordered = sorted(rows.values(), key=lambda r: hashlib.sha1(r["question"].encode()).hexdigest())
    return ordered, skipped


class DataTask(Task):
    """Rows from a file or HF directory; math rows score with math-verify, code rows in the sandbox."""

    def __init__(
        self,
        path: Path,
        columns: dict[str, Any] | None = None,
        eval_path: Path | None = None,
        code_partial_credit: bool = True,
        sandbox_min_isolation: str = "auto",
        **kw: Any,
    ) -> None:
        super().__init__(**kw)
        self.name = str(path)
        cols = resolve_columns(columns)
        self.rows, self.skipped = load_rows(path, cols)
        self.eval_rows: list[dict[str, Any]] | None = None
        self.overlap = 0  # training rows dropped because a held-out row has the same prompt
        if eval_path is not None:
            self.eval_rows, bad = load_rows(eval_path, cols)
            self.skipped += bad
            held = {r["question"] for r in self.eval_rows}
            self.overlap = sum(r["question"] in held for r in self.rows)
            if self.overlap:
                log.warning(
                    "%s: %d training prompt(s) also appear in the held-out file %s: they are not trained on",
                    path,
                    self.overlap,
                    eval_path,
                )
        self.partial_credit = code_partial_credit
        self.executor: LocalSandbox | None = None  # code rows: built (and checked) with the task
        if any(r["kind"] == "code" for r in self.rows + (self.eval_rows or [])):
            self.executor = LocalSandbox(min_isolation=sandbox_min_isolation)

    def _make(self, row: dict[str, Any]) -> Problem:
        pid = row["id"] or f"row-{hashlib.sha1(row['question'].encode()).hexdigest()[:10]}"
        meta: dict[str, Any] = {"kind": row["kind"]}
        if row["tests"]:
            meta["tests"] = row["tests"]
        if row["messages"]:
            meta["chat"] = row["messages"]
        return self._problem(pid, row["question"], row["answer"], meta)

    def heldout(self, n: int) -> list[Problem]:
        if self.eval_rows is not None:
            return [self._make(r) for r in self.eval_rows[:n]]
        if n >= len(self.rows):
            raise ValueError(f"{self.name}: eval.size={n} leaves no training rows ({len(self.rows)} rows)")
        return [self._make(r) for r in self.rows[:n]]

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        order = [i for i, r in enumerate(self.rows) if r["question"] not in exclude]
        if not order:
            raise ValueError(f"{self.name}: every row is held out; lower eval.size")
        rng = random.Random(seed)
        while True:  # epochs over the training rows, reshuffled each time
            rng.shuffle(order)
            yield from (self._make(self.rows[i]) for i in order)

    def is_correct(self, extracted: str, problem: Problem) -> bool:
        from streamrl.rewards.math import math_equal

        return math_equal(extracted, problem.answer)

    def score(self, problem: Problem, text: str) -> Score:
        if problem.meta.get("kind") != "code":
            return super().score(problem, text)
        from streamrl.data.code_task import LIMITS
        from streamrl.rewards.code import extract_program, score_program

        program = extract_program(text)
        if program is None:
            return Score(False, False, None, value=0.0)
        value, info = score_program(
            program, problem.meta["tests"], self.partial_credit, self.executor, LIMITS
        )
        return Score(info["passed"] == info["total"], True, program, value=value)


JsonlTask = DataTask  # the historical name of a {prompt, answer} JSONL task
