"""The code runner of env:python_tool: the model's program runs in the code sandbox.

The env's executor contract is `run_code(code) -> (output, status)`: output is stdout followed by
stderr, status "ok" | "error" | "timeout" | "memory" | "output_limit" | "killed". The default runs the
code tasks' sandbox (reward.sandbox_executor: `streamrl.rewards.sandbox`'s, with namespaces, a read-only
filesystem, no network and rlimits, checked against reward.sandbox_min_isolation, or the Executor your
factory returns; see docs/sandbox.md) with the env's wall-clock limit; pass any callable with that
contract instead.
"""

from __future__ import annotations

from collections.abc import Callable

from streamrl.rewards.sandbox import Limits, make_executor

RunCode = Callable[[str], "tuple[str, str]"]


class SandboxRunner:
    """run_code(code) -> (output, status) in the sandbox `executor` names (as reward.sandbox_executor:
    "local", a registered name or a factory's module:function), the built-in one checked against
    `min_isolation`."""

    def __init__(
        self,
        timeout: float = 5.0,
        executor: str = "local",
        memory_mb: int = 1024,
        min_isolation: str = "auto",
    ) -> None:
        if timeout <= 0:
            raise ValueError(f"SandboxRunner timeout must be > 0 seconds, got {timeout}")
        self.timeout = timeout
        self.executor = make_executor(executor, min_isolation)
        self.limits = Limits(cpu_s=timeout, wall_s=timeout, memory_mb=memory_mb, output_bytes=65536)

    def __call__(self, code: str) -> tuple[str, str]:
        res = self.executor.run(code, "", self.limits)
        status = "error" if res.status == "ok" and res.exit_code else res.status
        text = res.stdout + res.stderr
        if res.status == "timeout":
            text += f"\nTimeoutError: the program ran longer than {self.timeout:g} s and was stopped"
        return text, status
