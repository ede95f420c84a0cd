"""Tabular problem sources: `hf:NAME[:CONFIG]`, `data:PATH` and rows from code, with a column mapping.

Rows are read with Hugging Face `datasets` (data/loading.py) and mapped to problems with
`task_config.columns` (data/columns.py). A malformed row is skipped and counted; one warning names the
source and row of each of the first few. Only a source with no usable rows is an error.

Splits: training rows come from `task_config.split` (default `train`). The held-out rows come from
`task_config.eval_split`, else the source's `test` split when it has one, else from the training split
itself: distinct prompts are ordered by sha1(prompt), the first eval.size are held out and the rest
train (reshuffled each epoch). `task_config.eval_data=PATH` takes the held-out rows from another source
instead: its split `task_config.eval_split`, else its `test` split, else its only one. Training rows
whose prompt equals a held-out one are dropped and reported. A chat row's prompt is its every turn, not
only its last user turn; a prompt met again is read once (data/repeats.py).

`task_config.streaming=true` reads the splits lazily instead (data/streamed.py).
"""

from __future__ import annotations

import hashlib
import random
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from streamrl.data.columns import check_question_column, excluded, held_key, parse_row, resolve_columns
from streamrl.data.json_lines import jsonl_files
from streamrl.data.loading import held_split_name, open_splits, pick_split
from streamrl.data.repeats import Repeats
from streamrl.data.row_names import Label, failure, label_of, skipped_rows
from streamrl.data.row_task import RowTask, log, no_usable_rows, report_skipped
from streamrl.data.streamed import StreamedDataTask
from streamrl.data.task import Task
from streamrl.types import Problem


def collect_rows(
    records: Iterable[Any], columns: dict[str, str], label: Label
) -> tuple[list[dict], list[str]]:
    """Distinct-prompt rows in sha1(key) order (data/columns.py row_key; a repeated prompt as
    data/repeats.py says), and one message per skipped row (`FILE:row N: why`, data/row_names.py)."""
    check_question_column(str(label), columns, getattr(records, "column_names", None))
    rows: dict[str, dict[str, Any]] = {}
    failed: list[tuple[int, str, bool]] = []  # what skipped_rows needs of each refused row
    repeats = Repeats(label)
    id_rows: dict[str, int] = {}  # a mapped row id -> the row it was first seen in
    for i, rec in enumerate(records, 1):
        try:
            row = parse_row(rec, columns)
        except ValueError as e:
            failed.append(failure(label, i, rec, e))
            continue
        if not repeats.read(rows, row, i):  # a prompt read before
            continue
        if row["id"] is not None and (first := id_rows.setdefault(row["id"], i)) != i:
            # the id keys the reward cache, the sampler's pool and the drafts: two prompts cannot share it
            raise ValueError(
                f"task_config.columns.id: column '{columns['id']}' repeats '{row['id']}' "
                f"({label.two_rows(first, i)}, different prompts): map a column unique per row, or drop "
                "columns.id"
            )
        rows[row["key"]] = row
    skipped = skipped_rows(label, failed, columns)
    report_skipped(str(label), skipped)
    repeats.report()
    if not rows:
        raise no_usable_rows(str(label), skipped, getattr(records, "column_names", None))
    return sorted(rows.values(), key=lambda r: hashlib.sha1(r["key"].encode()).hexdigest()), skipped


class DataTask(RowTask):
    """Rows held in memory: held-out and training splits as described in the module docstring."""

    def __init__(
        self,
        name: str,
        rows: list[dict[str, Any]],
        eval_rows: list[dict[str, Any]] | None = None,
        skipped: list[str] | None = None,
        eval_name: str = "",
        **kw: Any,
    ) -> None:
        """rows / eval_rows: parsed rows in their held-out order (collect_rows); kw: RowTask's settings."""
        super().__init__(**kw)
        self.name = name
        self.rows, self.eval_rows, self.skipped = rows, eval_rows, list(skipped or [])
        self.overlap = 0  # training rows dropped because a held-out row has the same prompt
        self.held_prompts = {held_key(r) for r in eval_rows or []}  # every row of the held-out split
        if eval_rows is not None:
            self.rows = [r for r in rows if not excluded(r, self.held_prompts)]
            self.overlap = len(rows) - len(self.rows)
            if self.overlap:
                log.warning(
                    "%s: %d training prompt(s) are also held-out rows of %s: they are not trained on",
                    name,
                    self.overlap,
                    eval_name or "the eval split",
                )
        self.use_sandbox_for(self.rows + (self.eval_rows or []))

    def heldout_from_training(self) -> bool:
        return self.eval_rows is None

    def held_split(self) -> set[str]:
        return self.held_prompts

    def heldout(self, n: int) -> list[Problem]:
        if self.eval_rows is not None:
            return [self._make(r) for r in self.eval_rows[:n]]
        if n >= len(self.rows):
            raise ValueError(
                f"{self.name}: eval.size={n} leaves no training rows ({len(self.rows)} rows): lower "
                "eval.size, or give the held-out rows their own file (task_config.eval_data)"
            )
        return [self._make(r) for r in self.rows[:n]]

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        order = [i for i, r in enumerate(self.rows) if not excluded(r, exclude)]
        if not order and self.overlap:
            raise ValueError(
                f"{self.name}: every training row is also a held-out row (task_config.eval_data) or a "
                "few-shot example"
            )
        if not order:
            raise ValueError(
                f"{self.name}: every row is held out or a few-shot example; lower eval.size or "
                "task_config.few_shot_n"
            )
        rng = random.Random(seed)
        while True:  # epochs over the training rows, reshuffled each time
            rng.shuffle(order)
            yield from (self._make(self.rows[i]) for i in order)


