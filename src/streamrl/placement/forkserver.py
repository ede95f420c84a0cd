"""How rollout workers start: forked from a server that has already imported torch, transformers and the
engine, so a worker, and every restart of one, skips the seconds those imports take.

A spawned worker begins as a fresh interpreter and imports torch and transformers' model code before it
can load weights: about 9 s on a 2-core CPU, paid at every start and every restart while the trainer
waits for it (`wait_ready`). multiprocessing's forkserver start method pays it once: the server, itself
a fresh interpreter (never a fork of the trainer, whose threads and torch state must not be copied),
imports `PRELOAD` and then forks each worker from that state. `streamrl train` starts the server as
soon as its config is valid (`start_server_for`), and a job started from Python before it loads its
model, so the imports run on another core while the model and the task are checked and loaded.

A forked worker still unpickles its arguments, imports its target's module and takes sys.path and the
working directory as a spawned one does. Its environment is the subtle part: the server keeps the one
it was started with, and the libraries it preloaded read some variables at import (huggingface_hub's
HF_HOME and HF_HUB_OFFLINE, for instance). So the server is restarted when one of those libraries'
variables (`IMPORT_TIME_ENV`: by prefix) differs from what it started with (a later job in the same
Python process, e.g. a notebook that changed HF_HOME), and each worker takes its parent's whole
environment at its own start (`apply_environment`). Other variables (a test runner's per-test ones,
say) never cost a restart.

Where the platform has no fork server (Windows, macOS without it) workers are spawned."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
from multiprocessing import forkserver
from typing import Any

# what a worker imports before its first token: the engine (torch, transformers' model code) and the
# worker loop; importing them only loads code, it starts no thread and touches no device
PRELOAD = ("streamrl.engine.hf", "streamrl.rollout.worker")

# the variables torch, transformers, huggingface_hub and tokenizers (and this package) may read when
# imported, by prefix: a change in any of them restarts the server
IMPORT_TIME_ENV = (
    "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "SAFETENSORS_", "USE_", "XDG_",
    "TORCH", "PYTORCH_", "CUDA", "NCCL_", "OMP_", "MKL_", "KMP_", "STREAMRL_",
)  # fmt: skip
# set by torch itself when torch._dynamo is imported (its default compile cache, read again at each use):
# a job that imports it after starting the server must not restart the server for it
SET_BY_TORCH = ("TORCHINDUCTOR_CACHE_DIR",)
_server_env: dict[str, str] | None = None  # IMPORT_TIME_ENV's variables when the server started


def _import_time_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k.startswith(IMPORT_TIME_ENV) and k not in SET_BY_TORCH}


def worker_context() -> Any:
    """The multiprocessing context rollout workers (and their queues, locks and shared arrays) use; the
    fork server runs, on this process's current environment, when it returns. A job calls it at its
    start and again when its workers' backend is built; the second call, on the same environment, only
    returns the context. A restart (the environment changed) orphans running workers' exit codes, so a
    job's variables must not change once its workers run."""
    global _server_env
    if "forkserver" not in mp.get_all_start_methods():
        return mp.get_context("spawn")
    env = _import_time_env()
    if _server_env is not None and env != _server_env:
        if not stop_server():  # what it imported read the old environment: a new server imports it again
            return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(list(PRELOAD))  # read when the server starts
    forkserver.ensure_running()  # returns at once; the server imports PRELOAD meanwhile
    _server_env = env
    return ctx


def stop_server() -> bool:
    """Stop the fork server now, even in the middle of its imports (a plain stop waits for them, and
    until then the server holds the stdout and stderr it inherited); -> False if this Python cannot."""
    server = forkserver._forkserver
    stop = getattr(server, "_stop", None)  # CPython's own (its tests use it)
    if stop is None:
        return False
    if (pid := getattr(server, "_forkserver_pid", None)) is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    stop()
    return True


def start_server_for(cfg: Any) -> None:
    """Start the fork server now if the job `cfg` runs local rollout workers: its imports then run on
    another core while this process checks the config, the model and the task and loads its own model."""
    if cfg.runtime.mode == "async" and cfg.runtime.backend == "local":
        worker_context()


def apply_environment(env: dict[str, str]) -> None:
    """In a worker: the parent's environment at the worker's start (`dict(os.environ)` there)."""
    os.environ.clear()
    os.environ.update(env)
