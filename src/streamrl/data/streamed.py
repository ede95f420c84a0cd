"""A streamed tabular source (`task_config.streaming=true`): rows read lazily from IterableDatasets.

For sets too large to hold as Python rows. Held-out: the first eval.size usable rows of the held-out
split in its own order (of the training split when there is none; training then skips them by prompt).
Training never takes a prompt of a held-out split of its own, any of its rows (as a source held in
memory drops them): the held-out split is read through once, its prompts kept in a set.
Training: epoch after epoch over the training split, each epoch reshuffled with
`IterableDataset.shuffle(seed, buffer_size=task_config.shuffle_buffer)` and `set_epoch`, so a seed
replays the same order (a resumed run skips to its position). Rows are not deduplicated: a row that
repeats a prompt is a problem of its own, scored by its own answer (set-up warns when its rows give one
prompt other answers or tests, data/repeats.py).

Set-up reads the first PEEK_ROWS rows of each split, so a wrong column mapping fails before any model
loads; a malformed row met later while training is skipped, and the first few are logged. A record
that cannot be read at all (a line that is not JSON past what set-up checks, data/json_lines.py) ends
what `datasets` can read of its file: it stops the run with one line naming the source, the rows read
and, for a local .jsonl file, the file and line. So is a row
whose mapped id (`task_config.columns.id`) an earlier row with a different prompt had: the id keys the
reward cache, the sampler's pool and the drafts (in the first rows it is refused, as for a source held
in memory).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from streamrl.brief import brief_error
from streamrl.data.columns import check_question_column, excluded, held_key, parse_row
from streamrl.data.json_lines import first_bad_line, quiet_json_reader
from streamrl.data.repeats import streamed_conflicts
from streamrl.data.row_names import Label, failure, skipped_rows
from streamrl.data.row_task import SHOWN_WARNINGS, RowTask, log, no_usable_rows, report_skipped
from streamrl.types import Problem

PEEK_ROWS = 100


class StreamedDataTask(RowTask):
    def __init__(
        self,
        name: str,
        train: Any,
        columns: dict[str, str],
        held: Any = None,
        labels: tuple[Label, Label] | None = None,
        shuffle_buffer: int = 10_000,
        files: tuple[list[Path], list[Path]] = ([], []),
        **kw: Any,
    ) -> None:
        """train / held: IterableDatasets (held None: held out from train); labels: how warnings name
        the two and their rows (data/row_names.py; default: name); files: the local .jsonl files of
        each, where a failed read looks for its bad line; kw: RowTask's and Task's settings."""
        super().__init__(**kw)
        self.name = name
        self.train, self.held, self.columns = train, held, columns
        self.train_label, self.held_label = labels or (Label(name), Label(name))
        self.files = {"train": files[0], "held": files[1]}
        self.shuffle_buffer = shuffle_buffer
        self.skipped: list[str] = []  # malformed rows met while training (`where: why`)
        self._held_prompts: set[str] | None = None  # every prompt of the held-out split, read once
        # per split ("train", "held"; a split of its own names its rows apart): a mapped row id -> hash
        # of the prompt it was first seen with
        self._ids: dict[str, dict[str, int]] = {"train": {}, "held": {}}
        for ds, label, split in ((train, self.train_label, "train"), (held, self.held_label, "held")):
            if ds is not None:
                self._peek(ds, label, split)

    def _peek(self, ds: Any, label: Label, split: str) -> None:
        check_question_column(str(label), self.columns, getattr(ds, "column_names", None))
        rows, failed = [], []
        first: dict[str, int] = {}  # a mapped row id -> the row it was first seen in
        for i, rec in enumerate(itertools.islice(self._records(ds, label, split), PEEK_ROWS), 1):
            try:
                row = parse_row(rec, self.columns)
            except ValueError as e:
                failed.append(failure(label, i, rec, e))
                continue
            if self._repeats(row, split):  # its id came in this peek with another prompt
                raise ValueError(
                    f"task_config.columns.id: column '{self.columns['id']}' repeats '{row['id']}' "
                    f"({label.two_rows(first[row['id']], i)}, different prompts): map a column unique per "
                    "row, or drop columns.id"
                )
            first.setdefault(row["id"], i)
            rows.append((i, row))
        self._ids[split].clear()  # the stream is read again from its start
        bad = skipped_rows(label, failed, self.columns)
        if not rows:
            raise no_usable_rows(str(label), bad, getattr(ds, "column_names", None))
        report_skipped(str(label), bad)
        streamed_conflicts(label, rows)
        self.use_sandbox_for(row for _, row in rows)

    def _rows(self, ds: Any, label: Label, split: str) -> Iterator[dict[str, Any]]:
        """The usable rows of ds (split: "train" or "held") in its order; a malformed one is skipped (the
        first few are logged)."""
        for rec in self._records(ds, label, split):
            try:
                row = parse_row(rec, self.columns)
                if self._repeats(row, split):
                    raise ValueError(
                        f"task_config.columns.id: column '{self.columns['id']}' repeats '{row['id']}' of "
                        "an earlier row with a different prompt"
                    )
            except ValueError as e:
                self.skipped.append(f"{label}: {e}")
                if len(self.skipped) <= SHOWN_WARNINGS:
                    log.warning("%s: skipped a malformed row: %s", label, e)
                continue
            yield row

    def _records(self, ds: Any, label: Label, split: str) -> Iterator[Any]:
        """ds's records in its order. A read that fails (a line that is not JSON: the rest of its file
        cannot be read) is a ValueError naming the source, the rows this pass read, and the bad line
        of a local .jsonl file."""
        it = iter(ds)
        for n in itertools.count():
            try:
                with quiet_json_reader():  # a line that is not JSON: named once, below
                    rec = next(it)
            except StopIteration:
                return
            except Exception as e:
                why = first_bad_line(self.files[split]) or f"{brief_error(e)}; fix the source"
                raise ValueError(f"{label}: reading failed after {n} row(s) of this pass: {why}") from None
            yield rec

    def _repeats(self, row: dict[str, Any], split: str) -> bool:
        """Whether the row's mapped id came before in its split with a different prompt (remembering it
        if new)."""
        seen = self._ids[split]
        return row["id"] is not None and seen.setdefault(row["id"], hash(row["key"])) != hash(row["key"])

    def heldout_from_training(self) -> bool:
        return self.held is None

    def held_split(self) -> set[str]:
        if self.held is None:
            return set()
        if self._held_prompts is None:  # its malformed rows are reported where heldout reads them
            prompts = set()
            for rec in self._records(self.held, self.held_label, "held"):
                try:
                    prompts.add(held_key(parse_row(rec, self.columns)))
                except ValueError:
                    continue
            self._held_prompts = prompts
        return self._held_prompts

    def heldout(self, n: int) -> list[Problem]:
        if self.held is not None:
            rows = self._rows(self.held, self.held_label, "held")
        else:  # held out from the training split: the same ids
            rows = self._rows(self.train, self.train_label, "train")
        return [self._make(r) for r in itertools.islice(rows, n)]

    def train_stream(self, seed: int, exclude: set[str]) -> Iterator[Problem]:
        exclude = exclude | self.held_split()
        shuffled = self.train.shuffle(seed=seed, buffer_size=self.shuffle_buffer)
        for epoch in itertools.count():
            shuffled.set_epoch(epoch)
            fresh = 0
            for row in self._rows(shuffled, self.train_label, "train"):
                if not excluded(row, exclude):
                    fresh += 1
                    yield self._make(row)
            if not fresh and self.held is not None:
                raise ValueError(
                    f"{self.name}: every streamed training row is also a held-out row of {self.held_label} "
                    "or a few-shot example"
                )
            if not fresh:
                raise ValueError(f"{self.name}: every streamed row is held out; lower eval.size")
