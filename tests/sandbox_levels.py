"""Which sandbox isolation levels can run on this machine, found without the sandbox's own probe."""

from __future__ import annotations

import os
import subprocess

LEVELS = ("ns-root", "ns-user", "rlimits")
_NS = ["unshare", "--pid", "--fork", "--net", "--mount"]


def _succeeds(argv: list[str]) -> bool:
    try:
        return subprocess.run(argv, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def level_works(level: str) -> bool:
    """ns-root needs root and unshare; ns-user needs unprivileged user namespaces (unshare --user
    --map-root-user); rlimits always works."""
    if level == "ns-root":
        return os.geteuid() == 0 and _succeeds([*_NS, "true"])
    if level == "ns-user":
        return _succeeds([_NS[0], "--user", "--map-root-user", *_NS[1:], "true"])
    return True
