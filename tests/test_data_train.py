"""Samplers and replay inside the real loops: feedback arrives, accounting stays exact, state resumes."""

import copy
import json
import pickle

from scripted_worker import scripted_worker  # tests/ is on sys.path (rootdir conftest)
from tiny_args import TINY
from trajectories import make_traj

from streamrl.cli import main
from streamrl.config import load_config
from streamrl.data.replay import ReplayBuffer, Replayed
from streamrl.data.samplers import MoPPSSampler
from streamrl.loop.asynchronous import AsyncRunner
from streamrl.loop.signals import StopFlag
from streamrl.loop.state import RunState, latest_state, state_dirs


def test_async_runner_feeds_the_sampler_and_replays_distinct_samples(tiny):
    from streamrl.data.task import default_task_args
    from streamrl.tasks import make_task
    from streamrl.trainer.trainer import Trainer

    cfg = load_config(
        None, ["max_steps=8", "rollout.prompts_per_step=3", "rollout.samples_per_prompt=4", "max_staleness=1"]
    )
    task = make_task("rg:chain_sum", default_task_args("rg:chain_sum"), "", "", "answer_is")
    trainer = Trainer.from_config(copy.deepcopy(tiny[0]), cfg, pad_id=0)
    batches = []
    step = trainer.step
    trainer.step = lambda b: (batches.append([t.sample_id for t in b.trajectories]), step(b))[1]
    sampler = MoPPSSampler(task.train_stream(0, set()), pool=8)
    observed = []
    replay = ReplayBuffer(0.25, 64)

    def feedback(group):
        observed.append(group.problem.id)
        sampler.observe(group)

    runner = AsyncRunner(
        cfg, trainer, tiny[1], sampler, RunState(), StopFlag(), scripted_worker, feedback, replay
    )
    records = []
    runner.run(records.append)
    c = runner.ledger.counts()
    assert c["lost"] == 0 and c["trained"] == 24
    assert c["admitted"] == c["trained"] + c["filtered"] + c["carried_over"]
    assert len(observed) == c["generated"]  # every scored group reached the sampler exactly once
    assert sum(a + b > 2 for a, b in sampler.post.values()) == len(set(observed))
    replayed = [int(r.metrics.get("replay_samples", 0)) for r in records]
    assert c["replayed_samples"] == sum(replayed) > 0
    for ids, n in zip(batches, replayed):
        assert len(ids) == 12 + n and len(set(ids)) == len(ids)  # 3 groups x 4 fresh + distinct replays
        assert sum("-r" in i for i in ids) == n


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _plant_one_success(run):
    """The latest saved state's replay buffer replaced by one holding a single success -> that buffer."""
    saved = latest_state(run) / "carried.pkl"
    carried = pickle.loads(saved.read_bytes())
    planted = ReplayBuffer(0.3, 256)
    planted.items.append(Replayed(make_traj(0, [5, 6, 7], [8, 9], 1.0, loss_mask=[1, 1]), 1.0, 1))
    carried["replay"] = planted.state()
    saved.write_bytes(pickle.dumps(carried))
    return planted


def test_train_cli_with_mopps_and_replay_colocated_then_resume(tmp_path):
    run = tmp_path / "colo"
    args = ["train", *TINY, "runtime.mode=colocated", "max_staleness=0", "rollout.sampler=mopps"]
    assert main([*args, "rollout.replay_share=0.3", "max_steps=2", f"run_dir={run}"]) == 0
    rows = _rows(run)
    assert [r["policy_version"] for r in rows] == [1, 2] and all("sampler_pool_size" in r for r in rows)
    state = json.loads((latest_state(run) / "run_state.json").read_text())
    assert state["sampler"]["base_drawn"] >= 8 and len(state["sampler"]["post"]) >= 2
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == 4
    assert acc["replayed_samples"] == sum(r.get("replay_samples", 0) for r in rows)
    # the saved buffer is loaded on resume: a buffer of one planted success in place of the saved one
    # is the resumed step's whole buffer, replayed once: floor(0.3 * 8 / 0.7) = 3, at most 1
    _plant_one_success(run)
    assert main(["train", f"resume={run}", "max_steps=3"]) == 0
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert (rows[-1]["replay_samples"], rows[-1]["replay_buffer_size"]) == (1.0, 1.0)
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["replayed_samples"] == sum(r.get("replay_samples", 0) for r in rows)


def test_a_resume_with_replay_off_keeps_the_saved_buffer(tmp_path, capsys):
    """A run saved with replay on and resumed with rollout.replay_share=0: one line says what the saved
    buffer holds, nothing is replayed, and every state the resume saves (a periodic one, the last) keeps
    the buffer as saved; a later resume with replay on replays from it."""
    run = tmp_path / "colo"
    args = ["train", *TINY, "runtime.mode=colocated", "max_staleness=0"]
    assert main([*args, "rollout.replay_share=0.3", "max_steps=1", f"run_dir={run}"]) == 0
    planted = _plant_one_success(run)
    capsys.readouterr()
    off = ["rollout.replay_share=0", "train.save_every=1", "max_steps=3"]
    assert main(["train", f"resume={run}", *off]) == 0
    err = capsys.readouterr().err.splitlines()
    assert (
        "streamrl: note: rollout.replay_share is 0: the 1 success(es) in the saved replay buffer are not "
        "replayed; the run state keeps them for a resume with rollout.replay_share > 0"
    ) in err
    rows = _rows(run)
    assert [r["step"] for r in rows] == [1, 2, 3] and not any("replay_samples" in r for r in rows[1:])
    states = state_dirs(run)
    assert [d.name for d in states] == ["step-000002", "step-000003"]
    assert all(pickle.loads((d / "carried.pkl").read_bytes())["replay"] == planted.state() for d in states)
    assert main(["train", f"resume={run}", "rollout.replay_share=0.3", "max_steps=4"]) == 0
    assert (_rows(run)[-1]["replay_samples"], _rows(run)[-1]["replay_buffer_size"]) == (1.0, 1.0)


def test_train_cli_with_mopps_async(tmp_path):
    run = tmp_path / "async"
    assert (
        main(["train", *TINY, "runtime.mode=async", "rollout.sampler=mopps", "max_steps=2", f"run_dir={run}"])
        == 0
    )
    rows = _rows(run)
    assert [r["policy_version"] for r in rows] == [1, 2] and all("sampler_pool_size" in r for r in rows)
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == 4


def test_train_cli_with_curriculum_and_few_shot(tmp_path):
    run = tmp_path / "cur"
    overrides = [
        "rollout.sampler=curriculum",
        "task_config.few_shot_n=2",
        "runtime.mode=colocated",
        "max_staleness=0",
    ]
    assert main(["train", *TINY, *overrides, "max_steps=2", f"run_dir={run}"]) == 0
    assert all(r["curriculum_level"] == 0 for r in _rows(run))
