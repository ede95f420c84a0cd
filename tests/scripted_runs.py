"""AsyncRunners over scripted rollout workers (tests/scripted_worker.py: no model) on rg:chain_sum, and
the ledger's balance once one has run: nothing lost, nothing trained twice (tests/ is on sys.path)."""

from __future__ import annotations

import copy
import itertools

from scripted_worker import scripted_worker

from streamrl.config import load_config
from streamrl.loop.asynchronous import AsyncRunner
from streamrl.loop.signals import StopFlag
from streamrl.loop.state import RunState
from streamrl.trainer.trainer import Trainer

BASE = [
    "max_steps=6",
    "max_staleness=1",
    "rollout.prompts_per_step=3",
    "rollout.samples_per_prompt=2",
    "runtime.rollout_workers=2",
    "rollout.dynamic_sampling=false",
]


def _runner(tiny, extra: list[str], state: RunState | None = None) -> tuple[AsyncRunner, RunState]:
    from streamrl.data.task import default_task_args
    from streamrl.tasks import make_task

    cfg = load_config(None, [*BASE, *extra])
    trainer = Trainer.from_config(copy.deepcopy(tiny[0]), cfg, pad_id=0)
    task = make_task("rg:chain_sum", default_task_args("rg:chain_sum"), "", "", "answer_is")
    state = state or RunState()
    stream = itertools.islice(task.train_stream(0, set()), None)
    return AsyncRunner(cfg, trainer, tiny[1], stream, state, StopFlag(), scripted_worker), state


def _balanced(runner: AsyncRunner, state: RunState, records: list) -> dict:
    c = runner.ledger.counts()
    trained = [g.trajectories[0].group_id for r in records for g in r.groups]
    assert len(trained) == len(set(trained)) == c["trained"]
    assert c["lost"] == 0
    assert c["admitted"] == c["trained"] + c["filtered"] + c["carried_over"] == state.groups_made
    # what the ledger calls carried over is what the saved state holds, each once
    carried = sorted(g for g, s in runner.ledger.state.items() if s == "carried_over")
    assert carried == sorted(r.group_id for r in [*state.finished, *state.unfinished])
    return c
