"""Exact resume: a stopped and resumed run continues as if it had never stopped.

Colocated and synchronous (max_staleness=0) with a fixed seed, a run stopped after step 2 and resumed
ends with weights, optimizer moments and scheduler bitwise equal to an uninterrupted run of the same
length, and logs the same numbers for the steps after the stop. The restore itself is checked piece by
piece against the saved state, so a piece that is saved but not loaded fails here by name.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil

import pytest
import torch
from interrupt import stop_after  # tests/ is on sys.path
from safetensors.torch import load_file
from tiny_args import TINY
from transformers import PreTrainedModel

from streamrl.cli import main
from streamrl.config import load_config
from streamrl.loop import job
from streamrl.loop.restore import restore, saved_weights
from streamrl.loop.state import load_state
from streamrl.models.weight_files import index_shards

SYNC = [*TINY, "runtime.mode=colocated", "max_staleness=0", "max_steps=4", "train.lr=1e-3"]
# step metrics that measure time, not what was computed
TIMING = re.compile(r"(^time$|_time$|_s$|per_s$|_share$|_elapsed$)")


def _rows(run):
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


def _tensors(run):
    _, model_dir, tensors = load_state(run)
    return saved_weights(model_dir), tensors


def _assert_optimizer_equal(a, b):
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for k in a["state"]:
        for name, va in a["state"][k].items():
            vb = b["state"][k][name]
            assert torch.equal(torch.as_tensor(va), torch.as_tensor(vb)), f"optimizer state {k}.{name}"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """(uninterrupted run dir, stopped-at-2-then-resumed run dir)."""
    base = tmp_path_factory.mktemp("exact")
    whole, split = base / "whole", base / "split"
    assert main(["train", *SYNC, f"run_dir={whole}"]) == 0
    assert [r["step"] for r in _rows(whole)] == [1, 2, 3, 4]  # not stopped early (a stray signal)
    assert not json.loads((whole / "summary.json").read_text())["interrupted"]
    with pytest.MonkeyPatch.context() as mp:
        stop_after(mp, 2)
        assert main(["train", *SYNC, f"run_dir={split}"]) == 0
    assert [r["step"] for r in _rows(split)] == [1, 2]
    assert main(["train", f"resume={split}"]) == 0
    return whole, split


def test_resumed_run_ends_bitwise_equal_to_an_uninterrupted_one(runs):
    whole, split = runs
    w_weights, w_tensors = _tensors(whole)
    s_weights, s_tensors = _tensors(split)
    assert w_weights.keys() == s_weights.keys()
    differ = [k for k in w_weights if not torch.equal(w_weights[k], s_weights[k])]
    assert differ == [], f"weights differ after resume: {differ[:5]}"
    _assert_optimizer_equal(w_tensors["optimizer"], s_tensors["optimizer"])
    assert w_tensors["scheduler"] == s_tensors["scheduler"]


def test_resumed_run_logs_the_same_steps(runs):
    whole, split = runs
    a, b = _rows(whole), _rows(split)
    assert [r["step"] for r in b] == [1, 2, 3, 4]
    for ra, rb in zip(a, b, strict=True):
        same = {k: ra[k] for k in ra if not TIMING.search(k)}
        assert {k: rb.get(k) for k in same} == same, f"step {ra['step']} differs"
    ga = [json.loads(x) for x in (whole / "groups.jsonl").read_text().splitlines()]
    gb = [json.loads(x) for x in (split / "groups.jsonl").read_text().splitlines()]
    assert ga == gb  # the same problems, rewards and sampled text, step by step


def test_a_stop_during_a_steps_rollouts_drops_the_step_and_the_resume_makes_it_exactly(
    runs, tmp_path, monkeypatch
):
    """A SIGINT while step 3 generates ends its rollouts at the engine's next decode step: step 3 is
    neither trained nor logged, step 2 is saved, and the resumed run makes step 3 again with the problems
    and tokens the uninterrupted run had: it ends bitwise equal to it, with the same groups."""
    import os
    import signal

    from streamrl.engine.hf import HFEngine
    from streamrl.loop.colocated import ColocatedRunner

    whole, _ = runs
    run, at = tmp_path / "run", [0]
    real_batch, real_wait = ColocatedRunner._batch, HFEngine.wait

    def batch(self, step):
        at[0] = step
        return real_batch(self, step)

    def wait(self, handles, stop=None):
        if at[0] != 3 or stop is None:
            return real_wait(self, handles, stop)
        asked = [0]

        def stop_soon():  # the signal comes after two decode steps
            asked[0] += 1
            if asked[0] == 3:
                os.kill(os.getpid(), signal.SIGINT)
            return stop()

        return real_wait(self, handles, stop_soon)

    monkeypatch.setattr(ColocatedRunner, "_batch", batch)
    monkeypatch.setattr(HFEngine, "wait", wait)
    assert main(["train", *SYNC, f"run_dir={run}"]) == 0
    monkeypatch.undo()
    assert [r["step"] for r in _rows(run)] == [1, 2]
    assert sorted(p.name for p in (run / "state").iterdir()) == ["step-000002"]
    acc = json.loads((run / "accounting.json").read_text())
    assert acc["lost"] == 0 and acc["trained"] == 4
    assert json.loads((run / "summary.json").read_text())["interrupted"]
    assert main(["train", f"resume={run}"]) == 0
    w_weights, w_tensors = _tensors(whole)
    r_weights, r_tensors = _tensors(run)
    assert [k for k in w_weights if not torch.equal(w_weights[k], r_weights[k])] == []
    _assert_optimizer_equal(w_tensors["optimizer"], r_tensors["optimizer"])
    ga = [json.loads(x) for x in (whole / "groups.jsonl").read_text().splitlines()]
    gb = [json.loads(x) for x in (run / "groups.jsonl").read_text().splitlines()]
    assert ga == gb


def test_a_state_saved_in_shards_resumes_exactly(runs, tmp_path, monkeypatch):
    """A model past save_pretrained's max_shard_size is saved in shards (model.safetensors.index.json and
    the files it names, here of at most 100KB): the resume loads every one, and the run ends bitwise
    equal to the uninterrupted one. A state missing a shard its index names is refused in one line."""
    whole, _ = runs
    real = PreTrainedModel.save_pretrained

    def sharded(self, *args, **kwargs):
        return real(self, *args, **{**kwargs, "max_shard_size": "100KB"})

    monkeypatch.setattr(PreTrainedModel, "save_pretrained", sharded)
    run = tmp_path / "run"
    with pytest.MonkeyPatch.context() as mp:
        stop_after(mp, 2)
        assert main(["train", *SYNC, f"run_dir={run}"]) == 0
    model_dir = load_state(run)[1]
    shards = index_shards(model_dir / "model.safetensors.index.json")
    assert len(shards) >= 3 and not (model_dir / "model.safetensors").exists()
    assert main(["train", f"resume={run}"]) == 0
    w_weights, w_tensors = _tensors(whole)
    r_weights, r_tensors = _tensors(run)
    assert w_weights.keys() == r_weights.keys()
    assert [k for k in w_weights if not torch.equal(w_weights[k], r_weights[k])] == []
    _assert_optimizer_equal(w_tensors["optimizer"], r_tensors["optimizer"])
    assert w_tensors["scheduler"] == r_tensors["scheduler"]
    broken = tmp_path / "broken"
    shutil.copytree(load_state(run)[1], broken)
    (broken / shards[1]).unlink()
    with pytest.raises(ValueError) as e:
        saved_weights(broken)
    assert (
        str(e.value)
        == f"resume: {broken} lacks {shards[1]}, a shard its index names: its weights cannot be restored"
    )
    index = broken / "model.safetensors.index.json"
    index.write_text("{")  # cut short
    with pytest.raises(ValueError) as e:
        saved_weights(broken)
    why = "cannot be read or names no safetensors shard"
    assert str(e.value) == f"resume: {index} {why}: its weights cannot be restored"


def test_restore_loads_every_saved_piece(runs, tmp_path):
    """Fresh components + restore == the saved state: weights, optimizer, scheduler, RNGs, sampler, engine."""
    _, split = runs
    state, model_dir, tensors = load_state(split)
    cfg = load_config(None, [f"resume={split}"])
    parts = job.build_components(cfg)
    fresh = {k: v.clone() for k, v in parts.model.state_dict().items()}
    torch.manual_seed(12345)  # every RNG somewhere else than the saved state
    random.seed(12345)
    parts.engine.generator.manual_seed(12345)
    assert not torch.equal(torch.get_rng_state(), tensors["torch_rng"])
    restored = restore(split, parts.model, parts.trainer, parts.engine, parts.stream)
    saved = load_file(str(model_dir / "model.safetensors"))
    model_state = parts.model.state_dict()
    assert all(torch.equal(model_state[k], v) for k, v in saved.items())
    assert any(not torch.equal(fresh[k], v) for k, v in saved.items())  # training moved the weights
    _assert_optimizer_equal(parts.trainer.optimizer.state_dict(), tensors["optimizer"])
    assert parts.trainer.scheduler.state_dict() == tensors["scheduler"]
    assert torch.equal(torch.get_rng_state(), tensors["torch_rng"])
    assert random.getstate() == tensors["py_rng"]
    assert torch.equal(parts.engine.generator.get_state(), tensors["engine_rng"])
    assert parts.stream.state_dict() == state.sampler
    assert parts.trainer.version == restored.version == state.version == 4


def _data_parallel_runs(base, strategy):
    """(a 3-step run over 2 ranks, the same run stopped after step 1 and resumed) under `base`."""
    args = [
        *SYNC,
        "max_steps=3",
        f"train.strategy={strategy}",
        "train.world_size=2",
        "train.dist_timeout_s=60",
    ]
    args.append("train.token_budget=200")  # several micro-batches: the follower trains on some of them
    whole, split = base / "whole", base / "split"
    assert main(["train", *args, f"run_dir={whole}"]) == 0
    with pytest.MonkeyPatch.context() as mp:
        stop_after(mp, 1)
        assert main(["train", *args, f"run_dir={split}"]) == 0
    assert [r["step"] for r in _rows(split)] == [1]
    assert main(["train", f"resume={split}"]) == 0
    return whole, split


@pytest.fixture(scope="module")
def fsdp2_runs(tmp_path_factory):
    return _data_parallel_runs(tmp_path_factory.mktemp("fsdp2"), "fsdp2")


def test_a_data_parallel_run_resumes_exactly(tmp_path):
    """train.strategy=ddp over 2 ranks: a resume hands the followers rank 0's weights, optimizer moments,
    scheduler and version, so a run stopped after step 1 ends bitwise equal to one that never stopped.
    A follower left with its start weights or fresh moments would put other gradients into the
    all-reduce of the steps after the resume."""
    _assert_resumed_exactly(*_data_parallel_runs(tmp_path, "ddp"))


def test_a_sharded_run_resumes_exactly(fsdp2_runs):
    """train.strategy=fsdp2 over 2 ranks: its state holds the whole model and optimizer, gathered from
    the ranks' shards, and a resume gives every rank its shards back, so the resumed run ends bitwise
    equal to one that never stopped."""
    _assert_resumed_exactly(*fsdp2_runs)


def test_a_sharded_state_is_saved_whole_and_restored_on_every_rank(fsdp2_runs):
    """The fsdp2 state is one process's format (every parameter's moments, numbered as a single-process
    optimizer numbers them, full size); restored into fresh ranks, the state gathered back from their
    shards is the saved one, tensor for tensor: the follower's shards were loaded too."""
    _, split = fsdp2_runs
    state, model_dir, tensors = load_state(split)
    saved = load_file(str(model_dir / "model.safetensors"))
    optimizer = tensors["optimizer"]
    cfg = load_config(None, [f"resume={split}"])
    parts = job.build_components(cfg)
    try:
        params = [p for p in parts.model.parameters() if p.requires_grad]
        assert sorted(optimizer["state"]) == list(range(len(params)))
        assert [g["params"] for g in optimizer["param_groups"]] == [list(range(len(params)))]
        for i, p in enumerate(params):  # the whole tensor, not a rank's shard
            assert optimizer["state"][i]["exp_avg"].shape == p.shape
            assert float(optimizer["state"][i]["step"]) == 3
        # nothing trained yet: no moments (torch's gather would make them with a zero step), and a state
        # saved so, loaded, leaves none either
        fresh = parts.trainer.optimizer_state()
        assert fresh["state"] == {}
        parts.trainer.load_full_state(saved, fresh)
        assert parts.trainer.optimizer_state()["state"] == {}
        restored = restore(split, parts.model, parts.trainer, parts.engine, parts.stream)
        _assert_optimizer_equal(parts.trainer.optimizer_state(), optimizer)
        weights = parts.trainer.policy_state()
        assert weights.keys() >= saved.keys()
        assert all(torch.equal(weights[k], v) for k, v in saved.items())
        assert parts.trainer.scheduler.state_dict() == tensors["scheduler"]
        assert parts.trainer.version == restored.version == state.version == 3
    finally:
        parts.trainer.close()


