"""Everything needed to continue a run exactly: weights, optimizer, version, data position, staleness
counters, the ledger, and the carried-over groups (finished but untrained, and unfinished requests).

States live in RUN_DIR/state/step-NNNNNN/, one per save: written under a temporary name, every file
and the directory synced, then renamed, so a directory with a step name is always complete and a crash
at any moment (kill -9, power loss) leaves the newest complete state to resume from. The newest
`keep` states are kept."""

from __future__ import annotations

import dataclasses
import json
import pickle
import random
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from streamrl.files import TEMP
from streamrl.loop.durable import could_not_write, recover, swap_in, temp_beside, write_failed
from streamrl.run_dirs import STATE_DIR, STATE_PREFIX, no_state_message


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
    drafts: list[Any] = field(default_factory=list)  # rollout/drafts.py DraftStore.state_dict()
    # async: the rollout workers' cumulative busy_s, idle_s and tokens (engine_* metrics), kept across resume
    engine: dict[str, float] = field(default_factory=dict)
    # loop/shared.py RUN_COUNTERS (restarts, groups resent...) counted up to this state, kept across resume
    counters: dict[str, int] = field(default_factory=dict)
    # agent episodes returned after the last logged step (loop/episode_errors.py), logged after the resume
    episodes: dict[str, Any] = field(default_factory=dict)
    # the run's `time` and `train_elapsed` as of this state's step, which a resumed run continues, and
    # the async loop's trainer_waited and loop_elapsed seconds (trainer_wait_share), continued too
    clock: dict[str, float] = field(default_factory=dict)


# set by the job's save from what the loop ended with, the same for every save after it
_SET_BY_SAVE = ("clock", "replay")
_GROUPS = ("finished", "unfinished")  # GroupResult / GroupRequest: compared by group id


def same_save(a: RunState, b: RunState) -> bool:
    """Whether saving `b` would write what the save of `a` wrote: the same fields, the same groups carried
    over (by id). A stop saves as soon as the loop ends, then again once the workers stopped only if
    this says something changed meanwhile (groups that came back, requests admitted since)."""
    plain = [f.name for f in dataclasses.fields(RunState) if f.name not in _SET_BY_SAVE + _GROUPS]
    if any(getattr(a, k) != getattr(b, k) for k in plain):
        return False
    return all([g.group_id for g in getattr(a, k)] == [g.group_id for g in getattr(b, k)] for k in _GROUPS)


def sampler_state(stream: Any, at_mark: bool = False) -> dict[str, Any]:
    """The training stream's position (data/samplers.py), as of its last `mark_stream` if `at_mark`, or
    {} for a plain iterator."""
    if not hasattr(stream, "state_dict"):
        return {}
    return stream.state_at_mark() if at_mark else stream.state_dict()


def mark_stream(stream: Any) -> None:
    """Remember where the training stream stands (a sampler copies its state only when asked for it)."""
    if hasattr(stream, "mark"):
        stream.mark()


def state_dirs(run_dir: Path) -> list[Path]:
    """The complete states of a run, oldest first."""
    root = run_dir / STATE_DIR
    if not root.is_dir():
        return []
    found = [d for d in root.iterdir() if d.is_dir() and d.name.startswith(STATE_PREFIX)]
    return sorted(found, key=lambda d: int(d.name[len(STATE_PREFIX) :]))


def latest_state(run_dir: Path) -> Path | None:
    dirs = state_dirs(run_dir)
    return dirs[-1] if dirs else None


def carried_mismatch(state: RunState) -> str | None:
    """What a state gets wrong about its carried-over groups, in one line, or None: the ids its ledger
    carries over must be exactly those of its finished and unfinished groups, each held once: the ones a
    resume takes up again (a carried-over id in neither list is never generated again, and `lost` stays
    0; one held twice would be taken up twice)."""
    marked = {g for g, s in state.ledger.get("state", {}).items() if s == "carried_over"}
    ids = [r.group_id for r in [*state.finished, *state.unfinished]]
    held = set(ids)
    missing, unmarked = sorted(marked - held), sorted(held - marked)
    twice = sorted({g for g in ids if ids.count(g) > 1})
    said = []
    if missing:
        said.append(
            f"carries over {_ids(missing)} neither finished nor unfinished: a resume never makes them"
        )
    if unmarked:
        said.append(f"holds {_ids(unmarked)}, which its ledger does not carry over")
    if twice:
        said.append(f"holds {_ids(twice)} twice")
    return f"the state of step {state.step} {'; it '.join(said)}" if said else None


def reconcile_carried(state: RunState) -> str | None:
    """Make a state about to be resumed add up (carried_mismatch), and say how in one line, or None if it
    did: a group its ledger carries over and it does not hold is counted lost (no resume can make it;
    `lost` says so from now on, and no later save warns again); a group it holds that its ledger
    trained or filtered is not taken up again; any other it holds is carried over, once (a finished
    copy before an unfinished one)."""
    said = carried_mismatch(state)
    if said is None or not state.ledger:
        return None
    ledger = state.ledger["state"]
    held = {r.group_id for r in [*state.finished, *state.unfinished]}
    lost = sorted(g for g, s in ledger.items() if s == "carried_over" and g not in held)
    done = {g for g in held if ledger.get(g) in ("trained", "filtered")}
    for g in lost:
        ledger[g] = "lost"
    for g in held - done:
        ledger[g] = "carried_over"
    seen = set(done)
    state.finished, state.unfinished = _once(state.finished, seen), _once(state.unfinished, seen)
    how = [f"{_ids(lost)} counted lost"] if lost else []
    how += [f"{_ids(sorted(done))} already trained or filtered, not taken up again"] if done else []
    return f"{said}. Resumed with {' and '.join(how) or 'each group it holds carried over once'}"


