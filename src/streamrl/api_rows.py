"""Rows from code for the Python API (`train_data=`, `eval_data=`): checked against the made config, then
written once to a JSONL file in streamrl's cache named after the argument and their content
(data/row_names.py), which the run's task points at, so rollout workers, config.yaml and `resume=` see
the same data; a resumed run keeps the file its config names when it holds the same rows.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from streamrl.config import Config, ConfigError
from streamrl.config_parse import read_yaml
from streamrl.run_dirs import holds_run


@dataclass
class Rows:
    """Rows from code, as the JSONL file in the cache they are written to once checked."""

    key: str  # the argument that passed them: train_data or eval_data
    lines: list[str]  # one JSON object per row, in the order given
    path: Path  # named by the argument and the content

    def check(self, cfg: Config) -> None:
        """One line, naming the rows as passed (`train_data[0]`), when none is a problem under the
        config's column mapping (data/columns.py; a file's rows are read the same way)."""
        from streamrl.data.columns import parse_row, resolve_columns
        from streamrl.data.row_task import no_usable_rows

        columns = resolve_columns(cfg.task_config.columns)
        problems = []
        for i, line in enumerate(self.lines):
            try:
                parse_row(json.loads(line), columns)
            except ValueError as e:
                problems.append(f"{self.key}[{i}]: {e}")
        if len(problems) == len(self.lines):
            raise ConfigError(str(no_usable_rows(self.key, problems, None)))

    def write(self) -> str:
        if not self.path.is_file():
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(self.lines))
            tmp.replace(self.path)
        return str(self.path)


def data_source(rows: Any, key: str) -> str | Rows:
    """Rows (a list of dicts or a datasets.Dataset) -> Rows, their JSONL file in the cache named by the
    argument and their content, written after the config is made (write_rows); a string is a path or a
    source spec (`hf:NAME[:CONFIG]`, `data:PATH`) already, refused at once, naming `key`, if it is a path to
    nothing."""
    if isinstance(rows, (str, Path)):
        from streamrl.data.loading import missing_data_file

        if missing := missing_data_file(str(rows)):
            raise ConfigError(f"{key}: {missing}")
        return str(rows)
    if type(rows).__name__ == "IterableDataset":
        raise ConfigError(
            f"{key}: a streamed IterableDataset cannot be copied for the rollout workers; pass its name "
            "as task='hf:NAME' with task_config={'streaming': True}, or a Dataset"
        )
    if not isinstance(rows, Sequence) and not hasattr(rows, "to_list"):
        raise ConfigError(
            f"{key}: expected a list of dicts, a datasets.Dataset or a path, got {type(rows).__name__}"
        )
    records = rows.to_list() if hasattr(rows, "to_list") else list(rows)
    bad = next((i for i, r in enumerate(records) if not isinstance(r, dict)), None)
    if bad is not None:
        raise ConfigError(f"{key}[{bad}]: expected a dict of columns, got {type(records[bad]).__name__}")
    if not records:
        raise ConfigError(f"{key}: no rows")
    lines = [json.dumps(r, sort_keys=True, default=str) + "\n" for r in records]
    from streamrl.data.row_names import code_rows_file  # its rows are named as passed: train_data[0]

    return Rows(key, lines, code_rows_file(key, hashlib.sha1("".join(lines).encode()).hexdigest()[:16]))


def source_path(source: str | Rows) -> str:
    return source if isinstance(source, str) else str(source.path)


def write_rows(cfg: Config, *sources: str | Rows | None) -> None:
    """The rows from code checked against the made config, then written (before that, nothing is)."""
    rows = [s for s in sources if isinstance(s, Rows)]
    for r in rows:
        r.check(cfg)
    for r in rows:
        r.write()


def task_spec(source: str) -> str:
    """A source spec (`hf:NAME[:CONFIG]`, `data:PATH`) as it is; a path -> `data:PATH`."""
    return source if source.startswith(("hf:", "data:")) else f"data:{source}"


def refuse_a_second_task(config: Any, overrides: dict[str, Any]) -> None:
    """One line when a `task` keyword, a config dict's `task` or a config file's is given beside
    train_data (which sets the task: it would replace the other silently)."""
    for given, where in ((overrides, "task={!r}"), (config, "the config dict's 'task': {!r}")):
        if isinstance(given, dict) and "task" in given:
            raise ConfigError(
                f"{where.format(given['task'])} and train_data both name the training data: pass one "
                "(train_data: rows, a path or 'hf:NAME'; task: a task such as 'rg:NAME')"
            )
    if isinstance(config, (str, Path)) and Path(config).is_file():  # else load_config names the problem
        data = read_yaml(config)
        if isinstance(data, dict) and "task" in data:
            raise ConfigError(
                f"config file '{config}' sets task: {data['task']!r}, and train_data names the training data "
                "too: remove task from the file, or pass no train_data"
            )


def resume_on_saved_rows(config: Any, overrides: dict[str, Any], *sources: str | Rows | None) -> None:
    """Resuming a run (resume=RUN) with rows from code: their file is the one RUN/config.yaml names when
    it holds the same rows (the name it had when the run started: data/row_names.py); other rows are
    refused with one line."""
    from streamrl.config import RESUME_FIXED
    from streamrl.data.row_names import resumed_rows_file

    resume = (
        overrides["resume"]
        if "resume" in overrides  # resume="" starts a new run whatever the config says
        else config.get("resume")
        if isinstance(config, dict)
        else getattr(config, "resume", None)
    )  # a Config made before with resume= sets it too (a config file may not: load_config says so)
    path = Path(str(resume)) / "config.yaml"
    saved = read_yaml(path, "resume") if resume and holds_run(path.parent) else None
    if not isinstance(saved, dict):  # not resuming; else load_config names a directory not a run's
        return
    for rows in (s for s in sources if isinstance(s, Rows)):
        key = "task" if rows.key == "train_data" else "task_config.eval_data"
        section = saved if key == "task" else saved.get("task_config")
        value = section.get(key.rpartition(".")[2]) if isinstance(section, dict) else None
        if (found := resumed_rows_file(str(value or ""), rows.path)) is None:
            raise ConfigError(
                f"resume: {rows.key} holds other rows than {resume}/config.yaml names ({key}: {value!r}): a "
                f"resumed run keeps them ({RESUME_FIXED[key]}); pass the rows it started with, or no "
                f"{rows.key} (the run reads its own), or start a new run from its checkpoint"
            )
        rows.path = found
