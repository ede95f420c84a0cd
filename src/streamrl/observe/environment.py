"""What the run ran on: versions, cores and threads, model. Written once as environment.json."""

from __future__ import annotations

import os
import platform
import sys
from importlib import metadata
from typing import Any

PACKAGES = ("torch", "transformers", "streamrl", "vllm", "ray")


def _version(pkg: str) -> str | None:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return None


def collect_environment(
    model: str, train_threads: int | str, rollout_threads: int | str, rollout_workers: int | str
) -> dict[str, Any]:
    """A flat dict of strings/numbers for the report's environment table."""
    env: dict[str, Any] = {
        "python": sys.version.split()[0],
        "platform": platform.platform(terse=True),
        "cpu_count": os.cpu_count(),
        "trainer_threads": train_threads,
        "rollout_workers": rollout_workers,
        "rollout_threads_per_worker": rollout_threads,
        "model": model,
    }
    for pkg in PACKAGES:
        v = _version(pkg)
        if v is not None:
            env[pkg] = v
    try:
        import torch

        env["cuda"] = torch.cuda.is_available()
    except ImportError:  # the report CLI may run where torch is absent
        pass
    return env
