"""transformers' progress bars ("Loading weights", "Writing model shards") off while streamrl loads and
saves models itself: the run has its own progress display, and errors stay one line on stderr."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def no_progress_bars() -> Iterator[None]:
    from transformers.utils import logging

    was = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if was:
            logging.enable_progress_bar()
