"""The weight files of a model directory: the set transformers loads, and what a download fetches.

transformers (from_pretrained on a directory) loads the first of: model.safetensors; every shard that
model.safetensors.index.json names; pytorch_model.bin; every shard that pytorch_model.bin.index.json
names. A directory is complete when it holds config.json and every file of that set. Other weight files
a repository may ship next to them (a Mistral-format consolidated.safetensors, training_args.bin, a shard
no index names) are never part of the set: not downloaded, and not taken as a complete set.

Each file of the set is checked without reading a tensor (a safetensors header, a PyTorch checkpoint's zip
directory or, in torch.save's legacy format, its pickles), and a problem comes with the way out that
suits where the directory came from (`way_out`): a build in streamrl's cache is deleted and built again,
a Hub snapshot downloaded again, any other directory copied again from its base model.
"""

from __future__ import annotations

import json
import pickle
import pickletools
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

from streamrl.models.cache import models_dir

# (single file, shard index) per format, in transformers' order of preference
SAFETENSORS = ("model.safetensors", "model.safetensors.index.json")
PYTORCH = ("pytorch_model.bin", "pytorch_model.bin.index.json")
FORMATS = (SAFETENSORS, PYTORCH)


def index_shards(index: Path) -> list[str]:
    """The shard files an index's weight_map names, each once, sorted; [] when it cannot be read."""
    try:
        weight_map = json.loads(index.read_text()).get("weight_map")
        return sorted({str(shard) for shard in weight_map.values()})
    except (OSError, ValueError, AttributeError):
        return []


def weight_set(path: Path) -> list[str]:
    """The files transformers loads from directory `path` (relative names); [] when it finds none."""
    for single, index in FORMATS:
        if (path / single).is_file():
            return [single]
        if (path / index).is_file():
            return index_shards(path / index)
    return []


def is_complete(path: Path) -> bool:
    """config.json and every file of the weight set transformers loads from `path`."""
    files = weight_set(path)
    return (path / "config.json").is_file() and bool(files) and all((path / f).is_file() for f in files)


def download_sets(path: Path) -> list[list[str]]:
    """What to fetch into `path` (a snapshot holding the config and any shard index), one list per format
    in transformers' order: the shards its index names, else its single file; a format whose index
    cannot be read gives []."""
    return [index_shards(path / index) if (path / index).is_file() else [single] for single, index in FORMATS]


def unreadable(e: OSError) -> str:
    """Why a file cannot be read: the system's reason ("Permission denied"), else the error's own text
    (an OSError raised with a message alone has no strerror)."""
    return f"it cannot be read: {e.strerror or e}"


MAX_HEADER = 100_000_000  # bytes: the safetensors library refuses a longer header


def safetensors_problem(file: Path) -> str:
    """Why `file` is not a whole safetensors file, '' when it is. Only its header is read (an 8-byte
    little-endian length, then that much JSON), and the tensor data it describes must fill the rest of
    the file exactly, as safetensors requires: no tensor is read."""
    try:
        size = file.stat().st_size
        with file.open("rb") as f:
            head = f.read(8)
            length = int.from_bytes(head, "little") if len(head) == 8 else -1
            if length < 0 or 8 + length > size:
                return f"its header runs past the end of the file's {size} bytes"
            if length > MAX_HEADER:  # safetensors' own limit: a corrupt length is not read into memory
                return f"its header claims {length} bytes, past safetensors' limit of {MAX_HEADER}"
            header = json.loads(f.read(length))
    except OSError as e:
        return unreadable(e)
    except ValueError:  # not JSON, not UTF-8
        return "its header is not JSON"
    try:
        tensors = [t for key, t in header.items() if key != "__metadata__"]
        end = max((int(t["data_offsets"][1]) for t in tensors), default=0)
    except (AttributeError, TypeError, KeyError, IndexError, ValueError):
        return "its header does not describe tensors"
    if 8 + length + end != size:
        return f"it holds {size} bytes where its header describes {8 + length + end}"
    return ""


