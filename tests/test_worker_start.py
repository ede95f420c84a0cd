"""Rollout workers start forked from a server that has imported the engine (placement/forkserver.py),
each with the environment its parent had when it started it."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest
import torch
from scripted_worker import reporting_worker  # tests/ is on sys.path (rootdir conftest)

from streamrl.config import load_config
from streamrl.placement.backend import LocalRollouts
from streamrl.placement.forkserver import PRELOAD, stop_server

pytestmark = pytest.mark.skipif(
    "forkserver" not in mp.get_all_start_methods(), reason="this platform spawns workers"
)
CFG = ["model=tiny-random", "runtime.rollout_workers=1", "runtime.elastic_cores=fixed"]


def _report(backend: LocalRollouts) -> tuple:
    backend.start({"w": torch.zeros(2)}, 0)
    try:
        return backend.workers[0].results.get(timeout=120)
    finally:
        backend.stop()


def test_workers_start_from_the_preloaded_server(monkeypatch: pytest.MonkeyPatch) -> None:
    backend = LocalRollouts(load_config(None, CFG), reporting_worker)
    assert backend.ctx.get_start_method() == "forkserver"
    assert "streamrl.engine.hf" in PRELOAD
    assert _report(backend)[2] is True  # the engine was imported before the worker's own code ran


def test_a_worker_has_its_parents_environment_even_what_a_library_read_at_import(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("STREAMRL_TEST_MARK", "first")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "a"))
    assert _report(LocalRollouts(load_config(None, CFG), reporting_worker))[:2] == (
        "first",
        str(tmp_path / "a"),
    )
    # a later job in this process with another HF_HOME: the server, whose huggingface_hub read the old
    # one at import, is started again
    monkeypatch.setenv("HF_HOME", str(tmp_path / "b"))
    backend = LocalRollouts(load_config(None, CFG), reporting_worker)
    # changed after the job began: the worker still starts with its parent's environment of that moment
    monkeypatch.setenv("STREAMRL_TEST_MARK", "second")
    assert _report(backend)[:2] == ("second", str(tmp_path / "b"))


class _Loaded(Exception):
    """Raised where the job would load its model: the test has seen what it needed."""


@pytest.mark.parametrize("mode", ["colocated", "async"])
def test_an_async_job_starts_the_fork_server_before_it_loads_its_model(
    mode: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from multiprocessing import forkserver

    from tiny_args import TINY

    from streamrl.loop import job

    stop_server()  # whatever an earlier test started
    running_at_load = []

    def build_components(*args: object, **kw: object) -> None:
        running_at_load.append(forkserver._forkserver._forkserver_pid is not None)
        raise _Loaded

    monkeypatch.setattr(job, "build_components", build_components)
    eta = 0 if mode == "colocated" else 1
    cfg = load_config(
        None, [*TINY, f"runtime.mode={mode}", f"max_staleness={eta}", f"run_dir={tmp_path}/run"]
    )
    with pytest.raises(_Loaded):
        job.run_train(cfg)
    assert running_at_load == [mode == "async"]  # colocated starts no worker


def test_the_cli_starts_the_server_before_it_checks_the_model_and_keeps_it_through_the_job(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's imports (~7 s on one core) run while the CLI checks the model and the task; what
    torch sets in the environment when the job imports it later does not start it again."""
    from multiprocessing import forkserver

    from tiny_args import TINY

    import streamrl.preflight
    from streamrl.cli import main
    from streamrl.placement.forkserver import SET_BY_TORCH, worker_context

    stop_server()  # whatever an earlier test started
    for name in SET_BY_TORCH:
        monkeypatch.delenv(name, raising=False)
    at_preflight = []

    def preflight(cfg: object) -> None:
        at_preflight.append(forkserver._forkserver._forkserver_pid)
        raise _Loaded

    monkeypatch.setattr(streamrl.preflight, "preflight", preflight)
    with pytest.raises(_Loaded):
        main(["train", *TINY, f"run_dir={tmp_path}/run"])
    assert at_preflight[0] is not None
    assert not (tmp_path / "run").exists()  # nothing written before the checks
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))  # as importing torch._dynamo
    worker_context()  # the job's own call, after its imports
    assert forkserver._forkserver._forkserver_pid == at_preflight[0]
