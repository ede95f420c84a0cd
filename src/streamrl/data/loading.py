"""Opening a tabular source with Hugging Face `datasets`: a spec -> its splits, or one line saying why not.

- `hf:NAME[:CONFIG]`: `datasets.load_dataset(NAME, CONFIG)`, so the Hub, the datasets cache and the
  offline switches (HF_HUB_OFFLINE / HF_DATASETS_OFFLINE, HF_HOME / HF_DATASETS_CACHE / HF_HUB_CACHE)
  behave as they do for `datasets`. When the Hub cannot be used, a snapshot of the dataset repository in
  the hub cache (`hf download --repo-type dataset NAME`) is read as a local directory.
- `data:PATH`: a .jsonl / .json / .parquet / .csv file (`load_dataset(<builder>, data_files=PATH)`: one
  split, `train`), a directory written by `save_to_disk` (`load_from_disk`: a Dataset is the `train`
  split, a DatasetDict keeps its splits) or a directory of data files (`load_dataset(DIR)`: splits from
  the file names, e.g. train.jsonl and test.jsonl).

With `streaming`, splits are IterableDatasets read lazily (local .jsonl files are checked line by line
first, data/json_lines.py). The `datasets` import stays inside the
functions, so commands that never read data do not pay for it.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from streamrl.brief import brief_error
from streamrl.data.json_lines import check_before_streaming, first_bad_line, jsonl_files, quiet_json_reader

BUILDERS = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
LOCAL_HINT = (
    "pass local files with task=data:PATH (.jsonl, .json, .parquet, .csv or a save_to_disk directory)"
)


def open_splits(spec: str, streaming: bool, key: str = "task") -> tuple[str, dict[str, Any]]:
    """(the source's name, {split: Dataset | IterableDataset}) for `hf:NAME[:CONFIG]`, `data:PATH` or PATH;
    `key`: the config key that named it, for the error of a missing file."""
    if missing := missing_data_file(spec):
        raise ValueError(f"config key '{key}': {missing}")
    path = Path(spec.removeprefix("data:")).expanduser()
    with _no_progress_bars():  # the run shows its own progress; errors stay one line on stderr
        if spec.startswith("hf:"):
            return spec, _hub_splits(spec[3:], streaming)
        return str(path), _path_splits(path, streaming)


def missing_data_file(spec: str) -> str:
    """What is wrong with a `data:PATH` or PATH spec naming nothing that exists, `data file 'PATH' not found
    (relative to CWD)`; "" when it exists, or for `hf:NAME` (looked up when it is opened)."""
    path = Path(spec.removeprefix("data:")).expanduser()
    if spec.startswith("hf:") or path.exists():
        return ""
    where = "" if path.is_absolute() else f" (relative to {Path.cwd()})"
    return f"data file '{path}' not found{where}"


@contextmanager
def _no_progress_bars() -> Iterator[None]:
    from datasets.utils import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    was_on = not are_progress_bars_disabled()
    disable_progress_bars()
    try:
        yield
    finally:
        if was_on:
            enable_progress_bars()


def _hub_splits(ref: str, streaming: bool) -> dict[str, Any]:
    import datasets

    name, _, config = ref.partition(":")
    if not name:
        raise ValueError("task=hf:NAME[:CONFIG] needs a dataset name, e.g. hf:openai/gsm8k:main")
    try:
        return dict(datasets.load_dataset(name, config or None, streaming=streaming))
    except Exception as e:  # every failure becomes one line naming the dataset
        offline = bool(datasets.config.HF_HUB_OFFLINE)
        if not (offline or isinstance(e, ConnectionError)):
            hint = "; name one with task=hf:NAME:CONFIG" if "config" in str(e).lower() else ""
            raise ValueError(f"hf:{ref}: {brief_error(e)}{hint}") from None
        snapshot = _cached_snapshot(name)
        if snapshot is None:
            hub = "offline (HF_HUB_OFFLINE=1)" if offline else "unreachable"
            why = "" if isinstance(e, ConnectionError) else f" ({brief_error(e)})"
            raise ValueError(
                f"hf:{ref}: dataset '{name}' is not in the local Hugging Face cache and the Hub is {hub}"
                f"{why}; load it once with network access, or {LOCAL_HINT}"
            ) from None
    try:
        return dict(datasets.load_dataset(snapshot, config or None, streaming=streaming))
    except Exception as e:
        raise ValueError(
            f"hf:{ref}: the cached snapshot {snapshot} could not be read: {brief_error(e)}"
        ) from None


def _cached_snapshot(name: str) -> str | None:
    """The dataset repository's snapshot in the hub cache (HF_HUB_CACHE), without any network call."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(name, repo_type="dataset", local_files_only=True)
    except (OSError, ValueError):  # not cached (LocalEntryNotFoundError) or not a repo id
        return None


def _path_splits(path: Path, streaming: bool) -> dict[str, Any]:
    import datasets

    if path.is_dir() and ((path / "state.json").is_file() or (path / "dataset_dict.json").is_file()):
        loaded = datasets.load_from_disk(str(path))
        splits = dict(loaded) if isinstance(loaded, datasets.DatasetDict) else {"train": loaded}
        return {k: v.to_iterable_dataset() for k, v in splits.items()} if streaming else splits
    if path.is_dir():
        builder, files = str(path), None
    elif path.suffix in BUILDERS:
        builder, files = BUILDERS[path.suffix], str(path)
    else:
        raise ValueError(
            f"{path}: unsupported file type '{path.suffix}'; use .jsonl, .json, .parquet or .csv, a "
            "directory of them, or a save_to_disk directory"
        )
    if path.is_file() and path.stat().st_size <= 4096 and not path.read_bytes().strip():
        raise ValueError(f"{path}: the file is empty (no rows)")
    if streaming:  # read as training goes: a bad line is named now, not where training reaches it
        check_before_streaming(path)
    try:
        with quiet_json_reader():  # a line that is not JSON: named once, below
            return dict(datasets.load_dataset(builder, data_files=files, streaming=streaming))
    except Exception as e:  # the file's own problem, in one line
        bad = first_bad_line(jsonl_files(path))
        raise ValueError(bad or f"{path}: datasets could not read it: {brief_error(e)}") from None


def pick_split(name: str, splits: dict[str, Any], split: str, key: str) -> Any:
    """splits[split], or one line naming the source, the config key to set and the splits it has."""
    if split not in splits:
        raise ValueError(
            f"{name} has no split '{split}': set task_config.{key} to one of: {', '.join(splits)}"
        )
    return splits[split]


def held_split_name(splits: dict[str, Any], split: str, eval_split: str) -> str:
    """The held-out split: eval_split if set, else `test` when the source has one; "" = hold out rows of
    the training split itself (also when eval_split names the training split)."""
    held = eval_split or ("test" if "test" in splits else "")
    return "" if held == split else held
