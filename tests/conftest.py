"""Shared fixtures: isolated model and datasets caches and Ray temp root, and the tiny random model."""

from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

torch.set_num_threads(1)

# helper modules whose asserts fail tests: their failures show the values compared, as a test's do
pytest.register_assert_rewrite("scripted_runs", "spec_harness")

# `datasets` reads its cache location when first imported: the Arrow caches the data tests write go to a
# directory of this test session (removed at its end), not the user's ~/.cache/huggingface/datasets.
_DATASETS_CACHE = None
if "HF_DATASETS_CACHE" not in os.environ:
    _DATASETS_CACHE = os.environ["HF_DATASETS_CACHE"] = tempfile.mkdtemp(prefix="streamrl-hf-datasets-")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under `pytest -n --dist loadgroup`, the tests that use a module-scoped fixture of their own module
    run on one worker, so that fixture (often whole training runs) is built once, not once per worker."""
    for item in items:
        if item.get_closest_marker("xdist_group") is not None:
            continue
        module = item.nodeid.split("::")[0]
        defs = item._fixtureinfo.name2fixturedefs.values()
        if any(d[-1].scope == "module" and d[-1].baseid == module for d in defs):
            item.add_marker(pytest.mark.xdist_group(module))


@pytest.fixture(scope="session", autouse=True)
def _isolated_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    # Real SmolLM2 conversions are reused from the user cache; everything else is per test session.
    if "STREAMRL_CACHE" not in os.environ:
        os.environ["STREAMRL_CACHE"] = str(tmp_path_factory.mktemp("streamrl-cache"))


@pytest.fixture(scope="session", autouse=True)
def _remove_datasets_cache() -> Iterator[None]:
    yield
    if _DATASETS_CACHE is not None:
        shutil.rmtree(_DATASETS_CACHE, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _isolated_ray_root() -> Iterator[str]:
    """A fresh RAY_TMPDIR for the Ray instances of this test session (the tests' own and those
    streamrl.placement.ray_rollouts.ensure_ray starts): nothing is shared with another test run or a
    user's Ray. Directly under /tmp with a short name, not under pytest's tmp_path: Ray's unix-socket
    paths inside it must stay under ~107 bytes. -> the Ray temp dir (ray_temp_dir())."""
    old = os.environ.get("RAY_TMPDIR")
    root = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    os.environ["RAY_TMPDIR"] = root
    yield os.path.join(root, "ray")
    if old is None:
        os.environ.pop("RAY_TMPDIR", None)
    else:
        os.environ["RAY_TMPDIR"] = old
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session")
def tiny():
    """(model, tokenizer) of tiny-random, seed 0."""
    from streamrl.models import load_model, load_tokenizer, resolve_model_dir

    d = resolve_model_dir("tiny-random", seed=0)
    return load_model(d), load_tokenizer(d)


@pytest.fixture
def offline_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, Path]:
    """HF offline mode with empty caches under tmp_path -> (hub cache, datasets cache). The env is for
    child processes (rollout workers); `datasets` and `huggingface_hub` read it when first imported, so
    this process gets the same values patched into their config modules."""
    import datasets
    import huggingface_hub.constants as hub_constants

    hub, cache = tmp_path / "hf" / "hub", tmp_path / "hf" / "datasets"
    env = {"HF_HOME": tmp_path / "hf", "HF_HUB_CACHE": hub, "HF_DATASETS_CACHE": cache}
    for key, value in {**env, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}.items():
        monkeypatch.setenv(key, str(value))
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", cache)
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub_constants, "HF_HUB_CACHE", str(hub))
    return hub, cache


@pytest.fixture
def not_installed(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], None]:
    """not_installed(name): importlib.util.find_spec finds no module `name` from then on, as where that
    optional package is not installed; every other module is found as before."""
    import importlib.util

    real, hidden = importlib.util.find_spec, set()

    def find_spec(name: str, *args: Any, **kwargs: Any) -> Any:
        return None if name in hidden else real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return hidden.add


@pytest.fixture
def weight_loads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The weights a run would load, counted: streamrl.models.startup.load_model records a 1 per call
    and loads nothing. A test of what is refused before the weights load asserts it stays []."""
    import streamrl.models.startup as startup

    loads: list[int] = []
    monkeypatch.setattr(startup, "load_model", lambda *a, **k: loads.append(1))
    return loads


@pytest.fixture
def sandbox_root() -> Iterator[str]:
    """A directory of the test's own for sandbox workdirs, reachable by a dropped uid
    (tests/sandbox_procs.py finds the processes of the sandboxes under it). A sandbox process a failed
    test leaves running is killed at the end, then the directory is removed."""
    from sandbox_procs import sandboxed

    root = tempfile.mkdtemp(prefix="sbx-test-")
    os.chmod(root, 0o755)
    yield root
    for pid in sandboxed(root):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def lms():
    """(the current policy, other weights the drafts come from) of the speculative-rollout tests
    (tests/spec_harness.py), their heads checked once here (the check's own forward would otherwise
    show up in the tests that count forwards)."""
    from spec_harness import small_lm

    from streamrl.models.head import check_head

    models = small_lm(0), small_lm(1)
    for m in models:
        check_head(m, "cpu", "rollout.spec_drafts > 0", "speculative rollouts", "set rollout.spec_drafts=0")
    return models


@pytest.fixture
def user_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Your reward functions' file of tests/user_rewards.py, as my_rewards.py in the working directory."""
    from user_rewards import USER_FILE

    (tmp_path / "my_rewards.py").write_text(USER_FILE)
    monkeypatch.chdir(tmp_path)
    yield tmp_path / "my_rewards.py"
    sys.modules.pop("my_rewards", None)  # another test's my_rewards.py is another module
