"""What the benchmarks keep of a finished training run: everything but its resume state."""

from __future__ import annotations

import shutil
from pathlib import Path


def drop_resume_state(run_dir: Path) -> None:
    """Remove a finished run's resume state (state/): gigabytes of weights and optimizer moments a
    benchmark never reads (3 GB a run of the 135M model)."""
    from streamrl.loop.state import STATE_DIR

    shutil.rmtree(Path(run_dir) / STATE_DIR, ignore_errors=True)
