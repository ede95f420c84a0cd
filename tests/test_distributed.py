"""train.strategy=ddp|fsdp2 on CPU/gloo with 2 ranks: same numbers as one process, clear failures."""

import copy
import json
import math
import os
import signal

import pytest
from bounded import call_bounded
from dist_helpers import HANG_S, exit_at_once, join_then_hang, never_join, terminated_while_starting
from tiny_args import TINY
from trajectories import random_batch

from streamrl.config import ConfigError, load_config
from streamrl.loop.state import latest_state
from streamrl.placement.trainer_ranks import make_trainer
from streamrl.trainer.distributed import rank_share

# fp32, same weights, same micro-batches: only the order of float sums differs between 1 and 2 ranks
ATOL, RTOL = 1e-6, 1e-5
# the weights after AdamW steps: Adam divides each gradient by its own running scale, so for an entry
# whose gradient is near 0 a float-order difference moves the update by a share of lr (1e-3 here);
# 1% of lr still tells a rank that missed a sync or a step (its weights differ by whole updates)
PARAM_ATOL = 1e-5


def test_rank_share_is_round_robin_and_pads_with_zero_weight_passes():
    assert rank_share([0, 1, 2], 0, 2) == [(0, 2.0), (2, 2.0)]
    assert rank_share([0, 1, 2], 1, 2) == [(1, 2.0), (0, 0.0)]  # joins the 2nd all-reduce with no weight
    assert rank_share([4, 6], 1, 3) == [(6, 3.0)]
    assert rank_share([4, 6], 2, 3) == [(4, 0.0)]


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["train.world_size=2"], "'train.world_size'=2 needs train.strategy=ddp or fsdp2"),
        (["train.strategy=ddp", "train.world_size=0"], "'train.world_size' must be > 0"),
        (["train.strategy=ddp", "advantage.name=gae"], "does not train a value head yet"),
        (["train.strategy=fsdp2", "train.lora_rank=4"], "fsdp2 with train.lora_rank > 0"),
        (["train.strategy=ddp", "train.dist_timeout_s=0"], "'train.dist_timeout_s' must be > 0"),
    ],
)
def test_bad_distributed_config_is_one_clear_error(overrides, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_config(None, overrides)


def _grads(trainer, store):
    """Snapshot the (clipped) gradients just before each optimizer step; fsdp2: this rank's shard."""

    def hook(opt, args, kwargs):
        store.append(
            [(p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad).clone() for p in trainer.params]
        )

    trainer.optimizer.register_step_pre_hook(hook)


# M2PO's cut and the entropy quantile are taken over the mini-batch, gathered across the ranks
SELECT = ["loss.name=m2po", "loss.m2_threshold=26", "loss.entropy_top_q=0.5"]


@pytest.mark.parametrize(
    "strategy, backend, loss",
    [
        ("ddp", "local", []),
        ("fsdp2", "local", []),
        pytest.param("ddp", "ray", [], marks=pytest.mark.xdist_group("ray")),
        ("ddp", "local", SELECT),
    ],
    ids=["ddp", "fsdp2", "ddp-ray", "ddp-token-selections"],
)
def test_two_ranks_match_one_process(tiny, strategy, backend, loss, capsys):
    base = ["model=tiny-random", "train.lr=1e-3", "train.token_budget=40", "train.precision=fp32", *loss]
    single = make_trainer(copy.deepcopy(tiny[0]), load_config(None, base), pad_id=0)
    extra = [f"train.strategy={strategy}", "train.world_size=2", "train.dist_timeout_s=60"]
    if backend == "ray":  # rank 1 is a Ray actor (1 CPU) beside one rollout actor slot
        pytest.importorskip("ray")
        # a limit against a hang: on a loaded machine a new Ray instance's actor once took over 60 s to join
        extra += ["runtime.backend=ray", "ray.num_cpus=2", "train.dist_timeout_s=180"]
    cfg2 = load_config(None, base + extra)
    dist_trainer = make_trainer(copy.deepcopy(tiny[0]), cfg2, pad_id=0)
    try:
        if backend == "ray":
            from streamrl.placement.ray_ranks import RankHandle

            assert [type(p) for p in dist_trainer.links.procs] == [RankHandle]
            assert dist_trainer.links.procs[0].is_alive()
        if backend == "local":  # Slurm and systemd send SIGTERM to every process of the job: rank 0 decides
            os.kill(dist_trainer.links.procs[0].pid, signal.SIGTERM)
        g1, g2 = [], []
        _grads(single, g1)
        _grads(dist_trainer, g2)
        diffs = {}
        # 5 trajectories -> 2 micro-batches (even), then 8 -> 3 (uneven: rank 1 runs one zero-weight pass)
        for n, seed, n_micro in ((5, 0, 2), (8, 1, 3)):
            batch = random_batch(n, seed)
            m1, m2 = single.step(batch), dist_trainer.step(batch)
            assert m1["micro_batches"] == m2["micro_batches"] == n_micro
            for k in m1:
                if k != "train_time":
                    assert m2[k] == pytest.approx(m1[k], rel=RTOL, abs=ATOL), k
            if loss and n == 5:  # some tokens kept, some not, by each rule
                assert 0 < m1["m2_masked_frac"] < 1 and 0 < m1["entropy_mask_kept_frac"] < 1
            gd = max(float((a[: b.shape[0]] - b).abs().max()) for a, b in zip(g1[-1], g2[-1]))
            assert gd <= ATOL
            diffs[f"grad_step{len(g1)}"] = gd
        if strategy == "fsdp2":  # rank 0 really holds shards, compared with the matching rows
            assert any(b.shape != a.shape for a, b in zip(g1[-1], g2[-1]))
        s1, s2 = single.policy_state(), dist_trainer.policy_state()
        assert s1.keys() == s2.keys()
        diffs["params_after_2_adamw_steps"] = max(float((s1[k] - s2[k]).abs().max()) for k in s1)
        assert diffs["params_after_2_adamw_steps"] <= PARAM_ATOL
        with capsys.disabled():
            print(f"\n{strategy} ({backend}) 2 ranks vs 1 process, max abs diff: {diffs}")
    finally:
        dist_trainer.close()
    if backend == "ray":  # the ranks stopped and the Ray instance make_trainer started is gone
        import ray

        assert not ray.is_initialized()


def test_follower_that_never_joins_is_an_error_within_the_timeout(tiny):
    cfg = load_config(
        None, ["model=tiny-random", "train.strategy=ddp", "train.world_size=2", "train.dist_timeout_s=3"]
    )
    model = copy.deepcopy(tiny[0])
    # the follower sleeps HANG_S (far past the bound below): rank 0 must give up on its own timeout
    with pytest.raises(RuntimeError, match=r"not all 2 ranks joined within train.dist_timeout_s=3s"):
        call_bounded(
            lambda: make_trainer(model, cfg, pad_id=0, follower_target=never_join),
            HANG_S / 2,
            "rank 0 kept waiting for a follower that never joins: train.dist_timeout_s was not applied",
        )


def test_a_follower_that_exits_before_joining_ends_rank_0s_wait_at_once(tiny):
    # rank 0 waiting out its timeout would end with "not all 2 ranks joined": the message tells the
    # two apart, and the timeout (far above a follower's start) ends the wait either way, so no thread
    # is left waiting in the store when the test fails
    cfg = load_config(
        None, ["model=tiny-random", "train.strategy=ddp", "train.world_size=2", "train.dist_timeout_s=60"]
    )
    model = copy.deepcopy(tiny[0])
    with pytest.raises(
        RuntimeError, match=r"trainer rank\(s\) \[1\] exited before joining the process group"
    ):
        call_bounded(
            lambda: make_trainer(model, cfg, pad_id=0, follower_target=exit_at_once),
            150,  # a limit against a hang, not a speed check
            "rank 0 kept waiting for a follower whose process had ended",
        )


def test_a_follower_signalled_while_it_starts_survives_and_joins(tiny):
    """Ctrl-C or a group SIGTERM during a follower's imports, before its handlers exist, must not kill
    it: rank 0 stops the job and needs every rank alive to do so."""
    cfg = load_config(
        None, ["model=tiny-random", "train.strategy=ddp", "train.world_size=2", "train.dist_timeout_s=60"]
    )
    model = copy.deepcopy(tiny[0])
    trainer = call_bounded(
        lambda: make_trainer(model, cfg, pad_id=0, follower_target=terminated_while_starting),
        120,
        "rank 0 hung starting a follower that was signalled",
    )
    try:
        assert all(p.is_alive() for p in trainer.links.procs)
    finally:
        trainer.close()


def test_follower_that_hangs_in_a_collective_is_an_error_within_the_timeout(tiny):
    cfg = load_config(
        None, ["model=tiny-random", "train.strategy=ddp", "train.world_size=2", "train.dist_timeout_s=3"]
    )
    model = copy.deepcopy(tiny[0])
    with pytest.raises(RuntimeError, match=r"hung longer than train.dist_timeout_s=3s"):
        call_bounded(
            lambda: make_trainer(model, cfg, pad_id=0, follower_target=join_then_hang),
            HANG_S / 2,
            "rank 0 kept waiting in a collective the follower never joins: train.dist_timeout_s was "
            "not applied",
        )


# colocated ddp end to end: tests/test_resume_exact.py (a 2-rank run stopped, resumed, compared)
@pytest.mark.parametrize("mode, strategy", [("async", "ddp"), ("colocated", "fsdp2")])
def test_train_with_two_ranks_end_to_end(tmp_path, mode, strategy):
    from streamrl.loop.job import run_train

    cfg = load_config(
        None,
        TINY
        + [
            f"runtime.mode={mode}",
            "max_staleness=0",
            "max_steps=2",
            "train.token_budget=200",  # one ~171-token sample or group fits: several micro-batches
            f"train.strategy={strategy}",
            "train.world_size=2",
            "train.dist_timeout_s=60",
            f"run_dir={tmp_path}",
        ],
    )
    summary = run_train(cfg)
    assert summary["steps"] == 2 and not summary["interrupted"]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        assert r["micro_batches"] >= 2
        for k in ("loss", "grad_norm", "entropy"):
            assert math.isfinite(r[k]), (k, r[k])
    assert (latest_state(tmp_path) / "model" / "model.safetensors").is_file()


def test_a_stopped_fsdp2_run_saves_its_state_and_offers_its_resume(tmp_path, monkeypatch, capsys):
    """A sharded run's state is gathered whole from the ranks and saved: its stop message names the
    resume, as any run's does, and its model-only exports are written as well."""
    from streamrl.cli import main
    from streamrl.loop.run_dir import PeriodicSaver

    def stop(self, step):  # a real SIGINT, taken by the run's handler, after step 1
        os.kill(os.getpid(), signal.SIGINT)
        return False

    monkeypatch.setattr(PeriodicSaver, "after_step", stop)
    monkeypatch.setenv("COLUMNS", "400")  # the message on one line
    args = ["runtime.mode=colocated", "max_staleness=0", "max_steps=3", "train.strategy=fsdp2"]
    args += ["train.world_size=2", "train.dist_timeout_s=60", "checkpoint.every=1", "checkpoint.save=true"]
    assert main(["train", *TINY, *args, f"run_dir={tmp_path}"]) == 0
    err = " ".join(capsys.readouterr().err.split())
    assert (
        f"stopped by SIGINT at step 1: state saved; continue with `streamrl train resume={tmp_path}`"
    ) in err
    assert latest_state(tmp_path).name == "step-000001" and (tmp_path / "checkpoints" / "step-1").is_dir()
    assert (tmp_path / "checkpoint" / "README.md").is_file()


def test_the_stop_message_names_the_resume(tmp_path):
    from streamrl.loop.run_dir import stop_message

    said = stop_message("SIGTERM", 3, tmp_path)
    assert (
        said == f"stopped by SIGTERM at step 3: state saved; continue with `streamrl train resume={tmp_path}`"
    )