def test_a_sharded_runs_state_resumes_in_one_process(fsdp2_runs, tmp_path):
    """The fsdp2 state is one process's: train.strategy=single resumes it, its optimizer fused as its
    own are, and trains on from the saved moments."""
    _, split = fsdp2_runs
    run = tmp_path / "run"
    shutil.copytree(split, run)
    assert main(["train", f"resume={run}", "train.strategy=single", "train.world_size=1", "max_steps=4"]) == 0
    assert [r["step"] for r in _rows(run)] == [1, 2, 3, 4]
    optimizer = load_state(run)[2]["optimizer"]
    assert [g["fused"] for g in optimizer["param_groups"]] == [True]
    assert {float(s["step"]) for s in optimizer["state"].values()} == {4.0}


def test_a_single_process_state_resumes_sharded_on_every_rank(runs):
    """The other way round: a single-process state restored into train.strategy=fsdp2 over 2 ranks
    gives each rank its shards of the saved weights and moments; gathered back, they are the saved
    state tensor for tensor."""
    _, split = runs
    state, model_dir, tensors = load_state(split)
    saved = load_file(str(model_dir / "model.safetensors"))
    more = ["train.strategy=fsdp2", "train.world_size=2", "train.dist_timeout_s=60"]
    parts = job.build_components(load_config(None, [f"resume={split}", *more]))
    try:
        restored = restore(split, parts.model, parts.trainer, parts.engine, parts.stream)
        gathered = parts.trainer.optimizer_state()
        # fused is the implementation's own (fsdp2's sharded parameters take the unfused step)
        assert [g.pop("fused") for g in gathered["param_groups"]] == [False]
        expected = {
            **tensors["optimizer"],
            "param_groups": [dict(g) for g in tensors["optimizer"]["param_groups"]],
        }
        assert [g.pop("fused") for g in expected["param_groups"]] == [True]
        _assert_optimizer_equal(gathered, expected)
        weights = parts.trainer.policy_state()
        assert all(torch.equal(weights[k], v) for k, v in saved.items())
        assert parts.trainer.scheduler.state_dict() == tensors["scheduler"]
        assert parts.trainer.version == restored.version == state.version == 4
    finally:
        parts.trainer.close()


def _assert_resumed_exactly(whole, split):
    w_weights, w_tensors = _tensors(whole)
    s_weights, s_tensors = _tensors(split)
    differ = [k for k in w_weights if not torch.equal(w_weights[k], s_weights[k])]
    assert differ == [], f"weights differ after a data-parallel resume: {differ[:5]}"
    _assert_optimizer_equal(w_tensors["optimizer"], s_tensors["optimizer"])
    rows = _rows(split)
    assert [r["loss"] for r in _rows(whole)] == [r["loss"] for r in rows]
    assert all(r["micro_batches"] >= 2 and math.isfinite(r["grad_norm"] + r["entropy"]) for r in rows)
