"""The default code runner of env:python_tool: a local subprocess with a timeout.

Not a security boundary (the code sandbox, `streamrl.rewards.sandbox`, will replace it): it only keeps
a model's program from hanging or flooding a rollout. `python -I` in an empty temporary directory with
an empty environment, address space and written file size capped, the whole process group killed
on timeout. The executor contract is `run_code(code) -> (output, status)`, status "ok" | "error" |
"timeout"; output is stdout followed by stderr.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable

RunCode = Callable[[str], "tuple[str, str]"]

# Runs in the child before the program: limits are set there, not with preexec_fn (unsafe in a
# process with threads, as rollout workers are).
_BOOT = """import resource, sys
for _r, _v in ((resource.RLIMIT_AS, {mem}), (resource.RLIMIT_FSIZE, {fsize})):
    resource.setrlimit(_r, (_v, _v))
del resource, _r, _v
sys.argv = ["main.py"]
exec(compile(open("main.py").read(), "main.py", "exec"), {{"__name__": "__main__"}})
"""


class LocalRunner:
    """run_code(code) -> (output, status); output capped at max_output bytes per stream."""

    def __init__(self, timeout: float = 5.0, memory_mb: int = 1024, max_output: int = 65536) -> None:
        if timeout <= 0:
            raise ValueError(f"LocalRunner timeout must be > 0 seconds, got {timeout}")
        self.timeout = timeout
        self.max_output = max_output
        self.boot = _BOOT.format(mem=memory_mb * 2**20, fsize=4 * max_output)

    def __call__(self, code: str) -> tuple[str, str]:
        with tempfile.TemporaryDirectory(prefix="streamrl-py-") as tmp:
            cwd = os.path.join(tmp, "work")  # the program sees only its own file, not the output files
            os.mkdir(cwd)
            with open(os.path.join(cwd, "main.py"), "w") as f:
                f.write(code)
            out_path, err_path = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
            # output goes to files (not pipes) so a print loop cannot fill our memory before the timeout
            with open(out_path, "wb") as out, open(err_path, "wb") as err:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-c", self.boot],
                    cwd=cwd,
                    env={},
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=err,
                    start_new_session=True,  # its own process group: the kill reaches its children
                )
                try:
                    code_rc = proc.wait(timeout=self.timeout)
                    status = "ok" if code_rc == 0 else "error"
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
                    status = "timeout"
            text = self._read(out_path) + self._read(err_path)
        if status == "timeout":
            text += f"\nTimeoutError: the program ran longer than {self.timeout:g} s and was stopped"
        return text, status

    def _read(self, path: str) -> str:
        with open(path, "rb") as f:
            return f.read(self.max_output).decode("utf-8", errors="replace")