def pytorch_problem(file: Path) -> str:
    """Why `file` is not a whole PyTorch checkpoint, '' when it may be; no tensor is read. torch.save
    writes a zip archive holding a data.pkl, whose central directory (at the end of the file: one cut
    short has none) must read and name it. A legacy checkpoint starts with pickle's PROTO opcode and a
    protocol from 2 to 5: five pickles, then the storages' bytes, checked by legacy_problem."""
    try:
        with file.open("rb") as f:
            head = f.read(2)
            f.seek(0)
            if head != b"PK":
                pickled = len(head) == 2 and head[0] == 0x80 and 2 <= head[1] <= 5
                return legacy_problem(f, file.stat().st_size) if pickled else NEITHER
            names = zipfile.ZipFile(f).namelist()
    except OSError as e:
        return unreadable(e)
    except (zipfile.BadZipFile, ValueError, EOFError):
        return "its zip directory cannot be read: the file is cut short"
    if not any(n == "data.pkl" or n.endswith("/data.pkl") for n in names):
        return "its zip archive holds no data.pkl"
    return ""


NEITHER = "it is neither a zip archive nor a pickle"

# torch.save's legacy format (_use_new_zipfile_serialization=False): pickles of this magic number, a
# protocol version and the system's facts, then the saved object (each storage by reference: a persistent
# id ("storage", its type, its key, its device, its element count, ...)), then the list of the storages'
# keys, in the order their bytes follow the pickles: for each, its element count (8 bytes), then its
# elements
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
# bytes per element of each storage type a legacy checkpoint names (torch/storage.py)
STORAGE_BYTES = {
    "DoubleStorage": 8,
    "FloatStorage": 4,
    "HalfStorage": 2,
    "BFloat16Storage": 2,
    "LongStorage": 8,
    "IntStorage": 4,
    "ShortStorage": 2,
    "CharStorage": 1,
    "ByteStorage": 1,
    "BoolStorage": 1,
    "ComplexDoubleStorage": 16,
    "ComplexFloatStorage": 8,
    "QInt32Storage": 4,
    "QInt8Storage": 1,
    "QUInt8Storage": 1,
    "QUInt4x2Storage": 1,
    "QUInt2x4Storage": 1,
    "ComplexHalfStorage": 4,
    "UntypedStorage": 1,
}
# the opcodes that load an object by extension code (copyreg): one cached there bypasses find_class,
# one not yet cached would put find_class's stand-in in that process-wide cache; torch.save writes none
EXTENSIONS = {"EXT1", "EXT2", "EXT4"}


class _Named:
    """Stands for whatever class or function a legacy pickle names: nothing is imported and nothing of
    the checkpoint's runs; what the pickle builds with it is taken and dropped."""

    module = ""

    def __init__(self, *args: object, **kwargs: object) -> None:
        pass

    def __setstate__(self, state: object) -> None:
        pass

    def __setitem__(self, key: object, value: object) -> None:
        pass

    def append(self, item: object) -> None:
        pass

    def extend(self, items: object) -> None:
        pass


TORCH = ("torch", "torch.cuda")  # the modules of a legacy checkpoint's storage types (saved on a GPU: cuda)


class _Skim(pickle.Unpickler):
    """Reads one pickle of a legacy checkpoint: `storages` {key: (type name, element count)} of the
    storages it refers to."""

    def __init__(self, f: BinaryIO) -> None:
        super().__init__(f, encoding="latin1")  # a Python 2 pickle's str: any byte reads
        self.storages: dict[str, tuple[str, int]] = {}

    def find_class(self, module: str, name: str) -> type:
        return type(name, (_Named,), {"module": module})

    def persistent_load(self, pid: object) -> object:
        if isinstance(pid, tuple) and len(pid) >= 5 and pid[0] in ("storage", b"storage"):
            kind = pid[1]
            torch_type = isinstance(kind, type) and issubclass(kind, _Named) and kind.module in TORCH
            self.storages[str(pid[2])] = (kind.__name__ if torch_type else "", pid[4])
        return _Named()


def legacy_problem(f: BinaryIO, size: int) -> str:
    """Why the legacy checkpoint open in `f` (`size` bytes) is not whole, '' when it may be: its pickles
    must read (nothing they name is imported; one loading by extension code is refused unread), and the
    storages' bytes they describe must fit in the file after them. No tensor is read. A storage of a type
    this does not know counts its 8-byte length only (the sum stays a lower bound)."""
    try:
        if _skim(f) != LEGACY_MAGIC:
            return "it is a pickle without torch.save's magic number"
        _skim(f)  # the protocol version
        _skim(f)  # the system's facts
        saved = _Skim(f)
        _refuse_extensions(f)
        saved.load()
        keys = _skim(f)
        end = f.tell()
        if not isinstance(keys, list) or any(str(k) not in saved.storages for k in keys):
            return "its pickles do not describe its storages"
        for key in keys:
            kind, count = saved.storages[str(key)]
            width = STORAGE_BYTES.get(kind, 0) if isinstance(count, int) and count >= 0 else 0
            end += 8 + count * width if width else 8
    except OSError:
        raise
    except _Extension:
        return "its pickles load objects by extension code, which torch.save never writes"
    except Exception:  # a pickle cut short raises EOFError or UnpicklingError; a damaged one, others
        return "its pickles cannot be read: the file is cut short"
    if end > size:
        return f"it holds {size} bytes where its pickles describe {end}"
    return ""


