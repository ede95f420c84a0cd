"""The local sandbox's isolation levels: which ones this machine offers, the probe that picks the
strongest that works, and the minimum level a LocalSandbox accepts before it runs any model code.

Minimum (`reward.sandbox_min_isolation`, `LocalSandbox(min_isolation=...)`):
- "auto" (default): namespaces when this machine can create them, found by a cheap `unshare` check of
  its own (so a probe that fails for another reason, e.g. a broken read-only root, is not taken for
  "no namespaces here"); otherwise "rlimits" is accepted.
- "namespaces": "ns-root" or "ns-user".
- "rlimits": any level.
Below the minimum, LocalSandbox raises SandboxIsolationError with one line: the level required, the
level reached and why each stronger level failed, and how to lower the requirement.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import threading
from collections.abc import Callable
from dataclasses import dataclass

from streamrl.brief import brief

MIN_ISOLATION = ("auto", "namespaces", "rlimits")
_NS = ("--pid", "--fork", "--net", "--mount")


class SandboxIsolationError(ValueError):
    """The sandbox's isolation level is below the required minimum; it refuses to run model code."""


@dataclass(frozen=True)
class Isolation:
    name: str
    prefix: tuple[str, ...]  # argv before the interpreter (an unshare command) or empty
    fs: str  # "ro" | "none"
    drop: str  # "uid" | "caps" | "none"
    audit_hook: bool  # refuse sockets, new programs and ctypes in the interpreter (no namespaces)


@dataclass(frozen=True)
class Probe:
    level: Isolation  # the strongest level that worked
    failed: tuple[tuple[str, str], ...]  # (level, why) for each stronger level that did not


def _unshare() -> str | None:
    return shutil.which("unshare", path="/usr/bin:/bin:/usr/sbin:/sbin")


def candidates() -> list[Isolation]:
    """The levels to try here, strongest first; "rlimits" always works and comes last."""
    unshare = _unshare()
    ns = (*_NS, "--mount-proc", "--kill-child")
    root = os.geteuid() == 0
    out = []
    if unshare and root:
        out.append(Isolation("ns-root", (unshare, *ns), "ro", "uid", False))
    if unshare:
        out.append(Isolation("ns-user", (unshare, "--user", "--map-root-user", *ns), "ro", "caps", False))
    out.append(Isolation("rlimits", (), "none", "uid" if root else "none", True))
    return out


@functools.cache
def namespaces_possible() -> bool:
    """Whether this process may create PID, network and mount namespaces (a user namespace first when
    not root): `unshare ... true`, independent of the sandbox's own probe."""
    unshare = _unshare()
    if unshare is None:
        return False
    user = () if os.geteuid() == 0 else ("--user", "--map-root-user")
    try:
        r = subprocess.run([unshare, *user, *_NS, "true"], capture_output=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


_probes: dict[str, Probe] = {}
_lock = threading.Lock()


def detect(python: str, try_level: Callable[[Isolation, str], str | None]) -> Probe:
    """The strongest level where `try_level(level, python)` returns None (it works), probed once per
    interpreter; try_level returns a one-line reason when the level does not work."""
    with _lock:
        if python not in _probes:
            failed: list[tuple[str, str]] = []
            for iso in candidates():
                why = None if iso.name == "rlimits" else try_level(iso, python)
                if why is None:
                    _probes[python] = Probe(iso, tuple(failed))
                    break
                failed.append((iso.name, brief(why)))
        return _probes[python]


def check_minimum(level: Isolation, minimum: str, failed: tuple[tuple[str, str], ...] | None) -> None:
    """Raise SandboxIsolationError when `level` is below `minimum`; failed=None: the level was forced."""
    if minimum not in MIN_ISOLATION:
        raise ValueError(f"sandbox min_isolation must be one of {', '.join(MIN_ISOLATION)}, got {minimum!r}")
    if level.name != "rlimits" or minimum == "rlimits":
        return
    if minimum == "auto" and not namespaces_possible():
        return
    why = "auto, and this machine can create namespaces" if minimum == "auto" else "namespaces"
    if failed is None:
        reached = f"LocalSandbox(isolation='{level.name}') forces '{level.name}'"
    else:
        reasons = "; ".join(f"{name} failed: {reason}" for name, reason in failed) or "no namespace level"
        reached = f"the probe reached only '{level.name}' ({reasons})"
    raise SandboxIsolationError(
        f"the code sandbox requires namespace isolation (reward.sandbox_min_isolation={why}) but {reached}; "
        "to run model code with rlimits only, set reward.sandbox_min_isolation=rlimits"
    )
