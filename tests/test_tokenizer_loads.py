"""A training run loads its tokenizer once: the one preflight checked the prompts and the chat
template with is the one the trainer and the engine use."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tiny_args import TINY  # tests/ is on sys.path (rootdir conftest)

import streamrl.models as models
import streamrl.models.resolve as resolve
import streamrl.models.startup as startup
import streamrl.preflight as preflight
from streamrl.config import load_config


def test_a_training_run_loads_its_tokenizer_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from streamrl.loop.job import run_train

    original = resolve.load_tokenizer
    loads: list[Any] = []

    def counting(*args: Any, **kw: Any) -> Any:
        loads.append(args[0])
        return original(*args, **kw)

    for module in (resolve, models, startup, preflight):  # every name it is called by
        monkeypatch.setattr(module, "load_tokenizer", counting)
    run = tmp_path / "run"
    cfg = load_config(
        None, [*TINY, "runtime.mode=colocated", "max_staleness=0", "max_steps=1", f"run_dir={run}"]
    )
    summary = run_train(cfg)
    assert summary["steps"] == 1
    assert len(loads) == 1
