"""Everything needed to continue a run exactly: weights, optimizer, version, data position, staleness
counters, the ledger, and the carried-over groups (finished but untrained, and unfinished requests)."""

from __future__ import annotations

import json
import pickle
import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

STATE_DIR = "state"


@dataclass
class RunState:
    step: int = 0
    version: int = 0
    problems_drawn: int = 0  # position in the training stream
    groups_made: int = 0  # next group id
    staleness: dict[str, int] = field(default_factory=dict)
    ledger: dict[str, Any] = field(default_factory=dict)
    unfinished: list[Any] = field(default_factory=list)  # GroupRequest
    finished: list[Any] = field(default_factory=list)  # GroupResult, not yet trained
    sampler: dict[str, Any] = field(default_factory=dict)  # data/samplers.py state_dict (JSON)
    replay: list[Any] = field(default_factory=list)  # data/replay.py ReplayBuffer.state()


def save_state(
    run_dir: Path, state: RunState, trainer: Any, tokenizer: Any, engine_rng: torch.Tensor | None = None
) -> Path:
    """Write atomically: a crash while saving leaves the previous state intact.

    engine_rng: the sampling generator's state of the engine in this process (colocated mode samples
    with it), so a resumed run draws the same tokens an uninterrupted one would."""
    final = run_dir / STATE_DIR
    tmp = run_dir / f".{STATE_DIR}-tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    trainer.save(str(tmp / "model"), tokenizer)
    torch.save(
        {
            "optimizer": trainer.optimizer.state_dict(),
            "scheduler": trainer.scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "py_rng": random.getstate(),
            **({"engine_rng": engine_rng} if engine_rng is not None else {}),
        },
        tmp / "trainer.pt",
    )
    carried = ("unfinished", "finished", "replay")
    meta = {k: v for k, v in state.__dict__.items() if k not in carried}
    (tmp / "run_state.json").write_text(json.dumps(meta, indent=1))
    with (tmp / "carried.pkl").open("wb") as f:
        pickle.dump({k: getattr(state, k) for k in carried}, f)
    if final.exists():
        old = run_dir / f".{STATE_DIR}-old"
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        tmp.rename(final)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(final)
    return final


def load_state(run_dir: Path) -> tuple[RunState, Path, dict[str, Any]]:
    """-> (state, model dir, trainer tensors)."""
    d = run_dir / STATE_DIR
    if not (d / "run_state.json").is_file():
        raise FileNotFoundError(f"resume: no saved state in {d} (was the run stopped before its first step?)")
    meta = json.loads((d / "run_state.json").read_text())
    with (d / "carried.pkl").open("rb") as f:
        carried = pickle.load(f)
    state = RunState(
        **meta,
        unfinished=carried["unfinished"],
        finished=carried["finished"],
        replay=carried.get("replay", []),
    )
    return state, d / "model", torch.load(d / "trainer.pt", weights_only=False)