class _Extension(Exception):
    """A pickle that loads an object by extension code (EXTENSIONS)."""


def _refuse_extensions(f: BinaryIO) -> None:
    """Raise _Extension if the pickle at f's position uses an extension code; f is left where it was
    (pickletools only decodes the opcodes, it runs nothing)."""
    start = f.tell()
    try:
        if any(op.name in EXTENSIONS for op, _, _ in pickletools.genops(f)):
            raise _Extension
    finally:
        f.seek(start)


def _skim(f: BinaryIO) -> object:
    """The next pickle of a legacy checkpoint, read by _Skim (its storages not kept)."""
    _refuse_extensions(f)
    return _Skim(f).load()


# what each kind of weight file is checked with, and what it is called
FILE_CHECKS = {
    ".safetensors": (safetensors_problem, "safetensors file"),
    ".bin": (pytorch_problem, "PyTorch checkpoint"),
}


def hub_snapshot(path: Path) -> tuple[str, str] | None:
    """(repo id, commit) when `path` is a snapshot in huggingface_hub's cache
    (models--ORG--NAME/snapshots/COMMIT; a repo id has no '--'), else None."""
    entry = path.parent.parent
    if path.parent.name != "snapshots" or not entry.name.startswith("models--"):
        return None
    return entry.name.removeprefix("models--").replace("--", "/"), path.name


# the weights of a Hub snapshot that holds no weight set, per format in transformers' order: the single
# file, or its index and shards (which format the repository has is not known offline)
SNAPSHOT_WEIGHTS = ("model*.safetensors*", "pytorch_model*.bin*")


def way_out(path: Path, files: Sequence[str] = ()) -> str:
    """What to do about weight files `files` of directory `path` (cut short, unreadable or missing; ()
    when it holds no weight set at all): a model streamrl built into its cache (tiny-random,
    smollm2-135m-instruct) is deleted and built again on its next use; a Hub snapshot downloads those
    files again, replacing the cached ones (and only them: never the whole repository); another directory
    copies them again from its base model."""
    if path.resolve().parent == models_dir().resolve():
        return f"delete {path} so it is rebuilt"
    them = "it" if len(files) == 1 else "them"
    snapshot = hub_snapshot(path)
    if snapshot is not None:
        repo, commit = snapshot
        if not files:  # the safetensors weights, or the .bin ones of a repository that has no others
            first, other = (
                f'`hf download {repo} --include "{p}" --revision {commit}`' for p in SNAPSHOT_WEIGHTS
            )
            return f"download them: {first} (for a repository without safetensors weights: {other})"
        what = " ".join(files)
        return f"download {them} again: `hf download {repo} {what} --revision {commit} --force-download`"
    return "copy it again from the base model" if len(files) == 1 else "copy them from the base model"


def weights_problem(path: Path) -> str:
    """What keeps transformers from loading the weights of directory `path` ('' when nothing), naming
    the file and the way out (way_out): no weight set (weight_set), a shard index that does not read or
    names shards that are not there, a weight file cut short (FILE_CHECKS)."""
    files = weight_set(path)
    if not files:
        index = next((index for _, index in FORMATS if (path / index).is_file()), None)
        if index is not None:
            return f"{path / index} is not a shard index (JSON with a weight_map): {way_out(path, [index])}"
        return (
            f"no weights in {path} (model.safetensors, model.safetensors.index.json with its shards, or "
            f"pytorch_model.bin): {way_out(path)}"
        )
    missing = [f for f in files if not (path / f).is_file()]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return (
            f"{path} lacks {len(missing)} of the {len(files)} shards its index names ({missing[0]}{more}): "
            f"{way_out(path, missing)}"
        )
    for f in files:
        check, kind = FILE_CHECKS.get(Path(f).suffix, (None, ""))
        reason = check(path / f) if check else ""  # another format's shard: left to transformers
        if reason:
            return f"{path / f} is not a whole {kind} ({reason}): {way_out(path, [f])}"
    return ""