def _is_iterable_dataset(x: Any) -> bool:
    datasets = sys.modules.get("datasets")  # not imported: x cannot be one (and no import is paid for)
    return datasets is not None and isinstance(x, datasets.IterableDataset)


def task_from_rows(
    rows: Any,
    columns: dict[str, str] | None = None,
    eval_rows: Any = None,
    name: str = "rows",
    *,
    system_prompt: str = "",
    instruction: str = "",
    extract: str = "answer_is",
    shuffle_buffer: int = 10_000,
    code_partial_credit: bool = True,
    sandbox_min_isolation: str = "auto",
    sandbox_executor: str = "local",
) -> Task:
    """A task over rows from code: `rows` and `eval_rows` are each a list of dicts, a `datasets.Dataset` or
    a `datasets.IterableDataset`, mapped with `columns` (data/columns.py). With `eval_rows` None the
    held-out rows are drawn from `rows`. An IterableDataset as `rows` makes a streamed task
    (data/streamed.py); otherwise the rows are held in memory (DataTask). `name` names the source in
    warnings and errors. ValueError: an unknown column key or no usable rows."""
    cols = resolve_columns(columns)
    kw = {
        "system_prompt": system_prompt,
        "instruction": instruction,
        "extract": extract,
        "code_partial_credit": code_partial_credit,
        "sandbox_min_isolation": sandbox_min_isolation,
        "sandbox_executor": sandbox_executor,
    }
    for what, value in (("rows", rows), ("eval_rows", eval_rows)):
        if value is not None and (isinstance(value, (str, bytes, dict)) or not isinstance(value, Iterable)):
            raise ValueError(f"{what} must be a list of dicts, a datasets.Dataset or IterableDataset")
    labels = (Label(name), Label(f"{name}[eval_rows]"))
    return _task(name, rows, eval_rows, labels, cols, _is_iterable_dataset(rows), shuffle_buffer, kw)


def _task(
    name: str,
    train: Any,
    held: Any,
    labels: tuple[Label, Label],
    cols: dict[str, str],
    streaming: bool,
    shuffle_buffer: int,
    kw: dict[str, Any],
    files: tuple[list[Path], list[Path]] = ([], []),
) -> Task:
    """A streamed task over the (train, held) sources, or a DataTask over their rows collected now;
    `labels` name the two sources in warnings and errors; `files`: their local .jsonl files."""
    if streaming:
        return StreamedDataTask(name, train, cols, held, labels, shuffle_buffer, files, **kw)
    rows, skipped = collect_rows(train, cols, labels[0])
    eval_rows = None
    if held is not None:
        eval_rows, bad = collect_rows(held, cols, labels[1])
        skipped += bad
    return DataTask(name, rows, eval_rows, skipped, str(labels[1]), **kw)


def data_task(
    spec: str,
    columns: dict[str, Any] | None = None,
    *,
    split: str = "train",
    eval_split: str = "",
    eval_data: str = "",
    streaming: bool = False,
    shuffle_buffer: int = 10_000,
    **kw: Any,
) -> Task:
    """The task of `hf:NAME[:CONFIG]`, `data:PATH` or a bare PATH (split rules: module docstring);
    kw: system_prompt, instruction, extract, code_partial_credit, sandbox_min_isolation,
    sandbox_executor."""
    cols = resolve_columns(columns)
    name, splits = open_splits(spec, streaming)
    train = pick_split(name, splits, split, "split")
    train_label = name if len(splits) == 1 else f"{name}[{split}]"
    held, held_label = None, ""
    if eval_data:
        held_label, held_splits = open_splits(eval_data, streaming, "task_config.eval_data")
        held_name = eval_split or ("test" if "test" in held_splits else "")
        if not held_name and len(held_splits) > 1:
            raise ValueError(
                f"task_config.eval_data: {held_label} has splits {', '.join(held_splits)} and no 'test': "
                "name the held-out one with task_config.eval_split=<split>"
            )
        held = pick_split(held_label, held_splits, held_name or next(iter(held_splits)), "eval_split")
        if len(held_splits) > 1:
            held_label = f"{held_label}[{held_name}]"
    elif held_name := held_split_name(splits, split, eval_split):
        held, held_label = pick_split(name, splits, held_name, "eval_split"), f"{name}[{held_name}]"
    files = (local_jsonl(spec), local_jsonl(eval_data) if eval_data else local_jsonl(spec))
    labels = (label_of(train_label, spec), label_of(held_label, eval_data or spec))
    return _task(name, train, held, labels, cols, streaming, shuffle_buffer, kw, files)


def local_jsonl(spec: str) -> list[Path]:
    """The local .jsonl files of a `data:PATH` (or bare PATH) spec; none for `hf:NAME`."""
    return [] if spec.startswith("hf:") else jsonl_files(Path(spec.removeprefix("data:")).expanduser())
