"""Directories written durably (run states, checkpoints): written under a temporary name beside their
place, synced, then swapped in whole; and a failed write (a full disk, most often) told apart from a bug
in what was being written, in one line."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from streamrl.files import MOVED_ASIDE, TEMP, sync_dir, temp_path

# how the writers of states and checkpoints report a failed write that is not an OSError: torch.save's
# zip writer (RuntimeError) and safetensors under save_pretrained (SafetensorError, an Exception)
_WRITE_FAILURES = ("inline_container", "PytorchStreamWriter", "file write failed", "IoError", "No space left")


def temp_beside(final: Path) -> Path:
    """A fresh, empty temporary directory next to `final`, named for it and this process; leftovers of
    other processes (a writer killed mid-write) are removed, a swap cut short is finished."""
    final.parent.mkdir(parents=True, exist_ok=True)
    recover(final.parent)
    for leftover in final.parent.glob(f"{TEMP}{final.name}-*"):
        shutil.rmtree(leftover, ignore_errors=True)
    tmp = temp_path(final)
    tmp.mkdir()
    return tmp


def swap_in(tmp: Path, final: Path) -> None:
    """Sync the complete directory `tmp` and put it at `final`: a directory with the final name is
    always whole, the one it replaces (if any) moved aside first and removed after."""
    sync_tree(tmp)
    if final.exists():
        old = final.parent / f"{MOVED_ASIDE}{final.name}-{os.getpid()}"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        try:
            tmp.rename(final)
        except OSError:
            old.rename(final)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    sync_dir(final.parent)


def recover(parent: Path) -> None:
    """Finish swaps a crash cut short in `parent`: a directory moved aside whose replacement never
    arrived goes back to its name; one that was replaced is removed."""
    for old in parent.glob(f"{MOVED_ASIDE}*"):
        name = old.name[len(MOVED_ASIDE) :].rsplit("-", 1)[0]
        if (parent / name).exists():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.rename(parent / name)


def sync_tree(path: Path) -> None:
    """fsync every file below `path`, then the directories (names are durable only then)."""
    for f in sorted(path.rglob("*")):
        if f.is_file():
            with f.open("rb") as fh:
                os.fsync(fh.fileno())
    for d in [path, *sorted(p for p in path.rglob("*") if p.is_dir())]:
        sync_dir(d)


def write_failed(e: BaseException) -> bool:
    """Whether `e` says a file could not be written (rather than a bug in what was being saved)."""
    return isinstance(e, OSError) or any(marker in str(e) for marker in _WRITE_FAILURES)


def could_not_write(what: str, path: Path, e: BaseException) -> str:
    """'could not write WHAT PATH (the error's last line); N MB free on that disk.'"""
    free_mb = shutil.disk_usage(_existing(path)).free / 2**20
    reason = (str(e).strip().splitlines() or [type(e).__name__])[-1]
    return f"could not write {what} {path} ({reason}); {free_mb:.0f} MB free on that disk."


def _existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path