def _once(groups: list[Any], seen: set[str]) -> list[Any]:
    """`groups` without those whose id is in `seen`, which then holds theirs too."""
    kept = []
    for r in groups:
        if r.group_id not in seen:
            seen.add(r.group_id)
            kept.append(r)
    return kept


def _ids(ids: list[str], shown: int = 5) -> str:
    """How many groups, with the first `shown` ids and then how many more."""
    more = f", {len(ids) - shown} more" if len(ids) > shown else ""
    return f"{len(ids)} group(s) ({', '.join(ids[:shown])}{more})"


class StateSaveError(RuntimeError):
    """The run state could not be written (a full disk, most often); the newest complete state is kept."""


def save_state(
    run_dir: Path,
    state: RunState,
    trainer: Any,
    tokenizer: Any,
    engine_rng: torch.Tensor | None = None,
    keep: int = 2,
) -> Path:
    """Write state/step-<state.step>/ atomically and keep the newest `keep` states.

    engine_rng: the sampling generator's state of the engine in this process (colocated mode samples
    with it), so a resumed run draws the same tokens an uninterrupted one would. A write that fails
    removes its partial directory and raises StateSaveError naming the disk's free space and the
    state a resume would start from; any other error is raised as it is, its partial directory removed
    too. A state whose carried-over groups do not add up (carried_mismatch) is saved with a warning."""
    if (said := carried_mismatch(state)) is not None:  # saved even so: it is the newest state there is
        print(f"streamrl: warning: {said}", file=sys.stderr, flush=True)
    root = run_dir / STATE_DIR
    final = root / f"{STATE_PREFIX}{state.step:06d}"
    tmp: Path | None = None
    try:
        tmp = temp_beside(final)
        _write(tmp, state, trainer, tokenizer, engine_rng)
        swap_in(tmp, final)  # the same step may be saved again (by a resume that trains no further)
    except Exception as e:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if write_failed(e):
            raise StateSaveError(_failure(run_dir, final, keep, e)) from e
        raise
    for d in state_dirs(run_dir)[: -max(1, keep)]:
        shutil.rmtree(d, ignore_errors=True)
    for leftover in root.glob(f"{TEMP}*"):  # a save interrupted by a crash
        shutil.rmtree(leftover, ignore_errors=True)
    return final


def _failure(run_dir: Path, final: Path, keep: int, e: BaseException) -> str:
    """One line: what failed, the free space, and what a resume starts from."""
    newest = latest_state(run_dir)
    kept = f"the newest complete state, {newest.name}, is kept" if newest else "no earlier state was saved"
    return (
        f"{could_not_write('the run state', final, e)} "
        f"{kept}: free disk space (each state holds the weights and the optimizer; train.keep_states="
        f"{keep} are kept) and resume"
    )


def _write(tmp: Path, state: RunState, trainer: Any, tokenizer: Any, engine_rng: torch.Tensor | None) -> None:
    trainer.save(str(tmp / "model"), tokenizer)
    torch.save(
        {
            "optimizer": trainer.optimizer_state(),  # fsdp2: gathered whole from the ranks' shards
            "scheduler": trainer.scheduler.state_dict(),
            "torch_rng": torch.get_rng_state(),
            "py_rng": random.getstate(),
            **({"engine_rng": engine_rng} if engine_rng is not None else {}),
        },
        tmp / "trainer.pt",
    )
    carried = ("unfinished", "finished", "replay", "drafts")
    meta = {k: v for k, v in state.__dict__.items() if k not in carried}
    (tmp / "run_state.json").write_text(json.dumps(meta, indent=1))
    with (tmp / "carried.pkl").open("wb") as f:
        pickle.dump({k: getattr(state, k) for k in carried}, f)


def load_state(run_dir: Path) -> tuple[RunState, Path, dict[str, Any]]:
    """The newest complete state -> (state, model dir, trainer tensors)."""
    if (run_dir / STATE_DIR).is_dir():
        recover(run_dir / STATE_DIR)  # a save whose swap a crash cut short
    d = latest_state(run_dir)
    if d is None:
        raise FileNotFoundError(no_state_message(run_dir))
    meta = json.loads((d / "run_state.json").read_text())
    with (d / "carried.pkl").open("rb") as f:
        carried = pickle.load(f)
    state = RunState(
        **meta,
        unfinished=carried["unfinished"],
        finished=carried["finished"],
        replay=carried.get("replay", []),
        drafts=carried.get("drafts", []),
    )
    return state, d / "model", torch.load(d / "trainer.pt", weights_only=False)
